"""Statistics t: fold step t's rollouts into the scheduler state (:mod:`envsched_pipeline.core.fold`),
save it, and write ``statistics[t]`` (with the state's digest) and ``yields[t]``."""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from envsched_pipeline.core.build import build_scheduler
from envsched_pipeline.core.fold import DIGEST, apply, load_state, step_observations
from envsched_pipeline.core.gates import check_rollouts, halt, halt_message, stop_if_stalled
from envsched_pipeline.core.state_store import save_state
from envsched_pipeline.errors import StepError
from envsched_pipeline.lake import Lake
from envsched_pipeline.rollouts import batch_metrics
from envsched_pipeline.run import require_run


def statistics_step(lake: Lake, step: int) -> dict:
    spec = require_run(lake)
    if not lake.has("rollouts", step=step):
        raise StepError(f"cannot compute statistics for step {step}: its rollouts are missing")
    if not lake.has("manifests", step=step):
        raise StepError(f"cannot compute statistics for step {step}: its manifest is missing")
    gate = check_rollouts(lake, step, spec)
    if not gate["passed"]:  # rollouts that fail their check are never folded into the statistics
        raise StepError(halt_message(halt(lake, step, "rollouts_are_complete", gate["problems"])))
    state = load_state(lake, spec, step - 1)
    if state.step >= step:
        raise StepError(f"state after step {step - 1} already includes step {state.step}")
    sched = build_scheduler(lake, spec, state)
    rollouts = lake.read("rollouts", step=step)
    obs, u = step_observations(lake, state, step, rollouts)
    t0 = time.perf_counter()
    apply(sched, state, obs, u)
    seconds = time.perf_counter() - t0
    save_state(lake, state, step, spec.select_lag)
    a = state.arrays
    i = obs.task_idx
    w = np.maximum(a["W"][i], 1e-12)
    # what the scheduler now believes about these tasks (graph/environment prior and blend)
    prior_var = hat_var = np.full(len(i), np.nan)
    belief = sched.predict(state, model=False)  # the variance estimates below; no spread model fit
    if belief is not None:
        prior_var, hat_var = belief["prior_s2"][i], belief["hat_s2"][i]
    rows = {
        "step": np.full(len(i), step, dtype=np.int64),
        "task_id": state.task_ids[i].astype(str),
        "env_id": np.array([state.env_ids[e] for e in state.env[i]]),
        "group_mean": obs.mean,
        "group_var": obs.var,
        "group_dispersion": obs.dispersion,
        "observations": a["n_groups"][i],
        "own_mean": a["Xm"][i] / w,
        "own_var": a["Xs2"][i] / w,
        "own_dispersion": a["Xd"][i] / w,
        "exposure": a["exposure"][i],
        "predicted_var": u,
        "prior_var": prior_var,
        "posterior_var": hat_var,
        "retired": a["retired"][i] > 0,
        "hack_rate": np.where(a["hack_W"][i] > 0, a["hack_X"][i] / np.maximum(a["hack_W"][i], 1e-12), 0.0),
        DIGEST: np.full(len(i), state.digest()),  # what a state folded again must match
    }
    lake.write("statistics", pa.table(rows), step=step)
    audit = lake.read("audits", step=step).to_pylist()
    realized = float((obs.dispersion > 0).mean()) if len(i) else 0.0
    pred_y = (
        float(audit[0]["predicted_yield"])
        if audit and audit[0].get("predicted_yield") is not None
        else float("nan")
    )
    lake.write(
        "yields",
        [{"step": step, "predicted_yield": pred_y, "realized_yield": realized, "groups": len(i)}],
        step=step,
    )
    metrics = batch_metrics([np.asarray(g) for g in _group_rewards(rollouts)])
    stopped = stop_if_stalled(lake, step, spec)  # held-out stalled for eval_patience evaluations
    return {
        "stopped_early": stopped is not None,
        **({"stop_reason": stopped["problems"][0]} if stopped else {}),
        "predicted_yield": pred_y,
        "realized_yield": realized,
        "tasks_updated": len(i),
        "tasks_observed": int(state.observed.sum()),
        "retired": int((a["retired"] > 0).sum()),
        "update_seconds": seconds,
        "batch_variance": float(obs.var.mean()) if len(i) else 0.0,
        "zero_variance_fraction": float((obs.dispersion == 0).mean()) if len(i) else 0.0,
        "reward_mean": metrics["reward_mean"],
    }


def _group_rewards(rollouts: pa.Table) -> list[list[float]]:
    by: dict[str, list[float]] = {}
    for t, r in zip(
        rollouts.column("task_id").to_pylist(), rollouts.column("reward").to_pylist(), strict=True
    ):
        by.setdefault(t, []).append(r)
    return list(by.values())
