"""Dagster layer: definitions load, assets materialize on a test instance, the sensor drives the loop."""

from pathlib import Path

import dagster as dg

from envsched_pipeline.definitions import defs
from envsched_pipeline.lake import LATEST_REPORT
from envsched_pipeline.orchestration.partitions import training_steps
from envsched_pipeline.orchestration.sensors import training_loop_sensor
from envsched_pipeline.resources.lake import LakeResource
from envsched_pipeline.resources.trainer import TrainerLauncher
from envsched_pipeline.run import load_run


def test_definitions_load():
    dg.Definitions.validate_loadable(defs)
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {"environments", "tasks", "batch_manifest", "training_step", "reward_statistics"} <= keys


def resources(lake):
    return {"lake": LakeResource(root=str(lake.root)), "trainer": TrainerLauncher()}


def test_step_assets_materialize_through_pipes(small_run):
    lake = small_run
    assets = dg.load_assets_from_modules(
        [
            __import__("envsched_pipeline.assets.manifest", fromlist=["x"]),
            __import__("envsched_pipeline.assets.training", fromlist=["x"]),
        ]
    )
    key = f"{load_run(lake).run_id}-0"
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(training_steps.name, [key])
        res = dg.materialize(
            assets,
            partition_key=key,
            instance=instance,
            resources=resources(lake),
            selection=["batch_manifest", "training_step", "reward_statistics"],
        )
        assert res.success
        mats = res.get_asset_materialization_events()
        by_key = {m.asset_key.to_user_string(): m.materialization.metadata for m in mats}
        assert by_key["batch_manifest"]["dagster/row_count"].value == 8
        assert "cold start" in by_key["batch_manifest"]["near_misses"].value  # step 0 scores no task
        # plots and tables are stored once per step, in the materialization, not in the step output too
        outputs = [e.step_output_data.metadata for e in res.all_events if e.is_successful_output]
        assert len(outputs) == 3 and all(
            not isinstance(v, dg.MarkdownMetadataValue) for md in outputs for v in md.values()
        )
        assert all(
            isinstance(by_key[k][label], dg.MarkdownMetadataValue)
            for k, label in [
                ("batch_manifest", "plot"),
                ("training_step", "curves"),
                ("reward_statistics", "trends"),
            ]
        )
        # metadata reported by the trainer process through Pipes
        assert by_key["training_step"]["rollouts"].value == 32
        first = lake.read("rollouts", step=0).to_pylist()
        res2 = dg.materialize(
            assets,
            partition_key=key,
            instance=instance,
            resources=resources(lake),
            selection=["batch_manifest", "training_step"],
        )
        assert res2.success
        again = lake.read("rollouts", step=0).to_pylist()
        strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
        assert strip(first) == strip(again)


def test_sensor_requests_select_then_train_then_next_select(small_run):
    lake = small_run
    from envsched_pipeline.core.select import select_manifest
    from envsched_pipeline.core.statistics import statistics_step
    from trainer.step import run_step

    with dg.instance_for_test() as instance:
        ctx = dg.build_sensor_context(instance=instance, resources=resources(lake))
        r = training_loop_sensor(ctx)
        assert [q.job_name for q in r.run_requests] == ["select_job"]
        rid = load_run(lake).run_id
        assert r.run_requests[0].partition_key == f"{rid}-0"
        assert r.dynamic_partitions_requests[0].partition_keys == [f"{rid}-0"]
        tags = r.run_requests[0].tags
        assert tags["envsched/run_id"] == rid and tags["envsched/lake"] == str(lake.root)
        assert tags["envsched/pool"] == "synthetic" and tags["envsched/driver"] == "sensor"
        select_manifest(lake, 0)
        r = training_loop_sensor(dg.build_sensor_context(instance=instance, resources=resources(lake)))
        assert [q.job_name for q in r.run_requests] == ["train_job"]
        run_step(lake, 0, log=lambda *_: None)
        r = training_loop_sensor(dg.build_sensor_context(instance=instance, resources=resources(lake)))
        assert r.run_requests[0].asset_selection == [dg.AssetKey("reward_statistics")]
        statistics_step(lake, 0)
        r = training_loop_sensor(dg.build_sensor_context(instance=instance, resources=resources(lake)))
        assert r.run_requests[0].job_name == "select_job" and r.run_requests[0].partition_key == f"{rid}-1"
        assert r.run_requests[0].run_key.endswith("select-1-a0")


def test_a_complete_run_gets_its_report_once_per_completion(small_run):
    """When the run is complete the sensor requests `report_job` once (its cursor remembers), the
    job writes the report into the lake, and a run rewound and completed again gets a new one."""
    from envsched_pipeline.orchestration.rewind import rewind_run  # this test only
    from tests.conftest import run_steps  # the step service's loop: this test only

    lake = run_steps(small_run, 3)  # max_steps = 3: complete
    rid = load_run(lake).run_id
    with dg.instance_for_test() as instance:
        r = training_loop_sensor(dg.build_sensor_context(instance=instance, resources=resources(lake)))
        (req,) = r.run_requests
        assert (
            req.job_name == "report_job" and req.run_key == f"{rid}-report-2-r0" and r.cursor == req.run_key
        )
        assert req.tags["envsched/report_of"] == rid and "envsched/run_id" not in req.tags  # not a step
        again = training_loop_sensor(
            dg.build_sensor_context(instance=instance, resources=resources(lake), cursor=r.cursor)
        )
        assert isinstance(again, dg.SkipReason) and "its report was requested" in again.skip_message
        res = defs.resolve_job_def("report_job").execute_in_process(
            instance=instance, resources=resources(lake), tags=req.tags
        )
        assert res.success
        (mat,) = res.get_asset_materialization_events()
        assert mat.asset_key == dg.AssetKey("run_report")
        assert (
            Path(mat.materialization.metadata["report"].value)
            == Path(lake.local) / LATEST_REPORT / "index.html"
        )
        assert mat.materialization.metadata["steps"].value == 3
        # taken back to step 2 and redone: the same last step, another end of the run
        rewind_run(lake, instance, 2, who="test")
        run_steps(lake, [2])
        r = training_loop_sensor(
            dg.build_sensor_context(instance=instance, resources=resources(lake), cursor=r.cursor)
        )
        assert [q.run_key for q in r.run_requests] == [f"{rid}-report-2-r1"]


def test_sensor_skips_without_a_run(lake):
    with dg.instance_for_test() as instance:
        r = training_loop_sensor(dg.build_sensor_context(instance=instance, resources=resources(lake)))
        assert isinstance(r, dg.SkipReason) and "no run" in r.skip_message


def test_rewind_job_takes_the_run_back_from_the_ui(small_run):
    """`rewind_job` (launchpad config `ops.rewind_steps.config.to`) does what `envsched rewind` does,
    and a step it cannot go back to fails the run with the reason, moving nothing."""
    from envsched_pipeline.core.loop import next_action  # the loop this test drives
    from envsched_pipeline.core.select import select_manifest
    from envsched_pipeline.core.statistics import statistics_step
    from trainer.step import run_step

    lake = small_run
    for t in range(3):
        select_manifest(lake, t)
        run_step(lake, t, log=lambda *_: None)
        statistics_step(lake, t)
    job = defs.resolve_job_def("rewind_job")

    def config(to):
        return {
            "ops": {"rewind_steps": {"config": {"to": to}}},
            "resources": {"lake": {"config": {"root": str(lake.root)}}},
        }

    with dg.instance_for_test() as instance:
        bad = job.execute_in_process(run_config=config(7), instance=instance, raise_on_error=False)
        assert not bad.success and next_action(lake) is None
        failure = [e for e in bad.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE][0]
        assert "the run holds steps 0..2" in failure.step_failure_data.error.message
        assert job.execute_in_process(run_config=config(1), instance=instance).success
    assert next_action(lake) == ("select", 1) and lake.steps("rollouts") == [0]
