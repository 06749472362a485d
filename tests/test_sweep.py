"""`envsched sweep`: every scheduler at every seed through real `envsched train` processes (the
simulated learner on the built-in pool, one Dagster instance), then the table over seeds; a run
that fails costs only itself, Ctrl-C stops every run cleanly, and the same command resumes."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import dagster as dg
import pytest

from envs.registry import load_synthetic
from envsched_pipeline.analysis.ablation import compare_rows, table_markdown
from envsched_pipeline.analysis.seeds import compare_seeds, seed_table
from envsched_pipeline.cli import main
from envsched_pipeline.cli.common import STOP_WITH_ENV, UsageError, stop_with_parent
from envsched_pipeline.cli.sweep import Planned, comparable, finished, portable
from envsched_pipeline.core.gates import STALL_GATE, halt
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
    """The sweep, its policy settings from a file (the record inlines them)."""
    argv = ["sweep", "--dir", str(tmp_path / "sw"), "--schedulers", f"mopps,{FORM}", "--seeds", "0,1"]
    settings = tmp_path / "policy.json"
    settings.write_text('{"workers": 2}')
    flags = [*SHAPE, "--policy-conf", f"@{settings}"]  # an abbreviation, as argparse takes it
    return subprocess.run(
        [sys.executable, "-m", "envsched_pipeline.cli", *argv, "--steps", str(steps), *extra, "--", *flags],
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
    assert json.loads((tmp_path / "sw" / "sweep.json").read_text()) == {
        "schedulers": f"mopps,{FORM}",
        "seeds": [0, 1],
        "steps": 3,
        "baseline": "random",
        "train_flags": [*SHAPE, '--policy-config={"workers":2}'],
    }
    # every run is on the one Dagster instance (the UI shows them all)
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        lakes_seen = {r.dagster_run.tags.get("envsched/lake") for r in instance.get_run_records()}
    assert {str(lk.root) for lk in runs.values()} <= lakes_seen

    # longer, with one run halted meanwhile: it fails alone, the others go on, and the table is
    # made of what completed (mopps has one seed left and is left out)
    stuck = runs["mopps s1"]
    halt(stuck, 3, "train_job (train)", ["a test halted it"], failed_runs=["r1"])
    p = sweep(tmp_path, 4, "--jobs", "2")
    assert p.returncode == 1 and "failed mopps s1 (exit 2)" in p.stdout and "a test halted it" in p.stdout
    assert "1 of 6 runs failed (mopps s1); the same command runs them again" in p.stderr
    assert "left out: mopps s1 (failed); mopps (one seed left: a spread over seeds needs two)" in p.stdout
    assert {n: len(lk.steps("statistics")) for n, lk in runs.items()} == {
        n: 3 if n == "mopps s1" else 4 for n in runs
    }
    form = compare_seeds([runs[f"{FORM} s0"], runs[f"{FORM} s1"]], [runs["random s0"], runs["random s1"]])
    assert "\n".join(seed_table(form)) in p.stdout and "| scheduler |" not in p.stdout
    # resumed, the same command finishes it and leaves the rest as they are
    assert main(["--lake", str(stuck.root), "resume"]) == 0
    before = {n: lk.steps("manifests") for n, lk in runs.items() if n != "mopps s1"}
    # `envsched sweep --dir DIR` alone: the settings (train flags included) from DIR/sweep.json, the
    # policy settings as the sweep started with them although their file is gone
    (tmp_path / "policy.json").unlink()
    p = subprocess.run(
        [sys.executable, "-m", "envsched_pipeline.cli", "sweep", "--dir", str(tmp_path / "sw"), "--json"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,  # from another folder: nothing recorded is relative to where the sweep started
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert p.returncode == 0, p.stderr
    assert {n: lk.steps("manifests") for n, lk in runs.items() if n != "mopps s1"} == before
    assert len(stuck.steps("statistics")) == 4
    # the runs an earlier sweep finished start no process
    assert [line for line in p.stderr.splitlines() if line.startswith("started ")] == [
        f"started mopps s1 ({stuck.root})"
    ]
    assert (
        sum(line.startswith("already done ") and line.endswith(": 4 steps") for line in p.stderr.splitlines())
        == 5
    )
    result = json.loads(p.stdout)  # the progress went to stderr
    assert "all 6 runs complete in " in p.stderr
    assert [r["runs"]["name"] for r in result["rows"]] == ["mopps", FORM]
    assert {p["seed"] for r in result["rows"] for p in r["pairs"]} == {0, 1}


def test_the_recorded_train_flags_hold_from_any_folder_at_any_time(tmp_path, monkeypatch):
    """A settings file's JSON goes into the record (the runs not started yet keep the settings the
    sweep started with) and a local folder is made absolute; inline JSON and URLs stay as given."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.json").write_text('{"rho": 0.25}')
    flags = ["--batch-size", "8", "--scheduler-config", "s.json", "--model-p=ckpt", "--prior-lake"]
    flags += ["s3://b/p", "--policy-config", '{"epochs": 2}', "--pol", "neural"]
    assert portable(flags) == [
        "--batch-size",
        "8",
        '--scheduler-config={"rho":0.25}',
        f"--model-path={(tmp_path / 'ckpt').resolve()}",
        "--prior-lake=s3://b/p",
        '--policy-config={"epochs": 2}',
        "--pol",  # an abbreviation of another option (two start so: left for argparse to refuse)
        "neural",
    ]
    with pytest.raises(UsageError, match="--scheduler-config nowhere.json"):
        portable(["--scheduler-config", "@nowhere.json"])


def test_a_sweep_checks_every_run_before_any_starts(tmp_path, capsys):
    out = tmp_path / "sw"
    afile, lake = tmp_path / "a-file", Lake(tmp_path / "a-lake")
    afile.write_text("")
    start_run(
        lake, RunSpec(pool="synthetic", scheduler="mopps", seed=1, batch_size=8, group_size=4, max_steps=1)
    )
    made = sorted(lake.root.rglob("*"))
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
        (["--schedulers", "mopps", "--seeds", "0,1", "--dir", str(afile)], f"--dir: {afile} is a file"),
        (["--schedulers", "mopps", "--seeds", "0,1", "--dir", str(afile / "x")], f"{afile} is a file"),
        (["--schedulers", "mopps", "--seeds", "0,1", "--dir", str(lake.root)], "holds a run (it is a lake)"),
    ]
    for argv, why in cases:
        assert main([*base, *argv]) == 2, argv
        assert why in capsys.readouterr().err, argv
        assert not out.exists() and sorted(lake.root.rglob("*")) == made
    # a sweep to resume is read from DIR/sweep.json; without one, or with a damaged one, refused
    assert main(["sweep", "--dir", str(out)]) == 2
    assert "--schedulers, --seeds and --steps name a new sweep" in capsys.readouterr().err
    out.mkdir()
    for text, says in (
        ("{", "sweep.json: not JSON"),
        (
            '{"schedulers": "mopps", "seeds": [0, 1], "steps": true}',
            "field 'steps' missing or not an integer",
        ),
        (
            '{"schedulers": "mopps", "seeds": [0, -1], "steps": 2, "baseline": "random", "train_flags": []}',
            "field 'seeds' must list seeds",
        ),
    ):
        (out / "sweep.json").write_text(text)
        assert main(["sweep", "--dir", str(out)]) == 2
        assert says in capsys.readouterr().err and sorted(p.name for p in out.iterdir()) == ["sweep.json"]
    (out / "sweep.json").unlink()
    out.rmdir()
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
    # --dry-run: what would run, in order, the run already done named as done; nothing written
    before = sorted(out.rglob("*"))
    flags = ["--", "--batch-size", "8", "--group-size", "4"]
    assert (
        main(
            [
                "sweep",
                "--dir",
                str(out),
                "--schedulers",
                "mopps",
                "--seeds",
                "0,1",
                "--steps",
                "1",
                "--dry-run",
                *flags,
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("sweep plan: 4 runs, 3 to run, 1 at a time")
    assert lines[1:] == [
        f"  to run  random s0: envsched --lake {out / 'random-s0'} train --batch-size 8 --group-size 4 "
        "--scheduler random --seed 0 --steps 1",
        f"  to run  random s1: envsched --lake {out / 'random-s1'} train --batch-size 8 --group-size 4 "
        "--scheduler random --seed 1 --steps 1",
        f"  to run  mopps s0: envsched --lake {out / 'mopps-s0'} train --batch-size 8 --group-size 4 "
        f"--scheduler mopps --seed 0 --steps 1 --against {out / 'random-s0'}",
        f"  done    mopps s1: 1 step in {held.root}",
    ]
    assert sorted(out.rglob("*")) == before


def test_the_table_of_a_sweep_with_failed_runs_is_made_of_the_seeds_that_completed(tmp_path):
    def planned(scheduler, seed, rc):
        lake = tmp_path / f"{scheduler}-s{seed}"
        r = Planned(
            scheduler, seed, 4, lake, [], scheduler == "random", tmp_path / "x.log", f"random-s{seed}"
        )
        r.result = {"rc": rc, "seconds": 1.0}
        return r

    rcs = {
        "random": [0, 0, 0, 2],  # seed 3's baseline failed: every run of seed 3 is left out
        "mopps": [0, 2, 0, 0],
        "dps": [0, 2, 2, 0],  # one seed left: the scheduler is left out
        "greso": [2, 2, 2, 2],
    }
    runs = [planned(s, seed, rc) for s, codes in rcs.items() for seed, rc in enumerate(codes)]
    groups, against, left_out = comparable(runs)
    assert [[lk.root.name for lk in g] for g in groups] == [["mopps-s0", "mopps-s2"]]
    assert [lk.root.name for lk in against] == ["random-s0", "random-s2"]
    assert left_out == [
        "mopps s1 (failed)",
        "mopps s3 (random s3 failed)",
        "dps s1 (failed)",
        "dps s2 (failed)",
        "dps s3 (random s3 failed)",
        "dps (one seed left: a spread over seeds needs two)",
        "greso s0 (failed)",
        "greso s1 (failed)",
        "greso s2 (failed)",
        "greso s3 (failed)",
    ]
    for r in runs:
        r.result["rc"] = 0
    groups, against, left_out = comparable(runs)
    assert len(groups) == 3 and len(against) == 4 and not left_out


def test_a_run_whose_sweep_is_gone_stops_before_it_writes_anything(tmp_path):
    lake = tmp_path / "lake"
    gone = _dead_pid()  # the pid of a process that has ended: not this run's parent
    argv = ["--lake", str(lake), "train", "--pool", "synthetic", "--steps", "1"]
    p = subprocess.run(
        [sys.executable, "-m", "envsched_pipeline.cli", *argv],
        env={**os.environ, STOP_WITH_ENV: str(gone)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 130 and "envsched: interrupted" in p.stderr and not lake.exists()
    # with its sweep alive it goes on, and what it starts does not take the sweep for its parent
    code = (
        f"from {stop_with_parent.__module__} import stop_with_parent as f; f(); import os; print(os.environ)"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, STOP_WITH_ENV: str(os.getpid())},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0 and STOP_WITH_ENV not in p.stdout and "PATH" in p.stdout


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize(
    "stop", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["ctrl-c", "kill", "kill-9"]
)
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
    try:
        proc.send_signal(stop)
        out, err = proc.communicate(timeout=300)
        if stop == signal.SIGKILL:  # the sweep had no say: the kernel tells each run it is gone
            assert proc.returncode == -signal.SIGKILL
            gone_by = time.monotonic() + 120  # a step of this run takes a second or two
            while [pid for pid in children if _alive(pid)]:
                assert time.monotonic() < gone_by, "a run of a killed sweep went on"
                time.sleep(0.5)
        else:
            assert proc.returncode == 130 and "interrupted: the same command resumes the sweep" in err
        assert children and not [pid for pid in children if _alive(pid)]
    finally:  # a failed check leaves no run going
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for seed in (0, 1):  # each run stopped after a step: no driver left, nothing half written
        st = status(Lake(tmp_path / "sw" / f"random-s{seed}"))
        assert st["driver"] is None and st["consistent"] and st["last_statistics"] < 399


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_run_that_stopped_early_is_finished_and_one_halted_otherwise_is_not(tmp_path):
    """A run stopped early by its `--eval-patience` is done for the sweep (the same command does not
    start it again), with the steps it holds; one halted by a failure has to run again."""
    lake = Lake(tmp_path / "lake")
    for t in range(3):
        lake.write("statistics", [{"step": t, "task_id": "a"}], step=t)
    r = Planned("random", 0, 5, str(lake.root), [], True, tmp_path / "log", str(lake.root))
    assert finished(r) is None  # 3 of 5 steps, not halted: it goes on
    halt(lake, 2, "train_job (train)", ["a test halted it"])
    assert finished(r) is None
    halt(lake, 2, STALL_GATE, ["held-out has not beaten step 0's mean score"])
    assert finished(r) == 3
