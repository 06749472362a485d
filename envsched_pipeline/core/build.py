"""The run's scheduler: its config (paper defaults + the run's overrides) and, for the graph
family, the task graph from the lake."""

from __future__ import annotations

import os
from dataclasses import replace

from envs.registry import POOLS
from envsched_pipeline.core.state_store import prior_source
from envsched_pipeline.errors import ConfigError, PoolError
from envsched_pipeline.graph.store import load_graph
from envsched_pipeline.lake import Lake
from envsched_pipeline.run import RunSpec, check_partner, start_run, with_lr_horizon
from envsched_pipeline.scheduler import (
    SCHEDULERS,
    Scheduler,
    SchedulerConfig,
    SchedulerState,
    make_scheduler,
    uses_graph,
)
from envsched_pipeline.scheduler.variants import RECOMMENDED, resolve


def new_run(**settings) -> RunSpec:
    """A new run's defaults (``settings`` over them), scheduled by the recommended envsched form
    (``RECOMMENDED``: the best-supported form on the neural learner's bench, docs/evidence.md); the
    paper's constants are ``--scheduler envsched``. The run records the overrides the form resolves
    to, so a resumed run keeps them whatever the recommendation later becomes."""
    name, config = resolve(RECOMMENDED)
    return RunSpec(**{"scheduler": name, "scheduler_config": config, **settings})


def asked_run(base: RunSpec, scheduler: str | None = None, overrides: dict | None = None, **given) -> RunSpec:
    """The run a command or the API asks for: ``base`` (the lake's run when it holds one, else a
    new run's defaults) with each setting the caller gave; None keeps the base's, so a resumed run
    keeps its own settings. A ``scheduler`` name or named variant replaces the base's scheduler and
    config; ``overrides`` go over either. Raises ValueError for an unknown scheduler name. Whether
    a resumed run may change is start_run's to decide."""
    name, config = base.scheduler, dict(base.scheduler_config)
    if scheduler is not None:
        name, config = resolve(scheduler)
    kept = {k: v for k, v in given.items() if v is not None}
    if kept.get("prior_lake"):  # a lake is named by its root, however the caller spelled it
        kept["prior_lake"] = lake_name(kept["prior_lake"])
    if isinstance(kept.get("against"), (str, os.PathLike, Lake)):  # one lake named alone
        kept["against"] = [kept["against"]]
    if kept.get("against"):
        kept["against"] = [lake_name(p) for p in kept["against"]]
    return replace(base, **kept, scheduler=name, scheduler_config={**config, **(overrides or {})})


def lake_name(given):
    """A lake named by its root, whether given as a path, a ``Path`` or a :class:`Lake`; anything
    else (a blank name, a number) as it is, for the run's validation to refuse naming the field."""
    if isinstance(given, Lake):
        return str(given.root)
    if isinstance(given, os.PathLike) or (isinstance(given, str) and given.strip()):
        return str(Lake(os.fspath(given)).root)
    return given


def scheduler_config(spec: RunSpec) -> SchedulerConfig:
    """The run's scheduler config: the paper's defaults, the run's overrides, its B and G."""
    try:
        config = SchedulerConfig.from_dict(spec.scheduler_config).with_overrides(
            batch_size=spec.batch_size, group_size=spec.group_size
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc  # it names the field (scheduler_config.<field>)
    if config.validation_every:
        raise ConfigError(
            "scheduler_config.validation_every: a validation slice is evaluated only by `envsched bench "
            "scheduler --learner neural`; the pipeline's trainers run none, so a run here would "
            "silently ignore it (use 0)"
        )
    return config


def build_scheduler(lake: Lake, spec: RunSpec, state: SchedulerState | None = None) -> Scheduler:
    graph = load_graph(lake, spec.pool, state) if uses_graph(spec.scheduler) else None
    return make_scheduler(spec.scheduler, scheduler_config(spec), graph=graph)


def check_run(lake: Lake, spec: RunSpec) -> None:
    """Every setting of a run about to start or resume on ``lake``, checked without writing: the
    spec's own fields, its scheduler config, the runs it is to be compared with (those already
    started) and, for a run not started yet, its prior lake."""
    with_lr_horizon(spec).validate(SCHEDULERS)  # as start_run will check it
    scheduler_config(spec)
    for i, path in enumerate(spec.against):
        check_partner(lake, spec, Lake(path), f"against[{i}] {path}")
    if spec.prior_lake and not lake.steps("manifests"):
        prior_source(lake, spec)


def open_run(lake: Lake, spec: RunSpec, allow_config_change: bool = False) -> RunSpec:
    """Start (or resume) the lake's run after validating every setting, the scheduler config and
    the pool included (a registered pool is imported by the caller): a refused command writes
    nothing."""
    check_open(lake, spec)
    return start_run(lake, spec, SCHEDULERS, allow_config_change=allow_config_change)


def check_open(lake: Lake, spec: RunSpec) -> None:
    """What :func:`open_run` checks before it writes: every setting, and a pool it can find."""
    check_run(lake, spec)
    if spec.pool not in POOLS and not lake.has("tasks", pool=spec.pool):
        raise PoolError(
            f"pool {spec.pool!r} is neither in {lake.root} nor a registered pool "
            f"({', '.join(sorted(POOLS))}): `envsched pool create` or `envsched pool import` adds it, "
            "`envsched pool list` shows what there is"
        )
