"""Where the scheduler state lives: ``state/step=t/scheduler.npz`` in the lake, one per step.

The state after step t is what the manifest of step t+1 is selected from. Loading re-keys a
stored state onto an edited pool by task content hash (renamed tasks keep their history).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from envsched_pipeline.core.pools import pool_tasks
from envsched_pipeline.errors import StepError
from envsched_pipeline.lake import Lake
from envsched_pipeline.run import RunSpec
from envsched_pipeline.scheduler.state import SchedulerState, align_state, prior_from

STATE_FILE = "scheduler.npz"


def state_rel(step: int) -> str:
    return Lake.artifact_rel("state", step, STATE_FILE)


def has_state(lake: Lake, step: int) -> bool:
    return lake.exists(state_rel(step))


def state_steps(lake: Lake) -> set[int]:
    """The steps with a stored scheduler state, from one listing (on an object store, one request
    for the run rather than one per step)."""
    return set(lake.artifact_steps("state", STATE_FILE))


def save_state(lake: Lake, state: SchedulerState, step: int) -> Path:
    return lake.write_bytes(state_rel(step), state.to_bytes())


def read_state(lake: Lake, step: int) -> SchedulerState:
    where = lake.where(state_rel(step))
    data = lake.read_bytes(state_rel(step))
    if data is None:
        raise StepError(
            f"scheduler state after step {step} is missing ({where}); materialize statistics[{step}] first"
        )
    try:
        return SchedulerState.from_bytes(data)
    except (OSError, ValueError, KeyError) as exc:
        raise StepError(
            f"{where}: cannot read the scheduler state ({exc}); re-materialize that step's statistics"
        ) from exc


def load_state(lake: Lake, spec: RunSpec, step: int) -> SchedulerState:
    """State after ``step`` (a fresh state, or the cross-run prior, for step -1)."""
    tasks = pool_tasks(lake, spec.pool)
    ids = tasks.column("task_id").to_pylist()
    envs = tasks.column("env_id").to_pylist()
    hashes = tasks.column("content_hash").to_pylist()
    if step < 0:
        if spec.prior_lake:
            return prior_state(lake, spec, ids, envs, hashes)
        return SchedulerState.new(ids, envs, hashes)
    state = read_state(lake, step)
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


def prior_source(lake: Lake, spec: RunSpec) -> tuple[Lake, int]:
    """The lake and step whose scheduler state a run's cross-run prior starts from: the prior
    lake's last step with a state. Refused (naming the prior lake) when it is the run's own lake,
    is not there, or holds no scheduler state."""
    prev = Lake(spec.prior_lake)
    if prev.root == lake.root:
        raise StepError(f"prior lake {prev.root} is this run's own lake: name another run's lake")
    if not prev.root.is_dir():
        raise StepError(f"prior lake {prev.root}: no such directory")
    done = sorted(set(prev.steps("statistics")) & state_steps(prev))
    if not done:
        raise StepError(f"prior lake {prev.root} has no scheduler state to start from")
    return prev, done[-1]


def prior_state(lake: Lake, spec: RunSpec, ids, envs, hashes) -> SchedulerState:
    prev, step = prior_source(lake, spec)
    return prior_from(read_state(prev, step), ids, envs, hashes, spec.prior_discount)
