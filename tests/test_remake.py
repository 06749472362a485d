"""A policy checkpoint the lake no longer keeps (the simulated and neural learners keep step 0's,
every KEEP_EVERY-th and the newest two) is made again from the kept one before it, each step
checked against the checkpoint digest it recorded; `envsched rewind` does it before anything
moves, so a run goes back to any step as it went back to any scheduler state."""

import hashlib

import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute
import pytest

import envsched_pipeline.lake as lake_module
from envs.registry import load_synthetic
from envsched_pipeline.cli import main
from envsched_pipeline.core.gates import rewind
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.errors import StepError
from envsched_pipeline.lake import Lake
from envsched_pipeline.run import REMADE_CHECKPOINTS, RunSpec, start_run
from tests.test_report import neural_run
from tests.test_state_keep import one_step
from trainer.remake import _redo, remake

STEPS = 11
BY_STEP = [("step", "ascending"), ("task_id", "ascending"), ("rollout", "ascending")]
DONE = ["step", "task_id", "rollout", "reward", "checks_passed", "tool_calls", "error_class"]


def done(lake: Lake) -> list[dict]:
    """What the run's rollouts did (not how long they took)."""
    return lake.read("rollouts", columns=DONE).sort_by(BY_STEP).to_pylist()


def simulated_run(lake: Lake) -> Lake:
    spec = RunSpec(
        pool="synthetic", scheduler="envsched", seed=3, batch_size=10, group_size=4, max_steps=STEPS
    )
    start_run(lake, spec)
    for t in range(STEPS):
        one_step(lake, t)
    return lake


def recorded(lake: Lake, step: int) -> str:
    return lake.read("train_metrics", step=step).to_pylist()[0]["checkpoint_digest"]


@pytest.fixture
def two_runs(small_pool, tmp_path, monkeypatch):
    """The same run twice: one keeping every checkpoint, one keeping step 0's, every 4th and the
    newest two."""
    monkeypatch.setattr(lake_module, "KEEP_EVERY", 1)
    every = Lake(tmp_path / "every")
    import_pool(every, load_synthetic("synthetic", **small_pool_kwargs()))
    simulated_run(every)
    monkeypatch.setattr(lake_module, "KEEP_EVERY", 4)
    return simulated_run(small_pool), every


def small_pool_kwargs() -> dict:
    from tests.conftest import SMALL  # the pool the small_pool fixture imports

    return SMALL


def test_a_dropped_simulated_checkpoint_is_made_again_as_it_was(two_runs, dagster_home, capsys):
    lake, every = two_runs
    assert set(lake.artifact_steps("checkpoints")) == {0, 3, 7, 9, 10}
    assert set(every.artifact_steps("checkpoints")) == set(range(STEPS))
    out = remake(lake, 5, log=lambda *_: None)
    assert out["from"] == 3 and out["remade"] == [4, 5]
    made = lake.read_bytes("checkpoints/step=5/policy.json")
    assert made == every.read_bytes("checkpoints/step=5/policy.json")  # the one the step wrote
    assert hashlib.sha256(made).hexdigest() == recorded(lake, 5)
    assert remake(lake, 5)["remade"] == []  # kept now: nothing to do
    lake.delete("checkpoints/step=5")

    # `envsched rewind` makes it again (the trainer's own process) and the redo is the first run
    first = done(lake)
    assert main(["--lake", str(lake.root), "rewind", "--to", "6"]) == 0
    said = capsys.readouterr().out
    assert "making the policy after step 5 again from step 3's checkpoint (2 steps)" in said
    assert "step 5: the checkpoint made again matches (2/2)" in said and "rewound to step 6" in said
    assert lake.read_bytes("checkpoints/step=5/policy.json") == made
    for t in range(6, STEPS):
        one_step(lake, t)
    assert done(lake) == first
    assert set(lake.artifact_steps("checkpoints")) == {0, 3, 7, 9, 10}  # the same ones kept again


def test_a_checkpoint_that_does_not_come_out_as_recorded_is_refused_and_the_rewind_moves_nothing(
    two_runs, dagster_home, capsys
):
    lake, _ = two_runs
    held = lake.steps("manifests")
    kept = lake.read_bytes("checkpoints/step=3/policy.json")
    lake.write_bytes("checkpoints/step=3/policy.json", kept.replace(b'"version": 4', b'"version": 40'))
    with pytest.raises(
        StepError, match=r"step 4 done again from step 3's policy does not give the checkpoint"
    ):
        remake(lake, 5)
    assert lake.read_bytes("checkpoints/step=5/policy.json") is None
    with pytest.raises(
        StepError,
        match=r"the policy after step 5 is not on disk and cannot be made again \(step 4 done again .*\); "
        r"rewind to a step after one that is: 0, 1, 4, 8, 10",
    ):
        rewind(lake, 6, remake=lambda k: remake(lake, k))
    assert lake.steps("manifests") == held and lake.read_bytes("checkpoints/step=5/policy.json") is None
    capsys.readouterr()  # the same refusal from `envsched rewind`, the remake in the trainer's process
    assert main(["--lake", str(lake.root), "rewind", "--to", "6"]) == 2
    assert (
        "the policy after step 5 is not on disk and cannot be made again (step 4 done again from step "
        "3's policy does not give the checkpoint it wrote the first time"
    ) in capsys.readouterr().err
    assert lake.steps("manifests") == held and lake.read_bytes("checkpoints/step=5/policy.json") is None

    lake.write_bytes("checkpoints/step=3/policy.json", kept)
    metrics = lake.read("train_metrics", step=4)
    lake.write("train_metrics", metrics.drop_columns(["checkpoint_digest"]), step=4)  # before digests
    with pytest.raises(StepError, match=r"train_metrics\[4\] records no checkpoint_digest"):
        remake(lake, 5)
    lake.write("train_metrics", metrics, step=4)
    tasks = lake.read("tasks", pool="synthetic")
    step4 = set(lake.read("manifests", step=4).column("task_id").to_pylist())
    picked = next(t for t in lake.read("manifests", step=5).column("task_id").to_pylist() if t not in step4)
    lake.write("tasks", tasks.filter(pa.compute.not_equal(tasks["task_id"], picked)), pool="synthetic")
    with pytest.raises(
        StepError, match=rf"1 task\(s\) of step 5 are no longer in pool 'synthetic' \(first: '{picked}'"
    ):
        remake(lake, 5)  # the pool imported again without a task step 5 trained on
    lake.write("tasks", tasks, pool="synthetic")
    rows = lake.read("rollouts", step=4).to_pylist()[1:]
    lake.write("rollouts", pa.Table.from_pylist(rows), step=4)  # a rollout lost
    with pytest.raises(StepError, match=r"rollouts of step 4 lack 1 of the manifest's rollouts"):
        remake(lake, 5)


def test_a_dropped_neural_checkpoint_is_made_again_by_running_its_steps_again(tmp_path, monkeypatch):
    """The neural learner's steps are seeded: run again from the kept checkpoint, each gives the
    weights and optimizer state its step recorded."""
    monkeypatch.setattr(lake_module, "KEEP_EVERY", 3)
    lake = neural_run(tmp_path / "lake", "envsched", steps=6)
    assert set(lake.artifact_steps("checkpoints")) == {0, 2, 4, 5}
    first, digests = done(lake), [recorded(lake, t) for t in range(6)]
    said = []
    out = remake(lake, 3, log=said.append)
    assert (
        out["from"] == 2
        and out["remade"] == [3]
        and "  step 3: the checkpoint made again matches (1/1)" in said
    )
    lake.delete("checkpoints/step=3")
    rewind(lake, 4, remake=lambda k: remake(lake, k, log=lambda *_: None))
    for t in (4, 5):
        one_step(lake, t)
    assert done(lake) == first and [recorded(lake, t) for t in range(6)] == digests
    # a setting changed behind the run's back: the refusal says whether the rollouts or the update moved
    run = lake.read_json("run.json")
    for setting, value, differs in (
        ("temperature", 0.5, r"\d+ of its 16 rollouts earned other rewards than it recorded"),
        ("lr", 0.01, r"its rollouts earned the rewards it recorded, and the update differs"),
    ):
        lake.write_json("run.json", {**run, "policy_config": {**run["policy_config"], setting: value}})
        with pytest.raises(StepError, match=rf"step 3 done again .*train_metrics\[3\]; {differs}"):
            remake(lake, 3)


def test_a_checkpoint_made_again_across_a_settings_change_uses_each_steps_settings(small_pool, monkeypatch):
    """A run resumed with other policy settings (`--allow-config-change`, from step 6): the steps
    before the change are done again with the settings they were trained with."""
    monkeypatch.setattr(lake_module, "KEEP_EVERY", 4)
    lake = small_pool
    spec = RunSpec(pool="synthetic", seed=3, batch_size=10, group_size=4, max_steps=STEPS)
    start_run(lake, spec)
    for t in range(6):
        one_step(lake, t)
    changed = RunSpec(**{**spec.to_dict(), "policy_config": {"skill_lr": 0.09}})
    start_run(lake, changed, allow_config_change=True)
    for t in range(6, STEPS):
        one_step(lake, t)
    assert set(lake.artifact_steps("checkpoints")) == {0, 3, 7, 9, 10}
    out = remake(lake, 6, log=lambda *_: None)
    assert out["from"] == 3 and out["remade"] == [4, 5, 6]
    assert hashlib.sha256(lake.read_bytes("checkpoints/step=6/policy.json")).hexdigest() == recorded(lake, 6)
    assert b'"skill_lr": 0.09' in lake.read_bytes("checkpoints/step=6/policy.json")


def test_every_learner_whose_checkpoints_the_lake_drops_can_have_one_made_again():
    assert set(_redo) == set(REMADE_CHECKPOINTS)
