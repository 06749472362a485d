"""GRPO math that does not need torch (the torch loss lives in :mod:`trainer.loss`)."""

from __future__ import annotations

import numpy as np


def group_advantages(rewards: np.ndarray, eps: float = 1e-6, scale: bool = True) -> np.ndarray:
    """Group-normalized advantages.

    rewards: (n_groups, G). Returns (n_groups, G): (r - mean_g) / (std_g + eps), or r - mean_g
    when ``scale`` is False. A group whose rewards are all equal gets all-zero advantages: it
    carries no gradient, which is the waste the scheduler exists to avoid.
    """
    r = np.asarray(rewards, dtype=float)
    centered = r - r.mean(axis=1, keepdims=True)
    if not scale:
        return centered
    return centered / (r.std(axis=1, keepdims=True) + eps)
