"""The sampler correction of the language-model trainer: the engines report the log-probability
of each token they drew, the agent loop keeps it beside the token, and the update weighs each
token by how much more (or less) likely its own policy finds it than the sampler did (truncated
importance sampling, or tokens outside a band masked), and reports how far apart the two were.
The trainer's log-probabilities are those of the distribution the rollouts sample from (the
temperature applied), so on one machine and one precision the two agree to float rounding."""

import math

import numpy as np
import pyarrow as pa
import pytest
import torch

from envs.registry import episode_spec, load_synthetic
from envs.sandbox import SandboxPool
from envsched_pipeline.cli import main
from envsched_pipeline.cli.train import header, row, training_columns
from envsched_pipeline.core.loop import SAMPLER_CORRECTED_WARN, sampler_drift
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.lake import Lake
from envsched_pipeline.run import PolicyConfig, RunSpec, start_run
from tests.gradients import GradientTaker, assert_scaled
from trainer import engines as sampler_mod
from trainer import policy_step
from trainer.agent import AgentLoop, Episode
from trainer.engines import HFEngine, ScriptedEngine, sampled_logprobs
from trainer.loss import sampler_weights
from trainer.model import qwen3_tokenizer, tiny_qwen3
from trainer.update import GRPOConfig, GRPOTrainer


@pytest.fixture(scope="module")
def tok():
    return qwen3_tokenizer()


def test_the_weights_truncate_mask_or_leave_a_token_and_count_what_they_did():
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0, 1.0, 1.0]])
    trainer = torch.tensor([[0.0, -1.0, -1.0, -1.0, -1.0, -1.0]])
    # the sampler found these tokens e^0, e^-2 (4x less likely: weight e^2), e^+2, unknown, e^-0.5
    sampler = torch.tensor([[5.0, -1.0, -3.0, 1.0, math.nan, -1.5]])
    w, st = sampler_weights(trainer, sampler, mask, "truncate", 2.0)
    assert w[0].tolist() == pytest.approx([1.0, 1.0, 2.0, math.exp(-2.0), 1.0, math.exp(0.5)])
    assert (st["tokens"], st["unknown_tokens"], st["corrected"]) == (4, 1, 1)  # position 0 is no policy token
    assert st["abs_diff"] == pytest.approx(0 + 2 + 2 + 0.5) and st["max_abs_diff"] == pytest.approx(2.0)
    d = np.array([0.0, 2.0, -2.0, 0.5])
    assert st["kl"] == pytest.approx(float(np.sum(np.exp(d) - d - 1)), rel=1e-5)
    assert st["weight"] == pytest.approx(1 + 2 + math.exp(-2) + math.exp(0.5), rel=1e-6)
    w, st = sampler_weights(trainer, sampler, mask, "mask", 2.0)  # outside [1/2, 2]: no gradient
    assert w[0].tolist() == pytest.approx([1.0, 1.0, 0.0, 0.0, 1.0, math.exp(0.5)])
    assert st["corrected"] == 2
    w, st = sampler_weights(trainer, sampler, mask, "off", 2.0)
    assert w.tolist() == [[1.0] * 6] and st["corrected"] == 0 and st["abs_diff"] == pytest.approx(4.5)
    with pytest.raises(ValueError, match="unknown sampler correction 'clip'"):
        sampler_weights(trainer, sampler, mask, "clip", 2.0)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_the_hf_engine_reports_the_log_probabilities_the_trainer_computes(tok, temperature, monkeypatch):
    """The tokens ``sample`` draws are ``generate``'s, and their log-probabilities are the trainer's
    for the same tokens at the same temperature, to float rounding; the trainer at temperature 1
    (how it computed them before) is off by far more at 0.6."""
    model = tiny_qwen3(seed=1)
    prompts = [tok.encode("call the tool " * (k + 1), add_special_tokens=False) for k in range(3)]
    engine = HFEngine(model, tok, batch_size=3)
    engine.reseed(4)
    drawn = engine.sample(prompts, max_new_tokens=10, temperature=temperature)
    engine.reseed(4)
    kept = []
    real = sampler_mod._SampledLogprobs.__call__
    monkeypatch.setattr(sampler_mod._SampledLogprobs, "__call__", lambda *a: kept.append(1) or real(*a))
    assert engine.generate(prompts, max_new_tokens=10, temperature=temperature) == [t for t, _ in drawn]
    assert kept == []  # plain generation (`trainer.serve`) computes no log-probability
    assert all(len(t) == len(lp) > 0 and max(lp) <= 0 for t, lp in drawn)
    seqs = [p + t for p, (t, _) in zip(prompts, drawn, strict=True)]
    masks = [[0] * len(p) + [1] * len(t) for p, (t, _) in zip(prompts, drawn, strict=True)]
    logprobs = [[0.0] * len(p) + lp for p, (_, lp) in zip(prompts, drawn, strict=True)]
    gap = GRPOTrainer(model, tok, GRPOConfig(temperature=temperature, micro_batch=2)).sampler_gap(
        seqs, masks, logprobs
    )
    assert gap["sampler_logprob_diff_max"] < 1e-5 and gap["sampler_unknown_tokens"] == 0
    assert gap["sampler_corrected_fraction"] == 0.0 and gap["sampler_weight_mean"] == pytest.approx(1.0)
    at_one = GRPOTrainer(model, tok, GRPOConfig(temperature=1.0)).sampler_gap(seqs, masks, logprobs)
    if temperature != 1.0:
        assert at_one["sampler_logprob_diff"] > 1e-3


def _batch(tok):
    prompt = tok.encode(
        "<|im_start|>user\nsay yes<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    answers = [
        tok.encode(x + "<|im_end|>", add_special_tokens=False) for x in ("yes yes", "no", "yes", "no no")
    ]
    seqs = [prompt + a for a in answers]
    masks = [[0] * len(prompt) + [1] * len(a) for a in answers]
    return seqs, masks, np.array([1.0, 0.0, 1.0, 0.0])


def _gradients(tok, seqs, masks, rewards, sampler=None, **cfg) -> tuple[list[torch.Tensor], dict]:
    trainer = GRPOTrainer(tiny_qwen3(seed=0), tok, GRPOConfig(micro_batch=2, grad_clip=1e9, **cfg))
    trainer.optimizer = GradientTaker(trainer.model.parameters())
    metrics = trainer.update(seqs, masks, rewards, 2, sampler)
    return trainer.optimizer.grads, metrics


def test_the_update_weighs_each_token_by_the_sampler_correction(tok):
    """Every token drawn by a sampler that found it far less likely than the trainer does: truncated,
    each weighs the cap (the gradient doubles at cap 2); masked, none gives a gradient; off, or with
    no sampler log-probabilities, the gradient is the uncorrected one."""
    seqs, masks, rewards = _batch(tok)
    base, plain = _gradients(tok, seqs, masks, rewards)
    assert math.isnan(plain["sampler_logprob_diff"]) and plain["sampler_unknown_tokens"] == 0
    unlikely = [[-40.0] * len(q) for q in seqs]
    grads, m = _gradients(tok, seqs, masks, rewards, unlikely)
    assert_scaled(base, grads, 2.0)
    assert m["sampler_corrected_fraction"] == 1.0 and m["sampler_weight_mean"] == pytest.approx(2.0)
    assert m["sampler_logprob_diff"] > 20 and m["loss"] == pytest.approx(2 * plain["loss"], rel=1e-5)
    grads, m = _gradients(tok, seqs, masks, rewards, unlikely, sampler_cap=3.0)
    assert_scaled(base, grads, 3.0)
    grads, m = _gradients(tok, seqs, masks, rewards, unlikely, sampler_correction="mask")
    assert all(float(g.abs().max()) == 0.0 for g in grads) and m["sampler_weight_mean"] == 0.0
    grads, m = _gradients(tok, seqs, masks, rewards, unlikely, sampler_correction="off")
    assert_scaled(base, grads, 1.0)
    assert m["sampler_corrected_fraction"] == 0.0 and m["sampler_logprob_diff"] > 20  # still measured
    unknown = [[math.nan] * len(q) for q in seqs]
    grads, m = _gradients(tok, seqs, masks, rewards, unknown)
    assert_scaled(base, grads, 1.0)
    assert m["sampler_unknown_tokens"] == sum(map(sum, masks)) and math.isnan(m["sampler_logprob_diff"])
    with pytest.raises(ValueError, match=r"sampler_logprobs\[1\] has 2 values for a sequence of"):
        _gradients(tok, seqs, masks, rewards, [unknown[0], [0.0, 0.0], *unknown[2:]])


def test_one_epoch_takes_the_old_log_probabilities_from_its_training_pass(tok):
    """With one pass over the batch the update runs no pass of its own before training: the
    training pass's log-probabilities, detached, are the old ones. Its gradient, entropy and sampler
    numbers are those a separate pass before the update gives (two epochs compute one; the gradient
    taker leaves the weights as they were, so their second epoch repeats the first)."""
    seqs, masks, rewards = _batch(tok)
    drawn = [
        [-12.0 - 0.5 * (j % 3) for j in range(len(q))] for q in seqs
    ]  # about 1x, 1.8x, 2.9x: some past 2
    one, m1 = _gradients(tok, seqs, masks, rewards, drawn)
    two, m2 = _gradients(tok, seqs, masks, rewards, drawn, epochs=2)
    assert_scaled(one, two, 1.0)
    assert 0 < m1["sampler_corrected_fraction"] < 1
    for key in ("entropy", "sampler_logprob_diff", "sampler_corrected_fraction", "sampler_weight_mean"):
        assert m1[key] == pytest.approx(m2[key], rel=1e-6), key


def test_an_agent_loop_keeps_each_drawn_token_s_log_probability_beside_it(tok):
    """Real environments in the sandbox, the hf engine over several turns: the log-probabilities
    line up with the tokens (the policy's tokens have the sampler's, every other token 0), and an
    update of those episodes finds them where the trainer puts them. An engine that reports none
    (scripted) leaves NaN, which the update counts as unknown."""
    pool = load_synthetic("sc", n_envs=2, tasks_per_env=2, seed=3)
    envs = {e["env_id"]: e for e in pool.environments}
    tasks = pool.tasks[:2]
    model = tiny_qwen3(seed=2)
    engine = HFEngine(model, tok, batch_size=4)
    engine.reseed(5)
    loop = AgentLoop(engine, tok, max_actions=3, max_new_tokens=16, temperature=0.8)
    eps = [Episode(t["task_id"], r, None) for t in tasks for r in range(2)]
    with SandboxPool(workers=len(eps)) as sandbox:  # a session holds its worker to the end
        for e in eps:
            t = next(t for t in tasks if t["task_id"] == e.task_id)
            e.session = sandbox.session(episode_spec(envs[t["env_id"]], t))
        try:
            loop.run(eps)
        finally:
            for e in eps:
                e.session.close()
    for e in eps:
        assert len(e.logprobs) == len(e.ids) == len(e.mask) and e.generated_tokens > 0
        assert all(lp == 0.0 for lp, m in zip(e.logprobs, e.mask, strict=True) if not m)
        assert all(lp <= 0 and math.isfinite(lp) for lp, m in zip(e.logprobs, e.mask, strict=True) if m)
    trainer = GRPOTrainer(model, tok, GRPOConfig(temperature=0.8, micro_batch=2))
    m = trainer.update(
        [e.ids for e in eps],
        [e.mask for e in eps],
        np.array([1.0, 0.0, 0.0, 1.0]),
        2,
        [e.logprobs for e in eps],
    )
    assert m["trained_sequences"] == 4 and m["sampler_unknown_tokens"] == 0
    assert m["sampler_logprob_diff_max"] < 1e-4 and m["sampler_corrected_fraction"] == 0.0
    scripted = AgentLoop(ScriptedEngine(tok, [["done"]]), tok)
    ep = Episode("x", 0, one_turn_session())
    scripted.run([ep])
    assert len(ep.logprobs) == len(ep.ids) and all(
        math.isnan(ep.logprobs[j]) for j, m in enumerate(ep.mask) if m
    )


def test_a_language_model_step_trains_with_the_sampler_s_log_probabilities(tmp_path, monkeypatch):
    """A step of hf-tiny (agent loop, sandboxed environments, update) hands the update each
    episode's sampler log-probabilities: the step's metrics measure them on every trained token.
    A random-init model earns the same reward in every episode of a group, so the rewards are made
    to differ within each group (what is tested is what reaches the update, not the verifiers)."""
    lake = Lake(tmp_path / "lake")
    pool = load_synthetic("mini", n_envs=2, tasks_per_env=3, seed=1)
    import_pool(lake, pool)
    config = {"max_new_tokens": 8, "eval_every": 0, "temperature": 0.7, "sampler_correction": "mask"}
    spec = RunSpec(
        pool="mini", policy="hf-tiny", batch_size=2, group_size=2, max_steps=1, policy_config=config
    )
    start_run(lake, spec)
    tasks = pool.tasks[:2]
    manifest = pa.table({"task_id": [t["task_id"] for t in tasks], "env_id": [t["env_id"] for t in tasks]})
    monkeypatch.setattr(
        policy_step, "overrun_rewards", lambda verified, *_: np.tile([1.0, 0.0], len(verified) // 2)
    )
    out = policy_step.run_policy(lake, spec, 0, manifest, log=lambda *_: None)
    m = out["metrics"]
    assert m["sampler_unknown_tokens"] == 0 and m["sampler_logprob_diff_max"] < 1e-3
    assert m["sampler_corrected_fraction"] == 0.0 and m["grad_norm"] > 0


def one_turn_session():
    """A one-turn conversation with no tools (the scripted engine answers at once)."""

    class Session:
        def reset(self):
            return {"observation": "hello", "tools": []}

        def end_turn(self, content):
            return None

        def finish(self, answer):
            return {"reward": 0.0}

    return Session()


class _Logprob:
    def __init__(self, value):
        self.logprob = value


class _Completion:
    def __init__(self, token_ids, logprobs):
        self.token_ids, self.logprobs = token_ids, logprobs


def test_vllm_s_log_probabilities_are_read_for_the_tokens_it_drew():
    """``logprobs=0``: vLLM returns the drawn token's (a dict per position, keyed by token id); a
    position without one (or a completion without any) is unknown, not zero."""
    out = _Completion([7, 9, 11], [{7: _Logprob(-0.5)}, {9: _Logprob(-1.25), 3: _Logprob(-0.1)}, {}])
    tokens, logprobs = sampled_logprobs(out)
    assert tokens == [7, 9, 11] and logprobs[:2] == [-0.5, -1.25] and math.isnan(logprobs[2])
    tokens, logprobs = sampled_logprobs(_Completion([1, 2], None))
    assert tokens == [1, 2] and all(math.isnan(x) for x in logprobs)


def test_the_correction_is_a_setting_of_the_lm_policies_refused_by_name(tmp_path, capsys):
    spec = RunSpec(policy="hf-tiny", policy_config={"sampler_correction": "mask", "sampler_cap": 4.0})
    spec.validate()
    cfg = GRPOConfig.from_dict(spec.policy_settings().set_values())
    assert (cfg.sampler_correction, cfg.sampler_cap) == ("mask", 4.0)
    assert (GRPOConfig().sampler_correction, GRPOConfig().sampler_cap) == ("truncate", 2.0)
    with pytest.raises(ValueError, match="sampler_cap: must be > 1"):
        GRPOConfig(sampler_cap=1.0)
    with pytest.raises(ValueError, match="sampler_correction: 'clip' is not one of truncate, mask, off"):
        GRPOConfig(sampler_correction="clip")
    assert "sampler_correction" not in PolicyConfig.USED_BY["neural"]  # its sampler is its own policy
    for flags, message in (
        (["--sampler-cap", "1"], "policy_config.sampler_cap: 1.0 must be a number in (1, 1000]"),
        (["--sampler-correction", "clip"], "argument --sampler-correction: invalid choice"),
        (["--policy", "neural", "--sampler-cap", "3"], "policy 'neural' does not use sampler_cap"),
    ):
        lake = tmp_path / "lake"
        policy = [] if "--policy" in flags else ["--policy", "hf-tiny"]
        assert main(["--lake", str(lake), "train", *policy, *flags]) == 2
        assert message in capsys.readouterr().err
        assert not lake.exists()


def test_the_step_table_of_a_language_model_shows_its_sampler_gap():
    lm = training_columns(RunSpec(policy="hf-tiny"))
    assert lm[-1] == ("sampler_logprob_diff", "smp_gap") and header(lm).split()[-1] == "smp_gap"
    assert "smp_gap" not in header(training_columns(RunSpec(policy="neural")))
    printed = row({"step": 3, "seconds": 1.0, "sampler_logprob_diff": 7.7e-05}, training=lm).split()
    assert printed[0] == "3" and printed[-1] == "7.70e-05"
    assert (
        row({"step": 4, "sampler_logprob_diff": math.nan}, training=lm).split()[-1] == "-"
    )  # nothing trained


def test_a_step_whose_sampler_drifted_from_its_trainer_is_named(tmp_path):
    """The non-blocking check `sampler_matches_trainer` warns on a step whose correction changed more
    than 5% of the trained tokens; a step that measured nothing (another policy, nothing trained)
    passes."""
    lake = Lake(tmp_path / "lake")
    for step, fraction in ((0, 0.01), (1, 0.2), (2, math.nan)):
        row = {
            "step": step,
            "seconds": 1.0,
            "sampler_corrected_fraction": fraction,
            "sampler_logprob_diff": 0.3,
        }
        lake.write("train_metrics", [row], step=step)
    lake.write("train_metrics", [{"step": 3, "seconds": 1.0}], step=3)
    got = {s: sampler_drift(lake, s) for s in range(5)}
    assert [got[s]["drifting"] for s in range(5)] == [False, True, False, False, False]
    assert [got[s]["measured"] for s in range(5)] == [True, True, False, False, False]
    assert got[1]["sampler_corrected_fraction"] == 0.2 and got[1]["sampler_logprob_diff"] == 0.3
    assert SAMPLER_CORRECTED_WARN == 0.05
