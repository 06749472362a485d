"""Why a task was left out of a batch, from the internals of the EnvSched selection that built it
(``EnvSched.last_trace``): the constraint in force at the batch's end that blocks it, or how its
score less its similarity penalty compares with the exploit picks'. Pure: the state and the trace
only (``envsched explain`` and each manifest's near misses read it)."""

from __future__ import annotations

import math

import numpy as np

from envsched_pipeline.scheduler.state import SchedulerState


def left_out(sched, state: SchedulerState, i: int) -> dict:
    """For task index ``i``, not picked by ``sched``'s last selection: ``blocked_by`` (constraint
    names) and ``why`` (words); past the cold start also its ``score``, ``value`` (score less the
    similarity penalty), ``score_rank`` among ``tasks`` and the ``reason`` record a pick carries."""
    trace = sched.last_trace
    cons = trace["constraints"]
    blocked = [name for name, mask in cons.blocks().items() if mask[i]]
    out: dict = {"blocked_by": blocked}
    if trace["cold"]:
        out["why"] = "step 0 has no history: the cold start visits environments round robin " + (
            f"(blocked: {', '.join(blocked)})" if blocked else "and its environment's turn took other tasks"
        )
        return out
    pred, inf, penalty = trace["pred"], trace["inf"], trace["penalty"]
    snap = {"env_picks_this_step": int(cons.env_now[state.env[i]]), "relax_level": cons.level}
    reason = sched._pick(state, i, "not picked", pred, inf, snap, math.nan, float(penalty[i])).reason
    score = inf["score"]
    lam = sched.config.lambda_sim
    value = float(score[i] - lam * penalty[i])
    # the arithmetic, so the value can be checked against the estimates printed beside it
    worked = (
        f"{score[i]:.4g} - {lam:g} x {penalty[i]:.4g} = {value:.4g}" if lam and penalty[i] else f"{value:.4g}"
    )
    out.update(
        score=float(score[i]),
        value=value,
        score_rank=int((score > score[i]).sum()) + 1,
        tasks=int(state.n_tasks),
        reason=reason,
    )
    values = trace["exploit_values"]
    if blocked:
        out["why"] = "blocked by " + ", ".join(blocked_words(b, cons, state, i) for b in blocked)
    elif not values:
        out["why"] = "eligible, but the batch had no exploit half: coverage took every slot"
    elif value < min(values):
        out["why"] = (
            f"eligible, but its score less its weighted similarity penalty ({worked}) is below the lowest "
            f"exploit pick's when it was taken ({min(values):.4g})"
        )
    elif sched.config.exploit_sampling == "proportional":
        out["why"] = "eligible; exploit picks are drawn in proportion to their score and the draws passed it"
    else:
        relaxed = ", ".join(cons.relaxations) or "none"
        out["why"] = (
            f"eligible at the end of the batch with its score less its weighted similarity penalty ({worked}) "
            f"at or above the lowest exploit pick's ({min(values):.4g}): a constraint blocked it while "
            f"those picks were taken and was relaxed later (relaxed: {relaxed}), or it lost a tie"
        )
    return out


def blocked_words(name: str, cons, state, i: int) -> str:
    e = state.env[i]
    c = cons.config
    if name == "C1 per-step cap":
        return f"the C1 cap ({cons.env_now[e]} picks from its environment this step, cap {c.cap_env_step})"
    if name == "C3 window cap":
        return (
            f"the C3 cap ({cons.env_window[e] + cons.env_now[e]} picks from its environment over steps "
            f"t-2..t, cap {c.cap_env_window})"
        )
    if name == "informative cap":
        return (
            f"the useful-breadth cap (its environment's informative groups over t-2..t at {cons.inf_cap:.3g})"
        )
    if name == "consecutive cap":
        return "the consecutive cap (picked in each of the two previous steps)"
    if name == "retired":
        return "retirement (its groups stopped varying; it returns by chance or when a neighbour heats up)"
    if name == "quarantined":
        return "its environment's quarantine (infrastructure errors)"
    return name


def near_misses(sched, state: SchedulerState, picked: list[int], n: int = 10) -> list[dict]:
    """The ``n`` highest-scored tasks the last selection left out, each with :func:`left_out`'s
    answer (none at the cold start, which scores nothing)."""
    trace = getattr(sched, "last_trace", None)
    if not trace or trace["cold"]:
        return []
    score = np.array(trace["inf"]["score"], dtype=float)
    score[np.asarray(picked, dtype=np.int64)] = -np.inf
    order = np.argsort(-score, kind="stable")[: min(n, state.n_tasks - len(picked))]
    return [
        {
            "task_id": str(state.task_ids[i]),
            "env_id": state.env_ids[state.env[i]],
            **left_out(sched, state, int(i)),
        }
        for i in order
    ]
