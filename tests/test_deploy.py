"""Beyond one laptop: schedules, a Dagster instance on a real PostgreSQL server driven by the daemon."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import psycopg2
import pytest

from envsched_pipeline.definitions import defs
from envsched_pipeline.lake import Lake
from envsched_pipeline.orchestration.plan import run_tags
from envsched_pipeline.orchestration.schedules import advance_run, refresh_pool
from envsched_pipeline.resources.lake import LakeResource
from envsched_pipeline.run import load_run
from tests.postgres_server import Postgres
from tests.procs import stop

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def postgres():
    pg = Postgres().start()
    yield pg
    pg.stop()


def test_schedules_are_defined_and_described():
    names = {s.name: s for s in defs.schedules}
    assert set(names) >= {"advance_run", "refresh_pool"}
    assert all(s.description for s in names.values())


def test_advance_run_requests_the_next_step_and_is_idempotent_with_the_sensor(small_run):
    lake = small_run
    res = {"lake": LakeResource(root=str(lake.root))}
    with dg.instance_for_test() as instance:
        req = advance_run(dg.build_schedule_context(instance=instance, resources=res))
        assert req.asset_selection == [dg.AssetKey("batch_manifest")]
        assert req.partition_key == f"{load_run(lake).run_id}-0" and req.tags["envsched/driver"] == "schedule"
        instance.add_run(
            dg.DagsterRun(
                job_name="select_job",
                run_id="b" * 32,
                status=dg.DagsterRunStatus.STARTED,
                tags=run_tags(lake, load_run(lake), 0, "select", "sensor"),
            )
        )
        skip = advance_run(dg.build_schedule_context(instance=instance, resources=res))
        assert isinstance(skip, dg.SkipReason) and "is started" in skip.skip_message


def test_refresh_pool_reimports_the_runs_pool_edit_tolerantly(small_run):
    with dg.instance_for_test() as instance:
        req = refresh_pool(
            dg.build_schedule_context(
                instance=instance, resources={"lake": LakeResource(root=str(small_run.root))}
            )
        )
    assert req.run_config["ops"]["pool_tables"]["config"] == {"pool": "synthetic", "allow_edit": True}


def test_postgres_instance_stores_runs_and_the_daemon_drives_the_loop(postgres, tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(ROOT / "deploy" / "dagster-postgres.yaml", home / "dagster.yaml")
    lake = tmp_path / "lake"
    env = {**os.environ, **postgres.env(), "DAGSTER_HOME": str(home), "ENVSCHED_LAKE": str(lake)}
    cli = [sys.executable, "-m", "envsched_pipeline.cli"]
    assert (
        subprocess.run(
            cli + ["pool", "create", "synthetic", "--name", "mini", "--envs", "3", "--tasks-per-env", "4"],
            env=env,
            capture_output=True,
        ).returncode
        == 0
    )
    out = subprocess.run(
        cli
        + [
            "train",
            "--pool",
            "mini",
            "--steps",
            "2",
            "--max-steps",
            "3",
            "--batch-size",
            "4",
            "--group-size",
            "2",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    with psycopg2.connect(host="127.0.0.1", port=postgres.port, user="postgres", dbname="dagster") as conn:
        with conn.cursor() as cur:
            cur.execute("select count(*) from runs where status = 'SUCCESS'")
            assert cur.fetchone()[0] >= 4  # select + train, twice
    assert not (home / "history").exists()  # nothing fell back to SQLite
    daemon = subprocess.Popen(
        [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w", str(ROOT / "workspace.yaml")],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 420
        while time.time() < deadline and not Lake(lake).has("statistics", step=2):
            time.sleep(2)
        assert Lake(lake).has("statistics", step=2), "the daemon's sensor did not drive step 2"
    finally:
        stop(daemon)
    with psycopg2.connect(host="127.0.0.1", port=postgres.port, user="postgres", dbname="dagster") as conn:
        with conn.cursor() as cur:
            cur.execute(
                "select count(*) from runs r join run_tags t on t.run_id = r.run_id "
                "where t.key = 'envsched/driver' and t.value = 'sensor'"
            )
            assert cur.fetchone()[0] >= 2
