"""Where the scheduler state lives: ``state/step=t/scheduler.npz`` in the lake.

The state after step t is what the manifest of step t+1 is selected from. Saving the state after
step t drops the one after t-2 unless it is kept for good, step 0's or a ``KEEP_EVERY``-th (19,
39, ...; :func:`envsched_pipeline.lake.superseded`, the rule the learners' checkpoints follow): a
run's states cost the newest two and one in twenty rather than one a step (at 2550 tasks up to
about 330 KB each). A state no longer kept is folded again when asked for
(:mod:`envsched_pipeline.core.fold`).
"""

from __future__ import annotations

from pathlib import Path

from envsched_pipeline.errors import StepError
from envsched_pipeline.lake import Lake
from envsched_pipeline.run import RunSpec
from envsched_pipeline.scheduler.state import SchedulerState, prior_from

STATE_FILE = "scheduler.npz"


def state_rel(step: int) -> str:
    return Lake.artifact_rel("state", step, STATE_FILE)


def has_state(lake: Lake, step: int) -> bool:
    return lake.exists(state_rel(step))


def state_steps(lake: Lake) -> set[int]:
    """The steps with a stored scheduler state, from one listing (on an object store, one request
    for the run rather than one per step)."""
    return set(lake.artifact_steps("state", STATE_FILE))


def save_state(lake: Lake, state: SchedulerState, step: int, select_lag: int = 0) -> Path:
    """Write the state after ``step`` and drop the one after ``step - 2 - select_lag`` unless it is
    kept for good (the newest two stay: a retried step needs its predecessor's; a run selecting
    ``select_lag`` steps ahead selects from the state that many steps further back)."""
    path = lake.write_bytes(state_rel(step), state.to_bytes())
    lake.drop_superseded("state", step, newest=2 + select_lag)
    return path


def read_state(lake: Lake, step: int) -> SchedulerState:
    return state_from(lake, step, lake.read_bytes(state_rel(step)))


def state_from(lake: Lake, step: int, data: bytes | None) -> SchedulerState:
    """The state after ``step`` from the bytes read for it (None: it is not in the lake)."""
    where = lake.where(state_rel(step))
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
