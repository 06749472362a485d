"""The GRPO trainer: math against hand-computed values, the Qwen3 format and tokenizer, the agent
loop on scripted model outputs, a real update with the tiny Qwen3, and a Pipes launch end to end."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from envs.registry import episode_spec, load_synthetic
from envs.sandbox import SandboxPool
from tests.gradients import GradientTaker, assert_scaled
from tests.procs import stop
from trainer.agent import AgentLoop, Episode
from trainer.chat import parse_assistant, render_assistant, render_system
from trainer.engines import ScriptedEngine
from trainer.grpo import group_advantages
from trainer.loss import grpo_loss, token_logprobs


@pytest.fixture(scope="module")
def tok():
    from trainer.model import qwen3_tokenizer

    return qwen3_tokenizer()


# ---------------------------------------------------------------------------- math
def test_loss_hand_computed_no_clip():
    lp = torch.tensor([[0.0, -1.0, -2.0], [0.0, -0.5, -0.5]])
    old = lp.clone()
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[0, 1, 1], [0, 1, 0]], dtype=torch.float32)
    loss, st = grpo_loss(lp, old, adv, mask)
    # ratio 1 everywhere: per-token loss = -A; token-mean over 3 tokens: (-1 - 1 + 1) / 3
    assert loss.item() == pytest.approx(-1 / 3)
    loss, _ = grpo_loss(lp, old, adv, mask, aggregation="seq-mean")
    assert loss.item() == pytest.approx((-1 + 1) / 2)
    assert st["clip_fraction"] == 0.0


def test_loss_clips_large_ratios():
    old = torch.zeros(1, 2)
    lp = torch.tensor([[math.log(2.0), math.log(0.5)]])
    mask = torch.ones(1, 2)
    pos, st = grpo_loss(lp, old, torch.tensor([1.0]), mask, clip_eps=0.2)
    # A > 0: min(r, clip(r)) -> 1.2 for r = 2, 0.5 for r = 0.5
    assert pos.item() == pytest.approx(-(1.2 + 0.5) / 2)
    neg, _ = grpo_loss(lp, old, torch.tensor([-1.0]), mask, clip_eps=0.2)
    # A < 0: min(-r, -clip(r)) -> -2 for r = 2, -0.8 for r = 0.5
    assert neg.item() == pytest.approx((2.0 + 0.8) / 2)
    assert st["clip_fraction"] == 1.0


def test_dual_clip_bounds_a_negative_advantage_and_survives_an_overflowing_ratio():
    old = torch.zeros(1, 3)
    lp = torch.tensor([[math.log(2.0), math.log(5.0), 200.0]], requires_grad=True)
    mask = torch.ones(1, 3)
    with pytest.raises(ValueError, match="dual_clip"):
        grpo_loss(lp, old, torch.tensor([-1.0]), mask, dual_clip=1.0)
    neg, st = grpo_loss(lp, old, torch.tensor([-1.0]), mask, clip_eps=0.2, dual_clip=3.0)
    # A < 0: max(min(-r, -clip(r)), -3) -> -2 for r = 2, -3 for r = 5 and for r = e^200
    assert neg.item() == pytest.approx((2.0 + 3.0 + 3.0) / 3)
    assert st["dual_clip_fraction"] == pytest.approx(2 / 3)
    neg.backward()
    # only the r = 2 token moves; the held ones give no gradient (and no NaN from exp(200))
    assert (
        torch.isfinite(lp.grad).all()
        and lp.grad[0, 0] == pytest.approx(2.0 / 3)
        and (lp.grad[0, 1:] == 0).all()
    )
    pos, _ = grpo_loss(lp.detach(), old, torch.tensor([1.0]), mask, clip_eps=0.2, dual_clip=3.0)
    assert pos.item() == pytest.approx(-1.2)  # A > 0 unchanged: min(r, clip(r)) = 1.2 for all three
    plain, _ = grpo_loss(lp.detach()[:, :2], old[:, :2], torch.tensor([-1.0]), mask[:, :2])
    assert plain.item() == pytest.approx((2.0 + 5.0) / 2)  # off by default: -r unbounded


def test_kl_term_is_zero_at_reference_and_positive_away():
    lp = torch.tensor([[0.0, -1.0]])
    m = torch.ones(1, 2)
    base, _ = grpo_loss(lp, lp, torch.tensor([0.0]), m, kl_coef=0.1, ref_logprobs=lp)
    assert base.item() == pytest.approx(0.0)
    away, st = grpo_loss(lp, lp, torch.tensor([0.0]), m, kl_coef=0.1, ref_logprobs=lp - 0.5)
    assert away.item() > 0 and st["kl"] > 0


def test_token_logprobs_shift():
    logits = torch.zeros(1, 3, 4)
    logits[0, 0, 2] = 10.0  # position 0 predicts token 2
    lp = token_logprobs(logits, torch.tensor([[1, 2, 3]]))
    assert lp[0, 0] == 0.0 and lp[0, 1] > -1e-3 and lp[0, 2] == pytest.approx(-math.log(4), abs=1e-5)


def test_group_advantages():
    adv = group_advantages(np.array([[1.0, 0.0], [0.5, 0.5]]))
    assert np.allclose(adv, [[1, -1], [0, 0]], atol=1e-4)


# ---------------------------------------------------------------------------- format
def test_tokenizer_has_qwen3_special_ids(tok):
    for name, want in (
        ("<|im_start|>", 151644),
        ("<|im_end|>", 151645),
        ("<tool_call>", 151657),
        ("<tool_response>", 151665),
        ("<think>", 151667),
    ):
        assert tok.convert_tokens_to_ids(name) == want
    ids = tok.encode("<tool_call>\n{}\n</tool_call>", add_special_tokens=False)
    assert ids[0] == 151657 and ids[-1] == 151658


def test_parse_think_tool_calls_and_errors():
    p = parse_assistant(
        '<think>plan</think>\nok <tool_call>\n{"name": "get_x", "arguments": {"a": 1}}\n</tool_call>'
        '<tool_call>{"name": "f", "arguments": "{\\"b\\": 2}"}</tool_call><|im_end|>'
    )
    assert p.think == "plan" and p.content == "ok"
    assert p.tool_calls == [{"name": "get_x", "arguments": {"a": 1}}, {"name": "f", "arguments": {"b": 2}}]
    bad = parse_assistant("<tool_call>{not json}</tool_call>")
    assert bad.tool_calls == [] and "not valid JSON" in bad.errors[0]
    assert parse_assistant("just an answer").tool_calls == []
    roundtrip = parse_assistant(render_assistant("x", [{"name": "g", "arguments": {"k": "v"}}], think="t"))
    assert roundtrip.tool_calls == [{"name": "g", "arguments": {"k": "v"}}] and roundtrip.think == "t"
    assert "<tools>" in render_system([{"type": "function", "function": {"name": "g"}}])


# ---------------------------------------------------------------------------- agent loop
@pytest.fixture(scope="module")
def pool_and_task():
    data = load_synthetic(n_envs=2, tasks_per_env=3, seed=5)
    envs = {e["env_id"]: e for e in data.environments}
    task = data.tasks[0]
    with SandboxPool(workers=2) as pool:
        yield pool, episode_spec(envs[task["env_id"]], task), json.loads(task["gold"])


def as_text(calls):
    return "".join(f"<tool_call>{json.dumps(c)}</tool_call>" for c in calls)


def test_agent_loop_gold_script_scores_one(tok, pool_and_task):
    pool, spec, gold = pool_and_task
    engine = ScriptedEngine(tok, [[as_text([c]) for c in gold] + ["<think>all done</think>Done."]])
    with pool.session(spec) as s:
        ep = AgentLoop(engine, tok).run([Episode("t", 0, s)])[0]
    assert ep.result["reward"] == 1.0 and ep.actions == len(gold) and not ep.truncated
    assert ep.answer == "Done."
    # the mask covers exactly the generated tokens
    gen = sum(
        len(tok.encode(x + "<|im_end|>", add_special_tokens=False))
        for x in engine.scripts[0][: len(gold) + 1]
    )
    assert ep.generated_tokens == gen
    assert [m["role"] for m in ep.messages[:3]] == ["system", "user", "assistant"]


def test_agent_loop_parse_errors_and_unknown_tools_are_observations(tok, pool_and_task):
    pool, spec, _ = pool_and_task
    engine = ScriptedEngine(
        tok,
        [["<tool_call>{oops</tool_call>", as_text([{"name": "teleport", "arguments": {}}]), "I give up."]],
    )
    with pool.session(spec) as s:
        ep = AgentLoop(engine, tok).run([Episode("t", 0, s)])[0]
    assert ep.parse_errors == 1 and ep.unknown_tools == 1 and ep.actions == 2
    tool_msgs = [m["content"] for m in ep.messages if m["role"] == "tool"]
    assert "not valid JSON" in tool_msgs[0] and "unknown tool" in tool_msgs[1]
    assert ep.done and ep.result["reward"] < 1.0


def test_agent_loop_action_limit(tok, pool_and_task):
    pool, spec, gold = pool_and_task
    engine = ScriptedEngine(tok, [[as_text([gold[0]])] * 50])
    with pool.session(spec) as s:
        ep = AgentLoop(engine, tok, max_actions=5).run([Episode("t", 0, s)])[0]
    assert ep.truncated and ep.actions == 5 and ep.done


def test_agent_loop_multi_turn_bfcl(tok):
    from envs.registry import load_pool

    data = load_pool("bfcl", categories=("multi_turn_base",))
    envs = {e["env_id"]: e for e in data.environments}
    t = data.tasks[0]
    gold_turns = json.loads(t["gold"])
    script = []
    for turn in gold_turns:
        script += [as_text([c]) for c in turn] + ["Done with this request."]
    engine = ScriptedEngine(tok, [script])
    with SandboxPool(workers=1) as pool, pool.session(episode_spec(envs[t["env_id"]], t)) as s:
        ep = AgentLoop(engine, tok).run([Episode(t["task_id"], 0, s)])[0]
    assert ep.turns == len(gold_turns) and ep.result["reward"] == 1.0


# ---------------------------------------------------------------------------- the update
def test_tiny_qwen3_update_lowers_the_loss(tok):
    from trainer.model import tiny_qwen3
    from trainer.update import GRPOConfig, GRPOTrainer

    model = tiny_qwen3(seed=0)
    assert model.config.vocab_size >= 151669 and model.config.model_type == "qwen3"
    trainer = GRPOTrainer(model, tok, GRPOConfig(lr=3e-3, epochs=6, micro_batch=2))
    prompt = tok.encode(
        "<|im_start|>user\nsay yes<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    good = tok.encode("yes yes<|im_end|>", add_special_tokens=False)
    bad = tok.encode("no no<|im_end|>", add_special_tokens=False)
    seqs = [prompt + good, prompt + bad] * 2
    masks = [[0] * len(prompt) + [1] * len(good), [0] * len(prompt) + [1] * len(bad)] * 2
    rewards = np.array([1.0, 0.0, 1.0, 0.0])

    def margin():
        ids, att, _ = trainer._pad([seqs[0], seqs[1]], [masks[0], masks[1]])
        with torch.no_grad():
            lp = trainer._logprobs(model, ids, att)
        m = torch.tensor([masks[0], masks[1]], dtype=torch.float32)
        return float((lp[0] * m[0]).sum() - (lp[1] * m[1]).sum())

    before = margin()
    m = trainer.update(seqs, masks, rewards, group_size=2)
    assert m["trained_sequences"] == 4 and m["grad_norm"] > 0
    assert m["epoch_losses"][-1] < m["epoch_losses"][0]  # the surrogate loss falls within the step
    for _ in range(3):
        trainer.update(seqs, masks, rewards, group_size=2)
    assert margin() > before + 0.5  # the rewarded answer became more likely
    zero = trainer.update(seqs, masks, np.array([0.5, 0.5, 0.5, 0.5]), group_size=2)
    assert zero["trained_sequences"] == 0  # zero-variance groups: no gradient, no compute


def test_a_checkpoints_optimizer_loads_with_the_trainers_own_learning_rate(tok, tmp_path):
    """The saved optimizer state carries the learning rate and weight decay it ran with; a run
    resumed with other ones (`--allow-config-change`) trains with those it asked for."""
    from trainer.model import tiny_qwen3
    from trainer.update import GRPOConfig, GRPOTrainer

    old = GRPOTrainer(tiny_qwen3(seed=0), tok, GRPOConfig(lr=1e-3, weight_decay=0.0))
    old.save(tmp_path / "ckpt", step=3)
    new = GRPOTrainer(tiny_qwen3(seed=0), tok, GRPOConfig(lr=5e-3, weight_decay=0.01))
    new.load_optimizer(tmp_path / "ckpt")
    assert [(g["lr"], g["weight_decay"]) for g in new.optimizer.param_groups] == [(5e-3, 0.01)]


def test_the_loss_can_average_over_the_whole_batch(tok):
    """loss_denominator "batch": zero-advantage sequences join the token-mean's denominator, so the
    gradient is the informative-only one times the informative share of the batch's policy tokens."""
    from trainer.model import tiny_qwen3
    from trainer.update import GRPOConfig, GRPOTrainer

    prompt = tok.encode(
        "<|im_start|>user\nsay yes<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    good, bad = (tok.encode(x + "<|im_end|>", add_special_tokens=False) for x in ("yes yes", "no no no"))
    seqs = [prompt + good, prompt + bad, prompt + bad, prompt + bad]
    masks = [[0] * len(prompt) + [1] * (len(s) - len(prompt)) for s in seqs]
    rewards = np.array([1.0, 0.0, 0.0, 0.0])  # group 1 informative, group 2 all failed
    grads = {}
    for denominator in ("informative", "batch"):
        model = tiny_qwen3(seed=0)
        cfg = GRPOConfig(micro_batch=1, grad_clip=1e9, loss_denominator=denominator)
        tr = GRPOTrainer(model, tok, cfg)
        tr.optimizer = GradientTaker(model.parameters())
        tr.update(seqs, masks, rewards, group_size=2)
        grads[denominator] = tr.optimizer.grads
    share = sum(sum(m) for m in masks[:2]) / sum(sum(m) for m in masks)
    assert 0 < share < 1
    assert_scaled(grads["informative"], grads["batch"], share)


def test_a_non_finite_gradient_is_not_applied(tok):
    """An overflowing ratio (here: the log-probs kept before the update shifted by -200; two passes
    over the batch, as one pass takes them from its own training pass) makes the gradient
    infinite; the optimizer step is skipped, the weights stay as they were, and an update that
    skipped every epoch fails with the reason instead of leaving NaN weights behind."""
    from trainer.model import tiny_qwen3
    from trainer.update import GRPOConfig, GRPOTrainer

    class Overflowing(GRPOTrainer):
        def _logprobs(self, model, *a, **kw):
            lp = super()._logprobs(model, *a, **kw)
            return lp if torch.is_grad_enabled() else lp - 200.0  # the "old" pass runs without grad

    prompt = tok.encode(
        "<|im_start|>user\nsay yes<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    good, bad = (tok.encode(x + "<|im_end|>", add_special_tokens=False) for x in ("yes", "no"))
    seqs = [prompt + good, prompt + bad]
    masks = [[0] * len(prompt) + [1] * (len(s) - len(prompt)) for s in seqs]
    model = tiny_qwen3(seed=0)
    tr = Overflowing(model, tok, GRPOConfig(micro_batch=2, epochs=2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(FloatingPointError, match="not finite in all 2 epoch"):
        tr.update(seqs, masks, np.array([1.0, 0.0]), group_size=2)
    for k, v in model.state_dict().items():
        assert torch.isfinite(v).all() and torch.equal(v, before[k]), k
    metrics = GRPOTrainer(model, tok, GRPOConfig(micro_batch=2)).update(
        seqs, masks, np.array([1.0, 0.0]), group_size=2
    )
    assert metrics["skipped_updates"] == 0 and math.isfinite(metrics["grad_norm"])


def test_checkpoint_roundtrip(tok, tmp_path):
    from trainer.model import load_policy, tiny_qwen3
    from trainer.update import GRPOConfig, GRPOTrainer

    model = tiny_qwen3(seed=1)
    tr = GRPOTrainer(model, tok, GRPOConfig(lr=1e-3))
    tr.save(tmp_path / "ck", step=3)
    again = load_policy(str(tmp_path / "ck"))
    for (a, p), (_, q) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(p, q), a
    assert json.loads((tmp_path / "ck" / "trainer.json").read_text())["step"] == 3
    with pytest.raises(FileNotFoundError, match="never downloads"):
        load_policy(str(tmp_path / "nothing"))


# ---------------------------------------------------------------------------- end to end through Pipes
def test_hf_tiny_step_through_dagster_pipes_and_resume(tmp_path, dagster_home):
    from envsched_pipeline.cli import main  # the CLI in this process for the pool (the steps: a fresh one)
    from envsched_pipeline.lake import Lake

    lake = tmp_path / "lake"
    args = ["pool", "create", "synthetic", "--name", "mini", "--envs", "2", "--tasks-per-env", "3"]
    assert main(["--lake", str(lake), *args]) == 0  # a small pool: its import is not what is tested
    cmd = [
        sys.executable,
        "-m",
        "envsched_pipeline.cli",
        "--lake",
        str(lake),
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
        "12",
        "--lr",
        "1e-4",
        "--dual-clip",
        "3",
    ]
    p = subprocess.run(cmd + ["--steps", "1"], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads((lake / "run.json").read_text())["policy_config"]["dual_clip"] == 3.0
    lk = Lake(lake)
    r = lk.read("rollouts", step=0)
    assert r.num_rows == 4 and min(r.column("tokens").to_pylist()) > 100
    assert (lake / "checkpoints" / "latest" / "trainer.json").exists()
    tm = lk.read("train_metrics", step=0).to_pylist()[0]
    assert tm["policy"] == "hf-tiny" and tm["generated_tokens"] > 0 and tm["tokens_per_second"] > 0
    p = subprocess.run(cmd + ["--steps", "2"], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert lk.read("train_metrics", step=1).to_pylist()[0]["resumed_from_step"] == 0
    assert json.loads((lake / "checkpoints" / "latest" / "trainer.json").read_text())["step"] == 1
    # the final step also leaves a persistent checkpoint
    assert (lake / "checkpoints" / "step=1" / "policy" / "trainer.json").exists()


def test_masked_logprobs_equal_full_logprobs(tok):
    from trainer.model import tiny_qwen3
    from trainer.update import GRPOTrainer

    model = tiny_qwen3(seed=2).eval()
    tr = GRPOTrainer(model, tok)
    seqs = [[151644, 872, 198, 9707, 151645], [151644, 872, 198, 9707, 1879, 0, 151645]]
    masks = [[0, 0, 0, 1, 1], [0, 0, 0, 1, 1, 1, 1]]
    ids, att, msk = tr._pad(seqs, masks)
    with torch.no_grad():
        full = tr._logprobs(model, ids, att)
        part = tr._logprobs(model, ids, att, msk)
    assert torch.allclose(full * msk, part, atol=1e-5)


def test_openai_policy_against_a_real_local_server(tmp_path, capsys):
    """`envsched train --policy openai --base-url ... --model tiny` against trainer.serve on 127.0.0.1,
    which serves the tiny Qwen3 with the chat-completions + tools API."""
    import subprocess
    import sys
    import time
    import urllib.request

    from envsched_pipeline.cli import main as cli_main
    from envsched_pipeline.lake import Lake

    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer.serve", "--port", "0", "--model-name", "tiny"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        url = line.strip().split(" on ", 1)[1]
        for _ in range(50):
            try:
                models = json.loads(urllib.request.urlopen(url + "/models", timeout=2).read())
                break
            except OSError:
                time.sleep(0.2)
        assert models["data"][0]["id"] == "tiny"
        lake = tmp_path / "lake"
        code = cli_main(
            [
                "--lake",
                str(lake),
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
        assert code == 0
        code = cli_main(
            [
                "--lake",
                str(lake),
                "train",
                "--pool",
                "mini",
                "--policy",
                "openai",
                "--base-url",
                url,
                "--model",
                "tiny",
                "--steps",
                "1",
                "--batch-size",
                "2",
                "--group-size",
                "2",
                "--max-new-tokens",
                "16",
                "--policy-config",  # the random model never ends an episode itself: 3 calls, not 40
                '{"max_actions": 3}',
                "--eval-tasks",  # the run's last step is evaluated: one episode per held-out kind
                "1",
                "--eval-samples",
                "1",
            ]
        )
        assert code == 0, capsys.readouterr().err[-2000:]
        rows = Lake(lake).read("rollouts", step=0).to_pylist()
        assert len(rows) == 4 and all(0.0 <= r["reward"] <= 1.0 for r in rows)
        traj = json.loads(rows[0]["trajectory"])
        assert traj["engine"] == "openai" and traj["messages"][0]["role"] == "system"
        # held-out episodes are played through the same server
        held = Lake(lake).sql("select split, trajectory from eval_rollouts order by split").to_pylist()
        assert [r["split"] for r in held] == ["seen", "unseen"]
        assert all(json.loads(r["trajectory"])["engine"] == "openai" for r in held)
    finally:
        stop(proc)


# ---------------------------------------------------------------------------- vLLM up to the CUDA boundary
class _FakeRunner:
    """Stands in for vLLM's model runner (the one thing that needs a GPU): records what is loaded."""

    def __init__(self):
        self.loaded = []
        self.model = self

    def load_weights(self, weights):
        self.loaded.extend(name for name, _ in weights)


class _FakeLLM:
    """A fake of ``vllm.LLM`` only: collective_rpc dispatches to our real worker extension."""

    def __init__(self):
        from trainer.vllm_sync import WeightSyncExtension

        self.worker = type("W", (WeightSyncExtension,), {})()
        self.worker.model_runner = _FakeRunner()
        self.calls = []

    def collective_rpc(self, method, args=()):
        self.calls.append(method)
        return [getattr(self.worker, method)(*args)]

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")

    def sleep(self, level=1):
        self.calls.append(f"sleep{level}")

    def wake_up(self):
        self.calls.append("wake_up")


def test_vllm_weight_sync_uses_the_public_rpc_and_matches_vllm_names():
    from trainer.engines import VLLMEngine
    from trainer.model import tiny_qwen3
    from trainer.vllm_sync import sampling_kwargs, weight_items

    model = tiny_qwen3()
    items = weight_items(model)
    names = [n for n, _ in items]
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names  # tied embeddings
    assert set(names) == set(model.state_dict()) - {"lm_head.weight"}
    fake = _FakeLLM()
    engine = VLLMEngine("unused", llm=fake)
    engine.sleep()
    assert engine.sync_weights(model) == len(items)
    assert fake.calls == ["sleep1", "wake_up", "update_weights_from_tensors", "reset_prefix_cache"]
    assert fake.worker.model_runner.loaded == names
    kw = sampling_kwargs(64, 0.7, seed=3)
    assert kw["stop_token_ids"] == [151645] and kw["max_tokens"] == 64 and not kw["skip_special_tokens"]


def test_deepspeed_config_is_generated_from_the_trainer_config():
    from trainer.distributed import zero_config
    from trainer.update import GRPOConfig

    cfg = GRPOConfig(micro_batch=4, lr=2e-6, grad_clip=0.5, weight_decay=0.01)
    ds = zero_config(cfg, world_size=8, sequences_per_step=512)
    assert (
        ds["train_micro_batch_size_per_gpu"] == 4 and ds["gradient_accumulation_steps"] == 16
    )  # 64 per rank / 4
    assert ds["train_batch_size"] == 4 * 16 * 8 and ds["gradient_clipping"] == 0.5
    assert ds["optimizer"]["params"]["lr"] == 2e-6 and ds["optimizer"]["params"]["weight_decay"] == 0.01


def test_an_interrupted_trainer_step_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    """Ctrl-C (or Dagster forwarding a canceled run's SIGINT) used to print torch's import traceback;
    the trainer process now says which step stopped, and exits 130."""
    from trainer import step as step_mod  # this test's subject

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.delenv("DAGSTER_PIPES_CONTEXT", raising=False)
    monkeypatch.setattr(step_mod, "run_step", interrupted)
    assert step_mod.main(["--lake", str(tmp_path / "lake"), "--step", "4"]) == 130
    assert capsys.readouterr().err == "trainer: step 4 interrupted\n"


def test_a_trainer_step_off_a_terminal_writes_no_progress_bar(small_pool):
    """Off a terminal (a pipe, a CI log, Dagster's compute log) a step's stderr carries no progress
    bar: its redraws used to land between `envsched train`'s rows. The progress lines go to the log."""
    from envsched_pipeline.core.select import select_manifest  # the step needs its manifest
    from envsched_pipeline.run import RunSpec, start_run

    spec = RunSpec(  # real verifiers behind the simulated learner: the bar's path
        pool="synthetic",
        scheduler="random",
        seed=1,
        batch_size=8,
        group_size=4,
        policy_config={"mode": "real"},
    )
    start_run(small_pool, spec)
    select_manifest(small_pool, 0)
    cmd = [sys.executable, "-m", "trainer.step", "--lake", str(small_pool.root), "--step", "0"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1])["sim_mode"] == "real" and "rollouts 32/32" in done.stdout
    assert "synthetic rollouts" not in done.stderr and "\r" not in done.stderr
