"""What to request next for a run: shared by the loop sensor and the in-process driver.

The lake says what the run needs (``core.loop.next_action``); the Dagster instance says what is
already in flight and how often a step's job has failed. Every run carries the tags
``envsched/run_id``, ``envsched/pool``, ``envsched/lake``, ``envsched/step``, ``envsched/action`` and
``envsched/driver``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import dagster as dg

from envsched_pipeline.core.gates import halt, halted, retried_runs
from envsched_pipeline.core.loop import explain, next_action
from envsched_pipeline.lake import Lake
from envsched_pipeline.lease import current, describe
from envsched_pipeline.orchestration.partitions import partition_key
from envsched_pipeline.run import RunSpec, load_run

MAX_ATTEMPTS = 3  # a step's job runs at most this often before the run halts
IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]
ENDED_BADLY = [dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]
JOB_OF = {"select": "select_job", "train": "train_job", "stats": "train_job"}


@dataclass
class Request:
    kind: str
    step: int
    job: str
    partition: str
    attempt: int
    tags: dict

    @property
    def run_key(self) -> str:
        return f"{self.tags['envsched/run_id']}-{self.kind}-{self.step}-a{self.attempt}"


def run_tags(lake: Lake, spec: RunSpec, step: int, kind: str, driver: str) -> dict:
    return {
        "envsched/run_id": spec.run_id,
        "envsched/pool": spec.pool,
        "envsched/lake": str(lake.root),
        "envsched/step": str(step),
        "envsched/action": kind,
        "envsched/driver": driver,
    }


def runs_of(
    instance: dg.DagsterInstance, run_id: str, statuses=None, step: int | None = None, kind: str | None = None
) -> list:
    tags = {"envsched/run_id": run_id}
    if step is not None:
        tags["envsched/step"] = str(step)
    if kind is not None:
        tags["envsched/action"] = kind
    return list(instance.get_runs(filters=dg.RunsFilter(tags=tags, statuses=statuses or [])))


def in_flight(lake: Lake, instance: dg.DagsterInstance, run_id: str) -> list:
    """The run's Dagster runs that are queued or running. A run `envsched train` started in-process
    cannot outlive its driver: one whose driver no longer holds the lake's lease (killed, crashed,
    its machine lost) is marked canceled here, where it used to read as running forever and block
    every later driver."""
    live = current(lake)
    driving = f"cli:{live['id']}" if live else None
    flying = []
    for run in runs_of(instance, run_id, IN_FLIGHT):
        driver = run.tags.get("envsched/driver", "")
        if driver.startswith("cli:") and driver != driving:
            instance.report_run_canceled(run, message="its driver (envsched train) is gone")
        else:
            flying.append(run)
    return flying


def _halt_job(lake: Lake, step: int, kind: str, problem: str, runs: list, canceled: bool = False) -> str:
    """Halt the run at ``step`` because of its ``kind`` job's Dagster ``runs``; the halt in words."""
    record = halt(
        lake,
        step,
        f"{JOB_OF[kind]} ({kind})",
        [problem],
        failed_runs=[r.run_id for r in runs],
        canceled=canceled,
    )
    return explain(lake, ("halted", record["step"]))


def next_request(lake: Lake, instance: dg.DagsterInstance, driver: str) -> Request | str | None:
    """The next run to request, a reason to wait (str), or None when the run is complete; the
    lake read once for the answer (``Lake.snapshot``)."""
    with lake.snapshot():
        return _next_request(lake, instance, driver)


def _next_request(lake: Lake, instance: dg.DagsterInstance, driver: str) -> Request | str | None:
    spec = load_run(lake)
    if spec is None:
        return f"no run in {lake.root}: start one with `envsched train` or `envsched step select`"
    lease = current(lake)
    if lease is not None and driver == "sensor":
        return f"run {spec.run_id} is being driven by {describe(lease)}"
    flying = in_flight(lake, instance, spec.run_id)
    if flying:
        r = flying[0]
        return (
            f"run {spec.run_id}: {r.job_name} for step {r.tags.get('envsched/step')} is "
            f"{r.status.value.lower()} (Dagster run {r.run_id[:8]})"
        )
    action = next_action(lake)
    if action is None:
        return None
    kind, step = action
    if kind in ("halted", "broken"):
        return explain(lake, action)
    if kind == "wait":
        return f"waiting for the external trainer to ingest rollouts of step {step}"
    tried = runs_of(instance, spec.run_id, ENDED_BADLY, step=step, kind=kind)
    if canceled := stopped_by_hand(lake, tried):
        problem = f"its {JOB_OF[kind]} ({kind}) run was canceled in Dagster (run {canceled[0].run_id[:8]})"
        return _halt_job(lake, step, kind, problem, canceled, canceled=True)
    counted = counted_failures(lake, [r for r in tried if r.status == dg.DagsterRunStatus.FAILURE])
    if len(counted) >= MAX_ATTEMPTS:
        reason = failure_message(instance, counted[0].run_id)
        problem = f"failed {len(counted)} times; last Dagster run {counted[0].run_id[:8]}: {reason}"
        return _halt_job(lake, step, kind, problem, counted)
    return Request(
        kind=kind,
        step=step,
        job=JOB_OF[kind],
        partition=partition_key(spec.run_id, step),
        attempt=len(tried),  # every attempt ever ended, so a run key is never reused after a resume
        tags=run_tags(lake, spec, step, kind, driver),
    )


def halted_job_runs(lake: Lake, instance: dg.DagsterInstance) -> list[str]:
    """The failed Dagster runs behind a halt that a job's failures caused (gate ``"<job> (<kind>)"``),
    read from the instance: what `envsched resume` answers, for halts recorded before the halt
    itself listed them. Empty for a check's halt or no halt."""
    record = halted(lake)
    spec = load_run(lake)
    kind = (record or {}).get("gate", "").rpartition("(")[2].rstrip(")")
    if record is None or spec is None or kind not in JOB_OF:
        return []
    if "failed_runs" in record:  # the halt names them itself (and a cancel's halt names the cancel)
        return list(record["failed_runs"])
    failed = runs_of(instance, spec.run_id, [dg.DagsterRunStatus.FAILURE], step=record["step"], kind=kind)
    return [r.run_id for r in failed]


def stopped_by_hand(lake: Lake, ended: list) -> list:
    """The sensor's runs among ``ended`` that someone canceled (Terminate in the Dagster UI) and no
    `envsched resume` has answered: a cancel pauses the loop until a person resumes it, where
    requesting the step again would undo the cancel (and, under the canceled run's key, would never
    launch). Runs that `envsched train` canceled on Ctrl-C are its own driver's; the next driver
    simply goes on."""
    answered = retried_runs(lake)
    return [
        r
        for r in ended
        if r.status == dg.DagsterRunStatus.CANCELED
        and r.tags.get("envsched/driver") == "sensor"
        and r.run_id not in answered
    ]


def counted_failures(lake: Lake, failed: list) -> list:
    """The failed runs that count towards halting: those no `envsched resume` has answered yet."""
    retried = retried_runs(lake)
    return [r for r in failed if r.run_id not in retried]


def failure_message(instance: dg.DagsterInstance, dagster_run_id: str) -> str:
    """What made a failed run fail, in one line: the exception the trainer process reported through
    Pipes when there is one (a step's own failure only says the process exited with code 1), else
    the innermost cause of the step's error, else where to look."""
    reported = failed = None
    for record in instance.all_logs(dagster_run_id):
        event = record.dagster_event
        if event is None:
            continue
        if event.event_type == dg.DagsterEventType.STEP_FAILURE and event.step_failure_data.error:
            failed = failed or event.step_failure_data.error
        elif (
            event.event_type == dg.DagsterEventType.ENGINE_EVENT
            and "closed with exception" in (event.message or "")
            and event.engine_event_data.error is not None
        ):
            reported = event.engine_event_data.error
    err = reported or failed
    if err is None:
        return "see the run's logs in the Dagster UI"
    while err.cause is not None and reported is None:
        err = err.cause
    return error_line(err)


def error_line(err) -> str:
    """An error's first line with its class named without its module (a Pipes report spells it
    ``envsched_pipeline.errors.StepError: ...``), at most 300 characters."""
    line = (err.message.strip().splitlines() or [err.cls_name or ""])[0]
    qualified = (
        re.match(rf"(?:[A-Za-z_]\w*\.)+(?={re.escape(err.cls_name)}:)", line) if err.cls_name else None
    )
    return line[qualified.end() if qualified else 0 :][:300]
