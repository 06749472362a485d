"""The scheduler interface, the shared state update and the batch constraints.

Every scheduler (EnvSched and the baselines) implements::

    select(state, B, rng, step) -> list[Pick]     # picks with reasons
    update(state, observations) -> state           # incremental, in place

``update`` here is shared: it maintains the decayed own history (ALGORITHM.md §2), exposure,
recent-decline EMAs, retirement (§5.6), the identifier-hack rate (§5.7) and the environment
counters the constraints need (§6). Baselines that need more (GRESO, MoPPS, DPS) extend it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from envsched_pipeline.scheduler.config import SchedulerConfig
from envsched_pipeline.scheduler.state import CALIB_WINDOW, Observations, SchedulerState


@dataclass
class Pick:
    task_id: str
    env_id: str
    half: str  # cold | coverage | exploit | random | <baseline name>
    score: float
    pred_var: float = float("nan")  # predicted within-group reward variance
    p_nonzero: float = float("nan")  # predicted probability of a non-zero-variance group
    propensity: float = float("nan")  # probability of this pick under the scheduler's randomness
    reason: dict = field(default_factory=dict)
    index: int = -1  # index into the state's tasks


class Scheduler(Protocol):
    name: str
    config: SchedulerConfig

    def select(self, state: SchedulerState, batch_size: int, rng: np.random.Generator, step: int) -> list[Pick]: ...

    def update(self, state: SchedulerState, obs: Observations,
               predicted_u: np.ndarray | None = None) -> SchedulerState: ...


# ---------------------------------------------------------------------------- shared update
def update_state(state: SchedulerState, obs: Observations, config: SchedulerConfig,
                 predicted_u: np.ndarray | None = None) -> SchedulerState:
    """Apply one step's observations. O(pool) vector work; no history replay."""
    a = state.arrays
    gamma = 2.0 ** (-1.0 / config.h_long)
    steps_elapsed = max(1, obs.step - state.step) if state.step >= 0 else 1
    decay = gamma**steps_elapsed
    for k in ("W", "Xm", "Xs2", "Xd", "hack_W", "hack_X", "cost_W", "cost_X"):
        a.setdefault(k, np.zeros(state.n_tasks))
        a[k] *= decay
    i = obs.task_idx
    has = obs.rollouts > 0  # a group that produced task outcomes
    i, m, s2, d = i[has], obs.mean[has], obs.var[has], obs.dispersion[has]
    a["W"][i] += 1.0
    a["Xm"][i] += m
    a["Xs2"][i] += s2
    a["Xd"][i] += d
    # short / long EMAs of s2 (recent-decline guard)
    a_s = 1.0 - 2.0 ** (-1.0 / config.h_short)
    a_l = 1.0 - gamma
    first = a["n_groups"][i] == 0
    a["ema_short"][i] = np.where(first, s2, (1 - a_s) * a["ema_short"][i] + a_s * s2)
    a["ema_long"][i] = np.where(first, s2, (1 - a_l) * a["ema_long"][i] + a_l * s2)
    a["n_groups"][i] += 1
    if obs.cost is not None:
        c = np.asarray(obs.cost, dtype=float)[has]
        ok = np.isfinite(c) & (c > 0)
        a["cost_W"][i[ok]] += 1.0
        a["cost_X"][i[ok]] += c[ok]
    spent = obs.rollouts if obs.spent is None else obs.spent
    a["exposure"][obs.task_idx] += spent  # rollouts spent, successful or not
    a["last_seen"][obs.task_idx] = obs.step
    # last three group means and dispersions, newest in slot 0
    for k in ("recent_mean", "recent_disp"):
        for j in range(3):
            a.setdefault(f"{k}_{j}", np.full(state.n_tasks, np.nan))
        a[f"{k}_2"][i] = a[f"{k}_1"][i]
        a[f"{k}_1"][i] = a[f"{k}_0"][i]
    a["recent_mean_0"][i] = m
    a["recent_disp_0"][i] = d
    # identifier-hack rate: flagged share of rewarded rollouts, decayed like own history
    rewarded = obs.rewarded[has]
    flagged = obs.hack_flags[has]
    a["hack_W"][i] += (rewarded > 0).astype(float)
    a["hack_X"][i] += np.where(rewarded > 0, flagged / np.maximum(rewarded, 1.0), 0.0)
    # retirement (progress filter): the last `retire_window` groups all solved or all failed
    # ("mean"), or all without reward spread ("dispersion": also all-equal partial credit)
    w = config.retire_window
    recent = np.stack([a[f"recent_mean_{j}"] for j in range(w)])
    full = ~np.isnan(recent).any(axis=0)
    if config.retire_on == "dispersion":
        disp = np.stack([a[f"recent_disp_{j}"] for j in range(w)])
        dead = full & (np.nan_to_num(disp, nan=1.0) == 0).all(axis=0)
    else:
        solved = full & (np.nan_to_num(recent, nan=0.0) >= config.retire_solved).all(axis=0)
        failed = full & (np.nan_to_num(recent, nan=1.0) <= config.retire_failed).all(axis=0)
        dead = solved | failed
    hack_rate = np.where(a["hack_W"] > 0, a["hack_X"] / np.maximum(a["hack_W"], 1e-12), 0.0)
    newly = (dead | (hack_rate > config.hack_retire)) & (a["retired"] == 0)
    a["retired"][newly] = 1.0
    a["retired_at"][newly] = obs.step
    # a progress-retired task just observed with spread is back in play (a hacked one is not)
    back = (a["retired"] == 1) & np.isin(np.arange(state.n_tasks), i[d > 0]) & (hack_rate <= config.hack_retire)
    a["retired"][back] = 0.0
    # environment counters
    np.add.at(a["env_rollouts"], state.env[obs.task_idx], spent)
    a["env_last_seen"][state.env[obs.task_idx]] = obs.step
    # infrastructure failures per environment (decayed); a spike quarantines the environment
    g_inf = 2.0 ** (-1.0 / config.infra_half_life)
    for k in ("env_infra_W", "env_infra_X"):
        a.setdefault(k, np.zeros(state.n_envs))
        a[k] *= g_inf ** steps_elapsed
    a.setdefault("env_quarantine_until", np.full(state.n_envs, -1.0))
    np.add.at(a["env_infra_W"], state.env[obs.task_idx], spent)
    np.add.at(a["env_infra_X"], state.env[obs.task_idx], spent - obs.rollouts)
    rate = a["env_infra_X"] / np.maximum(a["env_infra_W"], 1e-12)
    hot = (rate > config.quarantine_rate) & (a["env_infra_W"] >= config.quarantine_min_rollouts)
    hot &= a["env_quarantine_until"] < obs.step  # not already in quarantine
    a["env_quarantine_until"][hot] = obs.step + config.quarantine_steps
    # per-step history
    state.realized_var = (state.realized_var + [float(s2.mean()) if len(s2) else 0.0])[-config.calib_window:]
    if predicted_u is not None:
        state.calib_u = (state.calib_u + [np.asarray(predicted_u, dtype=float)[has]])[-CALIB_WINDOW:]
        state.calib_s2 = (state.calib_s2 + [s2])[-CALIB_WINDOW:]
    state.recent_picks = (state.recent_picks + [obs.task_idx.copy()])[-3:]
    state.step = obs.step
    return state


# ---------------------------------------------------------------------------- constraints
class BatchConstraints:
    """Tracks the §6 constraints while a batch is built, with the relaxation order.

    Level 0: everything; 1: consecutive cap relaxed; 2: + C3 relaxed; 3: + C1 relaxed.
    """

    def __init__(self, state: SchedulerState, config: SchedulerConfig, step: int):
        self.state, self.config = state, config
        n, e = state.n_tasks, state.n_envs
        self.chosen = np.zeros(n, dtype=bool)
        self.env_now = np.zeros(e, dtype=np.int64)
        # picks of the two previous steps (t-1, t-2) from the state's recent history
        self.env_window = np.zeros(e, dtype=np.int64)
        picked_prev = [p for p in state.recent_picks[-2:]]
        for p in picked_prev:
            np.add.at(self.env_window, state.env[p], 1)
        self.streak_block = np.zeros(n, dtype=bool)
        if len(picked_prev) == 2 and step >= 2:
            both = np.intersect1d(picked_prev[0], picked_prev[1])
            self.streak_block[both] = True
        self.retired = state.arrays["retired"] > 0
        q = state.arrays.get("env_quarantine_until")
        self.quarantined_envs = np.flatnonzero(q >= step) if q is not None else np.array([], dtype=np.int64)
        self.quarantine = np.isin(state.env, self.quarantined_envs)
        self.level = 0
        self.relaxations: list[str] = []

    def quarantine_report(self) -> list[dict]:
        a = self.state.arrays
        out = []
        for e in self.quarantined_envs:
            rate = a["env_infra_X"][e] / max(a["env_infra_W"][e], 1e-12)
            out.append({"env_id": self.state.env_ids[e], "until_step": int(a["env_quarantine_until"][e]),
                        "reason": f"infrastructure error rate {rate:.0%} over recent rollouts"})
        return out

    def eligible(self, level: int | None = None) -> np.ndarray:
        level = self.level if level is None else level
        ok = ~self.chosen & ~self.retired & ~self.quarantine
        env = self.state.env
        if level < 1 and self.config.consecutive_cap > 0:
            ok &= ~self.streak_block
        if level < 2:
            ok &= (self.env_window + self.env_now)[env] < self.config.cap_env_window
        if level < 3:
            ok &= self.env_now[env] < self.config.cap_env_step
        return ok

    def eligible_or_relax(self) -> np.ndarray:
        """Eligible mask; relaxes constraints in order (and records it) when nothing is left."""
        names = ("consecutive cap", "C3 window cap", "C1 per-step cap")
        ok = self.eligible()
        while not ok.any() and self.level < 3:
            self.level += 1
            self.relaxations.append(names[self.level - 1])
            ok = self.eligible()
        if not ok.any():  # last resort: retired tasks come back rather than an empty slot
            ok = ~self.chosen & ~self.quarantine
            if ok.any() and "retired" not in self.relaxations:
                self.relaxations.append("retired")
        if not ok.any():  # and only then quarantined environments
            ok = ~self.chosen
            if ok.any() and "quarantine" not in self.relaxations:
                self.relaxations.append("quarantine")
        return ok

    def take(self, i: int) -> dict:
        e = self.state.env[i]
        snapshot = {
            "env_picks_this_step": int(self.env_now[e]),
            "env_picks_window": int(self.env_window[e] + self.env_now[e]),
            "relax_level": self.level,
        }
        self.chosen[i] = True
        self.env_now[e] += 1
        return snapshot


# ---------------------------------------------------------------------------- random baseline
class RandomScheduler:
    """Uniform without replacement (the paper's baseline); constraints off, like the paper's."""

    name = "random"

    def __init__(self, config: SchedulerConfig = SchedulerConfig()):
        self.config = config

    def select(self, state: SchedulerState, batch_size: int, rng: np.random.Generator, step: int) -> list[Pick]:
        n = state.n_tasks
        b = min(batch_size, n)
        idx = rng.choice(n, size=b, replace=False)
        prop = b / n
        return [
            Pick(
                task_id=str(state.task_ids[i]), env_id=state.env_ids[state.env[i]], half="random",
                score=0.0, propensity=prop, reason={"half": "random", "uniform_of": n}, index=int(i),
            )
            for i in idx
        ]

    def update(self, state: SchedulerState, obs: Observations,
               predicted_u: np.ndarray | None = None) -> SchedulerState:
        return update_state(state, obs, self.config, predicted_u)
