"""The scheduler state after a step: step t's rollouts folded into the state after t-1.

The lake keeps the state after every step only for a while (:mod:`envsched_pipeline.core.state_store`
keeps the newest two, step 0's and every ``KEEP_EVERY``-th); any other is derived data, folded
again from the nearest state kept before it through the steps' rollouts, manifests and ingest
records, exactly as the statistics asset folded them the first time. Each step's statistics
partition records the digest of the state it made (``state_digest``), and a rebuilt state must
match it, so a rebuild across a changed pool or graph is refused instead of returning another
state. Rollouts with an infrastructure error class are not evidence about the task: they count
as exposure (rollouts spent) but never as outcomes.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa

import envsched_pipeline.lake as lake_module
from envsched_pipeline.core.build import build_scheduler
from envsched_pipeline.core.pools import pool_tasks
from envsched_pipeline.core.state_store import (
    prior_state,
    state_from,
    state_rel,
    state_steps,
)
from envsched_pipeline.errors import StepError
from envsched_pipeline.lake import Lake
from envsched_pipeline.rollouts import TASK_OUTCOMES
from envsched_pipeline.run import RunSpec, config_changes, spec_at
from envsched_pipeline.scheduler import Observations, Scheduler, SchedulerState
from envsched_pipeline.scheduler.state import align_state
from envsched_pipeline.scheduler.update import count_pending

DIGEST = "state_digest"  # the statistics column that records the digest of the state a step made


def observations_from_rollouts(
    state: SchedulerState, step: int, rollouts: pa.Table, partial_tasks: set[str] = frozenset()
) -> Observations:
    """Group rollouts by task; infrastructure failures are excluded from the task's outcomes, and
    so are the rollouts of groups ingested as partial (their variance says nothing comparable)."""
    cols = rollouts.column_names
    task_ids = rollouts.column("task_id").to_pylist()
    rewards = np.asarray(rollouts.column("reward").to_pylist(), dtype=float)
    err = rollouts.column("error_class").to_pylist() if "error_class" in cols else ["none"] * len(task_ids)
    hack = (
        np.asarray(rollouts.column("hack_flag").to_pylist(), dtype=float)
        if "hack_flag" in cols
        else np.zeros(len(task_ids))
    )
    order: dict[str, list[int]] = {}
    for j, t in enumerate(task_ids):
        order.setdefault(t, []).append(j)
    tids = list(order)
    idx = state.index_of(tids)
    outcome = np.array([e is None or e in TASK_OUTCOMES for e in err], dtype=bool)
    secs = (
        np.asarray(rollouts.column("seconds").to_pylist(), dtype=float)
        if "seconds" in cols
        else np.full(len(task_ids), np.nan)
    )
    groups, flags, spent, cost = [], [], [], []
    for t in tids:
        js = np.array(order[t])
        ok = js[outcome[js]] if t not in partial_tasks else js[:0]
        groups.append(rewards[ok])
        flags.append(float(hack[ok][rewards[ok] > 0].sum()))
        spent.append(len(js))
        cost.append(float(np.nanmean(secs[js])) if np.isfinite(secs[js]).any() else np.nan)
    obs = Observations.from_groups(step, idx, groups, hack_flags=flags)
    obs.spent = np.asarray(spent, dtype=float)  # exposure counts every rollout spent
    obs.cost = np.asarray(cost, dtype=float)
    return obs


def apply(sched: Scheduler, state: SchedulerState, obs: Observations, u: np.ndarray) -> None:
    """``sched``'s update of ``state`` with one step's observations and the variances its manifest
    predicted for them (all NaN: none predicted)."""
    sched.update(state, obs, predicted_u=None if np.isnan(u).all() else np.nan_to_num(u))


def step_observations(
    lake: Lake, state: SchedulerState, step: int, rollouts: pa.Table | None = None
) -> tuple[Observations, np.ndarray]:
    """Step ``step``'s observations for ``state``'s tasks: the groups' outcomes and the half each
    task was picked in, and the variance its manifest predicted (NaN where it has none)."""
    rollouts = lake.read("rollouts", step=step) if rollouts is None else rollouts
    manifest = lake.read("manifests", step=step)
    partial = set((lake.read_json(f"ingest/step={step}.json") or {}).get("partial_tasks") or [])
    obs = observations_from_rollouts(state, step, rollouts, partial)
    picked = manifest.column("task_id").to_pylist()
    half_of = dict(zip(picked, manifest.column("half").to_pylist(), strict=True))
    obs.halves = np.array([half_of.get(t, "") for t in state.task_ids[obs.task_idx]])
    pred = dict(zip(picked, manifest.column("pred_var").to_pylist(), strict=True))
    u = np.array([pred.get(t, np.nan) for t in state.task_ids[obs.task_idx]], dtype=float)
    return obs, u


def state_available(lake: Lake, step: int) -> bool:
    """Whether the state after ``step`` can be had: kept in the lake, or folded again (its step's
    statistics exist; the state was saved before them)."""
    return lake.exists(state_rel(step)) or lake.has("statistics", step=step)


def load_state(lake: Lake, spec: RunSpec, step: int) -> SchedulerState:
    """State after ``step`` (a fresh state, or the cross-run prior, for step -1): the lake's copy,
    re-keyed onto an edited pool by task content hash, or one folded again from the nearest state
    kept before it."""
    tasks = pool_tasks(lake, spec.pool)
    ids = tasks.column("task_id").to_pylist()
    envs = tasks.column("env_id").to_pylist()
    hashes = tasks.column("content_hash").to_pylist()
    if step < 0:
        if spec.prior_lake:
            return prior_state(lake, spec, ids, envs, hashes)
        return SchedulerState.new(ids, envs, hashes)
    data = lake.read_bytes(state_rel(step))  # one request for a kept state, the hot path's case
    if data is None and lake.has("statistics", step=step):
        return _rebuilt(lake, spec, step)
    state = state_from(lake, step, data)
    stored = state.arrays.get("content_hash")
    if (
        stored is None
        or list(state.task_ids.astype(str)) != ids
        or list(np.asarray(stored).astype(str)) != hashes
    ):
        # the pool was re-imported with edits: re-key the history by content hash
        state, report = align_state(state, ids, envs, hashes)
        state.extra["last_alignment"] = report
    return state


def selection_base(spec: RunSpec, step: int) -> int:
    """The last step whose rollouts manifest ``step`` is chosen from: ``step - 1``, or
    ``select_lag`` steps earlier for a run that selects ahead of its rollouts (-1: none)."""
    return max(step - 1 - spec.select_lag, -1)


def selection_state(lake: Lake, spec: RunSpec, step: int) -> SchedulerState:
    """What manifest ``step`` is chosen from: the state after step ``selection_base`` with the
    picks of the manifests after it (``select_lag`` of them at most, rollouts not folded yet)
    counted as spent, so a selection ahead of the rollouts does not pick them again at once. For a
    run without ``select_lag`` it is the state after ``step - 1``, as it is stored."""
    base = selection_base(spec, step)
    state = load_state(lake, spec, base)
    index = {t: i for i, t in enumerate(state.task_ids.tolist())} if step - 1 > base else {}
    for p in range(base + 1, step):
        if not lake.has("manifests", step=p):
            raise StepError(
                f"cannot select step {step}: the manifest of step {p} is missing (select it first)"
            )
        picked = lake.read("manifests", step=p, columns=["task_id"]).column("task_id").to_pylist()
        count_pending(  # a task edited out of the pool since it was picked is skipped
            state, p, np.array([index[t] for t in picked if t in index], dtype=np.int64), spec.group_size
        )
    return state


def states_before(lake: Lake, spec: RunSpec, steps: Iterable[int]) -> Iterator[tuple[int, SchedulerState]]:
    """(t, state after t-1) for each of ``steps`` in order, each the caller's own copy. A state the
    lake no longer keeps is folded on from the one before it, so a pass over a run's steps folds
    each step at most once; which states are kept is one listing for the pass."""
    state: SchedulerState | None = None
    kept = state_steps(lake)
    folds = _Folds(lake, spec)
    for t in sorted(steps):
        if state is not None and state.step == t - 2 and t - 1 not in kept:
            folds.fold_on(state, t - 1)
        else:
            state = load_state(lake, spec, t - 1)
        yield t, copy.deepcopy(state)


def _rebuilt(lake: Lake, spec: RunSpec, step: int) -> SchedulerState:
    kept = [s for s in state_steps(lake) if s < step]
    base = kept[-1] if kept else -1
    state = load_state(lake, spec, base)
    folds = _Folds(lake, spec)
    for s in range(base + 1, step + 1):
        folds.fold_on(state, s)
    return state


class _Folds:
    """What one pass of folds shares: the run's recorded config changes (read once) and a scheduler
    per config in force (so a pass builds the graph once)."""

    def __init__(self, lake: Lake, spec: RunSpec):
        self.lake, self.spec = lake, spec
        self.changes = config_changes(lake)
        self.scheds: dict[str, Scheduler] = {}

    def fold_on(self, state: SchedulerState, step: int) -> None:
        """Fold ``step`` into the state after ``step - 1`` and check the result is the state the
        step made the first time (its statistics' digest)."""
        lake = self.lake
        where = lake.where(state_rel(step))
        if not lake.has("statistics", step=step):
            raise StepError(
                f"scheduler state after step {step} is missing ({where}); materialize statistics[{step}] first"
            )
        recorded = lake.read("statistics", step=step)  # a partition written before digests has none
        digests = set(recorded.column(DIGEST).to_pylist()) if DIGEST in recorded.column_names else set()
        if len(digests) != 1 or None in digests:
            raise StepError(
                f"scheduler state after step {step} is missing ({where}) and its statistics record no "
                f"state digest to fold it again against; re-materialize statistics[{step}]"
            )
        at = spec_at(self.spec, self.changes, step)
        key = json.dumps(at.scheduler_config, sort_keys=True)
        if key not in self.scheds:
            self.scheds[key] = build_scheduler(lake, at, state)
        apply(self.scheds[key], state, *step_observations(lake, state, step))
        if state.digest() != digests.pop():
            after = ", ".join(str(s + 1) for s in sorted(state_steps(lake))[-12:])
            raise StepError(
                f"the scheduler state after step {step} is not kept ({where}; the lake keeps step 0's, "
                f"every {lake_module.KEEP_EVERY}th and the newest two) and folding step {step}'s rollouts "
                "again does not give the state it made the first time: the pool, its graph or the "
                f"scheduler settings changed since. A step just after a kept state can be gone back to: {after}"
            )
