"""The batch constraints (docs/algorithm.md, batch construction) while a batch is built: no
duplicates, at most C1 tasks per environment per step, at most C3 per environment over steps
t-2..t (and, opt-in, a cap on its informative groups over those steps), no task three steps in a
row, retired tasks and quarantined environments skipped; when candidates run out, relax in order
(consecutive cap, C3, C1) and record each relaxation."""

from __future__ import annotations

import numpy as np

from envsched_pipeline.scheduler.config import SchedulerConfig
from envsched_pipeline.scheduler.state import SchedulerState


class BatchConstraints:
    """Tracks the batch constraints (docs/algorithm.md §6) while a batch is built, with the relaxation order.

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
        # the useful-breadth quota (config.informative_cap): realized informative groups per
        # environment at t-1 and t-2, this step's picks counted by their chance of spread (``chance``,
        # set once the scheduler has predicted), and the cap; None while there is no history
        self.env_inf_window, self.inf_cap = informative_window(state, config, step)
        self.env_inf_now = np.zeros(e)
        self.chance: np.ndarray | None = None

    def quarantine_report(self) -> list[dict]:
        a = self.state.arrays
        out = []
        for e in self.quarantined_envs:
            rate = a["env_infra_X"][e] / max(a["env_infra_W"][e], 1e-12)
            out.append(
                {
                    "env_id": self.state.env_ids[e],
                    "until_step": int(a["env_quarantine_until"][e]),
                    "reason": f"infrastructure error rate {rate:.0%} over recent rollouts",
                }
            )
        return out

    def blocks(self, level: int | None = None) -> dict[str, np.ndarray]:
        """Each constraint in force at ``level`` (default: the current one) and the tasks it blocks."""
        level = self.level if level is None else level
        env = self.state.env
        out = {"already picked": self.chosen, "retired": self.retired, "quarantined": self.quarantine}
        if level < 1 and self.config.consecutive_cap > 0:
            out["consecutive cap"] = self.streak_block
        if level < 2:
            out["C3 window cap"] = (self.env_window + self.env_now)[env] >= self.config.cap_env_window
            if self.inf_cap is not None:
                out["informative cap"] = (self.env_inf_window + self.env_inf_now)[env] >= self.inf_cap
        if level < 3:
            out["C1 per-step cap"] = self.env_now[env] >= self.config.cap_env_step
        return out

    def eligible(self, level: int | None = None) -> np.ndarray:
        return ~np.logical_or.reduce(list(self.blocks(level).values()))

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
        if self.inf_cap is not None:
            snapshot["env_informative_window"] = round(float(self.env_inf_window[e] + self.env_inf_now[e]), 3)
            snapshot["informative_cap"] = round(self.inf_cap, 3)
        self.chosen[i] = True
        self.env_now[e] += 1
        if self.chance is not None:
            self.env_inf_now[e] += float(np.clip(self.chance[i], 0.0, 1.0))
        return snapshot


def informative_window(
    state: SchedulerState, config: SchedulerConfig, step: int
) -> tuple[np.ndarray, float | None]:
    """(per environment: its groups with spread at steps t-2 and t-1, the cap on those plus this
    step's expected ones) for ``config.informative_cap`` (docs/algorithm.md §6); the cap is None
    when the quota is off or no recorded step falls in the window."""
    counts = np.zeros(state.n_envs)
    if config.informative_cap <= 0:
        return counts, None
    kept = [r for r in state.extra.get("env_informative", []) if step - 2 <= r["step"] < step]
    if not kept:
        return counts, None
    where = {e: j for j, e in enumerate(state.env_ids)}
    for r in kept:
        for env_id, n in r["counts"].items():
            if env_id in where:
                counts[where[env_id]] += n
    per_step = counts.sum() / len(kept)
    return counts, config.informative_cap * 3.0 * per_step / max(state.n_envs, 1)
