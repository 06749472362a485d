"""Where a paired held-out difference moves, by what the tasks ask.

Every synthetic task is made of one or more operation patterns (lookup, eligibility check,
transfer, ...; the pool's latents name them). A neural bench run keeps its held-out per task
(``evals[*]["seen_by_task"]`` / ``["unseen_by_task"]``) and, run with ``--trace``, every pick. For a
scheduler and the baseline at the same seed this gives, per pattern: the mean paired difference over
the held-out tasks that contain it, that mean's standard error over those tasks, the pattern's
*residual* (its mean minus the mean over every held-out task: what is particular to the pattern once
the run's common shift is taken out), and how much more of the pattern the scheduler trained on
than the baseline did (its share of pattern occurrences in the picks, over the baseline's share).
If a scheduler's held-out gain followed what it trains, residual and share ratio would go together.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

import numpy as np


def pattern_shares(picks: Iterable[str], patterns: dict[str, list[str]]) -> dict[str, float]:
    """Each pattern's share of the pattern occurrences in ``picks`` (task ids, one per pick)."""
    counts = Counter(p for task in picks for p in patterns[task])
    total = sum(counts.values())
    if not total:
        raise ValueError("no picks with patterns")
    return {p: n / total for p, n in counts.items()}


def pattern_effects(
    baseline: dict[str, float],
    scheduler: dict[str, float],
    patterns: dict[str, list[str]],
    baseline_picks: Iterable[str] | None = None,
    scheduler_picks: Iterable[str] | None = None,
) -> dict:
    """``baseline`` / ``scheduler``: held-out reward per task (the same tasks); ``patterns``: task id ->
    its patterns. Returns the mean paired difference over all tasks and, per pattern, ``tasks``,
    ``diff``, ``se``, ``residual``, ``baseline`` (the baseline's mean held-out on the pattern) and,
    with both runs' picks, ``share_ratio``."""
    if set(baseline) != set(scheduler):
        raise ValueError("the two runs' held-out task sets differ")
    missing = sorted(set(baseline) - set(patterns))
    if missing:
        raise ValueError(f"no patterns for held-out task(s) {', '.join(missing[:3])}")
    diffs = {t: scheduler[t] - baseline[t] for t in baseline}
    overall = float(np.mean(list(diffs.values())))
    shares = None
    if baseline_picks is not None and scheduler_picks is not None:
        shares = (pattern_shares(baseline_picks, patterns), pattern_shares(scheduler_picks, patterns))
    by: dict[str, list[str]] = {}
    for t in sorted(diffs):
        for p in patterns[t]:
            by.setdefault(p, []).append(t)
    rows = {}
    for p, tasks in sorted(by.items()):
        d = np.array([diffs[t] for t in tasks])
        row = {
            "tasks": len(tasks),
            "diff": float(d.mean()),
            "se": float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else float("nan"),
            "residual": float(d.mean()) - overall,
            "baseline": float(np.mean([baseline[t] for t in tasks])),
        }
        if shares is not None:
            a, b = shares[0].get(p, 0.0), shares[1].get(p, 0.0)
            row["share_ratio"] = b / a if a > 0 else float("nan")
        rows[p] = row
    return {"diff": overall, "tasks": len(diffs), "patterns": rows}


def residual_share_correlation(effects: Iterable[dict]) -> float:
    """Across every (run pair, pattern) of ``effects`` (results of :func:`pattern_effects` with
    picks): the correlation of a pattern's residual with its share ratio."""
    x, y = [], []
    for e in effects:
        for row in e["patterns"].values():
            if math.isfinite(row.get("share_ratio", float("nan"))):
                x.append(row["share_ratio"])
                y.append(row["residual"])
    if len(x) < 3:
        raise ValueError(f"need at least 3 patterns with picks (got {len(x)})")
    return float(np.corrcoef(x, y)[0, 1])
