"""Manifest t: the scheduler's selection from the state after step t-1 (or, for a run that
selects ahead of its rollouts, ``RunSpec.select_lag`` steps before that: :func:`selection_state`).

Deterministic for (run seed, step, state): re-running replaces the partition with identical rows.
The manifest (``manifests[t]``) holds one row per pick: task, environment, half, score,
predicted variance and non-zero-variance probability, propensity, reason (json), scheduler and
config hash. Each manifest also writes an input audit (``audits[t]``).
"""

from __future__ import annotations

import json
import time

from envsched_pipeline.core.build import build_scheduler, scheduler_config
from envsched_pipeline.core.fold import selection_base, selection_state
from envsched_pipeline.core.gates import require_not_halted
from envsched_pipeline.core.statistics import statistics_step
from envsched_pipeline.core.yields import oversampling_factor, predicted_yield
from envsched_pipeline.errors import StepError
from envsched_pipeline.lake import Lake
from envsched_pipeline.run import RunSpec, require_run, step_rng
from envsched_pipeline.scheduler import Pick
from envsched_pipeline.scheduler.explain import near_misses


def select_manifest(lake: Lake, step: int) -> dict:
    """Materialize manifest ``step``. Returns its picks, rows, audit and near misses (the
    highest-scored tasks left out, with what kept each out)."""
    spec = require_run(lake)
    require_not_halted(lake)
    if step < 0:
        raise StepError(f"step must be >= 0, got {step}")
    base = selection_base(spec, step)
    if base >= 0 and not lake.has("rollouts", step=base):
        ahead = (
            f" (the run selects {spec.select_lag} step(s) ahead of its rollouts)" if spec.select_lag else ""
        )
        raise StepError(f"cannot select step {step}: rollouts of step {base} are missing{ahead}")
    if base >= 0 and not lake.has("statistics", step=base):
        statistics_step(lake, base)  # an external trainer ingested it: fold it in now
    state = selection_state(lake, spec, step)
    sched = build_scheduler(lake, spec, state)
    t0 = time.perf_counter()
    selection = sched.select(state, spec.batch_size, step_rng(spec, step), step)
    seconds = time.perf_counter() - t0
    picks = selection.picks
    rows = manifest_rows(step, picks, spec)
    yield_pred = predicted_yield(state, picks)
    lake.write("manifests", rows, step=step)
    audit = {
        "step": step,
        "scheduler": spec.scheduler,
        "history_steps": int(state.step + 1),
        "selected_ahead": step - 1 - base,  # steps without rollouts yet: min(step, select_lag)
        "tasks_observed": int(state.observed.sum()),
        "pool_tasks": int(state.n_tasks),
        "retired": int((state.arrays["retired"] > 0).sum()),
        "select_seconds": seconds,
        "relaxations": json.dumps(selection.relaxations),
        "quarantined": json.dumps(selection.quarantined),
        "config_hash": scheduler_config(spec).hash(),
        "predicted_yield": yield_pred,
        "oversampling_factor": oversampling_factor(lake, step, yield_pred),
    }
    lake.write("audits", [audit], step=step)
    misses = near_misses(sched, state, [p.index for p in picks])
    return {"picks": picks, "rows": rows, "audit": audit, "near_misses": misses}


def manifest_rows(step: int, picks: list[Pick], spec: RunSpec) -> list[dict]:
    h = scheduler_config(spec).hash()
    return [
        {
            "step": int(step),
            "slot": j,
            "task_id": p.task_id,
            "env_id": p.env_id,
            "half": p.half,
            "score": float(p.score),
            "pred_var": float(p.pred_var),
            "p_nonzero": float(p.p_nonzero),
            "propensity": float(p.propensity),
            "reason": json.dumps(p.reason, default=float, sort_keys=True),
            "scheduler": spec.scheduler,
            "config_hash": h,
        }
        for j, p in enumerate(picks)
    ]
