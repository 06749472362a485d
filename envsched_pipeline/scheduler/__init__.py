"""The scheduling algorithm and its baselines: pure numpy/scipy/scikit-learn, no Dagster.

``make_scheduler(name, config, graph)`` returns an object with ``select(state, B, rng, step)``
and ``update(state, observations)``; see :mod:`envsched_pipeline.scheduler.core`.
"""

from __future__ import annotations

from envsched_pipeline.scheduler.config import SchedulerConfig
from envsched_pipeline.scheduler.core import Pick, RandomScheduler
from envsched_pipeline.scheduler.state import Observations, SchedulerState


def _random(config, graph):
    return RandomScheduler(config)


# name -> factory(config, graph)
SCHEDULERS = {
    "random": _random,
}


def make_scheduler(name: str, config: SchedulerConfig | None = None, graph=None):
    if name not in SCHEDULERS:
        raise KeyError(f"unknown scheduler {name!r}; choose one of {', '.join(SCHEDULERS)}")
    return SCHEDULERS[name](config or SchedulerConfig(), graph)


__all__ = ["SCHEDULERS", "Observations", "Pick", "SchedulerConfig", "SchedulerState", "make_scheduler"]
