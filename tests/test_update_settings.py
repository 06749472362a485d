"""The GRPO update's settings a run can set (clip ranges, clip-higher, KL, epochs, micro-batches,
weight decay, gradient clip): from `envsched train` flags or `--policy-config` to the trainer that
reads them, each one named where it is refused, every one documented."""

import dataclasses
import json
import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from envs.registry import load_synthetic
from envsched_pipeline.cli import build_parser, main
from envsched_pipeline.cli.train import requested_run
from envsched_pipeline.lake import Lake
from envsched_pipeline.run import LM_SETTINGS, PolicyConfig, RunSpec, load_run, resume_refusal, start_run
from tests.gradients import GradientTaker, assert_scaled
from trainer.loss import grpo_loss
from trainer.neural.learner import NeuralConfig, NeuralLearner
from trainer.update import GRPOConfig, GRPOTrainer, micro_batches

ROOT = Path(__file__).resolve().parents[1]


def test_clip_higher_lets_a_positive_advantage_past_the_lower_range():
    old = torch.zeros(1, 2)
    mask = torch.ones(1, 2)

    def grad(adv: float, **kw) -> tuple[float, float]:
        lp = torch.full((1, 2), math.log(1.25), requires_grad=True)  # every token's ratio is 1.25
        loss, st = grpo_loss(lp, old, torch.tensor([adv]), mask, clip_eps=0.2, **kw)
        loss.backward()
        return float(lp.grad.abs().sum()), st["clip_fraction"]

    # a positive advantage: past 1 + 0.2 the symmetric clip stops the gradient, clip-higher 0.28 does not
    assert grad(1.0) == (0.0, 1.0)
    g, frac = grad(1.0, clip_eps_high=0.28)
    assert g > 0 and frac == 0.0
    # a negative advantage is never clipped above (PPO's min takes the unclipped side): unchanged
    assert grad(-1.0)[0] == grad(-1.0, clip_eps_high=0.28)[0] > 0
    # below, the range stays clip_eps whatever the upper one
    lp = torch.full((1, 2), math.log(0.7), requires_grad=True)
    _, st = grpo_loss(lp, old, torch.tensor([-1.0]), mask, clip_eps=0.2, clip_eps_high=0.28)
    assert st["clip_fraction"] == 1.0


def test_the_neural_learner_trains_with_the_upper_clip_range_it_is_given():
    pool = load_synthetic("nn", n_envs=3, tasks_per_env=4, heldout_per_env=1, seed=5)
    envs = {e["env_id"]: e for e in pool.environments}
    infos, grads = {}, {}
    for high in (None, 0.3):
        lrn = NeuralLearner(envs, NeuralConfig(minibatches=1, grad_clip=1e9, clip_eps_high=high), seed=0)
        try:
            lrn.optimizer = GradientTaker(lrn.model.parameters())
            out = lrn.rollout(pool.tasks, 4, seed=7)
            for t in lrn.last["traces"]:  # as if every decision had been sampled 1.25 times less likely
                t.logp = [[x - math.log(1.25) for x in step] for step in t.logp]
            infos[high], grads[high] = lrn.learn(), lrn.optimizer.grads
        finally:
            lrn.close()
    assert (np.ptp(out["reward"].reshape(len(pool.tasks), 4), axis=1) > 1e-6).any()
    # every decision's ratio is 1.25: past the symmetric clip, inside clip-higher's 0.3
    assert infos[None]["clip_fraction"] == pytest.approx(1.0) and infos[0.3]["clip_fraction"] == 0.0
    # the positive advantages' decisions now give a gradient too
    assert any(not torch.allclose(a, b) for a, b in zip(grads[None], grads[0.3], strict=True))


def test_the_lm_trainer_trains_with_the_upper_clip_range_it_is_given():
    from trainer.model import qwen3_tokenizer, tiny_qwen3  # transformers: loaded for this test only

    tok = qwen3_tokenizer()
    prompt = tok.encode(
        "<|im_start|>user\nsay yes<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    good, bad = (tok.encode(x + "<|im_end|>", add_special_tokens=False) for x in ("yes yes", "no no no"))
    seqs = [prompt + good, prompt + bad]
    masks = [[0] * len(prompt) + [1] * (len(q) - len(prompt)) for q in seqs]
    got = {}
    for high in (None, 10.0):  # a second pass over the batch at a large rate moves the ratios past 1.2
        trainer = GRPOTrainer(
            tiny_qwen3(seed=0), tok, GRPOConfig(micro_batch=2, epochs=2, lr=0.05, clip_eps_high=high)
        )
        got[high] = trainer.update(seqs, masks, np.array([1.0, 0.0]), group_size=2)
    first, wide = got[None], got[10.0]
    assert first["epoch_losses"][0] == wide["epoch_losses"][0]  # the first pass: every ratio is 1
    assert first["epoch_losses"][1] != wide["epoch_losses"][1]  # the second: the upper clip differs
    assert wide["clip_fraction"] < first["clip_fraction"]


def test_the_update_s_memory_settings_leave_its_weights_as_they_were(monkeypatch):
    """Activation checkpointing runs each decoder layer again in the backward pass (its insides
    twice per training pass, not once) and a micro-batch of one accumulates the gradient over more
    passes; the gradient is that of the update with neither, to float rounding (and with
    checkpointing the weights too: a micro-batch's float rounding can flip Adam's first step on a
    weight whose gradient is next to nothing)."""
    from trainer.model import qwen3_tokenizer, tiny_qwen3  # transformers: loaded for this test only

    tok = qwen3_tokenizer()
    rng = np.random.default_rng(0)
    seqs = [[int(x) for x in rng.integers(10, 5000, size=int(rng.integers(8, 16)))] for _ in range(4)]
    masks = [[0] * 4 + [1] * (len(q) - 4) for q in seqs]
    weights, calls, grads = {}, {}, {}
    for kind, settings in {
        "plain": {"micro_batch": 4},
        "checkpointed": {"micro_batch": 4, "activation_checkpointing": True},
        "one at a time": {"micro_batch": 1},
    }.items():
        model = tiny_qwen3(seed=0)
        mlp, n = model.model.layers[0].mlp, []
        forward = type(mlp).forward

        def counted(self, *a, mlp=mlp, n=n, forward=forward, **kw):  # module hooks skip a recompute
            n.extend([1] if self is mlp else [])
            return forward(self, *a, **kw)

        monkeypatch.setattr(type(mlp), "forward", counted)
        trainer = GRPOTrainer(model, tok, GRPOConfig(lr=1e-3, **settings))
        trainer.update(seqs, masks, np.array([1.0, 0.0, 0.0, 1.0]), group_size=2)
        monkeypatch.undo()
        weights[kind], calls[kind] = model.state_dict(), len(n)
        grads[kind] = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    # one epoch: the training pass alone, which gives the old log-probs too (+ its recompute); one at
    # a time: 4 passes. A second epoch adds the pass before the update that keeps the old log-probs
    assert calls == {"plain": 1, "checkpointed": 2, "one at a time": 4}
    assert len(grads["plain"]) == len(list(model.parameters()))
    for kind in ("checkpointed", "one at a time"):
        assert grads[kind].keys() == grads["plain"].keys()
        assert all(torch.allclose(grads["plain"][k], g, rtol=1e-4, atol=1e-6) for k, g in grads[kind].items())
    assert all(torch.equal(weights["plain"][k], v) for k, v in weights["checkpointed"].items())


def test_micro_batches_hold_like_lengths_and_the_update_reports_its_padding():
    """Agent episodes' lengths vary by tens of times and a micro-batch is padded to its longest, so
    the update groups the shortest sequences together; the gradient is the one of a single
    micro-batch (to float rounding), and the step reports the share of padding it computed."""
    from trainer.model import qwen3_tokenizer, tiny_qwen3  # transformers: loaded for this test only

    lengths = [20, 200, 22, 210]
    assert micro_batches([0, 1, 2, 3], lengths, 2) == [[0, 2], [1, 3]]
    assert micro_batches([3, 1], lengths, 2) == [[1, 3]] and micro_batches([], lengths, 2) == []
    rng = np.random.default_rng(1)
    seqs = [[int(x) for x in rng.integers(10, 5000, size=n)] for n in lengths]
    masks = [[0] * 8 + [1] * (n - 8) for n in lengths]
    tok = qwen3_tokenizer()
    grads, got = {}, {}
    for size in (2, 4):
        trainer = GRPOTrainer(tiny_qwen3(seed=0), tok, GRPOConfig(micro_batch=size, grad_clip=1e9))
        trainer.optimizer = GradientTaker(trainer.model.parameters())
        got[size] = trainer.update(seqs, masks, np.array([1.0, 0.0, 0.0, 1.0]), group_size=2)
        grads[size] = trainer.optimizer.grads
    assert_scaled(grads[4], grads[2], 1.0)
    # [20, 22] padded to 22 and [200, 210] to 210: 12 of 464 positions (in arrival order 368 of 820)
    assert got[2]["padding_fraction"] == pytest.approx(12 / 464)
    assert got[4]["padding_fraction"] == pytest.approx(1 - 452 / 840)


def test_an_update_out_of_gpu_memory_names_the_memory_settings_and_a_resume_may_change_them(
    small_pool, monkeypatch
):
    """No GPU here: the update raises the out-of-memory error a GPU would (a stand-in for what
    cannot happen on a CPU); the step's error says which settings to change, and a resumed run may
    change them without --allow-config-change."""
    from envsched_pipeline.core.select import select_manifest  # the step needs its manifest
    from trainer.step import run_step

    spec = RunSpec(
        pool="synthetic",
        policy="hf-tiny",
        batch_size=2,
        group_size=2,
        max_steps=2,
        policy_config={"eval_every": 0, "max_new_tokens": 8},  # short turns: the update is what fails
    )
    start_run(small_pool, spec)
    select_manifest(small_pool, 0)

    def full(self, *a, **kw):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")

    monkeypatch.setattr(GRPOTrainer, "update", full)
    with pytest.raises(torch.OutOfMemoryError) as err:
        run_step(small_pool, 0)
    said = str(err.value)
    assert said.startswith("the GRPO update ran out of GPU memory at micro-batch 4 (sequences of up to ")
    assert "lower --micro-batch or add --activation-checkpointing and resume" in said
    assert said.endswith("CUDA out of memory. Tried to allocate 2.00 GiB")
    current = load_run(small_pool)
    for change in ({"micro_batch": 1}, {"activation_checkpointing": True}, {"lr": 1e-5}):
        asked = replace(current, policy_config={**current.policy_config, **change})
        refusal = resume_refusal(small_pool, current, asked)
        assert (refusal is None) == ("lr" not in change), (change, refusal)


def test_every_setting_a_policy_reads_reaches_its_trainer():
    """A name the run accepts but the trainer does not know would be dropped without a word."""
    own = {"workers", "resident", "model_path", "deepspeed", "lr_warmup_steps", "lr_schedule"}
    own |= {"lr_decay_steps", "lr_min_ratio", "eval_every", "eval_tasks", "eval_samples", "eval_temperature"}
    own |= {"overrun_penalty"}  # LM: the step's rewards (trainer/policy_step.py), not the update
    own |= {"keep_checkpoints"}  # LM: which checkpoints stay on disk (trainer/policy_step.py)
    own |= {"eval_patience"}  # the loop's: when the run stops early (core/gates.py), not the trainer's
    lm = set(LM_SETTINGS) - own  # read by GRPOConfig (trainer/update.py)
    assert lm <= {f.name for f in dataclasses.fields(GRPOConfig)}, lm - {
        f.name for f in dataclasses.fields(GRPOConfig)
    }
    neural = set(PolicyConfig.USED_BY["neural"]) - own  # read by NeuralConfig (trainer/neural)
    assert neural <= {f.name for f in dataclasses.fields(NeuralConfig)}
    given = {"clip_eps": 0.1, "clip_eps_high": 0.3, "kl_coef": 0.05, "epochs": 3, "micro_batch": 1}
    given |= {"aggregation": "seq-mean", "weight_decay": 0.01, "grad_clip": 0.5}
    cfg = GRPOConfig.from_dict(PolicyConfig(**given).set_values())
    assert {k: getattr(cfg, k) for k in given} == given
    neural_given = {
        "clip_eps": 0.1,
        "clip_eps_high": 0.3,
        "weight_decay": 0.01,
        "grad_clip": 0.5,
        "minibatches": 4,
    }
    n = NeuralConfig.from_dict(PolicyConfig(**neural_given).set_values())
    assert {k: getattr(n, k) for k in neural_given} == neural_given


def parsed(*flags):
    args = build_parser().parse_args(["train", *flags])
    return requested_run(args, None).policy_config


def test_policy_config_json_and_flags_merge_and_a_flag_wins(tmp_path):
    assert parsed(
        "--policy", "hf-tiny", "--policy-config", '{"epochs": 2, "micro_batch": 8}', "--micro-batch", "2"
    ) == {
        "epochs": 2,
        "micro_batch": 2,
    }
    f = tmp_path / "policy.json"
    f.write_text(json.dumps({"kl_coef": 0.05, "clip_eps_high": 0.28}))
    assert parsed("--policy", "hf-tiny", "--policy-config", f"@{f}", "--clip-eps", "0.15") == {
        "kl_coef": 0.05,
        "clip_eps_high": 0.28,
        "clip_eps": 0.15,
    }


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--policy", "neural", "--kl-coef", "0.1"], "policy 'neural' does not use kl_coef"),
        (
            ["--policy", "hf-tiny", "--clip-eps-high", "0.1"],
            "policy_config.clip_eps_high: 0.1 must be at least clip_eps (0.2)",
        ),
        (["--policy", "hf-tiny", "--micro-batch", "0"], "argument --micro-batch"),
        (
            ["--policy", "hf-tiny", "--policy-config", '{"aggregation": "sum"}'],
            "policy_config.aggregation: 'sum' is not one of",
        ),
        (
            ["--policy", "hf-tiny", "--policy-config", '{"epochs": 0}'],
            "policy_config.epochs: 0 must be a number in [1, 100]",
        ),
        (["--policy", "hf-tiny", "--policy-config", '{"momentum": 0.9}'], "policy_config: unknown"),
        (
            ["--policy", "openai", "--base-url", "http://127.0.0.1:9/v1", "--overrun-penalty", "0.1"],
            "policy 'openai' does not use overrun_penalty",  # it trains nothing
        ),
        (["--policy", "neural", "--policy-config", "@nowhere.json"], "--policy-config nowhere.json"),
        (["--policy", "neural", "--policy-config", "[1]"], "--policy-config"),
    ],
)
def test_a_bad_update_setting_is_refused_by_name_and_writes_nothing(tmp_path, capsys, flags, message):
    lake = tmp_path / "lake"
    assert main(["--lake", str(lake), "train", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not lake.exists()


def test_every_policy_setting_is_in_the_documented_table():
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text[text.index("## §7 The trained policy's settings") :]
    documented = set(re.findall(r"^\| `([a-z_]+)`", table, re.M)) | set(re.findall(r", `([a-z_]+)`", table))
    assert {f.name for f in dataclasses.fields(PolicyConfig)} <= documented, {
        f.name for f in dataclasses.fields(PolicyConfig)
    } - documented


def test_an_lm_episode_the_context_ended_trains_on_its_reward_less_the_overrun_penalty(tmp_path, capsys):
    """hf-tiny with a context that has no room for a turn: every episode ends before its first
    turn, verified as it stands (the synthetic checks give an untouched state partial credit); the
    step's rewards (what GRPO and the scheduler see) are the verifiers' less the penalty, floored at
    0, and each trajectory keeps the verifiers' reward."""
    lake = tmp_path / "lake"
    flags = ["--policy", "hf-tiny", "--batch-size", "2", "--group-size", "2", "--steps", "1", "--seed", "3"]
    flags += ["--max-context", "128", "--overrun-penalty", "0.25", "--eval-every", "0"]
    assert main(["--lake", str(lake), "train", *flags]) == 0, capsys.readouterr().err
    rows = Lake(lake).read("rollouts").to_pylist()
    verified = [json.loads(r["trajectory"])["verifier_reward"] for r in rows]
    assert len(rows) == 4 and all(r["truncated"] for r in rows)
    assert any(v > 0.25 for v in verified)  # the penalty shows (not floored away) somewhere
    assert [r["reward"] for r in rows] == pytest.approx([max(v - 0.25, 0.0) for v in verified])
