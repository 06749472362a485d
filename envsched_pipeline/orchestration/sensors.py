"""The loop sensor: drives select -> train -> statistics -> select ... from the lake's state.

It asks :func:`envsched_pipeline.orchestration.plan.next_request` what the run needs next (the lake
is the single source of truth, so the CLI, the sensor and a resumed run agree; the instance says
what is in flight). It never requests while a run of the same envsched run is queued or in
progress, never while ``envsched train`` holds the run's lease, retries a failed step at most
``MAX_ATTEMPTS`` times (a new run key per attempt) and then halts the run with the reason, which
its skip message shows. Once the run is complete it requests the run's report (``report_job``:
``run_report`` with its default config, so against the runs the run names: ``envsched train
--against``) once, so the finished run's page and verdicts are in the UI without anyone asking; a
run extended or rewound and completed again gets a new one, and so does a run whose named partner
completes after it.
"""

import dagster as dg

from envsched_pipeline.core.gates import rewinds
from envsched_pipeline.core.loop import partner
from envsched_pipeline.orchestration.jobs import report_job, select_job, train_job
from envsched_pipeline.orchestration.partitions import training_steps
from envsched_pipeline.orchestration.plan import Request, next_request
from envsched_pipeline.resources.lake import LakeResource
from envsched_pipeline.run import load_run


def loop_requests(lake, instance, cursor: str | None = None) -> dg.SensorResult | dg.SkipReason:
    req = next_request(lake, instance, driver="sensor")
    if req is None:
        return final_report(lake, cursor)
    if isinstance(req, str):
        return dg.SkipReason(req)
    return dg.SensorResult(
        run_requests=[to_run_request(req)],
        dynamic_partitions_requests=[]
        if instance.has_dynamic_partition(training_steps.name, req.partition)
        else [training_steps.build_add_request([req.partition])],
        cursor=f"{req.kind}:{req.step}:{req.attempt}",
    )


def final_report(lake, cursor: str | None) -> dg.SensorResult | dg.SkipReason:
    """The complete run's report, requested once per completion: its key names the run, its last
    step and how often it was rewound (a rewound run completed again is another run's end)."""
    spec = load_run(lake)
    last = max(lake.steps("statistics"), default=-1)
    key = f"{spec.run_id}-report-{last}-r{rewinds(lake)}{partners_mark(spec)}"
    if cursor == key:
        return dg.SkipReason(
            f"the run in {lake.root} is complete; its report was requested (report_job): see `run_report`"
        )
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(
                run_key=key,
                job_name=report_job.name,
                tags={
                    "envsched/report_of": spec.run_id,
                    "envsched/lake": str(lake.root),
                    "envsched/driver": "sensor",
                },
            )
        ],
        cursor=key,
    )


def partners_mark(spec) -> str:
    """How far the runs the report compares with (the run's ``against``) have got, for the report's
    key: a partner that completes after this run gets the report again (one under way is compared
    over the steps it holds, one not started yet is named as not compared)."""
    if not spec.against:
        return ""
    states = [partner(path) for path in spec.against]
    return "-vs-" + ".".join(str(p["last_step"]) if p["state"] == "complete" else "open" for p in states)


def to_run_request(req: Request) -> dg.RunRequest:
    return dg.RunRequest(
        run_key=req.run_key,
        partition_key=req.partition,
        job_name=req.job,
        tags=req.tags,
        asset_selection=[dg.AssetKey("reward_statistics")] if req.kind == "stats" else None,
    )


@dg.sensor(
    jobs=[select_job, train_job, report_job],
    minimum_interval_seconds=5,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Sees a finished step and requests the next one: training_step[t] after manifest[t], "
    "then statistics[t] + manifest[t+1], until the run's max steps, then the run's report once. Waits while a "
    "step runs or while `envsched train` drives the run; retries a failed step up to 3 times, then halts the run.",
)
def training_loop_sensor(context: dg.SensorEvaluationContext, lake: LakeResource):
    return loop_requests(lake.lake(), context.instance, context.cursor)
