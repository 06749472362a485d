"""The state update every scheduler shares, one named step per thing it maintains.

    decay               every decayed sum x gamma^(steps elapsed)                    (own history)
    add_observations    the step's group mean / variance / dispersion, EMAs, cost
    count_exposure      rollouts spent (failed ones too), last seen, environment counters
    count_pending       a selection ahead of the rollouts: the picks in between as exposure
    remember_recent     the last three group means / dispersions (retirement)
    track_hacks         decayed identifier-hack rate among rewarded rollouts
    retire              progress filter: retire tasks whose last groups were all solved / failed
    quarantine          environments whose infrastructure-error rate spikes are skipped for a while
    keep_history        realized variance, calibration pairs, recent picks
    track_half_yields   each half's decayed share of informative groups (adaptive coverage share)
    track_env_informative  groups with spread per environment, last two steps (useful-breadth quota)

Everything is O(pool) vector arithmetic; no history is replayed.
"""

from __future__ import annotations

import numpy as np

from envsched_pipeline.scheduler.config import SchedulerConfig
from envsched_pipeline.scheduler.state import CALIB_WINDOW, Observations, SchedulerState


def update_state(
    state: SchedulerState, obs: Observations, config: SchedulerConfig, predicted_u: np.ndarray | None = None
) -> SchedulerState:
    """Apply one step's observations in place; returns the state."""
    elapsed = max(1, obs.step - state.step) if state.step >= 0 else 1
    decay(state, config, elapsed)
    has = obs.rollouts > 0  # groups that produced task outcomes
    add_observations(state, obs, config, has)
    count_exposure(state, obs)
    remember_recent(state, obs, has)
    track_hacks(state, obs, has)
    retire(state, obs, config, has)
    quarantine(state, obs, config, elapsed)
    keep_history(state, obs, config, has, predicted_u)
    track_half_yields(state, obs, config, has, elapsed)
    track_env_informative(state, obs, config, has)
    state.step = obs.step
    return state


def decay(state: SchedulerState, config: SchedulerConfig, elapsed: int) -> None:
    a = state.arrays
    gamma = 2.0 ** (-1.0 / config.h_long)
    for k in ("W", "Xm", "Xs2", "Xd", "hack_W", "hack_X", "cost_W", "cost_X"):
        a.setdefault(k, np.zeros(state.n_tasks))
        a[k] *= gamma**elapsed


def add_observations(
    state: SchedulerState, obs: Observations, config: SchedulerConfig, has: np.ndarray
) -> None:
    a = state.arrays
    i, m, s2, d = obs.task_idx[has], obs.mean[has], obs.var[has], obs.dispersion[has]
    a["W"][i] += 1.0
    a["Xm"][i] += m
    a["Xs2"][i] += s2
    a["Xd"][i] += d
    # short / long EMAs of s2 (recent-decline guard)
    a_s = 1.0 - 2.0 ** (-1.0 / config.h_short)
    a_l = 1.0 - 2.0 ** (-1.0 / config.h_long)
    first = a["n_groups"][i] == 0
    a["ema_short"][i] = np.where(first, s2, (1 - a_s) * a["ema_short"][i] + a_s * s2)
    a["ema_long"][i] = np.where(first, s2, (1 - a_l) * a["ema_long"][i] + a_l * s2)
    a["n_groups"][i] += 1
    if obs.cost is not None:
        c = np.asarray(obs.cost, dtype=float)[has]
        ok = np.isfinite(c) & (c > 0)
        a["cost_W"][i[ok]] += 1.0
        a["cost_X"][i[ok]] += c[ok]


def count_exposure(state: SchedulerState, obs: Observations) -> None:
    a = state.arrays
    spent = obs.rollouts if obs.spent is None else obs.spent
    a["exposure"][obs.task_idx] += spent  # rollouts spent, successful or not
    a["last_seen"][obs.task_idx] = obs.step
    np.add.at(a["env_rollouts"], state.env[obs.task_idx], spent)
    a["env_last_seen"][state.env[obs.task_idx]] = obs.step


def count_pending(state: SchedulerState, step: int, task_idx: np.ndarray, group_size: int) -> None:
    """The picks of step ``step``, whose rollouts are not in ``state`` yet, counted as exposure (G
    rollouts each, seen at ``step``) and as that step's picks: what a selection made ahead of the
    rollouts (``RunSpec.select_lag``) knows of the manifests in between. Nothing is learned of
    their outcomes; ``state.step`` stays the last step observed."""
    a = state.arrays
    idx = np.asarray(task_idx, dtype=np.int64)
    a["exposure"][idx] += group_size
    a["last_seen"][idx] = step
    np.add.at(a["env_rollouts"], state.env[idx], group_size)
    a["env_last_seen"][state.env[idx]] = step
    state.recent_picks = (state.recent_picks + [idx.copy()])[-3:]


def remember_recent(state: SchedulerState, obs: Observations, has: np.ndarray) -> None:
    """Last three group means and dispersions, newest in slot 0."""
    a = state.arrays
    i = obs.task_idx[has]
    for k in ("recent_mean", "recent_disp"):
        for j in range(3):
            a.setdefault(f"{k}_{j}", np.full(state.n_tasks, np.nan))
        a[f"{k}_2"][i] = a[f"{k}_1"][i]
        a[f"{k}_1"][i] = a[f"{k}_0"][i]
    a["recent_mean_0"][i] = obs.mean[has]
    a["recent_disp_0"][i] = obs.dispersion[has]


def track_hacks(state: SchedulerState, obs: Observations, has: np.ndarray) -> None:
    """Identifier-hack rate: flagged share of rewarded rollouts, decayed like own history."""
    a = state.arrays
    i, rewarded, flagged = obs.task_idx[has], obs.rewarded[has], obs.hack_flags[has]
    a["hack_W"][i] += (rewarded > 0).astype(float)
    a["hack_X"][i] += np.where(rewarded > 0, flagged / np.maximum(rewarded, 1.0), 0.0)


def hack_rate(state: SchedulerState) -> np.ndarray:
    a = state.arrays
    return np.where(a["hack_W"] > 0, a["hack_X"] / np.maximum(a["hack_W"], 1e-12), 0.0)


def retire(state: SchedulerState, obs: Observations, config: SchedulerConfig, has: np.ndarray) -> None:
    """Progress filter: the last ``retire_window`` groups all solved or all failed ("mean"), or all
    without reward spread ("dispersion"); a hacked task is retired too. A progress-retired task
    just observed with spread is back in play (a hacked one is not)."""
    a = state.arrays
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
    rate = hack_rate(state)
    newly = (dead | (rate > config.hack_retire)) & (a["retired"] == 0)
    a["retired"][newly] = 1.0
    a["retired_at"][newly] = obs.step
    i = obs.task_idx[has]
    back = (
        (a["retired"] == 1)
        & np.isin(np.arange(state.n_tasks), i[obs.dispersion[has] > 0])
        & (rate <= config.hack_retire)
    )
    a["retired"][back] = 0.0


def quarantine(state: SchedulerState, obs: Observations, config: SchedulerConfig, elapsed: int) -> None:
    """Infrastructure failures per environment (decayed); a spike quarantines the environment."""
    a = state.arrays
    spent = obs.rollouts if obs.spent is None else obs.spent
    g_inf = 2.0 ** (-1.0 / config.infra_half_life)
    for k in ("env_infra_W", "env_infra_X"):
        a.setdefault(k, np.zeros(state.n_envs))
        a[k] *= g_inf**elapsed
    a.setdefault("env_quarantine_until", np.full(state.n_envs, -1.0))
    np.add.at(a["env_infra_W"], state.env[obs.task_idx], spent)
    np.add.at(a["env_infra_X"], state.env[obs.task_idx], spent - obs.rollouts)
    rate = a["env_infra_X"] / np.maximum(a["env_infra_W"], 1e-12)
    hot = (rate > config.quarantine_rate) & (a["env_infra_W"] >= config.quarantine_min_rollouts)
    hot &= a["env_quarantine_until"] < obs.step  # not already in quarantine
    a["env_quarantine_until"][hot] = obs.step + config.quarantine_steps


def track_half_yields(
    state: SchedulerState, obs: Observations, config: SchedulerConfig, has: np.ndarray, elapsed: int
) -> None:
    """Decayed share of informative groups per half (coverage / exploit), for the adaptive coverage
    share: {half: [weight, informative]} in ``state.extra["half_yield"]``."""
    if obs.halves is None:
        return
    gamma = 2.0 ** (-1.0 / config.h_long)
    ys = state.extra.setdefault("half_yield", {})
    for half in ("coverage", "exploit"):
        w, x = ys.get(half, [0.0, 0.0])
        sel = (np.asarray(obs.halves) == half) & has
        ys[half] = [
            w * gamma**elapsed + float(sel.sum()),
            x * gamma**elapsed + float(obs.dispersion[sel].sum()),
        ]


def track_env_informative(state: SchedulerState, obs: Observations, config: SchedulerConfig, has) -> None:
    """Groups with spread per environment at the last two observed steps, for the useful-breadth
    quota (``config.informative_cap``): ``state.extra["env_informative"]`` = [{"step", "counts":
    {env_id: n}}], keyed by environment id so a resume onto an edited pool keeps them."""
    if config.informative_cap <= 0:
        return
    env = state.env[obs.task_idx[has]][obs.dispersion[has] > 0]
    ids, n = np.unique(env, return_counts=True)
    counts = {state.env_ids[int(e)]: int(k) for e, k in zip(ids, n, strict=True)}
    kept = [r for r in state.extra.get("env_informative", []) if r["step"] < obs.step]
    state.extra["env_informative"] = (kept + [{"step": int(obs.step), "counts": counts}])[-2:]


def keep_history(
    state: SchedulerState,
    obs: Observations,
    config: SchedulerConfig,
    has: np.ndarray,
    predicted_u: np.ndarray | None,
) -> None:
    s2 = obs.var[has]
    state.realized_var = (state.realized_var + [float(s2.mean()) if len(s2) else 0.0])[-config.calib_window :]
    if predicted_u is not None:
        state.calib_u = (state.calib_u + [np.asarray(predicted_u, dtype=float)[has]])[-CALIB_WINDOW:]
        state.calib_s2 = (state.calib_s2 + [s2])[-CALIB_WINDOW:]
    state.recent_picks = (state.recent_picks + [obs.task_idx.copy()])[-3:]
