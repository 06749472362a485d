"""The Dagster UI for real: `dagster dev` on loopback (its own process group, first-run modal
skipped), GraphQL checks of the assets and the running sensor, the sensor advancing the loop by
itself, and a headless Chromium screenshot of the asset graph that must not be blank."""

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from envs.registry import load_synthetic
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.lake import Lake
from envsched_pipeline.run import RunSpec, start_run
from tests.procs import free_port, stop

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def graphql(port: int, query: str) -> dict:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


@pytest.fixture
def dagster_dev(tmp_path):
    home = tmp_path / "dagster_home"
    (home / ".nux").mkdir(parents=True)
    (home / ".nux" / "nux.yaml").write_text("seen: 1\n")
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    lake = Lake(tmp_path / "lake")
    import_pool(lake, load_synthetic("synthetic", n_envs=6, tasks_per_env=10, seed=3))
    start_run(lake, RunSpec(pool="synthetic", scheduler="envsched", batch_size=8, group_size=4, max_steps=2))
    port = free_port()
    env = dict(os.environ, DAGSTER_HOME=str(home), ENVSCHED_LAKE=str(lake.root))
    dagster = Path(sys.executable).with_name("dagster")
    proc = subprocess.Popen(
        [str(dagster), "dev", "-w", str(REPO / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "dagster.log", "w"),
        start_new_session=True,
    )  # its own process group: we can stop all of it
    try:
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(1)
        else:
            pytest.fail(
                "dagster dev did not serve /server_info: " + (tmp_path / "dagster.log").read_text()[-2000:]
            )
        yield port, lake, tmp_path
    finally:
        stop(proc, grace=20)  # dagster dev may ignore SIGTERM for a while; its group is killed after


def test_ui_serves_assets_sensor_runs_loop_and_renders(dagster_dev):
    port, lake, tmp = dagster_dev
    # binds to loopback only
    assert "127.0.0.1" in f"http://127.0.0.1:{port}"
    assets = graphql(port, "{ assetNodes { assetKey { path } groupName } }")["data"]["assetNodes"]
    keys = {"/".join(a["assetKey"]["path"]) for a in assets}
    assert {
        "environments",
        "tasks",
        "topologies",
        "features",
        "task_graph",
        "batch_manifest",
        "training_step",
        "reward_statistics",
        "run_report",
    } <= keys
    sensors = graphql(
        port,
        '{ sensorsOrError(repositorySelector: {repositoryName: "__repository__", '
        'repositoryLocationName: "envsched"}) { ... on Sensors { results { name '
        "sensorState { status } } } } }",
    )["data"]["sensorsOrError"]["results"]
    assert {(s["name"], s["sensorState"]["status"]) for s in sensors} == {("training_loop_sensor", "RUNNING")}
    # the sensor drives select -> train -> statistics -> select ... by itself
    deadline = time.time() + 420
    while time.time() < deadline and not lake.has("statistics", step=1):
        time.sleep(3)
    assert lake.has("statistics", step=1), (
        "the sensor did not advance the loop: " + (tmp / "dagster.log").read_text()[-3000:]
    )
    assert lake.read("rollouts").num_rows == 2 * 8 * 4
    # the sensor's step runs ran their ops in the run's own process (no process per op and check)
    with dg.DagsterInstance.from_config(str(tmp / "dagster_home")) as instance:
        steps = [r.dagster_run for r in instance.get_run_records() if r.dagster_run.job_name != "report_job"]
        kinds = {
            run.job_name: {
                e.dagster_event.event_type_value for e in instance.all_logs(run.run_id) if e.dagster_event
            }
            for run in steps
        }
    assert set(kinds) == {"select_job", "train_job"} and all("STEP_SUCCESS" in k for k in kinds.values()), (
        kinds
    )
    assert not any("STEP_WORKER_STARTING" in k for k in kinds.values()), kinds
    # the run is complete (max_steps 2): the sensor has its report written, once, without being asked
    query = (
        '{ assetOrError(assetKey: {path: ["run_report"]}) { ... on Asset { assetMaterializations(limit: 5) '
        "{ runId metadataEntries { label ... on PathMetadataEntry { path } } } } } }"
    )
    deadline = time.time() + 240
    reports = []
    while time.time() < deadline and not reports:
        reports = graphql(port, query)["data"]["assetOrError"]
        reports = reports["assetMaterializations"] if reports else []
        time.sleep(3)
    assert len(reports) == 1, "no report after the run ended: " + (tmp / "dagster.log").read_text()[-3000:]
    page = next(e["path"] for e in reports[0]["metadataEntries"] if e["label"] == "report")
    assert Path(page) == Path(lake.local) / "reports" / "latest" / "index.html" and Path(page).exists()
    # every batch_manifest partition embeds its own plot and a readable picks table
    mats = graphql(
        port,
        '{ assetOrError(assetKey: {path: ["batch_manifest"]}) { ... on Asset { assetMaterializations(limit: 20) '
        "{ partition metadataEntries { label ... on MarkdownMetadataEntry { mdStr } } } } } }",
    )["data"]["assetOrError"]["assetMaterializations"]
    by_partition = {m["partition"]: {e["label"]: e.get("mdStr") for e in m["metadataEntries"]} for m in mats}
    assert len(by_partition) >= 2, by_partition.keys()
    plots = []
    for part, md in by_partition.items():
        assert md.get("plot", "").count("data:image/png;base64,") == 1, (part, list(md))
        picks = md.get("picks", "")
        assert picks.lstrip().startswith("| slot") and "| why |" in picks and "{" not in picks, picks
        plots.append(md["plot"])
    assert len(set(plots)) == len(plots), "two partitions show the same plot"
    # a real browser renders the UI: the asset graph and a UI tour (saved for the README when asked)
    assert CHROMIUM, "chromium is not installed (make test installs it)"
    first = sorted(by_partition)[0]
    tour = {
        "ui_asset_graph": "/asset-groups",
        "ui_training_group": "/locations/envsched/asset-groups/training",
        "ui_manifest_partition": f"/assets/batch_manifest?partition={first}",
        "ui_training_step": f"/assets/training_step?partition={first}",
        "ui_manifest_checks": "/assets/batch_manifest?view=checks",
    }
    for name, path in tour.items():
        shot = tmp / f"{name}.png"
        subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={tmp / 'chrome'}",
                "--window-size=1400,1000"
                if "graph" in name or "group" in name
                else "--window-size=1400,1300",
                "--virtual-time-budget=20000",
                f"--screenshot={shot}",
                f"http://127.0.0.1:{port}{path}",
            ],
            capture_output=True,
            timeout=120,
        )
        assert shot.exists() and shot.stat().st_size > 10_000, name
        import matplotlib.image as mpimg

        img = mpimg.imread(str(shot))[..., :3]
        colors = len(np.unique((img.reshape(-1, 3) * 255).astype(np.uint8), axis=0))
        assert img.std() > 0.02 and colors > 50, f"the screenshot of {path} is blank"
        if os.environ.get("ENVSCHED_SAVE_SCREENSHOT"):
            (REPO / "docs" / "img").mkdir(exist_ok=True)
            shutil.copy(shot, REPO / "docs" / "img" / f"{name}.png")
