"""The loop sensor: drives select -> train -> statistics -> select ... from the lake's state.

It asks :func:`envsched_pipeline.service.next_action` what the run needs next (the lake is the
single source of truth, so the CLI, the sensor and a resumed run agree), adds the step's dynamic
partition, and requests the run with a ``run_key`` unique to (run, action, step): a request is
never duplicated while a run is in flight, and re-running a step by hand is always safe.
"""

import dagster as dg

from envsched_pipeline.core.loop import next_action
from envsched_pipeline.orchestration.jobs import select_job, train_job
from envsched_pipeline.orchestration.partitions import training_steps
from envsched_pipeline.resources.lake import LakeResource
from envsched_pipeline.run import load_run


def loop_requests(lake, instance) -> dg.SensorResult | dg.SkipReason:

    run = load_run(lake)
    if run is None:
        return dg.SkipReason(
            f"no run in {lake.root}: start one with `envsched train` or `envsched step select`"
        )
    action = next_action(lake)
    if action is None:
        return dg.SkipReason(f"run {run.run_id} complete: {run.max_steps} steps")
    kind, step = action
    if kind == "wait":
        return dg.SkipReason(f"waiting for the external trainer to ingest rollouts of step {step}")
    key = str(step)
    add = [] if instance.has_dynamic_partition(training_steps.name, key) else [key]
    if kind == "select":
        req = dg.RunRequest(
            run_key=f"{run.run_id}-select-{step}", partition_key=key, job_name=select_job.name
        )
    elif kind == "train":
        req = dg.RunRequest(run_key=f"{run.run_id}-train-{step}", partition_key=key, job_name=train_job.name)
    else:  # statistics only (the training step finished but its statistics did not)
        req = dg.RunRequest(
            run_key=f"{run.run_id}-stats-{step}",
            partition_key=key,
            job_name=train_job.name,
            asset_selection=[dg.AssetKey("reward_statistics")],
        )
    return dg.SensorResult(
        run_requests=[req],
        dynamic_partitions_requests=[training_steps.build_add_request(add)] if add else [],
        cursor=f"{kind}:{step}",
    )


@dg.sensor(
    jobs=[select_job, train_job],
    minimum_interval_seconds=5,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Sees a finished step and requests the next one: training_step[t] after manifest[t], "
    "then statistics[t] + manifest[t+1], until the run's max steps.",
)
def training_loop_sensor(context: dg.SensorEvaluationContext, lake: LakeResource):
    return loop_requests(lake.lake(), context.instance)
