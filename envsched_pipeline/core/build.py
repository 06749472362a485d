"""The run's scheduler: its config (paper defaults + the run's overrides) and, for the graph
family, the task graph from the lake."""

from __future__ import annotations

from envsched_pipeline.errors import ConfigError
from envsched_pipeline.graph.store import load_graph
from envsched_pipeline.lake import Lake
from envsched_pipeline.run import RunSpec, start_run
from envsched_pipeline.scheduler import (
    SCHEDULERS,
    Scheduler,
    SchedulerConfig,
    SchedulerState,
    make_scheduler,
    uses_graph,
)


def scheduler_config(spec: RunSpec) -> SchedulerConfig:
    """The run's scheduler config: the paper's defaults, the run's overrides, its B and G."""
    try:
        return SchedulerConfig.from_dict(spec.scheduler_config).with_overrides(
            batch_size=spec.batch_size, group_size=spec.group_size
        )
    except ValueError as exc:
        raise ConfigError(f"scheduler_config: {exc}") from exc


def build_scheduler(lake: Lake, spec: RunSpec, state: SchedulerState | None = None) -> Scheduler:
    graph = load_graph(lake, spec.pool, state) if uses_graph(spec.scheduler) else None
    return make_scheduler(spec.scheduler, scheduler_config(spec), graph=graph)


def open_run(lake: Lake, spec: RunSpec, allow_config_change: bool = False) -> RunSpec:
    """Start (or resume) the lake's run after validating every setting, the scheduler config
    included: a refused command writes nothing."""
    spec.validate(SCHEDULERS)
    scheduler_config(spec)
    return start_run(lake, spec, SCHEDULERS, allow_config_change=allow_config_change)
