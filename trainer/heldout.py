"""Held-out evaluation inside a run: when it is due, which tasks it reads, how a score is summed up.

A pool's evaluation split (the lake's ``eval_tasks``) is never scheduled: split ``seen`` holds
tasks of the training environments that the pool leaves out, split ``unseen`` tasks of
environments the pool does not contain (``eval_environments``). Every policy that trains a network
(neural, hf-tiny, hf, vllm) and the openai policy evaluate on it every ``eval_every`` steps (after
the step's update) and at the run's last step, and write ``evals`` rows ``heldout_seen`` and
``heldout_unseen`` with a standard error (docs/architecture.md §3).
"""

from __future__ import annotations

import numpy as np

SPLITS = ("seen", "unseen")


def due(step: int, max_steps: int, every: int) -> bool:
    """Whether step ``step`` (0-based) evaluates: every ``every`` steps from step 0, and the run's
    last step; ``every`` = 0 turns evaluation off."""
    return every > 0 and (step % every == 0 or step + 1 >= max_steps)


def heldout_tasks(rows: list[dict], seed: int, per_split: int | None = None) -> dict[str, list[dict]]:
    """The evaluation rows of each split that has any, in the lake's order. ``per_split`` keeps that
    many of a split, drawn once from the run's seed: the same tasks at every evaluation of a run, so
    its held-out curve compares like with like."""
    out = {}
    for k, split in enumerate(SPLITS):
        mine = [r for r in rows if r.get("split") == split]
        if per_split is not None and per_split < len(mine):
            keep = np.random.default_rng([seed, 17, k]).choice(len(mine), per_split, replace=False)
            mine = [mine[i] for i in sorted(keep)]
        if mine:
            out[split] = mine
    return out


def summarize(rewards: np.ndarray) -> dict:
    """``rewards`` (tasks x samples): the mean of the task means, and its standard error from the
    sampling noise within tasks (the tasks are a fixed set, so the error is the episodes' own)."""
    rewards = np.asarray(rewards, dtype=float)
    n, samples = rewards.shape
    if n == 0:
        return {"mean": float("nan"), "se": float("nan"), "tasks": 0, "samples": samples}
    within = rewards.var(axis=1, ddof=1) if samples > 1 else np.zeros(n)
    return {
        "mean": float(rewards.mean(axis=1).mean()),
        "se": float(np.sqrt(within.sum() / samples) / n),
        "tasks": n,
        "samples": samples,
    }
