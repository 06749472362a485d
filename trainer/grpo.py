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


def overrun_rewards(verified, stopped, penalty: float | None) -> np.ndarray:
    """The reward GRPO trains on: the verifiers' ``verified`` less ``penalty`` for each episode a
    cap ``stopped`` (DAPO's overlong penalty; the neural learner's action cap, an LM episode's action
    cap or context), floored at 0: the lake's rewards lie in [0, 1]. With group normalisation any
    penalty > 0 makes an all-solved group whose episodes differ in stopping informative."""
    return np.maximum(
        np.asarray(verified, dtype=float) - (penalty or 0.0) * np.asarray(stopped, dtype=bool), 0.0
    )
