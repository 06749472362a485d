"""The scheduling algorithm and its baselines: pure numpy/scipy/scikit-learn, no Dagster, no lake.

``make_scheduler(name, config, graph)`` returns a :class:`Scheduler` (see :mod:`.base`); the state
it reads and updates is a :class:`SchedulerState`; the graph it uses is built by
:mod:`envsched_pipeline.graph`.
"""

from __future__ import annotations

from envsched_pipeline.scheduler.base import Pick, Scheduler, Selection
from envsched_pipeline.scheduler.config import SchedulerConfig
from envsched_pipeline.scheduler.graph import TaskGraph
from envsched_pipeline.scheduler.registry import GRAPH_SCHEDULERS, SCHEDULERS, make_scheduler, uses_graph
from envsched_pipeline.scheduler.state import Observations, SchedulerState

__all__ = [
    "GRAPH_SCHEDULERS",
    "SCHEDULERS",
    "Observations",
    "Pick",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerState",
    "Selection",
    "TaskGraph",
    "make_scheduler",
    "uses_graph",
]
