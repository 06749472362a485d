"""Offline scheduler evaluation on a logged run: how would scheduler X have done, without new rollouts?

For each logged step t the target scheduler selects a batch from the *logged* scheduler state after
t-1 (the standard replay approximation: the counterfactual policy's own effect on later states is
not modelled). Each pick's within-group variance is estimated doubly robustly:

    v_hat_i = m_i + 1[i logged at t] / p_i * (v_i - m_i)

where p_i is the logged pick's propensity (its inclusion probability under the logging scheduler's
randomness; B/N for a random logger) and m_i a reward model built only from what was logged *before* step t (the task's
mean variance over the previous ``window`` steps, else its environment's, else all tasks', else the
cold prior): it never reads t's or later outcomes. With a full-support logger (random) the correction makes the estimate unbiased for
the replayed states; with a deterministic logger tasks it never picks carry only the model term,
which the report states as ``model_share``. The per-step estimates give a standard error.

Each scheduler named is what ``envsched train --scheduler NAME`` runs: the paper's constants with
the named variant's overrides, at the logged run's B and G; the logged run's own overrides are not
carried over (``envsched`` is the paper's scheduler whatever the logged run used).
"""

from __future__ import annotations

import numpy as np

from envsched_pipeline.core.build import scheduler_config
from envsched_pipeline.core.fold import states_before
from envsched_pipeline.graph.store import load_graph
from envsched_pipeline.lake import Lake
from envsched_pipeline.run import require_run, step_rng
from envsched_pipeline.scheduler import GRAPH_SCHEDULERS, make_scheduler
from envsched_pipeline.scheduler.config import SchedulerConfig
from envsched_pipeline.scheduler.variants import resolve, scheduler_label


def replay(lake: Lake, schedulers: list[str], window: int = 4, log=print) -> dict:
    for name in schedulers:
        resolve(name)  # an unknown name is named before the lake is read (ValueError)
    spec = require_run(lake)
    steps = [s for s in lake.steps("statistics") if lake.has("manifests", step=s)]
    if not steps:
        raise ValueError(f"{lake.root}: no completed steps to replay")
    hist = lake.sql(
        "select step, task_id, any_value(env_id) as env_id, var_pop(reward) as v from rollouts "
        "where error_class is null or error_class in ('none', 'task') group by 1, 2"
    ).to_pylist()
    by_task: dict[str, list[tuple[int, float]]] = {}
    by_step: dict[int, dict[str, float]] = {}
    env_step: dict[tuple[int, str], list[float]] = {}
    for r in hist:
        by_task.setdefault(r["task_id"], []).append((r["step"], r["v"]))
        by_step.setdefault(r["step"], {})[r["task_id"]] = r["v"]
        env_step.setdefault((r["step"], r["env_id"]), []).append(r["v"])
    logged_prop = {}
    for s in steps:
        for r in lake.read("manifests", step=s, columns=["task_id", "propensity"]).to_pylist():
            p = r["propensity"]
            logged_prop[(s, r["task_id"])] = p if p == p and p > 0 else 1.0
    forms = {}
    for name in schedulers:
        base, overrides = resolve(name)  # ValueError naming the choices
        config = SchedulerConfig(batch_size=spec.batch_size, group_size=spec.group_size)
        forms[name] = (base, config.with_overrides(**overrides))
        if forms[name][1].validation_every:  # a logged run holds no validation slice to steer by
            raise ValueError(f"{name}: a validation-slice variant runs only in `envsched bench scheduler`")
    graph = None
    if any(base in GRAPH_SCHEDULERS for base, _ in forms.values()):
        graph = load_graph(lake, spec.pool)
    out = {}
    for name, (base, config) in forms.items():
        est, overlap, model_share = [], [], []
        for t, state in states_before(lake, spec, steps):  # each its own copy: a scheduler annotates it
            g = graph.reindex(state.task_ids) if graph is not None else None
            sched = make_scheduler(base, config, graph=g if base in GRAPH_SCHEDULERS else None)
            picks = sched.select(state, spec.batch_size, step_rng(spec, t, salt=7), t).picks
            # the model term uses only what was known before step t (never t's or later outcomes)
            past_steps = [s for s in by_step if t - window <= s < t]
            past_all = [v for s in past_steps for v in by_step[s].values()]
            fallback = float(np.mean(past_all)) if past_all else scheduler_config(spec).cold_var
            vals, hits = [], 0
            for p in picks:
                own = [v for s, v in by_task.get(p.task_id, []) if t - window <= s < t]
                env = [v for s in past_steps for v in env_step.get((s, p.env_id), [])]
                m = float(np.mean(own)) if own else float(np.mean(env)) if env else fallback
                v_hat = m
                if p.task_id in by_step.get(t, {}):  # logged at t: the doubly robust correction
                    hits += 1
                    v_hat = m + (by_step[t][p.task_id] - m) / logged_prop.get((t, p.task_id), 1.0)
                vals.append(v_hat)
            est.append(float(np.mean(vals)))
            overlap.append(hits / max(len(picks), 1))
            model_share.append(1.0 - hits / max(len(picks), 1))
        arr = np.array(est)
        out[name] = {
            "batch_variance_estimate": float(arr.mean()),
            "stderr": float(arr.std(ddof=1) / np.sqrt(len(arr))) if len(arr) > 1 else float("nan"),
            "overlap_with_log": float(np.mean(overlap)),
            "model_share": float(np.mean(model_share)),  # share of picks valued by the model alone
            "steps": len(arr),
        }
        log(
            f"  replay {name:<16} estimate {arr.mean():.4f} +- {out[name]['stderr']:.4f} "
            f"(overlap {np.mean(overlap):.2f})"
        )
    logged = [float(np.mean(list(by_step[s].values()))) for s in steps if s in by_step]
    return {
        "logged": {
            "scheduler": scheduler_label(spec.scheduler, spec.scheduler_config),
            "batch_variance": float(np.mean(logged)),
            "steps": len(steps),
        },
        "schedulers": out,
    }
