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


def _envsched(**overrides):
    def make(config, graph):
        from envsched_pipeline.scheduler.envsched import EnvSched

        return EnvSched(config.with_overrides(**overrides) if overrides else config, graph)

    return make


def _baseline(cls_name):
    def make(config, graph):
        from envsched_pipeline.scheduler import baselines

        return getattr(baselines, cls_name)(config, graph)

    return make


# name -> factory(config, graph). The oracle is not here: it reads the simulator's ground truth
# and exists only inside the benchmark, as the ceiling.
SCHEDULERS = {
    "envsched": _envsched(),
    "random": _random,
    "exploit-only": _envsched(rho=0.0),
    "coverage-only": _envsched(rho=1.0),
    "variance-greedy": _baseline("VarianceGreedy"),
    "greso": _baseline("GRESO"),
    "mopps": _baseline("MoPPS"),
    "dps": _baseline("DPS"),
}
GRAPH_SCHEDULERS = {"envsched", "exploit-only", "coverage-only"}


def make_scheduler(name: str, config: SchedulerConfig | None = None, graph=None):
    if name not in SCHEDULERS:
        raise KeyError(f"unknown scheduler {name!r}; choose one of {', '.join(SCHEDULERS)}")
    sched = SCHEDULERS[name](config or SchedulerConfig(), graph)
    sched.name = name
    return sched


__all__ = ["GRAPH_SCHEDULERS", "SCHEDULERS", "Observations", "Pick", "SchedulerConfig", "SchedulerState", "make_scheduler"]
