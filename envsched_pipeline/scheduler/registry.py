"""Every scheduler by name: the CLI, the benchmarks, the API and the Dagster assets share this."""

from __future__ import annotations

from collections.abc import Callable

from envsched_pipeline.scheduler.base import Scheduler
from envsched_pipeline.scheduler.baselines import DPS, GRESO, MoPPS, RandomScheduler, VarianceGreedy
from envsched_pipeline.scheduler.config import SchedulerConfig
from envsched_pipeline.scheduler.envsched import EnvSched
from envsched_pipeline.scheduler.graph import TaskGraph


def _envsched(**overrides) -> Callable[[SchedulerConfig, TaskGraph | None], Scheduler]:
    def make(config: SchedulerConfig, graph: TaskGraph | None) -> Scheduler:
        return EnvSched(config.with_overrides(**overrides) if overrides else config, graph)

    return make


# name -> factory(config, graph). The oracle is not here: it reads the simulator's ground truth
# and exists only inside the benchmark, as the ceiling.
SCHEDULERS: dict[str, Callable[[SchedulerConfig, TaskGraph | None], Scheduler]] = {
    "envsched": _envsched(),
    "random": lambda config, graph: RandomScheduler(config),
    "exploit-only": _envsched(rho=0.0),
    "coverage-only": _envsched(rho=1.0),
    "variance-greedy": lambda config, graph: VarianceGreedy(config),
    "greso": lambda config, graph: GRESO(config),
    "mopps": lambda config, graph: MoPPS(config),
    "dps": lambda config, graph: DPS(config),
}
GRAPH_SCHEDULERS = frozenset(n for n, f in SCHEDULERS.items() if f(SchedulerConfig(), None).uses_graph)


def uses_graph(name: str) -> bool:
    return name in GRAPH_SCHEDULERS


def make_scheduler(
    name: str, config: SchedulerConfig | None = None, graph: TaskGraph | None = None
) -> Scheduler:
    if name not in SCHEDULERS:
        raise KeyError(f"unknown scheduler {name!r}; choose one of {', '.join(SCHEDULERS)}")
    sched = SCHEDULERS[name](config or SchedulerConfig(), graph)
    sched.name = name
    return sched
