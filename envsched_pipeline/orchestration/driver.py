"""Driving the Dagster jobs in-process (what ``envsched train`` does): the same jobs the loop
sensor requests, on the same instance and with the same tags, so every run shows in the UI.

The driver holds the run's lease for as long as it drives (one driver per run), retries a failed
step's job up to ``MAX_ATTEMPTS`` times, and stops with the reason when the run halts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

import dagster as dg

from envsched_pipeline.core.gates import STALL_GATE, halted
from envsched_pipeline.definitions import defs
from envsched_pipeline.errors import DRIVER_REPORTS_FAILURES, StepError
from envsched_pipeline.lake import Lake
from envsched_pipeline.lease import Lease
from envsched_pipeline.orchestration.partitions import training_steps
from envsched_pipeline.orchestration.plan import (
    IN_FLIGHT,
    MAX_ATTEMPTS,
    counted_failures,
    failure_message,
    in_flight,
    next_request,
    runs_of,
)
from envsched_pipeline.run import require_run

POOL_OPS = ("pool_tables", "topologies", "features", "task_graph")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) stopped the driver at ``step``'s ``kind`` job: after it (``done``), or
    in the middle of it, whose Dagster run is then marked canceled, so it never counts as a failed
    attempt."""

    def __init__(self, step: int, kind: str, dagster_run_id: str | None, done: bool):
        super().__init__(f"step {step} ({kind})")
        self.step, self.kind, self.dagster_run_id, self.done = step, kind, dagster_run_id, done


@contextlib.contextmanager
def stop_signals_seen() -> Iterator[Callable[[], bool]]:
    """Yields ``seen()``: whether SIGINT or SIGTERM reached this process since the block began.
    Dagster's in-process execution swallows them (its own handler turns one into a failed step,
    which the loop would retry), but every caught signal is also written to the wakeup fd whatever
    Python handler is installed, so this sees it. Outside the main thread signals cannot reach
    the driver's code, and ``seen()`` is always false."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    got: set[int] = set()

    def seen() -> bool:
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(read, 512):
                got.update(chunk)
        return any(s in got for s in STOP_SIGNALS)

    try:
        yield seen
    finally:
        signal.set_wakeup_fd(previous)
        os.close(read)
        os.close(write)


def _run_config(lake: Lake, quiet: bool) -> dict:
    return {
        "loggers": {"envsched_console": {"config": {"log_level": "WARNING" if quiet else "INFO"}}},
        "resources": {"lake": {"config": {"root": str(lake.root)}}},
    }


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in ``os.environ`` for the block (the trainer processes it starts inherit them)."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_loop(
    lake: Lake,
    target_steps: int,
    instance: dg.DagsterInstance | None = None,
    on_step: Callable[[int, float], None] | None = None,
    quiet: bool = True,
    on_failure: Callable[[str], None] | None = None,
    lease: Lease | None = None,
) -> None:
    """Run select / train / statistics jobs until the lake holds ``target_steps`` steps.
    ``on_step(step, seconds)`` is called after each completed training step, ``on_failure(line)``
    after each failed job with one line naming the step, the attempt and its cause. Ctrl-C or
    SIGTERM stops it with :class:`Interrupted` (the job's run canceled, not failed). ``lease``: the
    run's lease, already taken by the caller (who releases it); else the loop takes it for itself."""
    instance = instance or get_instance()
    spec = require_run(lake)
    # another live `envsched train` is refused by the lease (the caller's, or the one taken below),
    # which names it; a run the loop sensor drives has no lease, so its in-flight jobs are looked for
    flying = [
        r
        for r in in_flight(lake, instance, spec.run_id)
        if not r.tags.get("envsched/driver", "").startswith("cli:")
    ]
    if flying:
        raise StepError(
            f"run {spec.run_id} is being driven by the loop sensor (Dagster run {flying[0].run_id[:8]} "
            f"is {flying[0].status.value.lower()}); stop the sensor or wait for it"
        )
    jobs = {name: defs.resolve_job_def(name) for name in ("select_job", "train_job")}
    step_t0: dict[int, float] = {}
    reporting = {DRIVER_REPORTS_FAILURES: "1"} if on_failure is not None else {}
    held = contextlib.nullcontext(lease) if lease is not None else Lease(lake)
    with held as lease, stop_signals_seen() as stopped, environment(reporting):
        req = result = None  # the job asked for last, and its result once it ended
        try:
            while True:
                if stopped():  # between two jobs, where a library may have swallowed the KeyboardInterrupt
                    raise KeyboardInterrupt
                lease.check()  # taken over while this driver was paused: stop, never drive beside it
                asked = next_request(lake, instance, driver=f"cli:{lease.id}")
                if asked is None:
                    return
                if isinstance(asked, str):
                    if (halted(lake) or {}).get("gate") == STALL_GATE:  # stopped early, as the run asked
                        return
                    raise StepError(asked)
                if asked.step >= target_steps:
                    return
                req, result = asked, None
                if not instance.has_dynamic_partition(training_steps.name, req.partition):
                    instance.add_dynamic_partitions(training_steps.name, [req.partition])
                step_t0.setdefault(req.step, time.perf_counter())
                kw = {"asset_selection": [dg.AssetKey("reward_statistics")]} if req.kind == "stats" else {}
                result = jobs[req.job].execute_in_process(
                    partition_key=req.partition,
                    instance=instance,
                    run_config=_run_config(lake, quiet),
                    tags=req.tags,
                    raise_on_error=False,
                    **kw,
                )
                if stopped():  # Dagster took the signal (its run failed, or finished first)
                    raise KeyboardInterrupt
                if result.success and req.kind in ("train", "stats") and on_step is not None:
                    on_step(req.step, time.perf_counter() - step_t0[req.step])
                if not result.success and on_failure is not None:
                    failed = runs_of(
                        instance, spec.run_id, [dg.DagsterRunStatus.FAILURE], step=req.step, kind=req.kind
                    )
                    attempts = len(counted_failures(lake, failed))
                    on_failure(
                        f"step {req.step} ({req.kind}) failed, attempt {attempts} of {MAX_ATTEMPTS} "
                        f"(Dagster run {result.run_id[:8]}): {failure_message(instance, result.run_id)}"
                    )
                # after a failure the next request is the retry, or the halt after MAX_ATTEMPTS failures
        except BaseException as exc:
            # DuckDB turns a KeyboardInterrupt inside a query into a RuntimeError: the signal decides
            if isinstance(exc, KeyboardInterrupt) or (isinstance(exc, Exception) and stopped()):
                raise _interrupted(instance, req, result) from exc
            raise


def _interrupted(instance: dg.DagsterInstance, req, result) -> KeyboardInterrupt:
    """What Ctrl-C stopped: no job yet, a job that ended (``result``), or one that did not, whose
    Dagster run is then marked canceled."""
    if req is None:
        return KeyboardInterrupt()
    done = result is not None and result.success
    if not done:
        _cancel_runs_of(instance, req)
    return Interrupted(req.step, req.kind, result and result.run_id, done=done)


def _cancel_runs_of(instance: dg.DagsterInstance, req) -> None:
    """Ctrl-C: the run this driver started is marked canceled (not failed) in the instance."""
    for run in runs_of(
        instance,
        req.tags["envsched/run_id"],
        IN_FLIGHT + [dg.DagsterRunStatus.FAILURE],
        step=req.step,
        kind=req.kind,
    ):
        if (
            run.tags.get("envsched/driver") == req.tags["envsched/driver"]
            and run.status != dg.DagsterRunStatus.CANCELED
        ):
            instance.report_run_canceled(run, message="interrupted (Ctrl-C) in envsched train")


def get_instance() -> dg.DagsterInstance:
    """The instance of $DAGSTER_HOME; a broken dagster.yaml is a user error naming the file."""
    try:
        return dg.DagsterInstance.get()
    except dg.DagsterInvalidConfigError as exc:
        where = os.path.join(os.environ.get("DAGSTER_HOME", ""), "dagster.yaml")
        raise StepError(f"{where}: invalid Dagster instance config ({str(exc).splitlines()[0]})") from exc
    except Exception as exc:  # e.g. the instance's database cannot be reached
        if type(exc).__module__.split(".")[0] in ("sqlalchemy", "psycopg2", "dagster_postgres"):
            raise StepError(
                f"cannot open the Dagster instance in $DAGSTER_HOME: {str(exc).splitlines()[0]}"
            ) from exc
        raise


def materialize_pool(pool: str, lake: Lake, instance: dg.DagsterInstance | None = None) -> None:
    """Import the pool and build its topologies, features and graph through ``pool_job``."""
    job = defs.resolve_job_def("pool_job")
    cfg = _run_config(lake, quiet=True)
    cfg["ops"] = {name: {"config": {"pool": pool}} for name in POOL_OPS}
    instance = instance or get_instance()
    with stop_signals_seen() as stopped:
        res = job.execute_in_process(
            instance=instance,
            run_config=cfg,
            tags={"envsched/lake": str(lake.root), "envsched/pool": pool},
            raise_on_error=False,
        )
        if stopped():  # Ctrl-C: an interruption, not a failed import
            if not res.success:
                instance.report_run_canceled(
                    instance.get_run_by_id(res.run_id), message="interrupted (Ctrl-C)"
                )
            raise KeyboardInterrupt
    if not res.success:
        raise StepError(
            f"importing pool {pool} failed (Dagster run {res.run_id[:8]}): {failure_message(instance, res.run_id)}"
        )
