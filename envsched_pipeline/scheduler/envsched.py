"""EnvSched (docs/algorithm.md §2-§6): graph-propagated variance prediction and a coverage +
exploitation batch under environment quotas.

    predict(state)          own history, neighbour/environment prior, shrinkage blend   (§2, §4)
    informativeness(...)    u, isotonic calibration, discounts, guards                    (§5)
    select(state, B, ...)   cold start | coverage half + MMR exploitation half            (§6)

Everything is vectorized over the pool; the only per-pick loops are the B picks themselves.
"""

from __future__ import annotations

import numpy as np

from envsched_pipeline.scheduler.base import Pick, Scheduler, Selection
from envsched_pipeline.scheduler.config import SchedulerConfig
from envsched_pipeline.scheduler.constraints import BatchConstraints
from envsched_pipeline.scheduler.graph import TaskGraph
from envsched_pipeline.scheduler.state import Observations, SchedulerState

STATS = ("m", "s2", "d")
_SUM = {"m": "Xm", "s2": "Xs2", "d": "Xd"}


def _observed_topk(idx: np.ndarray, sim: np.ndarray, W: np.ndarray, k: int):
    """Among candidate neighbours (sorted by similarity), keep the first k observed ones.
    Returns (idx, weights) with weights w_ij = sim_ij * W_j / (W_j + 1) (0 where not kept)."""
    if idx.shape[1] == 0 or k <= 0:
        return idx[:, :0], sim[:, :0]
    valid = idx >= 0
    wj = np.where(valid, W[np.maximum(idx, 0)], 0.0)
    obs = valid & (wj > 0)
    keep = obs & (np.cumsum(obs, axis=1) <= k)
    w = np.where(keep, sim * wj / (wj + 1.0), 0.0)
    return idx, w


class EnvSched(Scheduler):
    name = "envsched"
    uses_graph = True
    applies_quotas = True

    def __init__(self, config: SchedulerConfig = SchedulerConfig(), graph: TaskGraph | None = None):
        super().__init__(config, graph)
        self.last_trace: dict | None = None  # the last select()'s internals, for explanations

    # ------------------------------------------------------------------ §2 + §4
    def predict(
        self, state: SchedulerState, model: bool = True, step: int | None = None
    ) -> dict[str, np.ndarray]:
        """Per-task estimates (hat_m, hat_s2, hat_d and their parts). With the config's spread_model
        and ``model``, hat_d is the fitted model's chance of spread at ``step`` (default: the one
        after the state's last; the shrunk estimate: base_d)."""
        c, a = self.config, state.arrays
        W = a["W"]
        obs = W > 0
        # own_floor: scale an observed task's decayed sums up to at least that many groups (means kept)
        floor = (
            np.where(obs, np.maximum(1.0, c.own_floor / np.maximum(W, 1e-12)), 1.0) if c.own_floor else None
        )
        if floor is not None:
            W = W * floor
        n = state.n_tasks
        out: dict[str, np.ndarray] = {"W": W}
        # environment and global decay-weighted means
        env_W = np.bincount(state.env, weights=W, minlength=state.n_envs)
        tot_W = W.sum()
        cold = {"m": c.cold_mean, "s2": c.cold_var, "d": c.cold_dispersion}
        use_graph = c.use_graph and self.graph is not None
        if use_graph:
            wi, ww = _observed_topk(self.graph.within_idx, self.graph.within_sim, W, c.k_within)
            xi, xw = _observed_topk(self.graph.cross_idx, self.graph.cross_sim, W, c.k_cross)
            mass_w, mass_x = ww.sum(axis=1), xw.sum(axis=1)
            out["n_within"] = (ww > 0).sum(axis=1)
            out["n_cross"] = (xw > 0).sum(axis=1)
        else:
            mass_w = mass_x = np.zeros(n)
            out["n_within"] = out["n_cross"] = np.zeros(n, dtype=np.int64)
        n_nb = mass_w + mass_x
        out["n_nb"] = n_nb
        if c.env_prior == "task":  # observed tasks per environment: the task prior's denominator
            n_obs_env = np.bincount(state.env, weights=obs.astype(float), minlength=state.n_envs)
        for x in STATS:
            X = a[_SUM[x]] if floor is None else a[_SUM[x]] * floor
            own = np.where(obs, X / np.maximum(W, 1e-12), np.nan)
            glob = X.sum() / tot_W if tot_W > 0 else cold[x]
            if x == "s2" and tot_W == 0:
                glob = c.cold_var
            if c.env_prior == "task":  # each observed task once, by its own estimate
                own0 = np.where(obs, own, 0.0)
                glob = float(own0[obs].mean()) if obs.any() else glob
                env_X, env_n = np.bincount(state.env, weights=own0, minlength=state.n_envs), n_obs_env
            else:
                env_X, env_n = np.bincount(state.env, weights=X, minlength=state.n_envs), env_W
            x_env = np.where(env_n > 0, env_X / np.maximum(env_n, 1e-12), glob)[state.env]
            if not c.use_env_prior:
                x_env = np.full(n, glob)
            if use_graph:
                vals = np.where(obs, X / np.maximum(W, 1e-12), 0.0)
                x_w = (ww * vals[np.maximum(wi, 0)]).sum(axis=1) / np.maximum(mass_w, 1e-12)
                x_x = (xw * vals[np.maximum(xi, 0)]).sum(axis=1) / np.maximum(mass_x, 1e-12)
                has_w, has_x = mass_w > 0, mass_x > 0
                cnt = has_w.astype(float) + has_x.astype(float)
                x_nb = (np.where(has_w, x_w, 0.0) + np.where(has_x, x_x, 0.0)) / np.maximum(cnt, 1.0)
                prior = (n_nb * x_nb + c.lambda_g * x_env) / (n_nb + c.lambda_g)
                out[f"nb_{x}"] = np.where(cnt > 0, x_nb, np.nan)
            else:
                prior = x_env
            hat = (X + c.lambda_s * prior) / (W + c.lambda_s)
            out[f"own_{x}"], out[f"prior_{x}"], out[f"hat_{x}"] = own, prior, hat
        if model and c.spread_model != "none":
            p = self._fit_spread_model(state, out, state.step + 1 if step is None else step)
            if p is not None:
                out["base_d"], out["hat_d"] = out["hat_d"], p
        return out

    def _fit_spread_model(
        self, state: SchedulerState, pred: dict[str, np.ndarray], step: int
    ) -> np.ndarray | None:
        """The chance of spread at ``step`` from a logistic regression on the run's past picks
        (``state.model_rows``); None until there are spread_model_min_rows rows with both outcomes."""
        rows = state.model_rows
        if rows.shape[0] < self.config.spread_model_min_rows:
            return None
        X, y = rows[:, :-1], rows[:, -1] > 0.5
        if y.all() or not y.any():
            return None
        feats = spread_features(state, pred, step, self.config.spread_features)
        if X.shape[1] != feats.shape[1]:  # rows from another feature set
            return None
        if self.config.spread_model == "boosted":
            return _boosted_chance(X, y, feats)
        from sklearn.linear_model import LogisticRegression  # scikit-learn loads slowly; only this option

        mu, sd = X.mean(axis=0), X.std(axis=0)
        sd[sd == 0] = 1.0
        fit = LogisticRegression(C=1.0, max_iter=1000).fit((X - mu) / sd, y)
        return fit.predict_proba((feats - mu) / sd)[:, 1]

    def update(
        self, state: SchedulerState, obs: Observations, predicted_u: np.ndarray | None = None
    ) -> SchedulerState:
        if self.config.spread_model != "none":
            has = obs.rollouts > 0
            if has.any():  # the features the state had when these tasks were picked, and the outcome
                feats = spread_features(
                    state, self.predict(state, model=False), obs.step, self.config.spread_features
                )
                new = np.column_stack([feats[obs.task_idx[has]], obs.dispersion[has]])
                old = state.model_rows if state.model_rows.shape[1:] == new.shape[1:] else new[:0]
                state.model_rows = np.concatenate([old, new])[-self.config.spread_model_rows :]
        return super().update(state, obs, predicted_u)

    # ------------------------------------------------------------------ §5
    def informativeness(
        self, state: SchedulerState, pred: dict[str, np.ndarray], rng: np.random.Generator | None = None
    ) -> dict[str, np.ndarray]:
        c, a = self.config, state.arrays
        recent = float(np.mean(state.realized_var[-c.calib_window :])) if state.realized_var else c.cold_var
        if c.target == "variance":
            u = pred["hat_s2"] + c.dispersion_bonus * pred["hat_d"] * recent
        else:
            f = c.success_floor
            pf = _pass_fail_weight(self._success(state, pred, rng), c.success_peak)
            d = np.clip(pred["hat_d"], 0.0, 1.0) ** c.spread_power
            spread = c.spread_floor + (1.0 - c.spread_floor) * d
            u = spread * (f + pf) / (1.0 + f)
        cal = u.copy()
        calibrated = False
        # isotonic calibration maps u onto realized variance: only for the variance target (the
        # success target's u is on its own fixed [0, 1] scale and is not a variance forecast)
        if c.calibrate and c.target == "variance" and len(state.calib_u) >= 2:
            xu = np.concatenate(state.calib_u[-c.calib_window :])
            ys = np.concatenate(state.calib_s2[-c.calib_window :])
            if len(xu) >= 8 and np.ptp(xu) > 0:
                from sklearn.isotonic import IsotonicRegression  # scikit-learn loads slowly; only from step 2

                iso = IsotonicRegression(increasing=True, out_of_bounds="clip", y_min=0.0)
                iso.fit(xu, ys)
                # a tiny monotone tie-break keeps the order inside isotonic plateaus
                cal = iso.predict(u) + 1e-4 * u
                calibrated = True
        top = cal.max() if len(cal) else 0.0
        norm = cal / top if top > 0 else np.zeros_like(cal)
        n_exp = a["exposure"] / (c.group_size if c.exposure_unit == "groups" else 1.0)
        exposure = c.c0 / (c.c0 + n_exp)
        seen = a["n_groups"] > 0
        delta = np.clip((a["ema_long"] - a["ema_short"]) / (a["ema_long"] + 1e-6), 0.0, 1.0)
        decline = np.where(seen, 1.0 - c.eta * delta, 1.0)
        hack = np.where(a["hack_W"] > 0, a["hack_X"] / np.maximum(a["hack_W"], 1e-12), 0.0)
        score = norm * exposure * decline * (1.0 - hack)
        cost = np.ones_like(score)
        if c.cost_aware:
            cost = self.predicted_cost(state)
            rel = cost / max(float(np.median(cost)), 1e-9)
            score = score * np.clip(1.0 / np.maximum(rel, 1e-9), c.cost_floor, 1.0 / c.cost_floor)
        return {
            "u": u,
            "calibrated": cal,
            "norm": norm,
            "exposure": exposure,
            "decline": decline,
            "hack": hack,
            "score": score,
            "cost": cost,
            "recent_var": np.full(1, recent),
            "is_calibrated": np.full(1, calibrated),
        }

    def _success(self, state: SchedulerState, pred, rng: np.random.Generator | None) -> np.ndarray:
        """The success rate u is built on: m_hat, or for ``success-sampled`` one draw from
        Beta(m_hat n + 1/2, (1 - m_hat) n + 1/2), n = G x (decayed groups seen) + 2 lambda_s (own
        rollouts plus a prior worth 2 lambda_s rollouts, so an unobserved task's draw is wide and
        centred on its neighbourhood's mean)."""
        m = np.clip(pred["hat_m"], 0.0, 1.0)
        if self.config.target != "success-sampled":
            return m
        if rng is None:
            raise ValueError("scheduler config target 'success-sampled' needs a random generator")
        n = self.config.group_size * state.arrays["W"] + 2.0 * self.config.lambda_s
        return rng.beta(m * n + 0.5, (1.0 - m) * n + 0.5)

    def predicted_cost(self, state: SchedulerState) -> np.ndarray:
        """Seconds per rollout: own decayed mean, else the environment's, else the global mean."""
        a = state.arrays
        cw, cx = a.get("cost_W", np.zeros(state.n_tasks)), a.get("cost_X", np.zeros(state.n_tasks))
        glob = cx.sum() / cw.sum() if cw.sum() > 0 else 1.0
        ew = np.bincount(state.env, weights=cw, minlength=state.n_envs)
        ex = np.bincount(state.env, weights=cx, minlength=state.n_envs)
        env_mean = np.where(ew > 0, ex / np.maximum(ew, 1e-12), glob)[state.env]
        return np.where(cw > 0, (cx + env_mean) / (cw + 1.0), env_mean)

    def _returning(self, state: SchedulerState, pred, rng: np.random.Generator) -> np.ndarray:
        """Retired tasks that come back this step: p = return_prob, or a neighbour heats up."""
        a = state.arrays
        retired = a["retired"] > 0
        back = retired & (rng.random(state.n_tasks) < self.config.return_prob)
        if self.graph is not None and retired.any() and state.realized_var:
            recent = float(np.mean(state.realized_var[-self.config.calib_window :]))
            if self.config.return_rule == "neighbour-mean":  # the neighbourhood as a whole heats up
                back |= retired & (
                    np.nan_to_num(pred.get("nb_s2", np.full(state.n_tasks, np.nan)), nan=0.0) > recent
                )
                return back
            hot = pred["hat_s2"] > recent
            r = np.flatnonzero(retired)
            nb = np.concatenate([self.graph.within_idx[r], self.graph.cross_idx[r]], axis=1)
            hot_nb = np.where(nb >= 0, hot[np.maximum(nb, 0)] & (a["W"][np.maximum(nb, 0)] > 0), False)
            back[r[hot_nb.any(axis=1)]] = True
        return back

    # ------------------------------------------------------------------ §6
    def select(
        self, state: SchedulerState, batch_size: int, rng: np.random.Generator, step: int
    ) -> Selection:
        c = self.config
        b = min(batch_size, state.n_tasks)
        cons = BatchConstraints(state, c, step)
        quarantined = cons.quarantine_report()
        if not state.observed.any():  # no history (and no cross-run prior): cold start
            picks = self._cold_start(state, b, rng, cons)
            self.last_trace = {"cold": True, "constraints": cons}
            return Selection(picks, cons.relaxations, quarantined)
        pred = self.predict(state, step=step)
        cons.chance = pred["hat_d"]  # this step's picks count towards the useful-breadth quota by it
        inf = self.informativeness(state, pred, rng)
        back = self._returning(state, pred, rng)
        cons.retired = cons.retired & ~back
        score = inf["score"]
        picks: list[Pick] = []
        n_cov = int(round(self.coverage_share(state) * b))
        # -- coverage half: environments by (rollouts spent, last seen, random), round robin
        last_seen = state.arrays["env_last_seen"]
        keys = (rng.random(state.n_envs), last_seen, state.arrays["env_rollouts"])
        if c.stale_after > 0:  # one pick per stale environment, the stalest first
            stale = self.stale_envs(state, step)
            n_cov = min(n_cov, int(stale.sum()))
            keys = (rng.random(state.n_envs), state.arrays["env_rollouts"], last_seen, ~stale)
        env_key = np.lexsort(keys)
        exposure = state.arrays["exposure"]

        def best_scored(cand):  # the highest score; ties random
            best = cand[score[cand] == score[cand].max()]
            return (int(best[0]) if len(best) == 1 else int(rng.choice(best))), 1.0 / len(best)

        def fewest_exposed(cand):  # fewest rollouts spent; ties: higher score, then random
            return best_scored(cand[exposure[cand] == exposure[cand].min()])

        def score_sampled(cand):  # drawn in proportion to the score; uniform where every score is 0
            w = np.clip(score[cand], 0.0, None)
            p = w / w.sum() if w.sum() > 0 else np.full(len(cand), 1.0 / len(cand))
            k = int(rng.choice(len(cand), p=p))
            return int(cand[k]), float(p[k])

        choose = {"score": best_scored, "sampled": score_sampled}.get(c.coverage_pick, fewest_exposed)
        for i, snap, prop in self._round_robin(state, cons, env_key, n_cov, choose):
            picks.append(self._pick(state, i, "coverage", pred, inf, snap, prop, 0.0))
        # -- exploitation half: greedy MMR
        penalty = np.zeros(state.n_tasks)
        sym = self.graph.symmetric() if (self.graph is not None and c.lambda_sim > 0) else None
        if sym is not None:
            for p in picks:
                self._add_penalty(sym, p.index, penalty)
        exploit_values = []  # each exploit pick's score less its similarity penalty when taken
        while len(picks) < b:
            ok = cons.eligible_or_relax()
            if not ok.any():
                break
            val = np.where(ok, score - c.lambda_sim * penalty, -np.inf)
            if c.exploit_sampling == "proportional":
                i, prop = _draw_proportional(val, ok, rng, c.exploit_power)
            else:
                i, prop = int(np.argmax(val)), 1.0
            exploit_values.append(float(val[i]))
            snap = cons.take(i)
            picks.append(self._pick(state, i, "exploit", pred, inf, snap, prop, float(penalty[i])))
            if sym is not None:
                self._add_penalty(sym, i, penalty)
        # what `envsched explain` reads back: this selection's estimates and final constraints
        self.last_trace = {
            "cold": False,
            "pred": pred,
            "inf": inf,
            "constraints": cons,
            "penalty": penalty,
            "returning": back,
            "coverage_slots": n_cov,
            "exploit_values": exploit_values,
        }
        return Selection(picks, cons.relaxations, quarantined)

    def coverage_share(self, state: SchedulerState) -> float:
        """rho, or with ``adaptive_rho`` rho x (coverage half's recent yield / exploit half's),
        clipped to [rho_min, rho]: coverage is worth its slots while it finds informative groups
        about as often as exploitation does; late in a run, when most coverage picks are solved
        or hopeless, the slots go to exploitation. With ``validation_every``, rho itself while the
        validation slice's score has stopped rising (:func:`validation_stalled`)."""
        c = self.config
        if c.validation_every and c.adaptive_rho and validation_stalled(state, c.validation_window):
            return c.rho
        ys = state.extra.get("half_yield") or {}
        if not c.adaptive_rho or c.rho <= 0 or "coverage" not in ys or "exploit" not in ys:
            return c.rho
        (wc, xc), (we, xe) = ys["coverage"], ys["exploit"]
        if wc < 4 or we < 4 or xe <= 0:
            return c.rho
        return float(np.clip(c.rho * (xc / wc) / (xe / we), min(c.rho_min, c.rho), c.rho))

    def stale_envs(self, state: SchedulerState, step: int) -> np.ndarray:
        """Environments not picked in the last ``stale_after`` steps (never picked: stale)."""
        last_seen = state.arrays["env_last_seen"]
        return (last_seen < 0) | (step - last_seen > self.config.stale_after)

    @staticmethod
    def _add_penalty(sym, i: int, penalty: np.ndarray) -> None:
        lo, hi = sym.indptr[i], sym.indptr[i + 1]
        cols, vals = sym.indices[lo:hi], sym.data[lo:hi]
        np.maximum.at(penalty, cols, vals)

    def _cold_start(self, state, b, rng, cons: BatchConstraints) -> list[Pick]:
        """Step 0: round-robin over environments (seeded order), max-min diversity inside each among
        the tasks least spent (all of them at step 0; not those of a step selected before it whose
        rollouts are not back, ``RunSpec.select_lag``)."""
        sym = self.graph.symmetric() if self.graph is not None else None
        order = rng.permutation(state.n_envs)
        max_sim = np.zeros(state.n_tasks)
        exposure = state.arrays["exposure"]

        sim_at_pick: dict[int, float] = {}

        def most_diverse(cand):  # max-min similarity to what the batch already holds
            cand = cand[exposure[cand] == exposure[cand].min()]
            least = cand[max_sim[cand] == max_sim[cand].min()]
            i = int(rng.choice(least))
            sim_at_pick[i] = float(max_sim[i])
            if sym is not None:
                self._add_penalty(sym, i, max_sim)
            return i, 1.0 / len(least)

        picks: list[Pick] = []
        for i, snap, prop in self._round_robin(state, cons, order, b, most_diverse):
            reason = {"half": "cold", "max_sim_to_batch": sim_at_pick[i], "constraints": snap}
            picks.append(
                Pick(
                    task_id=str(state.task_ids[i]),
                    env_id=state.env_ids[state.env[i]],
                    half="cold",
                    score=0.0,
                    pred_var=self.config.cold_var,
                    p_nonzero=self.config.cold_dispersion,
                    propensity=prop,
                    reason=reason,
                    index=i,
                )
            )
        return picks

    def _round_robin(self, state, cons: BatchConstraints, env_order, n: int, choose) -> list[tuple]:
        """Visit environments in ``env_order`` repeatedly, taking one eligible task from each with
        ``choose(candidates) -> (index, propensity)``, until ``n`` picks; when a full pass finds
        nothing, relax the next constraint. Returns (index, constraint snapshot, propensity)."""
        taken: list[tuple] = []
        while len(taken) < n:
            progressed = False
            for e in env_order:
                if len(taken) >= n:
                    break
                ok = cons.eligible() & (state.env == e)
                if not ok.any():
                    continue
                i, prop = choose(np.flatnonzero(ok))
                taken.append((i, cons.take(i), prop))
                progressed = True
            if not progressed and not self._relaxed(cons):
                break
        return taken

    @staticmethod
    def _relaxed(cons: BatchConstraints) -> bool:
        """Nothing was eligible in a full pass: relax one more constraint (True if that helped)."""
        before = cons.level
        cons.eligible_or_relax()
        return cons.level > before and cons.eligible().any()

    def _pick(self, state, i, half, pred, inf, snap, propensity, penalty) -> Pick:
        def f(x):
            v = float(x)
            return None if np.isnan(v) else round(v, 6)

        neighbours = []
        if self.graph is not None:
            for idx in (self.graph.within_idx[i], self.graph.cross_idx[i]):
                obs = idx[(idx >= 0)]
                obs = obs[state.arrays["W"][obs] > 0][:3]
                neighbours += [str(state.task_ids[j]) for j in obs]
        reason = {
            "half": half,
            "own_var": f(pred["own_s2"][i]),
            "prior_var": f(pred["prior_s2"][i]),
            "pred_var": f(pred["hat_s2"][i]),
            "pred_dispersion": f(pred["hat_d"][i]),
            "pred_success": f(pred["hat_m"][i]),
            "u": f(inf["u"][i]),
            "calibrated": f(inf["calibrated"][i]),
            "exposure_discount": f(inf["exposure"][i]),
            "decline_factor": f(inf["decline"][i]),
            "hack_factor": f(1.0 - inf["hack"][i]),
            "predicted_cost_s": f(inf["cost"][i]) if self.config.cost_aware else None,
            "similarity_penalty": f(penalty),
            "n_within": int(pred["n_within"][i]),
            "n_cross": int(pred["n_cross"][i]),
            "neighbours": neighbours,
            "constraints": snap,
        }
        return Pick(
            task_id=str(state.task_ids[i]),
            env_id=state.env_ids[state.env[i]],
            half=half,
            score=float(inf["score"][i]),
            pred_var=float(inf["u"][i]),
            p_nonzero=float(np.clip(pred["hat_d"][i], 0.0, 1.0)),
            propensity=propensity,
            reason=reason,
            index=i,
        )


def spread_features(
    state: SchedulerState, pred: dict[str, np.ndarray], step: int, kind: str = "base"
) -> np.ndarray:
    """(tasks, 11) what the spread model sees of each task at ``step``: first look, the last group's
    spread, mean and pass/fail variance, log steps since it (and times its spread), log groups so
    far, the shrunk estimates hat_d, hat_m, 4 hat_m (1 - hat_m), and hat_d's prior. ``kind`` "streak"
    adds 4 columns (tasks, 15): of the last three groups, how many in a row (newest first) had no
    spread, how many in a row sat flat at the newest one's mean, and each times log steps since."""
    a = state.arrays
    never = a["n_groups"] <= 0
    last_d = np.nan_to_num(a["recent_disp_0"], nan=0.0)
    last_m = np.clip(np.nan_to_num(a["recent_mean_0"], nan=0.0), 0.0, 1.0)
    age = np.where(never, 0.0, np.log1p(np.maximum(step - a["last_seen"], 0.0)))
    d, m = np.clip(pred["hat_d"], 0.0, 1.0), np.clip(pred["hat_m"], 0.0, 1.0)
    cols = [
        never,
        last_d,
        last_m,
        _pass_fail_variance(last_m),
        age,
        last_d * age,
        np.log1p(a["n_groups"]),
        d,
        m,
        _pass_fail_variance(m),
        np.clip(pred["prior_d"], 0.0, 1.0),
    ]
    if kind == "streak":
        flat, same = _flat_runs(a)
        cols += [flat, same, flat * age, same * age]
    return np.column_stack(cols).astype(float)


def _boosted_chance(X: np.ndarray, y: np.ndarray, feats: np.ndarray) -> np.ndarray:
    """spread_model "boosted": gradient-boosted trees on the same rows and features as the logistic
    model, so the chance of spread can bend where a straight line cannot (a task stuck for a while,
    then left alone). Fitted on one thread, without early stopping: the same rows give the same
    chances on any machine and thread count."""
    from sklearn.ensemble import HistGradientBoostingClassifier  # scikit-learn loads slowly; this option
    from threadpoolctl import threadpool_limits  # same reason

    with threadpool_limits(limits=1):
        fit = HistGradientBoostingClassifier(
            max_iter=100, learning_rate=0.1, max_leaf_nodes=15, min_samples_leaf=40, early_stopping=False
        ).fit(X, y)
        return fit.predict_proba(feats)[:, 1]


def _flat_runs(a: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per task, over its last three groups newest first: how many in a row had no spread, and how
    many in a row had no spread at the newest group's mean (a group not yet observed ends a run)."""
    flat_run = np.zeros(len(a["n_groups"]))
    same_run = np.zeros(len(a["n_groups"]))
    flat_on = np.ones(len(flat_run), dtype=bool)
    same_on = flat_on.copy()
    newest = np.nan_to_num(a["recent_mean_0"], nan=-2.0)
    for j in range(3):
        disp, mean = a[f"recent_disp_{j}"], a[f"recent_mean_{j}"]
        flat_on &= np.isfinite(disp) & (np.nan_to_num(disp, nan=1.0) <= 0.0)
        same_on &= flat_on & (np.abs(np.nan_to_num(mean, nan=-1.0) - newest) < 1e-9)
        flat_run += flat_on
        same_run += same_on
    return flat_run, same_run


def _pass_fail_variance(m: np.ndarray) -> np.ndarray:
    """4 m (1 - m): the variance of a pass/fail reward with success rate m, scaled to [0, 1]."""
    return 4.0 * m * (1.0 - m)


def _pass_fail_weight(m: np.ndarray, peak: float = 0.5) -> np.ndarray:
    """The success target's term in m: 1 at m = ``peak``, 0 at m = 0 and 1; at 0.5 exactly
    :func:`_pass_fail_variance`, else (m / c)^(2c) ((1 - m) / (1 - c))^(2 (1 - c)), c = ``peak``."""
    if peak == 0.5:
        return _pass_fail_variance(m)
    return (m / peak) ** (2.0 * peak) * ((1.0 - m) / (1.0 - peak)) ** (2.0 * (1.0 - peak))


def _draw_proportional(
    val: np.ndarray, ok: np.ndarray, rng: np.random.Generator, power: float = 1.0
) -> tuple[int, float]:
    """One eligible task drawn with probability proportional to ``val`` clipped at 0, to the power
    ``power`` (uniformly among the eligible when none is positive); returns (index, its probability:
    the pick's propensity)."""
    w = np.where(ok, np.maximum(np.nan_to_num(val, neginf=0.0), 0.0) ** power, 0.0)
    if w.sum() <= 0:
        w = ok.astype(float)
    p = w / w.sum()
    i = int(rng.choice(len(p), p=p))
    return i, float(p[i])


def validation_stalled(state: SchedulerState, window: int) -> bool:
    """Whether the validation slice's score has stopped rising: the mean of its last ``window``
    scores is not above the mean of the ``window`` before them. False until 2 x window scores exist
    (``state.extra["validation"]``: [step, score] pairs, oldest first)."""
    scores = [v for _, v in state.extra.get("validation") or []]
    if len(scores) < 2 * window:
        return False
    return float(np.mean(scores[-window:])) <= float(np.mean(scores[-2 * window : -window]))
