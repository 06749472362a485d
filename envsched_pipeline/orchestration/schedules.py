"""Schedules, visible under Automation in the UI.

* ``advance_run`` (every ``ENVSCHED_ADVANCE_CRON``, default every 10 minutes): asks the same plan
  as the loop sensor what the lake's run needs and requests it, so a run keeps (or resumes)
  advancing when the sensor is stopped or the daemon was down. Idempotent with the sensor: nothing
  is requested while a step of the run is queued or in progress, or while ``envsched train`` holds
  the run's lease; a halted or complete run is skipped with the reason.
* ``refresh_pool`` (``ENVSCHED_POOL_REFRESH_CRON``, default daily at 03:00): re-imports the run's
  pool and rebuilds its topologies, features and task graph. Unchanged tasks keep their topology
  (an LLM's answer is not paid twice) and their scheduler history (by content hash); the run goes
  on over the edited pool.
"""

import os

import dagster as dg

from envsched_pipeline.orchestration.jobs import pool_job
from envsched_pipeline.orchestration.partitions import training_steps
from envsched_pipeline.orchestration.plan import next_request
from envsched_pipeline.resources.lake import LakeResource
from envsched_pipeline.run import load_run

STEP_ASSETS = dg.AssetSelection.assets("batch_manifest", "training_step", "reward_statistics")
ASSETS_OF = {
    "select": ["batch_manifest"],
    "train": ["training_step", "reward_statistics"],
    "stats": ["reward_statistics"],
}


@dg.schedule(
    cron_schedule=os.environ.get("ENVSCHED_ADVANCE_CRON", "*/10 * * * *"),
    target=STEP_ASSETS,
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Advances (or resumes) the lake's run on a cadence: requests the step the run needs next, exactly "
    "as the loop sensor would (never while a step of the run is in flight or `envsched train` drives it).",
)
def advance_run(context: dg.ScheduleEvaluationContext, lake: LakeResource):
    lk = lake.lake()
    req = next_request(lk, context.instance, driver="schedule")
    if req is None:
        return dg.SkipReason(f"the run in {lk.root} is complete")
    if isinstance(req, str):
        return dg.SkipReason(req)
    if not context.instance.has_dynamic_partition(training_steps.name, req.partition):
        context.instance.add_dynamic_partitions(training_steps.name, [req.partition])
    return dg.RunRequest(
        run_key=f"schedule-{req.run_key}",
        partition_key=req.partition,
        asset_selection=[dg.AssetKey(a) for a in ASSETS_OF[req.kind]],
        tags=req.tags,
    )


@dg.schedule(
    cron_schedule=os.environ.get("ENVSCHED_POOL_REFRESH_CRON", "0 3 * * *"),
    job=pool_job,
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Re-imports the run's pool and rebuilds topologies, features and the task graph (unchanged tasks "
    "keep their topology and their history by content hash).",
)
def refresh_pool(context: dg.ScheduleEvaluationContext, lake: LakeResource):
    lk = lake.lake()
    spec = load_run(lk)
    if spec is None:
        return dg.SkipReason(f"no run in {lk.root}: nothing to refresh")
    ops = {
        "pool_tables": {"config": {"pool": spec.pool, "allow_edit": True}},
        **{name: {"config": {"pool": spec.pool}} for name in ("topologies", "features", "task_graph")},
    }
    return dg.RunRequest(
        run_key=None,
        run_config={"ops": ops},
        tags={"envsched/run_id": spec.run_id, "envsched/pool": spec.pool, "envsched/lake": str(lk.root)},
    )


ALL_SCHEDULES = [advance_run, refresh_pool]
