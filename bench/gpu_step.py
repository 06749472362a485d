"""One real 64 x 8 GRPO step with a Qwen3-architecture model built locally (no download, nothing
installed): the agent loop with the hf engine over synthetic-pool environments in the sandbox,
real verifier rewards, then the torch GRPO update (bf16 autocast on a GPU).

    python bench/gpu_step.py                 # on a GPU machine: the 64 x 8 step, ~0.6B-parameter model
    python bench/gpu_step.py --device cpu    # the same code on the CPU with a tiny model and 2 x 2
    python bench/gpu_step.py --activation-checkpointing   # the update recomputing each layer

Rewards are never altered. A random-init model earns rewards without spread (every group
zero-variance, so GRPO has no gradient); the script then also runs the update on a **scripted
batch** (half of each group replays the task's gold tool calls, half a wrong one, through the same
environments and verifier), labelled as such, so the update's cost is measured on a real gradient.
Results go to ``bench/RESULTS.md``: section "gpu" only when the step ran on CUDA; a CPU run is
written to section "gpu_path_on_cpu" and never under a GPU heading.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
# The project's modules, numpy and torch are imported inside the functions below: only once the
# repository root is on sys.path (above), and only when a step runs (`--help` needs none of them).


def rollouts(engine_for, tok, tasks, envs, group, max_new_tokens, workers):
    """``engine_for(first, n)``: the engine for episodes first..first+n-1 (a wave)."""
    # lazy, as every import of this script's project modules (see the comment at the top)
    from envs.registry import episode_spec
    from envs.sandbox import SandboxPool
    from trainer.agent import AgentLoop, Episode

    eps = [Episode(t["task_id"], r, None) for t in tasks for r in range(group)]
    by_id = {t["task_id"]: t for t in tasks}
    t_env = 0.0
    with SandboxPool(workers=min(workers, len(eps))) as pool:
        for s in range(0, len(eps), workers):
            wave = eps[s : s + workers]
            for e in wave:
                t = by_id[e.task_id]
                e.session = pool.session(episode_spec(envs[t["env_id"]], t))
            loop = AgentLoop(
                engine_for(s, len(wave)), tok, max_actions=40, max_new_tokens=max_new_tokens, temperature=1.0
            )
            loop.run(wave)
            for e in wave:
                e.session.close()
    return eps, t_env


def scripted_texts(tasks, group):
    """Per episode: the gold tool calls (first half of each group) or one wrong call (second half)."""
    from trainer.chat import render_assistant  # lazy (see the comment at the top)

    scripts = []
    for t in tasks:
        gold = json.loads(t.get("gold") or "[]") or []
        good = [render_assistant("", [c]) for c in gold] + ["done"]
        bad = [render_assistant("", [{"name": gold[0]["name"] if gold else "noop", "arguments": {}}]), "done"]
        scripts += [good if r < group // 2 else bad for r in range(group)]
    return scripts


def main() -> int:
    # lazy (see the comment at the top)
    import numpy as np
    import torch

    from envs.registry import load_synthetic
    from trainer.engines import HFEngine, ScriptedEngine
    from trainer.model import qwen3_tokenizer, tiny_qwen3
    from trainer.update import GRPOConfig, GRPOTrainer

    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument(
        "--activation-checkpointing",
        action="store_true",
        help="recompute each layer in the update's backward pass (less memory, one more forward)",
    )
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    on_gpu = args.device.startswith("cuda")
    if on_gpu and not torch.cuda.is_available():
        raise SystemExit(
            "--device cuda asked, but CUDA is not available: no GPU numbers can be recorded here"
        )
    if not on_gpu:  # exercise the same path with a tiny model
        args.hidden, args.layers, args.heads = 64, 2, 4
        args.batch, args.group, args.max_new_tokens = (
            min(args.batch, 2),
            min(args.group, 2),
            min(args.max_new_tokens, 16),
        )
        args.workers = min(args.workers, 2)
    torch.manual_seed(0)
    t_all = time.perf_counter()
    tok = qwen3_tokenizer()
    model = tiny_qwen3(
        hidden=args.hidden, layers=args.layers, heads=args.heads, kv_heads=max(1, args.heads // 2)
    )
    model = model.to(args.device)
    n_params = sum(p.numel() for p in model.parameters())
    trainer = GRPOTrainer(
        model,
        tok,
        GRPOConfig(
            lr=1e-6,
            micro_batch=8,
            max_new_tokens=args.max_new_tokens,
            activation_checkpointing=args.activation_checkpointing,
        ),
        device=args.device,
    )
    data = load_synthetic(n_envs=51, tasks_per_env=50, seed=0)
    envs = {e["env_id"]: e for e in data.environments}
    rng = np.random.default_rng(0)
    tasks = [data.tasks[i] for i in rng.choice(len(data.tasks), args.batch, replace=False)]
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    engine = HFEngine(model, tok, device=args.device, batch_size=args.batch * args.group)
    t0 = time.perf_counter()
    eps, _ = rollouts(
        lambda first, n: engine, tok, tasks, envs, args.group, args.max_new_tokens, args.workers
    )
    t_roll = time.perf_counter() - t0
    rewards = np.array([e.result.get("reward", 0.0) for e in eps])
    spread = float((np.ptp(rewards.reshape(-1, args.group), axis=1) > 1e-6).mean())
    batch_label = "policy rollouts"
    train_eps = eps
    if spread == 0.0:  # no gradient from a random policy: measure the update on a scripted batch instead
        texts = scripted_texts(tasks, args.group)
        train_eps, _ = rollouts(
            lambda first, n: ScriptedEngine(tok, texts[first : first + n]),
            tok,
            tasks,
            envs,
            args.group,
            512,
            args.workers,
        )
        rewards = np.array([e.result.get("reward", 0.0) for e in train_eps])
        batch_label = (
            "scripted batch (gold vs wrong tool calls; the random policy's groups had no reward spread)"
        )
    t1 = time.perf_counter()
    m = trainer.update(
        [e.ids for e in train_eps],
        [e.mask for e in train_eps],
        rewards,
        args.group,
        [e.logprobs for e in train_eps],
    )
    if on_gpu:
        torch.cuda.synchronize()
    t_upd = time.perf_counter() - t1
    # how far the sampler's log-probabilities of the policy's own rollouts are from the trainer's
    # (generation with a KV cache, left-padded, against the update's padded forward pass)
    gap = trainer.sampler_gap([e.ids for e in eps], [e.mask for e in eps], [e.logprobs for e in eps])
    gen = sum(e.generated_tokens for e in eps)
    res = {
        "device": torch.cuda.get_device_name(0) if on_gpu else "cpu",
        "params_m": round(n_params / 1e6, 1),
        "batch x group": f"{args.batch} x {args.group}",
        "policy groups with spread": spread,
        "update batch": batch_label,
        "generated_tokens": gen,
        "rollout_s": t_roll,
        "gen_tokens_per_s": gen / max(t_roll, 1e-9),
        "update_s": t_upd,
        "trained_tokens_per_s": m.get("trained_tokens_per_second", float("nan")),
        "padding_fraction": m.get("padding_fraction"),
        "step_s": time.perf_counter() - t_all,
        "loss": m["loss"],
        "grad_norm": m["grad_norm"],
        "approx_kl": m.get("approx_kl"),
        "entropy": m.get("entropy"),
        "sampler_logprob_diff": gap["sampler_logprob_diff"],
        "sampler_logprob_diff_max": gap["sampler_logprob_diff_max"],
        "peak_memory_gb": torch.cuda.max_memory_allocated() / 1e9 if on_gpu else None,
        "bf16": trainer.bf16,
        "activation_checkpointing": args.activation_checkpointing,
    }
    print(json.dumps(res, indent=2, default=str))
    if not args.no_write:
        from run_all import machine, write_section  # beside this script: only when writing RESULTS

        rows = [
            "| " + " | ".join(res) + " |",
            "|" + "---|" * len(res),
            "| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in res.values()) + " |",
        ]
        if on_gpu:
            write_section(
                "gpu",
                "\n".join(
                    [
                        "## GRPO step on a GPU (`bench/gpu_step.py`)",
                        "",
                        f"Real agent loop (hf engine) over synthetic environments, real verifier rewards, torch GRPO update "
                        f"(bf16). Machine: {machine()}.",
                        "",
                        *rows,
                    ]
                ),
            )
        else:
            write_section(
                "gpu_path_on_cpu",
                "\n".join(
                    [
                        "## The GPU step's code path, run on the CPU (`bench/gpu_step.py --device cpu`)",
                        "",
                        "**Not GPU numbers**: no GPU was available to this repository's sessions, so the 64 x 8 step ran only "
                        f"as a {args.batch} x {args.group} step with a {res['params_m']}M-parameter model on the CPU "
                        f"({machine()}). Rewards are the verifiers' own (no noise added); the update ran on the "
                        f"{batch_label}.",
                        "",
                        *rows,
                    ]
                ),
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
