"""The scheduler interface. Every scheduler (EnvSched and the baselines) is a :class:`Scheduler`:

    update(state, observations)          fold one step's group outcomes into the state (in place)
    predict(state)                       its beliefs per task (predicted variance...), or None
    select(state, batch_size, rng, step) -> Selection(picks, relaxations, quarantined)

A scheduler holds config only (and the task graph, for the graph family); all it knows about the
run is the :class:`SchedulerState` it is handed, which the caller stores between steps.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from envsched_pipeline.scheduler.config import SchedulerConfig
from envsched_pipeline.scheduler.graph import TaskGraph
from envsched_pipeline.scheduler.state import Observations, SchedulerState
from envsched_pipeline.scheduler.update import update_state


@dataclass
class Pick:
    """One row of a manifest: a task chosen for the batch, and why."""

    task_id: str
    env_id: str
    half: str  # cold | coverage | exploit | random | <baseline name>
    score: float
    pred_var: float = float("nan")  # predicted within-group reward variance
    p_nonzero: float = float("nan")  # predicted probability of a non-zero-variance group
    propensity: float = float("nan")  # probability of this pick under the scheduler's randomness
    reason: dict = field(default_factory=dict)
    index: int = -1  # index into the state's tasks


@dataclass
class Selection:
    """A scheduler's answer for one step."""

    picks: list[Pick]
    relaxations: list[str] = field(default_factory=list)  # constraints relaxed to fill the batch, in order
    quarantined: list[dict] = field(default_factory=list)  # environments skipped, with the reason


class Scheduler(ABC):
    """Base class: the shared state update, no predictions; subclasses implement ``select``."""

    name: str = "scheduler"
    uses_graph: bool = False  # needs the task graph (the lake's edges) to select
    applies_quotas: bool = False  # its manifests must respect the environment caps (checked)

    def __init__(self, config: SchedulerConfig = SchedulerConfig(), graph: TaskGraph | None = None):
        self.config = config
        self.graph = graph

    def update(
        self, state: SchedulerState, obs: Observations, predicted_u: np.ndarray | None = None
    ) -> SchedulerState:
        return update_state(state, obs, self.config, predicted_u)

    def predict(
        self, state: SchedulerState, model: bool = True, step: int | None = None
    ) -> dict[str, np.ndarray] | None:
        """Per-task estimates, or None for a scheduler without any; ``model=False`` skips a fitted
        model on top of them (EnvSched's spread_model) where only the shrunk estimates are needed;
        ``step``: the step they are for (default: the one after the state's last observed)."""
        return None

    @abstractmethod
    def select(
        self, state: SchedulerState, batch_size: int, rng: np.random.Generator, step: int
    ) -> Selection:
        """Choose ``min(batch_size, pool size)`` distinct tasks for ``step``."""
