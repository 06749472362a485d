"""`envsched sweep`: every scheduler at every seed through real `envsched train` processes (the
simulated learner on the built-in pool, one Dagster instance), then the table over seeds; a run
that fails costs only itself, Ctrl-C stops every run cleanly, and the same command resumes."""

import json
import signal
import subprocess
import sys
import time

import dagster as dg
import pytest

from envs.registry import load_synthetic
from envsched_pipeline.analysis.ablation import compare_rows, table_markdown
from envsched_pipeline.cli import main
from envsched_pipeline.core.gates import halt
from envsched_pipeline.core.loop import status
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.lake import LATEST_REPORT, Lake
from envsched_pipeline.run import RunSpec, load_run, start_run
from envsched_pipeline.scheduler.variants import resolve
from tests.conftest import SMALL, run_steps
from tests.procs import descendants

FORM = "envsched@success+adaptive+covsampled+lr"
SHAPE = ["--batch-size", "8", "--group-size", "4"]


def sweep(tmp_path, steps: int, *extra: str) -> subprocess.CompletedProcess:
    argv = ["sweep", "--dir", str(tmp_path / "sw"), "--schedulers", f"mopps,{FORM}", "--seeds", "0,1"]
    return subprocess.run(
        [sys.executable, "-m", "envsched_pipeline.cli", *argv, "--steps", str(steps), *extra, "--", *SHAPE],
        capture_output=True,
        text=True,
        timeout=900,
    )


def lakes(tmp_path) -> dict[str, Lake]:
    folders = {"random": "random", "mopps": "mopps", FORM: "envsched_success_adaptive_covsampled_lr"}
    return {
        f"{s} s{seed}": Lake(tmp_path / "sw" / f"{f}-s{seed}") for s, f in folders.items() for seed in (0, 1)
    }


def small_pools(runs) -> None:
    """The small pool in each lake before the sweep (the built-in one takes longer to import)."""
    for lake in runs:
        import_pool(lake, load_synthetic("synthetic", **SMALL))


def test_a_sweep_runs_every_scheduler_at_every_seed_then_judges_them_side_by_side(tmp_path, dagster_home):
    runs = lakes(tmp_path)
    small_pools(runs.values())
    p = sweep(tmp_path, 3, "--jobs", "2")
    assert p.returncode == 0, p.stderr
    for name, lake in runs.items():
        scheduler, seed = name.rsplit(" s", 1)
        spec = load_run(lake)
        assert (spec.scheduler, spec.scheduler_config) == resolve(scheduler) and spec.seed == int(seed)
        assert len(lake.steps("statistics")) == 3 and (spec.batch_size, spec.group_size) == (8, 4)
        base = runs[f"random s{seed}"]
        if scheduler == "random":
            assert spec.scheduler == "random" and spec.against == []
            continue
        # every other run names its seed's baseline run, and its own report compares with it
        assert spec.against == [str(base.root)]
        report = json.loads((lake.local / LATEST_REPORT / "summary.json").read_text())
        assert [a["lake"] for a in report["against"]] == [str(base.root)] and not report["not_compared"]
        assert f"done {name}: 3 steps in " in p.stdout
    # baselines first: a seed's other runs start once its baseline run has ended
    order = [
        line.split(" (")[0].removeprefix("started ")
        for line in p.stdout.splitlines()
        if line.startswith("started ")
    ]
    for seed in (0, 1):
        ends = p.stdout.index(f"done random s{seed}:")
        assert all(p.stdout.index(f"started {s} s{seed} (") > ends for s in ("mopps", FORM))
    assert sorted(order) == sorted(runs) and order[:2] == ["random s0", "random s1"]
    # the table is the one `envsched compare` gives for these lakes
    groups = [[runs[f"{s} s{seed}"] for seed in (0, 1)] for s in ("mopps", FORM)]
    table = table_markdown(compare_rows(groups, [runs["random s0"], runs["random s1"]]))
    assert "\n".join(table) in p.stdout and (tmp_path / "sw" / "comparison" / "index.html").exists()
    # every run is on the one Dagster instance (the UI shows them all)
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        lakes_seen = {r.dagster_run.tags.get("envsched/lake") for r in instance.get_run_records()}
    assert {str(lk.root) for lk in runs.values()} <= lakes_seen

    # longer, with one run halted meanwhile: it fails alone, the others go on
    stuck = runs["random s1"]
    halt(stuck, 3, "train_job (train)", ["a test halted it"], failed_runs=["r1"])
    p = sweep(tmp_path, 4, "--jobs", "2")
    assert p.returncode == 1 and "failed random s1 (exit 2)" in p.stdout and "a test halted it" in p.stdout
    assert "1 of 6 runs failed (random s1): no table" in p.stderr and "| scheduler |" not in p.stdout
    assert f"`envsched runs {tmp_path / 'sw'}` gives the comparisons" in p.stderr
    assert {n: len(lk.steps("statistics")) for n, lk in runs.items()} == {
        n: 3 if n == "random s1" else 4 for n in runs
    }
    # resumed, the same command finishes it and leaves the rest as they are
    assert main(["--lake", str(stuck.root), "resume"]) == 0
    before = {n: lk.steps("manifests") for n, lk in runs.items() if n != "random s1"}
    p = sweep(tmp_path, 4, "--json")
    assert p.returncode == 0, p.stderr
    assert {n: lk.steps("manifests") for n, lk in runs.items() if n != "random s1"} == before
    assert len(stuck.steps("statistics")) == 4
    # the runs an earlier sweep finished start no process
    assert [line for line in p.stderr.splitlines() if line.startswith("started ")] == [
        f"started random s1 ({stuck.root})"
    ]
    assert (
        sum(line.startswith("already done ") and line.endswith(": 4 steps") for line in p.stderr.splitlines())
        == 5
    )
    result = json.loads(p.stdout)  # the progress went to stderr
    assert "all 6 runs complete in " in p.stderr
    assert [r["runs"]["name"] for r in result["rows"]] == ["mopps", FORM]
    assert {p["seed"] for r in result["rows"] for p in r["pairs"]} == {0, 1}


def test_a_sweep_checks_every_run_before_any_starts(tmp_path, capsys):
    out = tmp_path / "sw"
    base = ["sweep", "--dir", str(out), "--steps", "2"]
    cases = [
        (["--schedulers", "mopps,nope", "--seeds", "0,1"], "--schedulers: unknown scheduler 'nope'"),
        (["--schedulers", "mopps", "--seeds", "0,1", "--", "--seed", "3"], "-- --seed: the sweep sets it"),
        (
            ["--schedulers", "mopps", "--seeds", "0,1", "--", "--against=x"],
            "-- --against=x: the sweep sets it",
        ),
        (
            ["--schedulers", "mopps", "--seeds", "0,1", "--", "--again", "x"],
            "sets the scheduler, seed, steps or",
        ),
        (["--schedulers", "mopps", "--seeds", "4"], "--seeds: two seeds at least"),
        (["--schedulers", "mopps", "--seeds", "3-1"], "argument --seeds: '3-1': a range goes up"),
        (["--schedulers", "random", "--seeds", "0,1"], "--schedulers: name a scheduler besides the baseline"),
        (
            ["--schedulers", "mopps", "--seeds", "0,1", "--", "--group-size", "1"],
            "argument --group-size: must be >= 2",
        ),
        (
            ["--schedulers", "mopps", "--seeds", "0,1", "--", "--prior-discount", "2"],
            "prior discount must be in [0, 1]",
        ),
        (["--schedulers", "mopps,dps,mopps", "--seeds", "0,1"], "--schedulers: mopps is named twice"),
    ]
    for argv, why in cases:
        assert main([*base, *argv]) == 2, argv
        assert why in capsys.readouterr().err, argv
        assert not out.exists()
    # a lake of the sweep already holding a run with other settings: refused, naming the run
    held = Lake(out / "mopps-s1")
    import_pool(held, load_synthetic("synthetic", **SMALL))
    start_run(
        held, RunSpec(pool="synthetic", scheduler="mopps", seed=1, batch_size=8, group_size=4, max_steps=1)
    )
    run_steps(held, 1)
    assert (
        main(
            [*base, "--schedulers", "mopps", "--seeds", "0,1", "--", "--batch-size", "4", "--group-size", "4"]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "mopps s1: " in err and "batch_size: lake has 8, asked 4" in err
    assert sorted(p.name for p in out.iterdir()) == ["mopps-s1"]  # nothing else made, no run started


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "kill"])
def test_ctrl_c_or_kill_stops_every_run_of_the_sweep_cleanly(tmp_path, dagster_home, stop):
    small_pools(Lake(tmp_path / "sw" / f"{s}-s{seed}") for s in ("random", "mopps") for seed in (0, 1))
    argv = [
        "sweep",
        "--dir",
        str(tmp_path / "sw"),
        "--schedulers",
        "mopps",
        "--seeds",
        "0,1",
        "--steps",
        "400",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "envsched_pipeline.cli", *argv, "--jobs", "2", "--", *SHAPE],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = Lake(tmp_path / "sw" / "random-s0")
    deadline = time.monotonic() + 300
    while len(first.steps("statistics")) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.5)
    children = descendants(proc.pid)
    proc.send_signal(stop)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "interrupted: the same command resumes the sweep" in err
    assert children and not [pid for pid in children if _alive(pid)]
    for seed in (0, 1):  # each run stopped after a step: no driver left, nothing half written
        st = status(Lake(tmp_path / "sw" / f"random-s{seed}"))
        assert st["driver"] is None and st["consistent"] and st["last_statistics"] < 399


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
