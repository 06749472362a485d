"""Baselines behind the same interface (docs/algorithm.md, baselines).

exploit-only and coverage-only are EnvSched with rho = 0 / 1. Here: random (the paper's baseline),
variance-greedy (own history only), GRESO, MoPPS, DPS, and the two oracles used only by the
benchmark as ceilings, never real options: the simulated learner's reads the simulator's true
variance, the neural learner's looks at fresh rollouts it does not pay for.
Their extra per-task state lives in ``state.arrays`` under a prefixed name, so it saves and loads
with the rest of the state.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from envsched_pipeline.scheduler.base import Pick, Scheduler, Selection
from envsched_pipeline.scheduler.config import SchedulerConfig
from envsched_pipeline.scheduler.state import SchedulerState
from envsched_pipeline.scheduler.update import update_state


def _picks(state: SchedulerState, idx, half: str, scores, reasons=None, propensity=1.0) -> list[Pick]:
    out = []
    for j, i in enumerate(idx):
        i = int(i)
        out.append(
            Pick(
                task_id=str(state.task_ids[i]),
                env_id=state.env_ids[state.env[i]],
                half=half,
                score=float(scores[i]),
                propensity=propensity,
                reason={"half": half, **(reasons[j] if reasons else {})},
                index=i,
            )
        )
    return out


def _top(values: np.ndarray, b: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of the b largest values, random tie-break."""
    order = np.lexsort((rng.random(len(values)), -values))
    return order[:b]


class RandomScheduler(Scheduler):
    """Uniform without replacement (the paper's baseline); constraints off, like the paper's."""

    name = "random"

    def select(
        self, state: SchedulerState, batch_size: int, rng: np.random.Generator, step: int
    ) -> Selection:
        n = state.n_tasks
        b = min(batch_size, n)
        idx = rng.choice(n, size=b, replace=False)
        prop = b / n
        return Selection(
            [
                Pick(
                    task_id=str(state.task_ids[i]),
                    env_id=state.env_ids[state.env[i]],
                    half="random",
                    score=0.0,
                    propensity=prop,
                    reason={"half": "random", "uniform_of": n},
                    index=int(i),
                )
                for i in idx
            ]
        )


class VarianceGreedy(Scheduler):
    """Top-B by own decayed variance shrunk to a global prior; no graph, no quotas."""

    name = "variance-greedy"

    def select(self, state, batch_size, rng, step) -> Selection:
        a, c = state.arrays, self.config
        glob = a["Xs2"].sum() / a["W"].sum() if a["W"].sum() > 0 else c.cold_var
        hat = (a["Xs2"] + c.lambda_s * glob) / (a["W"] + c.lambda_s)
        idx = _top(hat, min(batch_size, state.n_tasks), rng)
        p = _picks(state, idx, "greedy", hat, [{"pred_var": float(hat[i])} for i in idx])
        for q in p:
            q.pred_var = float(hat[q.index])
        return Selection(p)


class GRESO(Scheduler):
    """GRESO-style pre-rollout filtering: a task whose last k groups all had zero variance is
    skipped with probability 1 - p^k, with p_easy / p_hard (all-solved vs all-failed streaks)
    adapted each step towards a target zero-variance share (25%)."""

    name = "greso"
    target = 0.25
    delta = 0.01

    def _init(self, state):
        a = state.arrays
        for k in ("greso_streak", "greso_easy"):
            a.setdefault(k, np.zeros(state.n_tasks))
        state.extra.setdefault("greso_p_easy", 0.5)
        state.extra.setdefault("greso_p_hard", 0.5)

    def select(self, state, batch_size, rng, step) -> Selection:
        self._init(state)
        a = state.arrays
        p = np.where(a["greso_easy"] > 0, state.extra["greso_p_easy"], state.extra["greso_p_hard"])
        keep_prob = np.where(a["greso_streak"] > 0, p ** a["greso_streak"], 1.0)
        kept = rng.random(state.n_tasks) < keep_prob
        order = rng.permutation(state.n_tasks)
        ordered = order[kept[order]]
        b = min(batch_size, state.n_tasks)
        if len(ordered) < b:  # not enough survivors: fill with skipped ones
            ordered = np.concatenate([ordered, order[~kept[order]]])
        idx = ordered[:b]
        return Selection(
            _picks(
                state,
                idx,
                "greso",
                keep_prob,
                [
                    {"keep_prob": float(keep_prob[i]), "zero_var_streak": int(a["greso_streak"][i])}
                    for i in idx
                ],
            )
        )

    def update(self, state, obs, predicted_u=None):
        self._init(state)
        a = state.arrays
        i = obs.task_idx[obs.rollouts > 0]
        zero = obs.dispersion[obs.rollouts > 0] == 0
        mean = obs.mean[obs.rollouts > 0]
        a["greso_streak"][i] = np.where(zero, a["greso_streak"][i] + 1, 0)
        a["greso_easy"][i] = np.where(zero, (mean >= 0.5).astype(float), a["greso_easy"][i])
        if len(i):
            easy_share = float((zero & (mean >= 0.5)).mean())
            hard_share = float((zero & (mean < 0.5)).mean())
            # too many zero-variance groups of a kind -> skip that kind more (lower p)
            for key, share in (("greso_p_easy", easy_share), ("greso_p_hard", hard_share)):
                step = -self.delta if share > self.target / 2 else self.delta
                state.extra[key] = float(np.clip(state.extra[key] + step, 0.05, 1.0))
        return update_state(state, obs, self.config, predicted_u)


class MoPPS(Scheduler):
    """Beta posterior of each task's success rate (fractional counts n*s, n*(1-s), decayed),
    Thompson sample, pick the B samples closest to 0.5."""

    name = "mopps"
    decay = 0.95

    def select(self, state, batch_size, rng, step) -> Selection:
        a = state.arrays
        alpha = a.setdefault("mopps_alpha", np.ones(state.n_tasks))
        beta = a.setdefault("mopps_beta", np.ones(state.n_tasks))
        theta = rng.beta(alpha, beta)
        closeness = -np.abs(theta - 0.5)
        idx = _top(closeness, min(batch_size, state.n_tasks), rng)
        return Selection(
            _picks(
                state,
                idx,
                "mopps",
                closeness,
                [{"theta": float(theta[i]), "alpha": float(alpha[i]), "beta": float(beta[i])} for i in idx],
            )
        )

    def update(self, state, obs, predicted_u=None):
        a = state.arrays
        alpha = a.setdefault("mopps_alpha", np.ones(state.n_tasks))
        beta = a.setdefault("mopps_beta", np.ones(state.n_tasks))
        has = obs.rollouts > 0
        i, n, s = obs.task_idx[has], obs.rollouts[has], obs.mean[has]
        alpha[i] = 1 + self.decay * (alpha[i] - 1) + n * s
        beta[i] = 1 + self.decay * (beta[i] - 1) + n * (1 - s)
        return update_state(state, obs, self.config, predicted_u)


class DPS(Scheduler):
    """Three-state HMM per task (unsolved / partial / solved) with a shared transition matrix
    learned from Dirichlet counts; unobserved tasks' beliefs propagate through it each step.
    Picks the top-B predicted P(partial) (= a group with reward spread)."""

    name = "dps"
    UNSOLVED, PARTIAL, SOLVED = 0, 1, 2

    def _init(self, state):
        a = state.arrays
        if "dps_belief" not in a:
            a["dps_belief"] = np.tile([1 / 3, 1 / 3, 1 / 3], (state.n_tasks, 1)).reshape(-1)
            a["dps_last"] = np.full(state.n_tasks, -1.0)
            a["dps_counts"] = (np.ones((3, 3)) + 2 * np.eye(3)).reshape(-1)
        return a["dps_belief"].reshape(state.n_tasks, 3), a["dps_counts"].reshape(3, 3)

    def transition(self, counts):
        return counts / counts.sum(axis=1, keepdims=True)

    def select(self, state, batch_size, rng, step) -> Selection:
        belief, counts = self._init(state)
        pred = belief @ self.transition(counts)
        p_partial = pred[:, self.PARTIAL]
        idx = _top(p_partial, min(batch_size, state.n_tasks), rng)
        picks = _picks(state, idx, "dps", p_partial, [{"p_partial": float(p_partial[i])} for i in idx])
        for q in picks:
            q.p_nonzero = float(p_partial[q.index])
        return Selection(picks)

    def update(self, state, obs, predicted_u=None):
        belief, counts = self._init(state)
        a = state.arrays
        T = self.transition(counts)
        belief[:] = belief @ T  # everyone moves one step
        has = obs.rollouts > 0
        i = obs.task_idx[has]
        cls = np.where(
            obs.dispersion[has] > 0,
            self.PARTIAL,
            np.where(obs.mean[has] >= 0.999, self.SOLVED, self.UNSOLVED),
        )
        prev = a["dps_last"][i]
        known = prev >= 0
        np.add.at(counts, (prev[known].astype(int), cls[known]), 1.0)
        belief[i] = np.eye(3)[cls]
        a["dps_last"][i] = cls
        a["dps_belief"] = belief.reshape(-1)
        a["dps_counts"] = counts.reshape(-1)
        return update_state(state, obs, self.config, predicted_u)


class Oracle(Scheduler):
    """Benchmark ceiling only: knows the simulator's true variance. Never offered to users."""

    name = "oracle"

    def __init__(self, config=SchedulerConfig(), graph=None, true_variance: Callable | None = None):
        super().__init__(config, graph)
        if true_variance is None:
            raise ValueError("the oracle needs the simulator's true variance")
        self.true_variance = true_variance

    def select(self, state, batch_size, rng, step) -> Selection:
        tv = self.true_variance(state.task_ids)
        idx = _top(tv, min(batch_size, state.n_tasks), rng)
        return Selection(_picks(state, idx, "oracle", tv))


class ProbeOracle(Scheduler):
    """Benchmark ceiling for a learner without a true variance (the neural learner): each step it
    draws ``candidates`` tasks uniformly, rolls one fresh group of each at the learner's current
    weights (``probe(task_ids, seed) -> rewards (n, G)``; nothing learned from them), and picks the
    ``batch_size`` with the most reward variance in that group. The batch it trains on is rolled
    again, so its groups' spread is an honest draw. The look costs ``candidates / batch_size`` times
    a step's rollouts, which no scheduler has: a ceiling over a whole run, never offered to users."""

    name = "oracle"

    def __init__(
        self, config=SchedulerConfig(), graph=None, probe: Callable | None = None, candidates: int = 512
    ):
        super().__init__(config, graph)
        if probe is None:
            raise ValueError(
                "the probe oracle needs the learner's probe (fresh groups at its current weights)"
            )
        if candidates < 1:
            raise ValueError(f"the probe oracle needs at least one candidate (got {candidates})")
        self.probe = probe
        self.candidates = candidates

    def select(self, state, batch_size, rng, step) -> Selection:
        n = state.n_tasks
        cand = np.sort(rng.choice(n, size=min(self.candidates, n), replace=False))
        rewards = np.asarray(self.probe([str(state.task_ids[i]) for i in cand], int(rng.integers(2**62))))
        var = np.full(n, -1.0)  # never a candidate: never picked
        var[cand] = rewards.var(axis=1)
        idx = _top(var, min(batch_size, len(cand)), rng)
        picks = _picks(state, idx, "oracle", var)
        for p in picks:
            p.pred_var = float(var[p.index])
            p.p_nonzero = float(var[p.index] > 0)
        return Selection(picks)
