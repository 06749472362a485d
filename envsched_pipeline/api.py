"""Bring your own trainer: the scheduler as a step-by-step service over the lake (no Dagster).

    from envsched_pipeline.api import ExternalRun

    run = ExternalRun(pool="synthetic", lake="warehouse/lake", seed=0, batch_size=64, group_size=8)
    for step in range(run.next_step, 200):
        batch = run.manifest(step)                         # picks: task_id, env_id, half, score, ...
        rollouts = my_trainer.rollout_and_update(batch)    # [{"task_id", "rollout", "reward"}, ...]
        run.observe(step, rollouts)
        run.log_eval(step, {"heldout_seen": my_eval(...)})   # optional: your held-out scores

State lives in the lake, so a restarted trainer builds a new ``ExternalRun`` on the same lake and
continues where it stopped; everything is queryable with ``envsched sql`` and visible in Dagster.
"""

from __future__ import annotations

import json
import numbers
import os
from collections.abc import Iterable, Mapping

from envsched_pipeline.analysis.explain import explain_step
from envsched_pipeline.core.build import asked_run, check_run, new_run
from envsched_pipeline.core.gates import rewind
from envsched_pipeline.core.ingest import ingest_rollouts, record_evals
from envsched_pipeline.core.loop import status
from envsched_pipeline.core.pools import ensure_pool
from envsched_pipeline.core.select import select_manifest
from envsched_pipeline.core.statistics import statistics_step
from envsched_pipeline.errors import ConfigError, StepError
from envsched_pipeline.lake import Lake
from envsched_pipeline.lease import Lease
from envsched_pipeline.run import OPEN_ENDED_STEPS, load_run, start_run


class ExternalRun:
    """A run whose rollouts come from your trainer: ask for each step's manifest, hand back rewards."""

    def __init__(
        self,
        pool: str | None = None,
        lake: str | Lake | None = None,
        scheduler: str | None = None,
        seed: int | None = None,
        batch_size: int | None = None,
        group_size: int | None = None,
        prior_lake: str | None = None,
        prior_discount: float | None = None,
        against: list[str] | None = None,
        select_lag: int | None = None,
        **config_overrides,
    ):
        """Start a run on ``lake``, or resume the one it holds. A setting left as None is the run's
        own when resuming (a restarted trainer passes only the lake), else a new run's default:
        pool ``synthetic``, the recommended envsched form (``envsched@success+adaptive+covsampled+lr``;
        ``"envsched"``: the paper's constants), seed 0, B = 64, G = 8, no prior lake, prior discount
        0.5, compared with no other run. ``against``: lakes of other runs of this pool and batch shape
        (a baseline's) that the run's report compares with (`envsched report`, `run_report`).
        ``select_lag`` (default 0): how many steps :meth:`manifest` may run ahead of
        :meth:`observe`; with 1, ``manifest(t + 1)`` is chosen from the rollouts up to ``t - 1`` (step
        t's picks counted as spent), for a trainer that asks for the next batch while one trains.
        ``scheduler`` may be any scheduler or named variant: its overrides under
        ``config_overrides``. Every setting is checked before anything is
        written; one that changes a run under way is refused, naming it."""
        self.lake = lake if isinstance(lake, Lake) else Lake(lake)
        existing = load_run(self.lake)
        base = existing or new_run(policy="external", trainer="external", max_steps=OPEN_ENDED_STEPS)
        try:  # a named variant: its overrides under yours
            spec = asked_run(
                base,
                scheduler,
                config_overrides,
                pool=pool,
                seed=seed,
                batch_size=batch_size,
                group_size=group_size,
                prior_lake=prior_lake,
                prior_discount=prior_discount,
                against=against,
                select_lag=select_lag,
                trainer="external",
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        check_run(self.lake, spec)  # a bad setting or prior lake: refused before anything is written
        if spec.pool == "synthetic":
            ensure_pool(self.lake, spec.pool)  # the built-in pool is created on first use
        if not self.lake.has("tasks", pool=spec.pool):
            raise StepError(f"pool {spec.pool!r} is not in {self.lake.root}: import or create it first")
        self.spec = start_run(self.lake, spec)

    @property
    def next_step(self) -> int:
        """The first step without ingested rollouts (where a restarted trainer resumes)."""
        done = self.lake.steps("rollouts")
        return (done[-1] + 1) if done else 0

    def manifest(self, step: int | None = None) -> list[dict]:
        """Manifest of ``step`` (default: next_step). An existing manifest is returned unchanged.
        Step t needs the rollouts of step ``t - 1 - select_lag`` observed, and the manifests before
        it chosen."""
        step = self.next_step if step is None else _step(step)
        if not self.lake.has("manifests", step=step):
            select_manifest(self.lake, step)
        rows = self.lake.read("manifests", step=step).sort_by("slot").to_pylist()
        for r in rows:
            r["reason"] = json.loads(r["reason"]) if r.get("reason") else {}
        return rows

    def observe(
        self,
        step: int,
        rollouts: Iterable[Mapping] | str | os.PathLike,
        replace: bool = False,
        partial_groups: bool = False,
    ) -> dict:
        """Hand back step ``step``'s rollouts ({task_id, rollout, reward, ...optional}): records,
        a pyarrow Table, a polars DataFrame, or the path of a .jsonl/.parquet file of them.
        Validated, written atomically, then folded into the scheduler's statistics."""
        step = _step(step)
        metrics = ingest_rollouts(self.lake, step, rollouts, replace=replace, partial_groups=partial_groups)
        statistics_step(self.lake, step)
        return metrics

    def log_eval(self, step: int, scores: dict) -> list[dict]:
        """Record your evaluation after step ``step``'s update: benchmark name -> score, or
        ``{"score": x, "se": s}``. ``heldout_seen`` / ``heldout_unseen`` fill the step table's
        held-out columns; other names are charted in the report and sent to the trackers."""
        return record_evals(self.lake, _step(step), scores, where=f"step {step} scores")

    def predicted_yield(self, step: int) -> float:
        """Predicted share of informative (non-zero-variance) groups in manifest ``step``."""
        self.manifest(step)
        return float(self.lake.read("audits", step=step).to_pylist()[0]["predicted_yield"])

    def oversampling_factor(self, step: int) -> float:
        """Roll out this many times B tasks to keep B informative groups after DAPO-style filtering
        (1 / predicted yield, calibrated on the realized yield of recent steps)."""
        self.manifest(step)
        return float(self.lake.read("audits", step=step).to_pylist()[0]["oversampling_factor"])

    def rewind(self, step: int) -> dict:
        """Take the run back to ``step`` (`envsched rewind --to`): the manifests, rollouts and
        statistics of ``step`` and later move to ``archive/``, and the next ``manifest(step)`` is
        chosen again from the scheduler state after ``step - 1``. Returns what moved where."""
        with Lease(self.lake, kind="ExternalRun.rewind"):  # never beside a driver of the run
            return rewind(self.lake, _step(step))

    def explain(self, step: int, task: str | None = None) -> dict:
        """Why manifest ``step`` is what it is and, with ``task``, why that task was or was not
        picked (`envsched explain`: the selection recomputed, nothing written)."""
        return explain_step(self.lake, _step(step), task)

    def status(self) -> dict:
        return status(self.lake)


def _step(step) -> int:
    """A step as given to the API: an integer (numpy's included), never a string or a bool."""
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        raise StepError(f"step must be an integer, got {type(step).__name__} {step!r}")
    return int(step)
