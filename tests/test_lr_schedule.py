"""The learning rate over a run: a warmup, then constant or a linear or cosine decay to a floor,
each step's rate a function of the step alone (a resumed or longer run keeps the rates it had)."""

import math

import pytest

from envs.registry import load_synthetic
from envsched_pipeline.cli import main
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.core.select import select_manifest
from envsched_pipeline.core.statistics import statistics_step
from envsched_pipeline.errors import ConfigError
from envsched_pipeline.lake import Lake
from envsched_pipeline.run import PolicyConfig, RunSpec, load_run, start_run
from trainer.remake import remake
from trainer.step import run_step


def test_a_step_warms_up_then_decays_to_its_floor_and_stays_there():
    cosine = PolicyConfig(
        lr=2.0, lr_warmup_steps=4, lr_schedule="cosine", lr_decay_steps=12, lr_min_ratio=0.25
    )
    rates = [cosine.lr_at(t, base=99.0) for t in range(16)]  # lr, when set, is the run's own rate
    assert rates[:4] == [0.5, 1.0, 1.5, 2.0]  # the warmup climbs to lr in its last step
    assert rates[4] == 2.0  # the decay starts from lr where the warmup ends
    assert rates[8] == pytest.approx(2.0 * (0.25 + 0.75 / 2))  # half way: half way to the floor
    assert rates[6] == pytest.approx(2.0 * (0.25 + 0.75 * (1 + math.cos(math.pi / 4)) / 2))
    assert rates[12:] == [0.5] * 4  # the floor from lr_decay_steps on, however long the run goes
    assert all(a > b for a, b in zip(rates[4:12], rates[5:13], strict=True))

    linear = PolicyConfig(lr_schedule="linear", lr_decay_steps=4, lr_min_ratio=0.0)
    assert [linear.lr_at(t, base=1.0) for t in range(6)] == [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
    # the floor a decay ends at when none is given
    assert PolicyConfig(lr_schedule="linear", lr_decay_steps=2).lr_at(5, base=1.0) == pytest.approx(0.1)
    # the default: the trainer's own rate at every step; a warmup alone then stays at lr
    assert {PolicyConfig().lr_at(t, base=3e-4) for t in range(50)} == {3e-4}
    assert [PolicyConfig(lr_warmup_steps=2).lr_at(t, base=1.0) for t in range(4)] == [0.5, 1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"lr_decay_steps": 5}, "policy_config.lr_decay_steps is used only by a decaying schedule"),
        ({"lr_min_ratio": 0.5}, "policy_config.lr_min_ratio is used only by a decaying schedule"),
        (
            {"lr_schedule": "cosine", "lr_warmup_steps": 6, "lr_decay_steps": 6},
            r"policy_config.lr_decay_steps: 6 must be more than lr_warmup_steps \(6\)",
        ),
        ({"lr_schedule": "step"}, "policy_config.lr_schedule: 'step' is not one of constant, linear, cosine"),
        (
            {"lr_schedule": "linear", "lr_min_ratio": 1.5},
            r"policy_config.lr_min_ratio: 1.5 must be .* \[0, 1\]",
        ),
        ({"lr_warmup_steps": -1}, r"policy_config.lr_warmup_steps: -1 must be"),
    ],
)
def test_schedule_settings_are_checked_together(settings, message):
    with pytest.raises(ConfigError, match=message):
        PolicyConfig(**settings).validate("neural")


def test_a_refused_schedule_names_the_setting_and_writes_nothing(tmp_path, capsys):
    lake = tmp_path / "lake"
    cases = [
        # the run's length is the decay's when none is given: a warmup as long refuses it
        (
            ["--policy", "neural", "--steps", "5", "--lr-schedule", "cosine", "--lr-warmup-steps", "5"],
            "policy_config.lr_decay_steps: 5 must be more than lr_warmup_steps (5)",
        ),
        (["--policy", "neural", "--lr-decay-steps", "9"], "policy_config.lr_decay_steps is used only by"),
        (["--lr-schedule", "cosine"], "policy 'simulated' does not use lr_schedule"),
        (["--policy", "hf-tiny", "--lr-schedule", "exp"], "argument --lr-schedule: invalid choice: 'exp'"),
    ]
    for flags, message in cases:
        assert main(["--lake", str(lake), "train", *flags]) == 2
        err = capsys.readouterr().err
        assert message in err, err
        assert not lake.exists()


def test_a_neural_run_trains_each_step_at_its_scheduled_rate_and_a_longer_run_keeps_them(tmp_path, capsys):
    lake = Lake(tmp_path / "lake")
    import_pool(lake, load_synthetic("synthetic", n_envs=3, tasks_per_env=4, heldout_per_env=1, seed=5))
    schedule = {"lr": 1e-3, "lr_warmup_steps": 2, "lr_schedule": "cosine", "lr_min_ratio": 0.2}
    asked = RunSpec(
        pool="synthetic",
        policy="neural",
        batch_size=4,
        group_size=4,
        max_steps=4,
        policy_config={**schedule, "warm_start_steps": 5, "eval_every": 0},
    )
    spec = start_run(lake, asked)
    # the decay's length is stated when the run starts: the run's max_steps
    assert spec.policy_config["lr_decay_steps"] == 4 == load_run(lake).policy_config["lr_decay_steps"]

    def train(steps):
        for t in steps:
            select_manifest(lake, t)
            run_step(lake, t, log=lambda *_: None)
            statistics_step(lake, t)

    train(range(2))
    # made longer (as `envsched train --steps 5` asks: the run's own policy config, a new max_steps)
    longer = start_run(lake, RunSpec(**{**load_run(lake).to_dict(), "max_steps": 5}))
    assert longer.max_steps == 5 and longer.policy_config["lr_decay_steps"] == 4
    train(range(2, 5))
    got = lake.sql("select step, lr from train_metrics order by step").to_pylist()
    half = 1e-3 * (0.2 + 0.8 * 0.5)  # step 3: half way from the warmup's end (2) to the floor (4)
    want = [5e-4, 1e-3, 1e-3, half, 2e-4]  # step 4, past the decay's end: the floor
    assert [r["step"] for r in got] == list(range(5))
    assert [r["lr"] for r in got] == pytest.approx(want, rel=1e-9)
    # a checkpoint the lake no longer keeps is made again at the rates its steps had: step 3's (half
    # way down the decay) must repeat for the digest its step recorded to match
    assert set(lake.artifact_steps("checkpoints")) == {0, 3, 4}
    lake.delete("checkpoints/step=3")
    assert remake(lake, 3, log=lambda *_: None)["remade"] == [1, 2, 3]
    # `envsched status` names the run's policy settings, the stated decay among them
    capsys.readouterr()
    assert main(["--lake", str(lake.root), "status"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("  policy settings: "))
    assert "lr=0.001, lr_decay_steps=4, lr_min_ratio=0.2, lr_schedule=cosine, lr_warmup_steps=2" in line
