"""Yield: the share of a batch's groups with non-zero reward variance, predicted before the
rollouts and realized after them; and the over-sampling factor a DAPO-style trainer needs."""

from __future__ import annotations

import numpy as np

from envsched_pipeline.lake import Lake
from envsched_pipeline.scheduler import Pick, SchedulerState

OVERSAMPLING_CAP = 8.0


def predicted_yield(state: SchedulerState, picks: list[Pick]) -> float:
    """Predicted share of this batch's groups with non-zero reward variance: the mean of the picks'
    predicted non-zero-variance probabilities (schedulers without one: the decayed observed share)."""
    p = [x.p_nonzero for x in picks if x.p_nonzero == x.p_nonzero]
    if p:
        return float(np.mean(np.clip(p, 0.0, 1.0)))
    W = state.arrays["W"]
    return float(state.arrays["Xd"].sum() / W.sum()) if W.sum() > 0 else 0.5


def yield_calibration(lake: Lake, before_step: int, window: int = 8) -> float:
    """realized / predicted yield over the last ``window`` steps (1.0 without history)."""
    if not lake.steps("yields"):
        return 1.0
    rows = [r for r in lake.read("yields").to_pylist() if before_step - window <= r["step"] < before_step]
    pred = sum(r["predicted_yield"] for r in rows if r["predicted_yield"] == r["predicted_yield"])
    real = sum(r["realized_yield"] for r in rows if r["predicted_yield"] == r["predicted_yield"])
    return float(real / pred) if rows and pred > 0 else 1.0


def oversampling_factor(lake: Lake, step: int, yield_pred: float, cap: float = OVERSAMPLING_CAP) -> float:
    """How many times B tasks to roll out so that, after dropping zero-variance groups (DAPO-style
    dynamic sampling), B informative groups remain: 1 / calibrated predicted yield, in [1, cap]."""
    calibrated = yield_pred * yield_calibration(lake, step)
    return float(min(cap, max(1.0, 1.0 / max(calibrated, 1.0 / cap))))
