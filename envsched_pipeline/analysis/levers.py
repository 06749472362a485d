"""What in a schedule goes with its held-out gain, over every paired run of a bench.

A paired run is one scheduler's run against the baseline's (random) at the same seed and draw: the
same pool, held-out split, warm start and held-out samples. Each carries its held-out differences
and its differences in how the batches were spent (the zero-variance share, split into solved and
failed groups; batch variance; breadth). Differences between schedulers inside one (group, seed)
cell share that cell's pool and baseline run, so correlations are taken within cells (each cell's
mean removed); the fit of the held-out difference on the zero-variance difference keeps the
intercept (what a schedule gains or loses at random's zero-variance share), with standard errors
from a bootstrap over cells.
"""

from __future__ import annotations

import numpy as np

KINDS = ("seen", "unseen")
# how a run spent its batches (keys of the bench's per-seed summary)
FEATURES = (
    "zero_variance_fraction",
    "zero_variance_solved",
    "zero_variance_failed",
    "batch_variance",
    "effective_envs",
    "distinct_tasks",
    "max_task_picks",
    "mean_reward",
)


def paired_runs(
    groups: dict[str, dict[str, dict[int, dict]]],
    baseline: str = "random",
    features: tuple[str, ...] = FEATURES,
) -> list[dict]:
    """``groups[label][scheduler][seed]``: the bench's per-seed summaries, one label per set of
    runs that share a draw and a machine. One row per run of a scheduler other than ``baseline``
    whose seed the baseline has in the same group: its group, seed and scheduler, and for every
    held-out kind and each of ``features`` its value (``value``) and its difference from the
    baseline's (``delta``)."""
    keys = [f"heldout_{k}_final" for k in KINDS] + list(features)
    rows = []
    for label, by_name in groups.items():
        base = by_name.get(baseline, {})
        for name, by_seed in by_name.items():
            if name == baseline:
                continue
            for seed, summary in sorted(by_seed.items()):
                if seed not in base:
                    continue
                missing = [k for k in keys if summary.get(k) is None or base[seed].get(k) is None]
                if missing:
                    raise ValueError(f"{label}/{name} seed {seed}: no {', '.join(missing)} in its summary")
                rows.append(
                    {
                        "group": label,
                        "seed": seed,
                        "scheduler": name,
                        "value": {k: float(summary[k]) for k in keys},
                        "delta": {k: float(summary[k]) - float(base[seed][k]) for k in keys},
                    }
                )
    return rows


def _cells(rows: list[dict]) -> np.ndarray:
    labels = [f"{r['group']}\x00{r['seed']}" for r in rows]
    return np.unique(labels, return_inverse=True)[1]


def _demeaned(x: np.ndarray, cells: np.ndarray) -> np.ndarray:
    means = np.bincount(cells, weights=x) / np.bincount(cells)
    return x - means[cells]


def within_correlations(rows: list[dict], features=FEATURES) -> dict[str, dict[str, float]]:
    """Per feature and held-out kind: the correlation over runs of the feature's difference with
    the held-out difference, each taken within its (group, seed) cell. NaN where a feature does
    not vary within cells."""
    cells = _cells(rows)
    out: dict[str, dict[str, float]] = {}
    for f in features:
        x = _demeaned(np.array([r["delta"][f] for r in rows]), cells)
        out[f] = {}
        for kind in KINDS:
            y = _demeaned(np.array([r["delta"][f"heldout_{kind}_final"] for r in rows]), cells)
            sx, sy = np.sqrt((x * x).sum()), np.sqrt((y * y).sum())
            out[f][kind] = float((x * y).sum() / (sx * sy)) if sx > 0 and sy > 0 else float("nan")
    return out


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), float(slope)


def zero_variance_fit(
    rows: list[dict], kind: str, feature: str = "zero_variance_fraction", boot: int = 2000, seed: int = 0
) -> dict:
    """The held-out difference of ``kind`` against the difference in ``feature`` (the zero-variance
    share), a straight line over the runs: intercept, slope, their bootstrap standard errors
    (cells resampled with replacement), R², the runs and cells behind it, and each run's residual."""
    if kind not in KINDS:
        raise ValueError(f"kind: {kind!r} is not one of {', '.join(KINDS)}")
    x = np.array([r["delta"][feature] for r in rows])
    y = np.array([r["delta"][f"heldout_{kind}_final"] for r in rows])
    cells = _cells(rows)
    n_cells = int(cells.max()) + 1 if len(cells) else 0
    if n_cells < 3 or np.ptp(x) == 0:
        raise ValueError(f"zero_variance_fit: {len(rows)} runs in {n_cells} cells, too few to fit")
    a, b = _line(x, y)
    members = [np.flatnonzero(cells == c) for c in range(n_cells)]
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(boot):
        pick = np.concatenate([members[c] for c in rng.integers(0, n_cells, n_cells)])
        if np.ptp(x[pick]) > 0:
            draws.append(_line(x[pick], y[pick]))
    draws_arr = np.array(draws)
    resid = y - (a + b * x)
    return {
        "intercept": a,
        "slope": b,
        "intercept_se": float(draws_arr[:, 0].std(ddof=1)),
        "slope_se": float(draws_arr[:, 1].std(ddof=1)),
        "r2": float(1 - (resid**2).sum() / ((y - y.mean()) ** 2).sum()),
        "runs": len(rows),
        "cells": n_cells,
        "residual": resid.tolist(),
    }


def needed_change(fit: dict, target: float) -> float:
    """The difference in the fitted feature at which the line reaches a held-out difference of
    ``target`` (the fit's own extrapolation; nothing says the line holds that far)."""
    if fit["slope"] == 0:
        raise ValueError("needed_change: the fit is flat")
    return (target - fit["intercept"]) / fit["slope"]
