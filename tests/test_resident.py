"""The resident policy worker: the model is loaded once across steps driven through Dagster, and a
worker killed mid-run is replaced from the newest checkpoint with a consistent lake."""

import json
import os
import signal
import time

import pytest

from envs.registry import load_synthetic
from envsched_pipeline.cli import main
from envsched_pipeline.core.gates import halt, resume
from envsched_pipeline.core.loop import status
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.lake import Lake
from envsched_pipeline.run import RunSpec, start_run
from trainer.policy_step import checkpoint_dirs
from trainer.remake import remake
from trainer.resident import Worker, read_info

TRAIN = [
    "train",
    "--pool",
    "mini",
    "--policy",
    "hf-tiny",
    "--batch-size",
    "2",
    "--group-size",
    "2",
    "--max-new-tokens",
    "6",
    "--resident",
    "--checkpoint-every",
    "2",
    "--eval-every",  # held-out evaluation by a resident worker: tests/test_heldout.py
    "0",
]


@pytest.fixture
def lake(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    root = tmp_path / "lake"
    assert (
        main(
            [
                "--lake",
                str(root),
                "pool",
                "create",
                "synthetic",
                "--name",
                "mini",
                "--envs",
                "2",
                "--tasks-per-env",
                "3",
            ]
        )
        == 0
    )
    yield Lake(root)
    info = read_info(Lake(root))
    if info:
        try:
            os.kill(int(info["pid"]), signal.SIGKILL)
        except ProcessLookupError:
            pass


def metrics(lake):
    return lake.sql(
        "select step, model_loads, worker_pid, load_seconds, save_seconds from train_metrics order by step"
    ).to_pylist()


def test_five_steps_load_the_model_once(lake, capsys):
    schedule = ["--lr", "1e-5", "--lr-warmup-steps", "2", "--lr-schedule", "linear", "--lr-min-ratio", "0"]
    assert main(["--lake", str(lake.root), *TRAIN, "--steps", "5", *schedule]) == 0
    rows = metrics(lake)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    # each step's update ran at its scheduled rate: warmup over 2 steps, then a linear decay to 0 at
    # the run's last step (the decay's length a run states when it starts)
    rates = [r["lr"] for r in lake.sql("select lr from train_metrics order by step").to_pylist()]
    assert rates == pytest.approx([5e-6, 1e-5, 1e-5, 1e-5 * 2 / 3, 1e-5 / 3], rel=1e-9)
    # the step table shows the rate when a schedule moves it
    table = [
        line.split() for line in capsys.readouterr().out.splitlines() if line.split()[:1] in (["step"], ["0"])
    ]
    assert table[0][-2:] == ["lr", "smp_gap"] and table[1][len(table[0]) - 2] == "5.00e-06", table
    assert {r["worker_pid"] for r in rows} == {rows[0]["worker_pid"]} and {
        r["model_loads"] for r in rows
    } == {1}
    assert rows[0]["load_seconds"] > 0 and all(r["load_seconds"] == 0 for r in rows[1:])
    ckpts = sorted(p.parent.name for p in (lake.root / "checkpoints").glob("step=*/policy"))
    assert ckpts == ["step=1", "step=3", "step=4"]  # every 2 steps and the last, not every step
    assert (lake.root / "checkpoints" / "step=4" / "policy" / "tokenizer.json").exists()
    assert read_info(lake) is None  # the run is complete: the worker exited


def test_a_killed_worker_resumes_from_the_checkpoint_with_a_consistent_lake(lake):
    assert main(["--lake", str(lake.root), *TRAIN, "--steps", "3", "--max-steps", "6"]) == 0
    first = read_info(lake)
    os.kill(int(first["pid"]), signal.SIGKILL)  # checkpoint at step 1; step 2 existed only in its memory
    time.sleep(0.5)
    assert main(["--lake", str(lake.root), *TRAIN, "--steps", "5"]) == 0
    rows = metrics(lake)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert {r["worker_pid"] for r in rows[:2]} == {first["pid"]}
    assert {r["worker_pid"] for r in rows[2:]} != {first["pid"]}  # step 2 was redone by the new worker
    archived = list((lake.root / "archive").glob("resident-restart-from-step1-*/rollouts/step=2"))
    assert archived, "the dead worker's step 2 was archived, not mixed"
    st = status(lake)
    assert st["consistent"] and st["halted"] is None


def test_a_rewind_makes_the_live_worker_reload_the_policy_it_goes_back_to(lake, capsys):
    """The worker outlives `envsched train`; after `envsched rewind --to 2` it used to train step 2
    again on its in-memory policy, which had already learned from steps 2 and 3. It now reloads the
    checkpoint after step 1, and the redone step 2 repeats the first one's rollouts."""
    assert main(["--lake", str(lake.root), *TRAIN, "--steps", "4", "--max-steps", "6"]) == 0
    pid = read_info(lake)["pid"]
    key = ["task_id", "rollout"]
    first = (
        lake.read("rollouts", step=2).sort_by([(k, "ascending") for k in key]).column("reward").to_pylist()
    )
    assert main(["--lake", str(lake.root), "rewind", "--to", "2"]) == 0
    assert "rewound to step 2: steps 2..3 moved to" in capsys.readouterr().out
    assert main(["--lake", str(lake.root), *TRAIN, "--steps", "4"]) == 0
    rows = metrics(lake)
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and {r["worker_pid"] for r in rows} == {pid}
    assert [r["model_loads"] for r in rows] == [1, 1, 2, 2]  # reloaded once, at the redone step 2
    again = (
        lake.read("rollouts", step=2).sort_by([(k, "ascending") for k in key]).column("reward").to_pylist()
    )
    assert again == first


def test_the_neural_learner_runs_resident_with_the_results_of_one_process_per_step(tmp_path, monkeypatch):
    """`--policy neural --resident`: one worker keeps the learner (its torch model, optimizer and
    environment processes) across steps, loaded once, and every step's numbers equal those of the
    one-process-per-step run: rewards, loss, held-out, the checkpoint's digest (so one the lake drops
    is made again from a kept one). Resumed with another learning rate (`--allow-config-change`),
    the live worker reloads the policy with it, as a new process per step does (it trained on with
    the settings it was built with)."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    base = ["train", "--pool", "mini", "--policy", "neural", "--batch-size", "2", "--group-size", "2"]
    lakes = {}
    for mode in ("resident", "per-step"):
        root = tmp_path / mode
        pool = ["pool", "create", "synthetic", "--name", "mini", "--envs", "2", "--tasks-per-env", "3"]
        assert main(["--lake", str(root), *pool]) == 0
        extra = ["--resident"] if mode == "resident" else []
        assert main(["--lake", str(root), *base, *extra, "--steps", "2", "--max-steps", "3"]) == 0
        again = ["--steps", "3", "--allow-config-change", "--lr", "0.002"]
        assert main(["--lake", str(root), *base, *extra, *again]) == 0
        lakes[mode] = Lake(root)
    rows = (
        lakes["resident"]
        .sql("select model_loads, worker_pid, lr from train_metrics order by step")
        .to_pylist()
    )
    assert [r["model_loads"] for r in rows] == [1, 1, 2] and len({r["worker_pid"] for r in rows}) == 1
    assert [r["lr"] for r in rows][1:] == [3e-4, 0.002]
    assert read_info(lakes["resident"]) is None  # the run is complete: the worker exited
    for q in (
        "select step, task_id, rollout, reward from rollouts order by 1, 2, 3",
        "select step, loss::varchar as loss, grad_norm::varchar as g from train_metrics order by 1",  # NaN: text
        "select step, benchmark, score from evals order by 1, 2",
        "select step, checkpoint_digest from train_metrics order by 1",
    ):
        assert lakes["resident"].sql(q).to_pylist() == lakes["per-step"].sql(q).to_pylist(), q
    # a checkpoint the worker wrote, once dropped, is made again as it was (trainer.remake)
    lakes["resident"].delete("checkpoints/step=1")
    assert remake(lakes["resident"], 1, log=lambda *_: None)["remade"] == [1]


def test_a_run_made_longer_keeps_its_worker_and_checkpoint_cadence(lake):
    """`envsched train --steps 4` after a run of 3 steps: the live worker reads the run's new length
    (it used to keep the one it started with, so it checkpointed at the old last step and exited
    there, and the next step paid a new worker's load)."""
    assert main(["--lake", str(lake.root), *TRAIN, "--steps", "2", "--max-steps", "3"]) == 0
    assert main(["--lake", str(lake.root), *TRAIN, "--steps", "4"]) == 0
    rows = metrics(lake)
    assert [r["model_loads"] for r in rows] == [1, 1, 1, 1] and len({r["worker_pid"] for r in rows}) == 1
    ckpts = sorted(p.parent.name for p in (lake.root / "checkpoints").glob("step=*/policy"))
    assert ckpts == ["step=1", "step=3"]  # every 2 steps and the run's last, not the old last (step 2)


def test_a_halted_run_lets_its_worker_go_unless_it_holds_unsaved_steps(tmp_path):
    """The worker leaves a halted run (freeing its memory until a resume) when the lake holds all it
    does: no policy in memory, or a language model whose newest step is checkpointed. One trained
    past its newest checkpoint (every `checkpoint_every` steps) stays: leaving would cost a resume
    the steps since, redone from that checkpoint. The neural learner checkpoints every step."""
    lake = Lake(tmp_path / "lake")
    import_pool(lake, load_synthetic("mini", n_envs=2, tasks_per_env=3, seed=0))
    start_run(lake, RunSpec(pool="mini", policy="hf-tiny", batch_size=2, group_size=2, max_steps=10))
    meta = checkpoint_dirs(lake)[1] / "step=1" / "policy" / "trainer.json"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"step": 1}))  # the newest checkpoint: after step 1
    worker = Worker(lake)
    worker.session = object()  # a policy in memory, after step 2 (trained past the checkpoint)
    worker.next_step = 3
    assert not worker._halted_with_nothing_unsaved()  # the run goes on: the worker waits for it
    halt(lake, 3, "rollouts_are_valid", ["a check failed"])
    assert not worker._halted_with_nothing_unsaved()  # halted, but step 2 is only in memory
    worker.next_step = 2  # the policy in memory is the checkpointed one
    assert worker._halted_with_nothing_unsaved()
    worker.session, worker.next_step = None, None  # nothing in memory (a step failed, say)
    assert worker._halted_with_nothing_unsaved()
    worker.session, worker.next_step = object(), 3
    worker.spec = RunSpec(pool="mini", policy="neural")  # a checkpoint every step
    assert worker._halted_with_nothing_unsaved()
    resume(lake)
    assert not worker._halted_with_nothing_unsaved()
