"""A minimal custom GRPO loop using envsched's Python API (no Dagster needed).

    python examples/custom_loop.py --lake /tmp/envsched-example --steps 5

Replace ``rollout_group`` with your trainer's rollouts (vLLM, an agent framework, remote
workers); keep ``run.manifest`` / ``run.observe`` around it. Everything lands in the lake:
`envsched --lake /tmp/envsched-example sql "select * from step_summary"`.
"""

import argparse
import random

from envsched_pipeline.api import ExternalRun


def rollout_group(task: dict, group_size: int, rng: random.Random) -> list[dict]:
    """Stand-in for your trainer: G rollouts of one task -> rewards in [0, 1]."""
    p = rng.random()
    return [
        {"task_id": task["task_id"], "rollout": g, "reward": float(rng.random() < p)}
        for g in range(group_size)
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lake", default="/tmp/envsched-example")
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    run = ExternalRun(pool="synthetic", lake=args.lake, seed=0, batch_size=64, group_size=8)
    rng = random.Random(0)
    for step in range(run.next_step, args.steps):
        batch = run.manifest(step)
        rollouts = [r for task in batch for r in rollout_group(task, 8, rng)]
        # ... your GRPO update on `rollouts` goes here ...
        m = run.observe(step, rollouts)
        print(f"step {step}: {len(batch)} tasks, zero-variance groups {m['zero_variance_fraction']:.2f}")


if __name__ == "__main__":
    main()
