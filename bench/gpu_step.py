"""One real GRPO step on a GPU with a small Qwen3-shaped model built locally (no download).

    python bench/gpu_step.py [--device cuda] [--hidden 1024 --layers 8] [--batch 16 --group 8]

Runs the real agent loop (hf engine: transformers generate) over synthetic-pool environments in
the sandbox, then the torch GRPO update (bf16 autocast on GPU), and records step time, tokens/s
and peak memory in bench/RESULTS.md (section "gpu"). On a machine without CUDA it runs the same
code on the CPU with a tiny model (``--device cpu``) so the path is exercised up to CUDA; the
RESULTS section then says it ran on the CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def main() -> int:
    import numpy as np
    import torch

    from envs.registry import episode_spec, load_synthetic
    from envs.sandbox import SandboxPool
    from trainer.agent import AgentLoop, Episode
    from trainer.engines import HFEngine
    from trainer.model import qwen3_tokenizer, tiny_qwen3
    from trainer.update import GRPOConfig, GRPOTrainer

    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    if args.device == "cpu":  # exercise the path with a tiny model
        args.hidden, args.layers, args.heads = 64, 2, 4
        args.batch, args.group, args.max_new_tokens = (
            min(args.batch, 2),
            min(args.group, 2),
            min(args.max_new_tokens, 16),
        )
    t_all = time.perf_counter()
    tok = qwen3_tokenizer()
    model = tiny_qwen3(
        hidden=args.hidden, layers=args.layers, heads=args.heads, kv_heads=max(1, args.heads // 2)
    )
    model = model.to(args.device)
    n_params = sum(p.numel() for p in model.parameters())
    trainer = GRPOTrainer(
        model, tok, GRPOConfig(lr=1e-6, micro_batch=8, max_new_tokens=args.max_new_tokens), device=args.device
    )
    data = load_synthetic(n_envs=51, tasks_per_env=50, seed=0)
    envs = {e["env_id"]: e for e in data.environments}
    rng = np.random.default_rng(0)
    tasks = [data.tasks[i] for i in rng.choice(len(data.tasks), args.batch, replace=False)]
    engine = HFEngine(model, tok, device=args.device, batch_size=args.batch * args.group)
    loop = AgentLoop(engine, tok, max_actions=40, max_new_tokens=args.max_new_tokens, temperature=1.0)
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    eps = [Episode(t["task_id"], r, None) for t in tasks for r in range(args.group)]
    t0 = time.perf_counter()
    with SandboxPool(workers=min(args.workers, len(eps))) as pool:
        for s in range(0, len(eps), args.workers):
            wave = eps[s : s + args.workers]
            for e in wave:
                t = next(x for x in tasks if x["task_id"] == e.task_id)
                e.session = pool.session(episode_spec(envs[t["env_id"]], t))
            loop.run(wave)
            for e in wave:
                e.session.close()
    t_roll = time.perf_counter() - t0
    rewards = np.array([e.result.get("reward", 0.0) for e in eps])
    # random-init policies rarely produce reward spread: perturb ties so the update has gradient
    rewards = rewards + 1e-3 * rng.standard_normal(len(rewards))
    t1 = time.perf_counter()
    m = trainer.update([e.ids for e in eps], [e.mask for e in eps], rewards, args.group)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    t_upd = time.perf_counter() - t1
    gen = sum(e.generated_tokens for e in eps)
    total = sum(len(e.ids) for e in eps)
    res = {
        "device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu",
        "params_m": n_params / 1e6,
        "batch": args.batch,
        "group": args.group,
        "episodes": len(eps),
        "generated_tokens": gen,
        "sequence_tokens": total,
        "rollout_s": t_roll,
        "update_s": t_upd,
        "step_s": time.perf_counter() - t_all,
        "gen_tokens_per_s": gen / max(t_roll, 1e-9),
        "train_tokens_per_s": total / max(t_upd, 1e-9),
        "loss": m["loss"],
        "grad_norm": m["grad_norm"],
        "peak_memory_gb": (torch.cuda.max_memory_allocated() / 1e9)
        if args.device.startswith("cuda")
        else None,
        "bf16": trainer.bf16,
    }
    print(json.dumps(res, indent=2))
    if not args.no_write:
        from run_all import write_section

        rows = [
            "| " + " | ".join(res) + " |",
            "|" + "---|" * len(res),
            "| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in res.values()) + " |",
        ]
        where = (
            "on a GPU"
            if args.device.startswith("cuda")
            else "**on the CPU with a tiny model** (no GPU was available: the vLLM engine and DeepSpeed are untested "
            "on a GPU; the hf engine + torch update path ran up to the point that needs CUDA)"
        )
        write_section(
            "gpu",
            "\n".join(
                [
                    "## GRPO step with a neural policy (`bench/gpu_step.py`)",
                    "",
                    f"Real agent loop (hf engine) over synthetic environments + torch GRPO update, run {where}.",
                    "",
                    *rows,
                ]
            ),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
