"""Scheduler benchmark: every scheduler against the same simulated learner, pool and seeds.

The learner is the simulated one (ALGORITHM.md §8) — results are a simulation and say so. The
comparison is fair: schedulers see the task text (through the graph built from lake rows) and the
observed rewards only; the learner's latent skills and patterns stay inside the learner. The
oracle (true variance from the simulator) is reported as the ceiling, never as a scheduler.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import numpy as np

from envs.registry import load_synthetic
from envsched_pipeline.graph.topk import build_graph
from envsched_pipeline.scheduler import GRAPH_SCHEDULERS, SCHEDULERS, make_scheduler
from envsched_pipeline.scheduler.baselines import Oracle
from envsched_pipeline.scheduler.config import SchedulerConfig
from envsched_pipeline.scheduler.state import Observations, SchedulerState
from trainer.simulated import SimulatedLearner

METRICS = ("batch_variance", "zero_variance_fraction", "envs_touched", "median_reward", "mean_reward",
           "pool_seen_fraction", "heldout_final", "steps_to_random_best", "select_seconds_median", "relaxations",
           "informative_groups_per_second")


def prepare_pool(envs: int, tasks_per_env: int, seed: int, progress: Callable | None = None) -> dict:
    data = load_synthetic("synthetic", n_envs=envs, tasks_per_env=tasks_per_env, seed=seed)
    tasks = sorted(data.tasks, key=lambda t: t["task_id"])
    tools = {e["env_id"]: [x["function"]["name"] for x in json.loads(e["tools"])] for e in data.environments}
    t0 = time.perf_counter()
    graph, stats = build_graph(tasks, tools, progress=progress)
    stats["build_seconds"] = time.perf_counter() - t0
    latents = [dict(r, z=json.loads(r["z"])) for r in data.latents]
    return {"tasks": tasks, "graph": graph, "graph_stats": stats, "latents": latents}


def run_one(name: str, pool: dict, steps: int, seed: int, batch_size: int = 64, group_size: int = 8,
            overrides: dict | None = None, use_graph: bool = True, init_state: SchedulerState | None = None,
            difficulty_shift: float = 0.0, return_state: bool = False) -> dict:
    """One scheduler, one seed: per-step series. ``difficulty_shift`` > 0 simulates a weaker model
    (e.g. a smaller one whose run provides a cross-run prior)."""
    tasks = pool["tasks"]
    lat = pool["latents"] if not difficulty_shift else [dict(r, difficulty=r["difficulty"] + difficulty_shift)
                                                         for r in pool["latents"]]
    learner = SimulatedLearner(lat)
    state = init_state or SchedulerState.new([t["task_id"] for t in tasks], [t["env_id"] for t in tasks],
                                             [t["content_hash"] for t in tasks])
    config = SchedulerConfig(batch_size=batch_size, group_size=group_size).with_overrides(**(overrides or {}))
    if name == "oracle":
        sched = Oracle(config, true_variance=lambda ids: learner.true_variance(
            np.array([learner.index[t] for t in ids])))
    else:
        base = name.split("@")[0]
        sched = make_scheduler(base, config, graph=pool["graph"] if (use_graph and base in GRAPH_SCHEDULERS) else None)
    roll_rng = np.random.default_rng([seed, 99])
    series: dict[str, list] = {k: [] for k in ("batch_variance", "zero_variance_fraction", "envs_touched",
                                               "median_reward", "mean_reward", "pool_seen_fraction", "heldout",
                                               "select_seconds", "relaxations", "predicted_nonzero",
                                               "informative_per_second")}
    seen = np.zeros(state.n_tasks, dtype=bool)
    for t in range(steps):
        t0 = time.perf_counter()
        selection = sched.select(state, batch_size, np.random.default_rng([seed, t]), t)
        picks = selection.picks
        t_sel = time.perf_counter() - t0
        ids = [p.task_id for p in picks]
        idx = np.array([p.index for p in picks])
        out = learner.rollout(ids, group_size, roll_rng)
        r = out["reward"]
        learner.learn(ids, r)
        obs = Observations.from_groups(t, idx, list(r))
        obs.cost = out["seconds"].mean(axis=1)
        t1 = time.perf_counter()
        sched.update(state, obs, predicted_u=np.array([p.pred_var for p in picks]))
        t_upd = time.perf_counter() - t1
        seen[idx] = True
        v = r.var(axis=1)
        series["batch_variance"].append(float(v.mean()))
        series["zero_variance_fraction"].append(float((np.ptp(r, axis=1) <= 1e-6).mean()))
        series["envs_touched"].append(len({p.env_id for p in picks}))
        series["median_reward"].append(float(np.median(r.mean(axis=1))))
        series["mean_reward"].append(float(r.mean()))
        series["pool_seen_fraction"].append(float(seen.mean()))
        series["heldout"].append(learner.heldout_score())
        series["select_seconds"].append(t_sel + t_upd)
        series["relaxations"].append(len(selection.relaxations))
        pn = [p.p_nonzero for p in picks if not np.isnan(p.p_nonzero)]
        series["predicted_nonzero"].append(float(np.mean(pn)) if pn else float("nan"))
        series["informative_per_second"].append(float((np.ptp(r, axis=1) > 1e-6).sum() / out["seconds"].sum()))
    if return_state:
        series["_state"] = state
    return series


def summarize(series: dict, random_best: float | None) -> dict:
    ho = series["heldout"]
    steps_to = None
    if random_best is not None:
        hit = [i for i, h in enumerate(ho) if h >= random_best - 1e-12]
        steps_to = (hit[0] + 1) if hit else None
    return {
        "batch_variance": float(np.mean(series["batch_variance"])),
        "zero_variance_fraction": float(np.mean(series["zero_variance_fraction"])),
        "envs_touched": float(np.mean(series["envs_touched"])),
        "median_reward": float(np.mean(series["median_reward"])),
        "mean_reward": float(np.mean(series["mean_reward"])),
        "pool_seen_fraction": float(series["pool_seen_fraction"][-1]),
        "heldout_final": float(ho[-1]),
        "steps_to_random_best": steps_to,
        "select_seconds_median": float(np.median(series["select_seconds"])),
        "relaxations": float(np.mean(series["relaxations"])),
        "informative_groups_per_second": float(np.mean(series["informative_per_second"])),
    }


def run_benchmark(schedulers: list[str], steps: int, seed: int, envs: int = 51, tasks_per_env: int = 50,
                  seeds: int = 1, batch_size: int = 64, group_size: int = 8,
                  overrides: dict[str, dict] | None = None, log: Callable[[str], None] = print) -> dict:
    """All schedulers x seeds. Returns the JSON document of ``envsched bench scheduler``."""
    unknown = [s for s in schedulers if s.split("@")[0] not in SCHEDULERS and s != "oracle"]
    if unknown:
        raise ValueError(f"unknown scheduler(s): {', '.join(unknown)}; known: {', '.join(SCHEDULERS)}, oracle")
    names = list(dict.fromkeys(schedulers))
    runs: dict[str, list[dict]] = {n: [] for n in names}
    summaries: dict[str, list[dict]] = {n: [] for n in names}
    graph_stats = None
    for k in range(seeds):
        s = seed + k
        pool = prepare_pool(envs, tasks_per_env, s)
        graph_stats = pool["graph_stats"]
        ordered = (["random"] if "random" in names else []) + [n for n in names if n != "random"]
        random_best = None
        for n in ordered:
            t0 = time.perf_counter()
            ser = run_one(n, pool, steps, s, batch_size, group_size, (overrides or {}).get(n))
            if n == "random":
                random_best = max(ser["heldout"])
            runs[n].append(ser)
            summaries[n].append(summarize(ser, random_best))
            log(f"  seed {s} {n:<16} var={summaries[n][-1]['batch_variance']:.4f} "
                f"zero={summaries[n][-1]['zero_variance_fraction']:.3f} envs={summaries[n][-1]['envs_touched']:.1f} "
                f"heldout={summaries[n][-1]['heldout_final']:.4f} ({time.perf_counter() - t0:.1f}s)")
    out = {"schedulers": {}, "series": {}, "setup": {
        "simulated": True, "envs": envs, "tasks_per_env": tasks_per_env, "steps": steps, "seed": seed,
        "seeds": seeds, "batch_size": batch_size, "group_size": group_size, "graph": graph_stats}}
    for n in names:
        agg = {}
        for m in METRICS:
            vals = [x[m] for x in summaries[n]]
            if m == "steps_to_random_best":
                agg[m] = float(np.mean(vals)) if vals and all(v is not None for v in vals) else None
            else:
                agg[m] = float(np.mean(vals))
        agg["batch_variance_sd"] = float(np.std([x["batch_variance"] for x in summaries[n]]))
        out["schedulers"][n] = agg
        out["series"][n] = {k: np.mean([r[k] for r in runs[n]], axis=0).tolist() for k in runs[n][0] if not k.startswith("_")}
    return out
