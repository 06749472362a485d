"""How much of a probe's headroom the run's history could have found.

The headroom probe (``envsched_pipeline.analysis.bench.headroom_probe``) rolls two fresh groups
(draws A and B) of every pool task at the learner's current weights. Its oracle ranks tasks by
draw A and is scored on draw B: it spends a whole-pool probe on one step's choice. This module asks
the question between the oracle and a scheduler: how well could *any* ranking that sees only the
run's history (the scheduler state: each task's recent groups, decayed sums, neighbour and
environment estimates) do at that step?

It fits a gradient-boosted classifier from history features to draw A's spread on part of the pool
and ranks the rest by it (cross-fitted, so no task is ranked by a model that saw its own draw A),
then scores the top |batch| on draw B, like the oracle. The fit uses the current step's outcome of
three quarters of the pool, which no scheduler has; so its share is a generous ceiling for what the
history can say, not a scheduler. If a scheduler's batch is near it, a better predictor from the
same history has little left to find; if it is far below, the history holds more than the scheduler
reads from it.
"""

from __future__ import annotations

import numpy as np

from envsched_pipeline.scheduler.config import SchedulerConfig
from envsched_pipeline.scheduler.envsched import EnvSched, spread_features
from envsched_pipeline.scheduler.state import SchedulerState

# the shrunk estimates beside spread_features' columns: own, neighbour and environment/graph prior
_PRED_COLUMNS = ("own_m", "own_s2", "own_d", "nb_m", "nb_d", "prior_m", "prior_s2", "prior_d", "hat_s2")


def history_features(state: SchedulerState, graph, step: int) -> np.ndarray:
    """(tasks, 26): every column the spread model's "streak" set has (docs/algorithm.md §4), the
    shrunk estimates' parts (own, neighbour and prior means, variances and chances of spread; -1
    where a task has none), its decayed weight and steps since its last group (-1: never)."""
    pred = EnvSched(SchedulerConfig(target="success"), graph).predict(state, model=False)
    cols: list[np.ndarray] = [spread_features(state, pred, step, "streak")]
    for k in _PRED_COLUMNS:  # "nb_*" exist only with a graph
        cols.append(np.nan_to_num(pred[k], nan=-1.0) if k in pred else np.full(state.n_tasks, -1.0))
    seen = state.arrays["n_groups"] > 0
    cols += [pred["W"], np.where(seen, step - state.arrays["last_seen"], -1.0)]
    return np.column_stack(cols).astype(float)


def history_ceiling(
    features: np.ndarray, spread_a: np.ndarray, spread_b: np.ndarray, k: int, seed: int, folds: int = 4
) -> dict:
    """Cross-fitted ranking of the pool from ``features`` (one row per task) trained on draw A's
    spread; returns ``history_spread`` (draw B's share with spread among its top ``k``) and
    ``history_auc`` (how well its chance ranks draw B over the whole pool; NaN if draw B is all one
    kind)."""
    from sklearn.ensemble import HistGradientBoostingClassifier  # scikit-learn loads slowly; probes only
    from sklearn.metrics import roc_auc_score  # same reason

    a = np.asarray(spread_a, dtype=bool)
    b = np.asarray(spread_b, dtype=bool)
    n = len(a)
    if features.shape[0] != n or len(b) != n:
        raise ValueError(f"history_ceiling: {features.shape[0]} feature rows for {n} / {len(b)} tasks")
    rng = np.random.default_rng([seed, 31])
    fold = rng.permutation(n) % folds
    p = np.full(n, a.mean() if n else 0.0)
    for f in range(folds):
        train, test = fold != f, fold == f
        if not test.any() or a[train].all() or not a[train].any():
            continue  # one outcome only: the fold keeps the base rate
        model = HistGradientBoostingClassifier(
            max_iter=150, learning_rate=0.05, max_leaf_nodes=15, min_samples_leaf=20, random_state=seed
        )
        p[test] = model.fit(features[train], a[train]).predict_proba(features[test])[:, 1]
    tie = rng.random(n)
    top = np.lexsort((tie, -p))[: min(k, n)]
    auc = float(roc_auc_score(b, p)) if 0 < b.sum() < n else float("nan")
    return {"history_spread": float(b[top].mean()) if len(top) else float("nan"), "history_auc": auc}
