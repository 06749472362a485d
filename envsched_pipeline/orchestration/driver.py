"""Driving the Dagster jobs in-process (what ``envsched train`` does): the same jobs the loop
sensor requests, on the same instance, so every run shows in the UI afterwards."""

from __future__ import annotations

import time
from collections.abc import Callable

import dagster as dg

from envsched_pipeline.core.loop import next_action
from envsched_pipeline.definitions import defs
from envsched_pipeline.errors import StepError
from envsched_pipeline.lake import Lake
from envsched_pipeline.orchestration.partitions import training_steps

POOL_OPS = ("pool_tables", "topologies", "features", "task_graph")


def _run_config(lake: Lake, quiet: bool) -> dict:
    return {
        "loggers": {"console": {"config": {"log_level": "WARNING" if quiet else "INFO"}}},
        "resources": {"lake": {"config": {"root": str(lake.root)}}},
    }


def run_loop(
    lake: Lake,
    target_steps: int,
    instance: dg.DagsterInstance | None = None,
    on_step: Callable[[int, float], None] | None = None,
    quiet: bool = True,
) -> None:
    """Run select / train / statistics jobs until the lake holds ``target_steps`` steps.
    ``on_step(step, seconds)`` is called after each completed training step."""
    instance = instance or dg.DagsterInstance.get()
    jobs = {name: defs.resolve_job_def(name) for name in ("select_job", "train_job")}
    step_t0: dict[int, float] = {}
    while True:
        action = next_action(lake)
        if action is None or action[1] >= target_steps:
            return
        kind, step = action
        if kind == "wait":
            raise StepError(f"step {step} waits for an external trainer's rollouts (`envsched step ingest`)")
        key = str(step)
        if not instance.has_dynamic_partition(training_steps.name, key):
            instance.add_dynamic_partitions(training_steps.name, [key])
        step_t0.setdefault(step, time.perf_counter())
        job = jobs["select_job" if kind == "select" else "train_job"]
        kw = {"asset_selection": [dg.AssetKey("reward_statistics")]} if kind == "stats" else {}
        result = job.execute_in_process(
            partition_key=key,
            instance=instance,
            run_config=_run_config(lake, quiet),
            raise_on_error=False,
            **kw,
        )
        if not result.success:
            msgs = [e.message for e in result.all_events if e.is_failure]
            detail = msgs[-1] if msgs else "see the run in the Dagster UI"
            raise StepError(f"step {step} ({kind}) failed: {detail} (run {result.run_id})")
        if kind in ("train", "stats") and on_step is not None:
            on_step(step, time.perf_counter() - step_t0[step])


def materialize_pool(pool: str, lake: Lake, instance: dg.DagsterInstance | None = None) -> None:
    """Import the pool and build its topologies, features and graph through ``pool_job``."""
    job = defs.resolve_job_def("pool_job")
    cfg = _run_config(lake, quiet=True)
    cfg["ops"] = {name: {"config": {"pool": pool}} for name in POOL_OPS}
    res = job.execute_in_process(
        instance=instance or dg.DagsterInstance.get(), run_config=cfg, raise_on_error=False
    )
    if not res.success:
        msgs = [e.message for e in res.all_events if e.is_failure]
        raise StepError(f"importing pool {pool} failed: {msgs[-1] if msgs else res.run_id}")
