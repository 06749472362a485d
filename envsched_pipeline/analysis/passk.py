"""Held-out success over repeated attempts: pass@k, the chance that at least one of k attempts at a
task solves it, and pass^k, the chance that all k do (tau-bench's measure of reliability). Each is
the unbiased estimate from a task's n evaluation episodes, c of which solved it (Chen et al. 2021
for pass@k: 1 - C(n-c, k) / C(n, k); pass^k: C(c, k) / C(n, k)), averaged over a split's tasks. An
episode solves its task when its reward reaches 1 (every check passed), as ``heldout_by_env``'s
``solved`` counts it; pass@1 = pass^1 is that share.

The standard error is the episodes' own noise, the tasks being a fixed set (as for the held-out
mean, ``trainer.heldout.summarize``): a jackknife over each task's episodes, which needs k < n, so
at k = n none is given. The lake's view ``heldout_pass_at_k`` (warehouse/views.sql) computes the
same estimates in SQL; two runs' estimates are set side by side by
``analysis.compare.compare_reliability``, with the other run-against-run verdicts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from envsched_pipeline.lake import Lake

SOLVED_AT = 1 - 1e-9  # an episode's reward from which it solved its task (heldout_by_env's solved)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of k of a task's n episodes (c solved) solved it, drawn without
    replacement: 1 - C(n-c, k) / C(n, k)."""
    _check(n, c, k)
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """The chance that all k of a task's n episodes (c solved) solved it: C(c, k) / C(n, k)."""
    _check(n, c, k)
    return math.comb(c, k) / math.comb(n, k)


def _check(n: int, c: int, k: int) -> None:
    if not (1 <= k <= n and 0 <= c <= n):
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")


def _jackknife_var(f: Callable[[int, int, int], float], n: int, c: int, k: int) -> float:
    """The jackknife variance of ``f(n, c, k)`` over a task's n episodes: each left out in turn (a
    solved one leaves (n-1, c-1), another (n-1, c)); needs k < n."""
    solved = f(n - 1, c - 1, k) if c > 0 else 0.0
    failed = f(n - 1, c, k) if c < n else 0.0
    mean = (c * solved + (n - c) * failed) / n
    return (n - 1) / n * (c * (solved - mean) ** 2 + (n - c) * (failed - mean) ** 2)


def default_ks(most: int) -> list[int]:
    """1, 2, 4, ... below ``most`` episodes a task has, and ``most`` itself."""
    ks, k = [], 1
    while k < most:
        ks.append(k)
        k *= 2
    return [*ks, most] if most >= 1 else []


def reliability(episodes: Mapping[str, Sequence[float]], ks: Sequence[int] | None = None) -> list[dict]:
    """A split's pass@k and pass^k for each k (default: ``default_ks`` of the most episodes a task
    has) from its episodes (task id -> their rewards): ``{"k", "tasks"`` (those with at least k
    episodes), ``"pass_at_k", "pass_at_k_se", "pass_hat_k", "pass_hat_k_se"}``; an ``_se`` is None
    where a task has no more than k episodes."""
    counts = [(len(r), sum(1 for x in r if x >= SOLVED_AT)) for r in episodes.values() if len(r)]
    if not counts:
        return []
    out = []
    for k in ks if ks is not None else default_ks(max(n for n, _ in counts)):
        mine = [(n, c) for n, c in counts if n >= k]
        if not mine:
            continue
        row: dict = {"k": int(k), "tasks": len(mine)}
        for name, f in (("pass_at_k", pass_at_k), ("pass_hat_k", pass_hat_k)):
            row[name] = sum(f(n, c, k) for n, c in mine) / len(mine)
            jack = all(n > k for n, _ in mine)
            row[f"{name}_se"] = (
                math.sqrt(sum(_jackknife_var(f, n, c, k) for n, c in mine)) / len(mine) if jack else None
            )
        out.append(row)
    return out


def headline_reliability(episodes: Mapping[str, Mapping[str, Sequence[float]]]) -> dict[str, float]:
    """Each held-out split's share solved in one attempt, in any of K and in all K (K: the most
    episodes a task has), flat for a step's metadata and trackers: ``heldout_<split>_solved``,
    ``heldout_<split>_pass_at_<K>``, ``heldout_<split>_pass_hat_<K>``."""
    out = {}
    for split, eps in sorted(episodes.items()):
        rows = reliability(eps)
        if rows:
            first, last = rows[0], rows[-1]
            out[f"heldout_{split}_solved"] = first["pass_at_k"]
            out[f"heldout_{split}_pass_at_{last['k']}"] = last["pass_at_k"]
            out[f"heldout_{split}_pass_hat_{last['k']}"] = last["pass_hat_k"]
    return out


def episodes_by_split(lake: Lake, step: int) -> dict[str, dict[str, list[float]]]:
    """The evaluation episodes' rewards at ``step``: split -> task id -> rewards (empty when the lake
    keeps none at that step)."""
    if step not in lake.steps("eval_rollouts"):
        return {}
    return split_episodes(lake.read("eval_rollouts", step=step, columns=["split", "task_id", "reward"]))


def split_episodes(table) -> dict[str, dict[str, list[float]]]:
    """Episodes in the lake's ``eval_rollouts`` columns (a pyarrow table with split, task_id and
    reward) as split -> task id -> rewards."""
    out: dict[str, dict[str, list[float]]] = {}
    cols = [table.column(c).to_pylist() for c in ("split", "task_id", "reward")]
    for split, task, reward in zip(*cols, strict=True):
        out.setdefault(split, {}).setdefault(task, []).append(float(reward))
    return out


def heldout_reliability(lake: Lake, step: int | None = None) -> dict:
    """pass@k and pass^k of each held-out split at ``step`` (default: the run's last evaluation that
    kept its episodes): ``{"step", "splits": {split: reliability rows}}``; ``step`` None when the
    lake keeps no evaluation episodes."""
    steps = lake.steps("eval_rollouts")
    if step is None:
        step = steps[-1] if steps else None
    if step is None:
        return {"step": None, "splits": {}}
    return {
        "step": int(step),
        "splits": {s: reliability(eps) for s, eps in sorted(episodes_by_split(lake, step).items())},
    }
