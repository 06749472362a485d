"""Taking a run back to an earlier step (`envsched rewind --to K`, or ``rewind_job`` from the
Dagster UI): the lake's part is ``core.gates.rewind``; this adds the instance's part, so the
redone steps' old failed or canceled runs stop counting as attempts, and nothing runs beside it."""

import subprocess
import sys
import tempfile

import dagster as dg
from pydantic import Field

from envsched_pipeline.core.gates import rewind
from envsched_pipeline.errors import EnvschedError, StepError
from envsched_pipeline.lake import Lake
from envsched_pipeline.lease import Lease
from envsched_pipeline.orchestration.plan import ENDED_BADLY, in_flight, runs_of
from envsched_pipeline.resources.lake import LakeResource
from envsched_pipeline.run import require_run


def remake_policy(lake: Lake, after: int, log=print) -> None:
    """Make the policy checkpoint after step ``after`` again (``python -m trainer.remake``: the
    trainer's own process, so the code location never loads torch), its lines passed to ``log``."""
    cmd = [sys.executable, "-m", "trainer.remake", "--lake", str(lake.root), "--after", str(after)]
    with (
        tempfile.TemporaryFile("w+") as errors,  # a file, not a pipe: stderr never fills up and blocks it
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errors, text=True) as proc,
    ):
        for line in proc.stdout:
            log(line.rstrip())
        proc.wait()
        errors.seek(0)
        err = errors.read().strip()
    if proc.returncode != 0:
        last = (err.splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise StepError(last.removeprefix("error: "))


def rewind_run(lake: Lake, instance: dg.DagsterInstance, step: int, who: str, log=print) -> dict:
    """Rewind the lake's run to ``step`` while holding its lease (as ``who``), refusing while one of
    its steps is queued or running in Dagster; a policy checkpoint the lake no longer keeps is made
    again first (lines to ``log``)."""
    spec = require_run(lake)
    with Lease(lake, kind=who):  # no driver may run beside it
        flying = in_flight(lake, instance, spec.run_id)
        if flying:
            raise StepError(
                f"step {flying[0].tags.get('envsched/step')} of the run is being run by Dagster run "
                f"{flying[0].run_id[:8]} ({flying[0].status.value.lower()}); stop the sensor and wait for it"
            )
        ended = [
            r.run_id
            for r in runs_of(instance, spec.run_id, ENDED_BADLY)
            if int(r.tags.get("envsched/step", -1)) >= step
        ]
        return rewind(lake, step, answered_runs=ended, remake=lambda k: remake_policy(lake, k, log))


class RewindConfig(dg.Config):
    to: int = Field(
        description="the first step to redo; the policy after the step before it is made again if the lake no longer keeps it"
    )


@dg.op(
    description="Take the lake's run back to step `to`: later steps move to archive/, the loop redoes them."
)
def rewind_steps(context: dg.OpExecutionContext, config: RewindConfig, lake: LakeResource) -> None:
    try:
        out = rewind_run(
            lake.lake(), context.instance, config.to, who="rewind_job (Dagster)", log=context.log.info
        )
    except EnvschedError as exc:
        raise dg.Failure(str(exc)) from exc
    steps = out["steps"]
    context.log.info(
        f"rewound to step {config.to}: steps {steps[0]}..{steps[-1]} moved to {out['archive']}"
        + ("; the halt is cleared" if out["halt_cleared"] else "")
    )


@dg.job(description="Take the run back to a step and redo it from there (`envsched rewind --to K`).")
def rewind_job() -> None:
    rewind_steps()
