"""Where the scheduler state lives: ``state/step=t/scheduler.npz`` in the lake, one per step.

The state after step t is what the manifest of step t+1 is selected from. Loading re-keys a
stored state onto an edited pool by task content hash (renamed tasks keep their history).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from envsched_pipeline.core.pools import pool_tasks
from envsched_pipeline.errors import StepError
from envsched_pipeline.lake import Lake, atomic_write_bytes
from envsched_pipeline.run import RunSpec
from envsched_pipeline.scheduler.state import SchedulerState, align_state, prior_from


def state_path(lake: Lake, step: int) -> Path:
    return lake.artifact_path("state", step, "scheduler.npz")


def save_state(lake: Lake, state: SchedulerState, step: int) -> Path:
    path = state_path(lake, step)
    atomic_write_bytes(path, state.to_bytes())
    return path


def read_state(path: Path) -> SchedulerState:
    try:
        return SchedulerState.from_bytes(Path(path).read_bytes())
    except (OSError, ValueError, KeyError) as exc:
        raise StepError(
            f"{path}: cannot read the scheduler state ({exc}); re-materialize that step's statistics"
        ) from exc


def load_state(lake: Lake, spec: RunSpec, step: int) -> SchedulerState:
    """State after ``step`` (a fresh state, or the cross-run prior, for step -1)."""
    tasks = pool_tasks(lake, spec.pool)
    ids = tasks.column("task_id").to_pylist()
    envs = tasks.column("env_id").to_pylist()
    hashes = tasks.column("content_hash").to_pylist()
    if step < 0:
        if spec.prior_lake:
            return prior_state(spec, ids, envs, hashes)
        return SchedulerState.new(ids, envs, hashes)
    path = state_path(lake, step)
    if not path.exists():
        raise StepError(
            f"scheduler state after step {step} is missing ({path}); materialize statistics[{step}] first"
        )
    state = read_state(path)
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


def prior_state(spec: RunSpec, ids, envs, hashes) -> SchedulerState:
    prev = Lake(spec.prior_lake)
    done = [s for s in prev.steps("statistics") if state_path(prev, s).exists()]
    if not done:
        raise StepError(f"prior lake {prev.root} has no scheduler state to start from")
    return prior_from(read_state(state_path(prev, done[-1])), ids, envs, hashes, spec.prior_discount)
