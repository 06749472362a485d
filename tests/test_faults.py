"""Fault injection: a killed trainer, a corrupt Parquet file, a write that fails half way, and
SQL while a step writes. (Hostile environment code is in test_pools.)"""

import os
import signal
import subprocess
import sys
import threading
import time

import pyarrow.parquet as pq
import pytest

from envs.registry import load_synthetic
from envsched_pipeline.cli import main
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.core.select import select_manifest
from envsched_pipeline.lake import Lake, LakeError
from envsched_pipeline.run import RunSpec, start_run
from tests.procs import gone


def test_trainer_killed_mid_step_then_rerun_leaves_exactly_b_x_g(tmp_path):
    lake = Lake(tmp_path / "lake")
    import_pool(lake, load_synthetic("synthetic", n_envs=20, tasks_per_env=20, seed=1))
    # real-environment mode: each rollout runs in the sandbox, so the step takes seconds
    start_run(
        lake,
        RunSpec(
            pool="synthetic",
            scheduler="random",
            batch_size=64,
            group_size=8,
            max_steps=1,
            policy_config={"mode": "real"},
        ),
    )
    select_manifest(lake, 0)
    cmd = [sys.executable, "-m", "trainer.step", "--lake", str(lake.root), "--step", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    time.sleep(2.0)
    os.killpg(proc.pid, signal.SIGKILL)  # the trainer and its sandbox workers die mid-step
    proc.wait()
    # whatever the moment of death: no partial partition is visible, and the step is not complete
    if lake.has("rollouts", step=0):
        assert lake.read("rollouts", step=0).num_rows == 64 * 8
    assert not lake.has("train_metrics", step=0) or lake.read("rollouts", step=0).num_rows == 512
    leftovers = [p for p in lake.root.rglob("*.tmp")]
    assert all(p.parent.name.startswith("step=") for p in leftovers)  # orphan temps are never read as data
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    r = lake.read("rollouts", step=0)
    keys = set(zip(r.column("task_id").to_pylist(), r.column("rollout").to_pylist(), strict=True))
    assert r.num_rows == 512 == len(keys)
    assert lake.sql("select count(*) as n from rollouts").column("n")[0].as_py() == 512


def test_corrupt_parquet_error_names_the_file(tmp_path, capsys):
    lake = Lake(tmp_path / "lake")
    lake.write("rollouts", [{"step": 0, "task_id": "t", "rollout": 0, "env_id": "e", "reward": 1.0}], step=0)
    bad = lake.write(
        "rollouts", [{"step": 1, "task_id": "t", "rollout": 0, "env_id": "e", "reward": 1.0}], step=1
    )
    bad.write_bytes(b"PAR1" + b"\x00" * 64 + b"PAR1")
    assert main(["--lake", str(lake.root), "sql", "select count(*) from rollouts"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "cannot read Parquet" in err


def test_write_failing_half_way_leaves_old_partition(tmp_path, monkeypatch):
    lake = Lake(tmp_path / "lake")
    rows = [{"step": 0, "task_id": f"t{i}", "rollout": 0, "env_id": "e", "reward": 0.5} for i in range(5)]
    lake.write("rollouts", rows, step=0)
    real = pq.write_table

    def half_then_fail(table, where, **kw):
        real(table.slice(0, 2), where, **kw)  # bytes reach the disk ...
        raise OSError("disk full")  # ... then the write dies

    monkeypatch.setattr(pq, "write_table", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        lake.write("rollouts", rows[:1], step=0)
    monkeypatch.setattr(pq, "write_table", real)
    assert lake.read("rollouts", step=0).num_rows == 5  # the old partition, whole
    assert [p.name for p in (lake.root / "rollouts" / "step=0").iterdir()] == ["part-0.parquet"]


def test_sql_works_while_a_step_writes(tmp_path):
    lake = Lake(tmp_path / "lake")
    stop = threading.Event()
    errors: list[Exception] = []

    def writer():
        k = 0
        while not stop.is_set():
            rows = [
                {"step": k % 5, "task_id": f"t{i}", "rollout": r, "env_id": "e", "reward": 0.5}
                for i in range(64)
                for r in range(8)
            ]
            lake.write("rollouts", rows, step=k % 5)
            k += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        seen = 0
        deadline = time.time() + 4
        while time.time() < deadline:
            try:
                n = lake.sql("select count(*) as n from rollouts").column("n")[0].as_py()
                assert n % 512 == 0  # whole partitions only
                seen += 1
            except LakeError as exc:  # pragma: no cover - would be a failure below
                errors.append(exc)
    finally:
        stop.set()
        t.join()
    assert not errors and seen > 5


def test_a_pool_worker_dies_with_its_killed_parent():
    """Bench workers call die_with_parent: a bench killed by a signal leaves no run computing on."""
    child = (
        "from envs.isolation import die_with_parent; import os, time; die_with_parent(); "
        "print(os.getpid(), flush=True); time.sleep(120)"
    )
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    pid = int(parent.stdout.readline())  # printed once the death signal is set
    assert not gone(pid)
    parent.kill()
    parent.wait()
    deadline = time.time() + 10
    while not gone(pid) and time.time() < deadline:
        time.sleep(0.1)
    assert gone(pid)
