"""Scheduler benchmark: every scheduler against the same learner, pool and seeds.

Two learners:

* ``simulated`` (trainer/simulated.py): a model of learning, fast, for mechanics (variance,
  zero-variance share, calibration, latency, replay). Its held-out numbers are not evidence of
  generalization (docs/algorithm.md explains why) and are labelled simulated wherever reported.
* ``neural`` (trainer/neural): a ~1.2M-parameter pointer policy acting in the synthetic pool's real
  sandboxed environments, trained with the project's GRPO functions. Its held-out scores, on
  unseen tasks of the training environments and on environments never trained on, are the evidence.

The comparison is fair: schedulers see the task text (through the graph built from task rows) and
the observed rewards only. The oracle (true variance from the simulator) is the ceiling, never a
scheduler, and exists for the simulated learner only.

Runs are independent (scheduler, seed) jobs: ``run_benchmark(..., jobs=2, cache_dir=DIR)`` runs them
in parallel processes and keeps each finished job's series in ``DIR``, so an interrupted benchmark
resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from importlib import metadata
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info

from envs.isolation import die_with_parent
from envs.registry import load_synthetic, unseen_validation
from envsched_pipeline.analysis.headroom import history_ceiling, history_features
from envsched_pipeline.analysis.passk import reliability
from envsched_pipeline.analysis.trace import TraceWriter
from envsched_pipeline.graph.topk import build_graph
from envsched_pipeline.rollouts import flat_kinds, informative
from envsched_pipeline.run import floats_as_declared
from envsched_pipeline.scheduler import SCHEDULERS, make_scheduler, uses_graph
from envsched_pipeline.scheduler.baselines import Oracle, ProbeOracle
from envsched_pipeline.scheduler.config import SchedulerConfig
from envsched_pipeline.scheduler.envsched import validation_stalled
from envsched_pipeline.scheduler.state import Observations, SchedulerState
from envsched_pipeline.scheduler.variants import VARIANTS
from trainer.neural import UPDATE_DIAGNOSTICS
from trainer.simulated import SimLearnerConfig, SimulatedLearner

LEARNERS = ("simulated", "neural")
# tasks the neural learner's oracle looks at each step: 8 times a step's rollouts (B = 64), a
# fifth of the 2550-task pool: a 200-step run on the overrun learner took 30-40 minutes with two
# runs sharing 2 cores (4-5x a scheduler's run)
ORACLE_CANDIDATES = 512
METRICS = (
    "batch_variance",
    "zero_variance_fraction",
    "envs_touched",
    "median_reward",
    "mean_reward",
    "pool_seen_fraction",
    "heldout_final",
    "steps_to_random_best",
    "select_seconds_median",
    "relaxations",
    "informative_groups_per_second",
    "heldout_seen_initial",
    "heldout_seen_final",
    "heldout_seen_final_se",
    "heldout_seen_initial_se",
    "heldout_unseen_initial",
    "heldout_unseen_final",
    "heldout_unseen_initial_se",
    "heldout_unseen_final_se",
    "heldout_seen_auc",
    "heldout_unseen_auc",
    "informative_envs",
    "effective_envs",
    "distinct_tasks",
    "max_task_picks",
    "step_seconds",
)
# the neural learner's held-out over repeated attempts at the last evaluation (final_passk): in the
# table where every run of a scheduler has them, and paired against random's
PASSK_METRICS = tuple(
    f"heldout_{kind}_final_{m}"
    for kind in ("seen", "unseen")
    for m in ("solved", "solved_se", "pass_any", "pass_all")
)
UNSEEN_ENVS = 12  # environments of the unseen held-out split (one per domain of the unseen family)
VALIDATION_SAMPLES = 8  # episodes per validation-slice task (scheduler_config.validation_every)


def prepare_pool(
    envs: int, tasks_per_env: int, seed: int, progress: Callable | None = None, unseen_envs: int = UNSEEN_ENVS
) -> dict:
    """The generated pool with its graph, the simulator's latents, and both held-out sets
    (``unseen_envs`` environments of the unseen family; a larger split starts with the same
    environments and tasks as a smaller one, so it only adds to what is held out)."""
    data = load_synthetic(
        "synthetic", n_envs=envs, tasks_per_env=tasks_per_env, seed=seed, unseen_envs=unseen_envs
    )
    tasks = sorted(data.tasks, key=lambda t: t["task_id"])
    tools = {e["env_id"]: [x["function"]["name"] for x in json.loads(e["tools"])] for e in data.environments}
    t0 = time.perf_counter()
    graph, stats = build_graph(tasks, tools, progress=progress)
    stats["build_seconds"] = time.perf_counter() - t0
    latents = [dict(r, z=json.loads(r["z"])) for r in data.latents]
    return {
        "tasks": tasks,
        "graph": graph,
        "graph_stats": stats,
        "latents": latents,
        "environments": data.environments,
        "eval_environments": data.eval_environments,
        "heldout": data.heldout,
        "seed": seed,
        "shape": {"envs": envs, "tasks_per_env": tasks_per_env},
    }


# ---------------------------------------------------------------------------- learners
class SimulatedBench:
    """The simulated learner; held-out (seen) = its expected reward on the held-out split, held-out
    (unseen) = expected reward on generated environments it never trains on (familiarity 0)."""

    name = "simulated"

    def __init__(
        self, pool: dict, seed: int, difficulty_shift: float = 0.0, learner_config: dict | None = None
    ):
        lat = (
            pool["latents"]
            if not difficulty_shift
            else [dict(r, difficulty=r["difficulty"] + difficulty_shift) for r in pool["latents"]]
        )
        self.learner = SimulatedLearner(lat, SimLearnerConfig(**(learner_config or {})))
        self.true_variance = lambda ids: self.learner.true_variance(
            np.array([self.learner.index[t] for t in ids])
        )

    def rollout(self, task_ids: list[str], group_size: int, rng: np.random.Generator) -> dict:
        return self.learner.rollout(task_ids, group_size, rng)

    def learn(self, task_ids: list[str], rewards: np.ndarray) -> dict:
        return self.learner.learn(task_ids, rewards)

    def probe(self, task_ids: list[str], group_size: int, seed: int) -> np.ndarray:
        """Fresh rewards (n, G) at the learner's current skill; the learner is left as it was."""
        return self.learner.rollout(task_ids, group_size, np.random.default_rng(seed))["reward"]

    def evaluate(self, seed: int) -> dict:
        return {
            "seen": {"mean": self.learner.heldout_score(), "se": 0.0},
            "unseen": {"mean": self.learner.unseen_score(), "se": 0.0},
        }

    def close(self) -> None:
        pass


class NeuralBench:
    """The neural learner in the real sandboxed environments (see :mod:`trainer.neural.testbed`)."""

    name = "neural"

    def __init__(self, pool: dict, seed: int, learner_config: dict | None = None):
        from trainer.neural.learner import NeuralConfig  # torch: loaded only for the neural learner
        from trainer.neural.testbed import NeuralTestbed  # torch as well

        self.testbed = NeuralTestbed(
            pool["environments"] + pool["eval_environments"],
            pool["heldout"],
            seed,
            neural=NeuralConfig.from_dict(learner_config or {}),
        )
        self.rows = {t["task_id"]: t for t in pool["tasks"]}
        self.true_variance = None

    def rollout(self, task_ids: list[str], group_size: int, rng: np.random.Generator) -> dict:
        return self.testbed.rollout([self.rows[t] for t in task_ids], group_size, rng)

    def learn(self, task_ids: list[str], rewards: np.ndarray) -> dict:
        return self.testbed.learn()

    def probe(self, task_ids: list[str], group_size: int, seed: int) -> np.ndarray:
        """Fresh rewards (n, G) from the current policy; nothing is kept for ``learn``."""
        return self.testbed.probe([self.rows[t] for t in task_ids], group_size, seed)

    def evaluate(self, seed: int) -> dict:
        return self.testbed.evaluate(seed)

    def validation_slice(self, pool: dict) -> list[dict]:
        """The tasks of a validation slice (:func:`envs.registry.unseen_validation`: unseen-family
        environments past the held-out split's), their environments made known to the learner."""
        envs, tasks = unseen_validation("synthetic", pool["seed"], after=len(pool["eval_environments"]))
        self.testbed.learner.add_envs({e["env_id"]: e for e in envs})
        return tasks

    def validate(self, tasks: list[dict], seed: int) -> dict:
        """The policy's expected reward on ``tasks``, VALIDATION_SAMPLES sampled episodes each."""
        return self.testbed.learner.evaluate(tasks, VALIDATION_SAMPLES, seed=seed)

    def close(self) -> None:
        self.testbed.close()


def check_learner_config(kind: str, config: dict) -> dict:
    """Refuse unknown or invalid learner settings before any run starts (ValueError naming them).
    Returns the settings as recorded runs are keyed: a whole number given for a float setting
    becomes a float, so ``{"dual_clip": 3}`` and ``{"dual_clip": 3.0}`` find the same runs."""
    if kind == "neural":
        from trainer.neural.learner import NeuralConfig  # torch: loaded only for the neural learner

        NeuralConfig.from_dict(config)
        return floats_as_declared(config, NeuralConfig)
    fields = SimLearnerConfig.__dataclass_fields__
    bad = sorted(set(config) - set(fields))
    if bad:
        raise ValueError(
            f"unknown simulated learner setting(s): {', '.join(bad)}; known: {', '.join(sorted(fields))}"
        )
    return floats_as_declared(config, SimLearnerConfig)


def record_key_config(kind: str, config: dict | None) -> dict:
    """The learner settings a recorded run is keyed by. Neural: those differing from the learner's
    defaults as they stood when runs were first recorded (``trainer.neural.learner.record_settings``),
    so records keep their meaning when a default changes; simulated: the settings as given."""
    if kind != "neural":
        return dict(config or {})
    from trainer.neural.learner import record_settings  # torch: loaded only for the neural learner

    return record_settings(config)


def make_learner(kind: str, pool: dict, seed: int, **kw):
    if kind not in LEARNERS:
        raise ValueError(f"unknown learner {kind!r}; choose one of {', '.join(LEARNERS)}")
    return (SimulatedBench if kind == "simulated" else NeuralBench)(pool, seed, **kw)


# ---------------------------------------------------------------------------- one run
def default_eval_every(steps: int) -> int:
    """The neural learner's held-out schedule when none is given: every quarter of the run."""
    return max(1, steps // 4)


def eval_points(steps: int, learner: str, every: int | None = None) -> list[int]:
    """Steps after which held-out is measured: every step for the simulated learner (it is exact and
    free), every ``every`` (default steps // 4) plus the start for the neural one."""
    if learner == "simulated":
        return list(range(steps + 1))
    every = every or default_eval_every(steps)
    return sorted({0, steps, *range(every, steps, every)})


def run_one(
    name: str,
    pool: dict,
    steps: int,
    seed: int,
    batch_size: int = 64,
    group_size: int = 8,
    overrides: dict | None = None,
    use_graph: bool = True,
    init_state: SchedulerState | None = None,
    difficulty_shift: float = 0.0,
    return_state: bool = False,
    learner: str = "simulated",
    eval_every: int | None = None,
    log: Callable[[str], None] | None = None,
    learner_config: dict | None = None,
    probe_every: int | None = None,
    trace: str | Path | None = None,
    oracle_candidates: int = ORACLE_CANDIDATES,
    draw: int = 0,
) -> dict:
    """One scheduler, one seed: per-step series and held-out evaluations. ``difficulty_shift`` > 0
    simulates a weaker model (simulated learner only). ``probe_every``: every that many steps, probe
    the whole pool (:func:`headroom_probe`; the run itself is unchanged). ``trace``: write the run's
    picks beside their groups' outcomes to this Parquet file (envsched_pipeline/analysis/trace.py).
    ``oracle_candidates``: how many tasks the neural learner's oracle looks at each step
    (:class:`~envsched_pipeline.scheduler.baselines.ProbeOracle`). ``draw``: which of the seed's
    streams of rollout sampling and selection ties the run uses (0: the seed's own; another number
    gives another run from the same pool, split, warm start and held-out samples)."""
    if draw < 0:
        raise ValueError(f"draw must be >= 0 (got {draw})")
    stream = [draw] if draw else []  # draw 0 keeps the streams every recorded run used
    tasks = pool["tasks"]
    kw = (
        {"difficulty_shift": difficulty_shift, "learner_config": learner_config}
        if learner == "simulated"
        else {"learner_config": learner_config}
    )
    lrn = make_learner(learner, pool, seed, **kw)
    try:
        state = init_state or SchedulerState.new(
            [t["task_id"] for t in tasks], [t["env_id"] for t in tasks], [t["content_hash"] for t in tasks]
        )
        config = SchedulerConfig(batch_size=batch_size, group_size=group_size).with_overrides(
            **(overrides or {})
        )
        base = name.split("@")[0]
        if base == "oracle" and lrn.true_variance is not None:
            sched = Oracle(config, true_variance=lrn.true_variance)
        elif base == "oracle":  # no true variance: look at fresh groups of some tasks instead
            sched = ProbeOracle(
                config,
                probe=lambda ids, s: lrn.probe(ids, group_size, s),
                candidates=oracle_candidates,
            )
        else:
            sched = make_scheduler(
                base, config, graph=pool["graph"] if (use_graph and uses_graph(base)) else None
            )
        validation = None  # the scheduler's validation slice (scheduler_config.validation_every)
        if config.validation_every:
            if learner == "simulated":
                raise ValueError(
                    "scheduler_config.validation_every needs the neural learner (a validation slice of "
                    "real environments); the simulated learner has none"
                )
            validation = lrn.validation_slice(pool)
        roll_rng = np.random.default_rng([seed, 99, *stream])
        keys = (
            "batch_variance",
            "zero_variance_fraction",
            "envs_touched",
            "median_reward",
            "mean_reward",
            "pool_seen_fraction",
            "heldout",
            "select_seconds",
            "relaxations",
            "predicted_nonzero",
            "informative_per_second",
            "step_seconds",
            "coverage_picks",
        )
        series: dict[str, list] = {k: [] for k in keys}
        series["evals"] = []
        picks_per_task = np.zeros(state.n_tasks, dtype=np.int64)
        informative_per_env = np.zeros(state.n_envs)
        points = set(eval_points(steps, learner, eval_every))
        probe_at = set(range(probe_every, steps, probe_every)) if probe_every else set()
        skipped = 0  # optimizer steps the learner did not apply (non-finite gradient)
        tracer = TraceWriter(trace, name, seed) if trace else None
        for t in range(steps + 1):
            if t in points:
                ev = lrn.evaluate(seed=10_000 + t)
                series["evals"].append(
                    {
                        "step": t,
                        **{f"{k}_{m}": ev[k][m] for k in ("seen", "unseen") for m in ("mean", "se")},
                        # the neural learner's held-out per environment and per task (where the
                        # spread comes from; per task it can be grouped by what the task asks)
                        **{
                            f"{k}_{by}": ev[k][by]
                            for k in ("seen", "unseen")
                            for by in ("by_env", "by_task")
                            if by in ev[k]
                        },
                        **passk_fields(ev),
                    }
                )
                if log and learner != "simulated":
                    log(
                        f"    {name} seed {seed} step {t}: held-out seen {ev['seen']['mean']:.4f} "
                        f"unseen {ev['unseen']['mean']:.4f}"
                    )
            if t == steps:
                break
            if validation and t % config.validation_every == 0:
                # one sampling seed for every look of a run, so successive scores differ by what
                # the policy learned more than by which episodes were drawn
                v = lrn.validate(validation, seed=30_000 + seed)
                state.extra.setdefault("validation", []).append([t, v["mean"]])
                series.setdefault("validation", []).append({"step": t, "mean": v["mean"], "se": v["se"]})
                series["validation_episodes"] = (
                    series.get("validation_episodes", 0) + v["tasks"] * v["samples"]
                )
            if validation:
                series.setdefault("validation_stalled", []).append(
                    validation_stalled(state, config.validation_window)
                )
            t_step = time.perf_counter()
            t0 = time.perf_counter()
            selection = sched.select(state, batch_size, np.random.default_rng([seed, t, *stream]), t)
            t_sel = time.perf_counter() - t0
            picks = selection.picks
            ids = [p.task_id for p in picks]
            idx = np.array([p.index for p in picks])
            if t in probe_at:
                series.setdefault("probes", []).append(
                    headroom_probe(
                        lrn,
                        state,
                        pool["graph"],
                        idx,
                        group_size,
                        seed,
                        t,
                        log=log,
                        predicted=(sched.predict(state) or {}).get("hat_d"),
                        halves=[p.half for p in picks],
                    )
                )
            out = lrn.rollout(ids, group_size, roll_rng)
            r = out["reward"]
            if tracer:
                tracer.add(t, picks, r)
            info = lrn.learn(ids, r)
            skipped += int(info.get("skipped_updates", 0))
            if "error_class" in out:  # neural: episodes the sandbox ended (time limit, crash, infra)
                kinds = np.asarray(out["error_class"])
                series.setdefault("sandbox_failures", []).append(
                    int((~np.isin(kinds, ("none", "task"))).sum())
                )
            if "forced_stop_share" in info:  # neural: episodes the max_actions cap ended
                series.setdefault("forced_stop_share", []).append(float(info["forced_stop_share"]))
            for k in UPDATE_DIAGNOSTICS:  # neural: what the step's update did (NaN: nothing trained)
                if k in info:
                    series.setdefault(f"update_{k}", []).append(float(info[k]))
            obs = Observations.from_groups(t, idx, list(r))
            obs.cost = np.asarray(out["seconds"]).mean(axis=1)
            obs.halves = np.array([p.half for p in picks])
            t1 = time.perf_counter()
            sched.update(state, obs, predicted_u=np.array([p.pred_var for p in picks]))
            t_upd = time.perf_counter() - t1
            picks_per_task[idx] += 1
            inf = informative(r)
            np.add.at(informative_per_env, state.env[idx], inf.astype(float))
            series["batch_variance"].append(float(r.var(axis=1).mean()))
            series["zero_variance_fraction"].append(float(1.0 - inf.mean()))
            for kind, share in zero_variance_kinds(r, inf).items():
                series.setdefault(f"zero_variance_{kind}", []).append(share)
            series["envs_touched"].append(len({p.env_id for p in picks}))
            series["median_reward"].append(float(np.median(r.mean(axis=1))))
            series["mean_reward"].append(float(r.mean()))
            series["pool_seen_fraction"].append(float((picks_per_task > 0).mean()))
            series["select_seconds"].append(t_sel + t_upd)
            series["relaxations"].append(len(selection.relaxations))
            # picks of the coverage half this step (envsched's adaptive / stale shares move it)
            series["coverage_picks"].append(sum(p.half == "coverage" for p in picks))
            pn = [p.p_nonzero for p in picks if not np.isnan(p.p_nonzero)]
            series["predicted_nonzero"].append(float(np.mean(pn)) if pn else float("nan"))
            series["informative_per_second"].append(
                float(inf.sum() / max(np.asarray(out["seconds"]).sum(), 1e-9))
            )
            series["step_seconds"].append(time.perf_counter() - t_step)
            if log and learner != "simulated":
                _step_progress(log, name, seed, t + 1, steps, series)
        if learner == "simulated":  # the held-out after each step (evals[0] is before any step)
            series["heldout"] = [e["seen_mean"] for e in series["evals"][1:]]
        else:
            series["heldout"] = [e["seen_mean"] for e in series["evals"]]
        series["breadth"] = breadth(picks_per_task, informative_per_env)
        if learner != "simulated":
            series["skipped_updates"] = skipped
        if return_state:
            series["_state"] = state
        if tracer:
            tracer.close()
        return series
    finally:
        lrn.close()


def _step_progress(log: Callable[[str], None], name: str, seed: int, done: int, steps: int, series) -> None:
    """A line every twentieth of the run (between the held-out evaluations, which are minutes apart
    on the neural learner): the last stretch's zero-variance share and batch variance, seconds a
    step and the time left at that pace."""
    every = max(1, steps // 20)
    if done % every or done == steps:
        return
    recent = slice(-every, None)
    per_step = float(np.mean(series["step_seconds"][recent]))
    log(
        f"    {name} seed {seed} step {done}/{steps}: zero-variance "
        f"{np.mean(series['zero_variance_fraction'][recent]):.2f}, batch variance "
        f"{np.mean(series['batch_variance'][recent]):.4f}, {per_step:.1f} s/step, "
        f"~{per_step * (steps - done) / 60:.0f} min left"
    )


def zero_variance_kinds(rewards: np.ndarray, informative_groups: np.ndarray) -> dict[str, float]:
    """Shares of the batch whose group has no spread, by kind: every episode solved (reward 1),
    every one failed (0), or every one at the same partial credit (a policy stuck on part of the
    checklist: GRPO gets no signal from it any more than from a solved task)."""
    kinds = flat_kinds(rewards)
    kinds[np.asarray(informative_groups, dtype=bool)] = ""  # the caller's spread decides what counts
    n = max(len(kinds), 1)
    return {k: float((kinds == k).sum() / n) for k in ("solved", "failed", "partial")}


def headroom_probe(
    lrn,
    state: SchedulerState,
    graph,
    picked: np.ndarray,
    group_size: int,
    seed: int,
    step: int,
    log: Callable | None = None,
    predicted: np.ndarray | None = None,
    halves: list[str] | None = None,
) -> dict:
    """How many informative groups this step could have had. Two fresh groups of G episodes of every
    pool task at the learner's current skill (draws A and B; the learner is left as it was):
    ``pool_spread``: share of the pool whose draw-B group has spread (what a uniform pick finds);
    ``batch_spread``: the same share among the tasks the scheduler picked this step; ``oracle_spread``:
    among the |batch| tasks with the highest draw-A reward variance (random tie-break). The oracle
    spends a probe of the whole pool on one step's choice, so its zero-variance share (1 - this) is
    a floor that a scheduler seeing only history is not expected to reach. ``history_spread`` and
    ``history_auc``: the same share among the |batch| tasks a model of the run's history (the
    scheduler state before this step) ranks first, fitted on draw A of other tasks, and how well it
    ranks draw B (envsched_pipeline/analysis/headroom.py): between the two. With ``predicted`` (the
    scheduler's own chance of spread per task, where it has one), ``model_spread``: the same share
    among the |batch| tasks it rates highest, quotas and halves aside; with ``halves`` (each pick's
    half), ``half_spread``: the batch's share per half."""
    t0 = time.perf_counter()
    ids = [str(t) for t in state.task_ids]
    rewards = np.concatenate(
        [
            lrn.probe(
                ids[i : i + 256], 2 * group_size, int(np.random.default_rng([seed, step, i]).integers(2**62))
            )
            for i in range(0, len(ids), 256)
        ]
    )
    a, b = rewards[:, :group_size], rewards[:, group_size:]
    spread_b = informative(b)
    tie = np.random.default_rng([seed, step, 7]).random(len(ids))
    oracle = np.lexsort((tie, -a.var(axis=1)))[: len(picked)]
    row = {
        "step": step,
        "pool_spread": float(spread_b.mean()),
        "batch_spread": float(spread_b[picked].mean()),
        "oracle_spread": float(spread_b[oracle].mean()),
        **history_ceiling(history_features(state, graph, step), informative(a), spread_b, len(picked), seed),
        "pool_tasks_with_spread": int(spread_b.sum()),
    }
    if predicted is not None:
        own = np.lexsort((tie, -np.nan_to_num(np.asarray(predicted, dtype=float), nan=-1.0)))[: len(picked)]
        row["model_spread"] = float(spread_b[own].mean())
    if halves is not None:
        kinds = np.asarray(halves)
        row["half_spread"] = {h: float(spread_b[picked[kinds == h]].mean()) for h in sorted(set(halves))}
    row["seconds"] = time.perf_counter() - t0
    if log:
        log(
            f"    probe seed {seed} step {step}: spread in pool {row['pool_spread']:.3f}, batch "
            f"{row['batch_spread']:.3f}, history {row['history_spread']:.3f}, oracle "
            f"{row['oracle_spread']:.3f} ({row['seconds']:.0f}s)"
        )
    return row


def _mean_probe(rows: list[dict]) -> dict:
    """One probe step over seeds: each number averaged over the runs that recorded it (a field
    added later is absent from older records), ``half_spread`` per half likewise."""
    out: dict = {}
    for k in dict.fromkeys(k for r in rows for k in r):
        vals = [r[k] for r in rows if k in r]
        if isinstance(vals[0], dict):
            out[k] = {
                h: float(np.mean([v[h] for v in vals if h in v]))
                for h in sorted({h for v in vals for h in v})
            }
        else:
            out[k] = float(np.mean(vals))
    return out


PASSK_KEYS = tuple(
    f"{kind}_{name}{se}"
    for kind in ("seen", "unseen")
    for name in ("pass_at", "pass_hat")
    for se in ("", "_se")
)


def passk_fields(ev: dict) -> dict:
    """An evaluation's pass@k and pass^k per held-out kind with their standard errors (analysis.passk),
    each a dict k -> value (``seen_pass_at``, ``seen_pass_at_se``, ``seen_pass_hat``, ...), where the
    learner gives each task's episodes (``task_rewards``: the neural learner's)."""
    out = {}
    for kind in ("seen", "unseen"):
        if "task_rewards" not in ev.get(kind, {}):
            continue
        rows = reliability(ev[kind]["task_rewards"])
        for name in ("pass_at_k", "pass_hat_k"):
            stem = f"{kind}_{name.removesuffix('_k')}"
            out[stem] = {str(r["k"]): r[name] for r in rows}
            out[f"{stem}_se"] = {str(r["k"]): r[f"{name}_se"] for r in rows}
    return out


def final_passk(last: dict) -> dict:
    """The last evaluation's share solved in one attempt (``heldout_{kind}_final_solved``, with its
    error), in any of K and in all K (``_pass_any``, ``_pass_all``; K: the episodes a task had, in
    ``heldout_passk_k``), where it has ``passk_fields`` (the neural learner)."""
    out = {}
    for kind in ("seen", "unseen"):
        at, hat = last.get(f"{kind}_pass_at"), last.get(f"{kind}_pass_hat")
        if not at:
            continue
        most = max(at, key=int)
        out[f"heldout_{kind}_final_solved"] = at["1"]
        out[f"heldout_{kind}_final_solved_se"] = last[f"{kind}_pass_at_se"]["1"]
        out[f"heldout_{kind}_final_pass_any"] = at[most]
        out[f"heldout_{kind}_final_pass_all"] = hat[most]
        out["heldout_passk_k"] = int(most)
    return out


def breadth(picks_per_task: np.ndarray, informative_per_env: np.ndarray) -> dict:
    """Useful breadth of a run: environments with >= 1 informative group, the effective number of
    environments over informative groups (exp of the entropy of their distribution), distinct tasks
    trained, and the most picks of one task."""
    total = informative_per_env.sum()
    p = informative_per_env[informative_per_env > 0] / total if total > 0 else np.array([])
    return {
        "informative_envs": int((informative_per_env > 0).sum()),
        "effective_envs": float(np.exp(-(p * np.log(p)).sum())) if len(p) else 0.0,
        "distinct_tasks": int((picks_per_task > 0).sum()),
        "max_task_picks": int(picks_per_task.max()) if len(picks_per_task) else 0,
    }


def steps_to_reach(evals: list[dict], key: str, target: float) -> float | None:
    """The first step at which ``evals[...][key]`` reaches ``target``, linearly interpolated between
    the two evaluations around it (None: never reached). The start (step 0) never counts."""
    for prev, e in zip(evals, evals[1:], strict=False):
        if e[key] < target - 1e-12:
            continue
        if prev[key] >= target - 1e-12:  # only the start can be there already: the first evaluation
            return float(e["step"])
        return float(prev["step"] + (target - prev[key]) / (e[key] - prev[key]) * (e["step"] - prev["step"]))
    return None


def summarize(series: dict, random_best: float | None, random_final: dict | None = None) -> dict:
    """One run's numbers. ``random_best``: random's best held-out in the same seed (steps_to_random_best);
    ``random_final``: random's last evaluation in the same seed, for the steps this run took to reach
    it on each kind of held-out (``steps_to_random_{seen,unseen}_final``; the neural learner)."""
    evals = series["evals"]
    ho = series["heldout"]
    steps_to = None
    if random_best is not None:
        curve = [(e["step"], e["seen_mean"]) for e in evals if e["step"] > 0]
        hit = [s for s, h in curve if h >= random_best - 1e-12]
        steps_to = hit[0] if hit else None
    first, last = evals[0], evals[-1]
    later = evals[1:] or evals  # every evaluation after the start: how fast held-out rose, not one point
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
        "heldout_seen_initial": first["seen_mean"],
        "heldout_seen_initial_se": first["seen_se"],
        "heldout_seen_final": last["seen_mean"],
        "heldout_seen_final_se": last["seen_se"],
        "heldout_unseen_initial": first["unseen_mean"],
        "heldout_unseen_initial_se": first["unseen_se"],
        "heldout_unseen_final": last["unseen_mean"],
        "heldout_unseen_final_se": last["unseen_se"],
        **final_passk(last),
        "heldout_seen_auc": float(np.mean([e["seen_mean"] for e in later])),
        "heldout_unseen_auc": float(np.mean([e["unseen_mean"] for e in later])),
        # how far the last evaluation fell below the best earlier one (0 when it is the best): a
        # learner that unlearns late shows here, whatever the scheduler did before
        "heldout_seen_drop": max(0.0, max(e["seen_mean"] for e in evals[:-1]) - last["seen_mean"])
        if len(evals) > 1
        else 0.0,
        "step_seconds": float(np.median(series["step_seconds"])),
        **{
            f"steps_to_random_{kind}_final": steps_to_reach(
                evals, f"{kind}_mean", random_final[f"{kind}_mean"]
            )
            for kind in ("seen", "unseen")
            if random_final is not None and f"{kind}_mean" in random_final
        },
        **series["breadth"],
        **_capped_shares(series.get("forced_stop_share")),
        **(
            {"sandbox_failures": int(sum(series["sandbox_failures"]))} if "sandbox_failures" in series else {}
        ),
        # validation-slice runs: the episodes the slice cost beside the training rollouts, and the
        # share of steps whose coverage share the stalled slice set back to rho
        **(
            {
                "validation_episodes": int(series["validation_episodes"]),
                "validation_stalled_share": float(np.mean(series["validation_stalled"])),
            }
            if "validation_episodes" in series
            else {}
        ),
        # runs recorded before the split lack it
        **{
            f"zero_variance_{k}": float(np.mean(series[f"zero_variance_{k}"]))
            for k in ("solved", "failed", "partial")
            if series.get(f"zero_variance_{k}")
        },
    }


def _capped_shares(share: list[float] | None) -> dict:
    """Neural runs: the share of episodes the max_actions cap ended, over the first and the last
    quarter of the steps (older records lack the series: nothing)."""
    if not share:
        return {}
    q = max(len(share) // 4, 1)
    return {
        "capped_first_quarter": float(np.mean(share[:q])),
        "capped_last_quarter": float(np.mean(share[-q:])),
    }


# ---------------------------------------------------------------------------- many runs
def _job(args: tuple) -> tuple[str, int, dict]:
    """One (scheduler, seed) run in a worker process (one torch thread each)."""
    name, seed, kw = args
    try:
        import torch  # the neural learner's only dependency that needs a thread setting

        torch.set_num_threads(1)
    except ImportError:
        pass
    pool = prepare_pool(
        kw.pop("envs"), kw.pop("tasks_per_env"), seed, unseen_envs=kw.pop("unseen_envs", UNSEEN_ENVS)
    )
    return name, seed, run_one(name, pool, seed=seed, log=_progress, **kw)


def _progress(line: str) -> None:
    """A worker's progress (held-out evaluations of the neural learner): whole lines, at once."""
    print(line, flush=True)


# the packages a run's numbers depend on (graph features, sampling, the neural learner's arithmetic);
# none is pinned to one version, so a recorded run says which ones it ran under
RUN_PACKAGES = ("numpy", "scipy", "scikit-learn", "torch")


def cpu_name() -> str:
    """The CPU as /proc/cpuinfo names it, with its widest vector extension: the same packages on
    another CPU can round a float sum differently (other kernels), and one rounding difference
    changes every sampled episode after it. ``platform.processor()`` where there is no
    /proc/cpuinfo."""
    try:
        info = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.processor() or "unknown"
    first: dict[str, str] = {}  # the first core's fields
    for ln in info.splitlines():
        key, _, value = ln.partition(":")
        first.setdefault(key.strip(), value.strip())
    model, flags = first.get("model name", ""), set(first.get("flags", "").split())
    isa = next(
        (name for flag, name in (("avx512f", "AVX512"), ("avx2", "AVX2"), ("avx", "AVX")) if flag in flags),
        "",
    )
    return f"{model or 'unknown'}" + (f" ({isa})" if isa else "")


def blas_kernel() -> str:
    """The kernels the loaded BLAS libraries (numpy's, scipy's) run on this CPU. OpenBLAS picks them
    when it loads, from the CPU it detects or from ``OPENBLAS_CORETYPE``, so the same packages on
    two CPUs of one name can run different kernels (``Haswell``: AVX2, ``SkylakeX``: AVX-512) and
    round a float product apart in the last bits. Until the task graph grouped topology vectors by
    their bytes (commit 24ddfc9) it depended on them, and a graph-reading schedule picked another
    batch from its first step under each (docs/experiments.md, "BLAS kernels"); a record names
    them so a departure can be traced. ``name version`` for a BLAS that is not OpenBLAS; "unknown"
    when none is loaded."""
    found = []
    for lib in threadpool_info():
        if lib.get("user_api") != "blas":
            continue
        name = lib.get("architecture") if lib.get("internal_api") == "openblas" else None
        found.append(name or f"{lib.get('internal_api')} {lib.get('version')}")
    return "/".join(sorted(set(found))) or "unknown"


def run_environment() -> dict:
    """Python, machine, CPU, BLAS kernels and the numerically relevant package versions of this
    process."""
    out = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": cpu_name(),
        "blas": blas_kernel(),
    }
    for pkg in RUN_PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def environment_mismatch(recorded: dict | None, current: dict) -> str | None:
    """What differs between a record's environment and this one (None: the same, or not recorded).
    A field the record does not have (records made before the CPU was kept) is not compared:
    :func:`provenance` counts those records apart."""
    if not recorded:
        return None
    diff = [
        f"{k} {recorded.get(k)} (now {current.get(k)})"
        for k in current
        if k in recorded and recorded.get(k) != current.get(k)
    ]
    return ", ".join(diff) or None


def provenance(environments: list[dict | None], current: dict) -> dict:
    """How the runs behind one table were recorded: how many ran under ``current``'s package
    versions (``current``; ``complete``: of those, the ones that recorded every field ``current``
    has, CPU and BLAS kernels included), how many before versions were kept (``None``), and the
    others by what differs."""
    differs = [environment_mismatch(e, current) for e in environments]
    other: dict[str, int] = {}
    for d in filter(None, differs):
        other[d] = other.get(d, 0) + 1
    same = [bool(e) and not d for e, d in zip(environments, differs, strict=True)]
    return {
        "runs": len(environments),
        "current": sum(same),  # nothing they recorded differs from this environment
        # ... and they recorded all of it (not a record from before the CPU or kernels were kept)
        "complete": sum(1 for e, ok in zip(environments, same, strict=True) if ok and set(current) <= set(e)),
        "unversioned": sum(1 for e in environments if not e),
        "no_cpu": sum(1 for e in environments if e and "cpu" not in e),
        "no_blas": sum(1 for e in environments if e and "blas" not in e),
        "other": other,
        "environment": current,
    }


def provenance_text(prov: dict, what: str = "Runs behind this table") -> str:
    """One sentence for a report: under which package versions a table's runs were recorded."""
    env = prov["environment"]
    versions = ", ".join(f"{k} {v}" for k, v in env.items() if k not in ("python", "machine", "cpu", "blas"))
    kernels = f"blas {env['blas']}, " if "blas" in env else ""
    complete = prov["complete"]
    parts = [f"{complete} under this environment's (Python {env['python']}, {kernels}{versions})"]
    if prov["current"] > complete:
        parts.append(
            f"{prov['current'] - complete} under its package versions, the CPU or BLAS kernels not recorded"
        )
    if prov["unversioned"]:
        parts.append(f"{prov['unversioned']} recorded before runs kept their package versions")
    parts += [f"{n} under other versions ({diff})" for diff, n in prov["other"].items()]
    tail = " (a re-run of those may differ)" if prov["unversioned"] or prov["other"] else ""
    cpu = ""
    if prov.get("no_cpu"):
        cpu = (
            f" Of the versioned runs, {prov['no_cpu']} were recorded before runs kept their CPU (this "
            f"one: {env.get('cpu', 'unknown')}); on another CPU a re-run can depart after a few steps."
        )
    if prov["no_blas"]:
        cpu += (
            f" {prov['no_blas']} versioned run(s) predate the BLAS kernels in the record (this process: "
            f"{env.get('blas', 'unknown')})."
        )
    return f"{what}: {prov['runs']}; " + "; ".join(parts) + tail + "." + cpu


def _canonical_eval(keyed: dict) -> dict:
    """A neural run keyed by the held-out schedule it ran (``eval_every`` left out and given as its
    default, steps // 4, are one run), so a recorded run is found however the command spelled it."""
    if keyed.get("learner") == "simulated" or keyed.get("eval_every"):
        return keyed
    return {**keyed, "eval_every": default_eval_every(keyed["steps"])}


def _record_file(cache_dir: Path | None, name: str, seed: int, keyed: dict) -> Path | None:
    """Where a run's record is: under its canonical key; a neural run recorded before the key was
    canonical, with ``eval_every`` left out, is found under that older key too."""
    f = _cache_file(cache_dir, name, seed, _canonical_eval(keyed))
    if f is None or f.exists():
        return f
    unsaid = {**keyed, "eval_every": None}
    older = _cache_file(cache_dir, name, seed, unsaid)
    return older if _canonical_eval(unsaid) == _canonical_eval(keyed) and older.exists() else f


def _cache_file(cache_dir: Path | None, name: str, seed: int, kw: dict) -> Path | None:
    if cache_dir is None:
        return None
    key = hashlib.sha256(
        json.dumps({"name": name, "seed": seed, **kw, "v": 3}, sort_keys=True, default=str).encode()
    ).hexdigest()[:12]
    return cache_dir / f"{name}-s{seed}-{key}.json"


def _trace_file(trace_dir: str | Path, name: str, seed: int, draw: int = 0) -> str:
    return str(Path(trace_dir) / (f"{name}-s{seed}" + (f"-d{draw}" if draw else "") + ".parquet"))


def first_departure(record: dict, rerun: dict) -> int | None:
    """First step whose mean reward differs between a recorded run and a re-run of it (None: the
    re-run repeats the record, as far as the shorter of the two goes)."""
    a, b = record.get("mean_reward", []), rerun.get("mean_reward", [])
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if abs(x - y) > 1e-12), None)


def run_benchmark(
    schedulers: list[str],
    steps: int,
    seed: int,
    envs: int = 51,
    tasks_per_env: int = 50,
    seeds: int = 1,
    batch_size: int = 64,
    group_size: int = 8,
    overrides: dict[str, dict] | None = None,
    log: Callable[[str], None] = print,
    learner: str = "simulated",
    jobs: int = 1,
    cache_dir: str | Path | None = None,
    eval_every: int | None = None,
    learner_config: dict | None = None,
    recorded_only: bool = False,
    probe_every: int | None = None,
    trace_dir: str | Path | None = None,
    oracle_candidates: int = ORACLE_CANDIDATES,
    unseen_envs: int = UNSEEN_ENVS,
    draw: int = 0,
) -> dict:
    """All schedulers x seeds. Returns the JSON document of ``envsched bench scheduler``.
    ``learner_config``: settings of the learner (simulated: e.g. the sweep's phenomena; neural: e.g.
    ``loss_denominator``); part of each recorded run's key.
    ``recorded_only``: run nothing; aggregate the runs found in ``cache_dir`` (each scheduler over the
    seeds it has). ``probe_every``: probe the whole pool every that many steps (:func:`headroom_probe`;
    the JSON's ``probes``); part of the key only when set. ``trace_dir``: write every run's picks and
    their outcomes to ``<trace_dir>/<scheduler>-s<seed>.parquet`` (envsched_pipeline/analysis/trace.py);
    a run already on record is run again for its trace, its record is kept, and the log says whether
    the re-run repeated it step for step. ``oracle_candidates``: the neural learner's oracle looks at
    a fresh group of that many tasks each step (part of its runs' key). ``unseen_envs``: environments
    in the unseen held-out split (neural learner; part of the key when not the default 12; the first
    12 are the default split's, so every run's held-out includes the default one, environment by
    environment in its ``evals``). ``draw``: another run of every (scheduler, seed) from the same
    pool, split and warm start, with other rollout-sampling and selection streams (0: the recorded
    runs; part of the key only when not 0; traces get a ``-d<draw>`` suffix): how much a schedule's
    held-out varies from run to run at one seed."""
    unknown = [
        s
        for s in schedulers
        if s not in (*SCHEDULERS, "oracle")
        and not (s.split("@")[0] in SCHEDULERS and (s in VARIANTS or s in (overrides or {})))
    ]  # a variant name must be a known variant (or given its overrides), never a bare label
    if unknown:
        raise ValueError(
            f"unknown scheduler(s): {', '.join(unknown)}; known: {', '.join(SCHEDULERS)}, oracle, "
            "and the named variants (`envsched bench variants`)"
        )
    if learner not in LEARNERS:
        raise ValueError(f"unknown learner {learner!r}; choose one of {', '.join(LEARNERS)}")
    if steps < 1 or seeds < 1:
        raise ValueError("steps and seeds must be >= 1")
    if seed < 0:
        raise ValueError(f"seed must be >= 0 (got {seed})")
    if batch_size < 1 or group_size < 2:
        raise ValueError(
            f"batch_size must be >= 1 and group_size >= 2 (GRPO compares rollouts within a group); "
            f"got {batch_size} and {group_size}"
        )
    if probe_every is not None and probe_every < 1:
        raise ValueError(f"probe_every must be >= 1 (got {probe_every})")
    if oracle_candidates < 1:
        raise ValueError(f"oracle_candidates must be >= 1 (got {oracle_candidates})")
    if unseen_envs < 1:
        raise ValueError(f"unseen_envs must be >= 1 (got {unseen_envs})")
    if draw < 0:
        raise ValueError(f"draw must be >= 0 (got {draw})")
    if learner_config:
        learner_config = check_learner_config(learner, learner_config)
    key_config = record_key_config(learner, learner_config)
    if trace_dir is not None and recorded_only:
        raise ValueError("trace_dir runs every run again; it cannot be combined with recorded_only")
    names = list(dict.fromkeys(schedulers))
    cache = Path(cache_dir) if cache_dir else None
    if cache:
        cache.mkdir(parents=True, exist_ok=True)
    todo, results, recorded_env = [], {}, {}
    rerun: set[tuple[str, int]] = set()  # runs on record, run again for their trace only
    here = run_environment()
    for k in range(seeds):
        for n in names:
            kw = {
                "envs": envs,
                "tasks_per_env": tasks_per_env,
                "steps": steps,
                "batch_size": batch_size,
                "group_size": group_size,
                "overrides": (overrides or {}).get(n, VARIANTS.get(n)),
                **({"learner_config": learner_config} if learner_config else {}),
                "learner": learner,
                "eval_every": eval_every,
                **({"probe_every": probe_every} if probe_every else {}),
                **({"unseen_envs": unseen_envs} if unseen_envs != UNSEEN_ENVS else {}),
                **({"draw": draw} if draw else {}),
                **(
                    {"oracle_candidates": oracle_candidates}
                    if n == "oracle" and learner != "simulated"
                    else {}
                ),
            }
            keyed = {**kw, "learner_config": key_config}  # runs are keyed by record_key_config
            if not key_config:
                del keyed["learner_config"]
            f = _record_file(cache, n, seed + k, keyed)
            if f is not None and f.exists():
                results[(n, seed + k)] = rec = json.loads(f.read_text())
                recorded_env[(n, seed + k)] = rec.get("environment")
                differs = environment_mismatch(rec.get("environment"), here)
                log(
                    f"  seed {seed + k} {n:<16} (cached"
                    + (f"; recorded under {differs}: a re-run may differ)" if differs else ")")
                )
                if trace_dir is not None:
                    rerun.add((n, seed + k))
                    todo.append((n, seed + k, {**kw, "trace": _trace_file(trace_dir, n, seed + k, draw)}, f))
            else:
                if trace_dir is not None:
                    kw = {**kw, "trace": _trace_file(trace_dir, n, seed + k, draw)}
                todo.append((n, seed + k, kw, f))
    unversioned = sum(1 for e in recorded_env.values() if not e)
    if unversioned:
        log(f"  {unversioned} cached run(s) predate recorded package versions (a re-run may differ)")
    if recorded_only:
        if cache is None:
            raise ValueError("recorded_only needs cache_dir (where the runs are recorded)")
        if todo:
            log(f"  not on record (left out): {', '.join(f'{n} seed {s}' for n, s, _, _ in todo)}")
        todo = []
    t_start = time.perf_counter()
    completed: list[tuple[str, int]] = []
    repeats: dict[str, dict[int, int | None]] = {}  # traced re-runs: first step departing from the record

    def done(n, s, ser, f):
        if (n, s) in rerun:  # traced again: the record stays; say whether the re-run repeated it
            completed.append((n, s))
            dep = first_departure(results[(n, s)], ser)
            repeats.setdefault(n, {})[s] = dep
            rerun.discard((n, s))
            log(
                f"  seed {s} {n:<16} traced; "
                + (
                    "the re-run repeats its record step for step"
                    if dep is None
                    else f"the re-run departs from its record at step {dep} (the trace is of the re-run)"
                )
                + f" [{len(completed)}/{len(todo)}]"
            )
            return
        results[(n, s)] = ser
        recorded_env[(n, s)] = here
        if f is not None:
            tmp = f.with_suffix(f".tmp{os.getpid()}")
            rec = {k: v for k, v in ser.items() if not k.startswith("_")}
            tmp.write_text(json.dumps({**rec, "environment": here}))
            os.replace(tmp, f)
        m = summarize(ser, None)
        completed.append((n, s))
        finished = len(completed)
        left = len(todo) - finished
        eta = f", ETA {(time.perf_counter() - t_start) / finished * left:.0f}s" if left else ""
        log(
            f"  seed {s} {n:<16} var={m['batch_variance']:.4f} zero={m['zero_variance_fraction']:.3f} "
            f"envs={m['envs_touched']:.1f} held-out seen={m['heldout_seen_final']:.4f} "
            f"unseen={m['heldout_unseen_final']:.4f} [{finished}/{len(todo)}{eta}]"
        )

    if jobs > 1 and len(todo) > 1:
        # a bench killed by a signal takes its workers (and their runs) with it
        with ProcessPoolExecutor(
            max_workers=jobs, mp_context=get_context("spawn"), initializer=die_with_parent
        ) as ex:
            futs = {ex.submit(_job, (n, s, dict(kw))): (n, s, f) for n, s, kw, f in todo}
            for fut in as_completed(futs):
                n, s, f = futs[fut]
                done(n, s, fut.result()[2], f)
    else:
        pools: dict[int, dict] = {}
        for n, s, kw, f in todo:
            if s not in pools:
                pools = {s: prepare_pool(envs, tasks_per_env, s, unseen_envs=unseen_envs)}
            kw = dict(kw)
            kw.pop("envs"), kw.pop("tasks_per_env"), kw.pop("unseen_envs", None)
            done(n, s, run_one(n, pools[s], seed=s, log=log, **kw), f)
    out = aggregate(
        names,
        [seed + k for k in range(seeds)],
        results,
        {
            "learner": learner,
            "simulated": learner == "simulated",
            "envs": envs,
            "tasks_per_env": tasks_per_env,
            "steps": steps,
            "seed": seed,
            "seeds": seeds,
            "batch_size": batch_size,
            "group_size": group_size,
            "learner_config": learner_config or {},
            "unseen_envs": unseen_envs,
            "draw": draw,
        },
    )
    out["provenance"] = provenance([recorded_env.get(k) for k in results], here)
    if trace_dir is not None:
        out["traces"] = [kw["trace"] for _, _, kw, _ in todo]
        out["trace_repeats"] = repeats
    return out


def aggregate(names: list[str], seeds: list[int], results: dict, setup: dict) -> dict:
    """Means over seeds, paired differences against random, per-step mean series. A scheduler is
    averaged over the seeds it has results for (``seeds`` in its row), and compared with random over
    the seeds both have (``n`` in each paired difference); one without any result is left out.
    ``per_seed``: each scheduler's summary per seed (for pairings across runs of other settings)."""
    out = {"schedulers": {}, "series": {}, "paired_vs_random": {}, "per_seed": {}, "setup": setup}
    summaries = {}
    for s in seeds:
        rnd = results.get(("random", s))
        random_best = max(rnd["heldout"]) if rnd else None
        random_final = rnd["evals"][-1] if rnd and rnd.get("evals") else None
        for n in names:
            if (n, s) in results:
                summaries[(n, s)] = summarize(results[(n, s)], random_best, random_final)
    for n in names:
        mine = [s for s in seeds if (n, s) in summaries]
        if not mine:
            continue
        agg = {}
        for m in METRICS:
            vals = [summaries[(n, s)][m] for s in mine]
            if m == "steps_to_random_best":
                agg[m] = float(np.mean(vals)) if vals and all(v is not None for v in vals) else None
            else:
                agg[m] = float(np.mean(vals))
        for m in PASSK_METRICS:  # records made before these were measured lack them
            if all(m in summaries[(n, s)] for s in mine):
                agg[m] = float(np.mean([summaries[(n, s)][m] for s in mine]))
        agg["batch_variance_sd"] = float(np.std([summaries[(n, s)]["batch_variance"] for s in mine]))
        agg["seeds"] = len(mine)
        out["schedulers"][n] = agg
        out["per_seed"][n] = {s: summaries[(n, s)] for s in mine}
        runs = [results[(n, s)] for s in mine]
        out["series"][n] = {
            k: np.mean([r[k] for r in runs], axis=0).tolist()
            for k in runs[0]
            # per-step numbers only (not the validation slice's looks, which are records of their
            # own), and only those every run has (older records lack newer ones)
            if not k.startswith("_")
            and k not in ("evals", "breadth", "heldout", "probes", "validation")
            and all(isinstance(r.get(k), list) for r in runs)
        }
        out["series"][n]["evals"] = [
            {
                k: float(np.mean([r["evals"][j][k] for r in runs]))
                for k in runs[0]["evals"][j]
                # per environment or task, and pass@k by k: in each run's record
                if not k.endswith(("_by_env", "_by_task")) and k not in PASSK_KEYS
            }
            for j in range(len(runs[0]["evals"]))
        ]
        out["series"][n]["heldout"] = np.mean([r["heldout"] for r in runs], axis=0).tolist()
        probes = [r["probes"] for r in runs if r.get("probes")]
        if probes and len(probes) == len(runs):
            out.setdefault("probes", {})[n] = [
                _mean_probe([p[j] for p in probes]) for j in range(min(len(p) for p in probes))
            ]
        paired = [s for s in mine if ("random", s) in summaries]
        if n != "random" and paired:
            diff = {}
            for m in (
                "heldout_seen_final",
                "heldout_unseen_final",
                "heldout_seen_auc",
                "heldout_unseen_auc",
                "batch_variance",
                "zero_variance_fraction",
                *(m for m in PASSK_METRICS if not m.endswith("_se")),
            ):
                if not all(m in summaries[(x, s)] for x in (n, "random") for s in paired):
                    continue
                d = np.array([summaries[(n, s)][m] - summaries[("random", s)][m] for s in paired])
                diff[m] = {
                    "mean": float(d.mean()),
                    "sd": float(d.std(ddof=1)) if len(d) > 1 else 0.0,
                    "wins": int((d > 0).sum())
                    if "heldout" in m or m == "batch_variance"
                    else int((d < 0).sum()),
                    "n": len(d),
                    "per_seed": d.tolist(),
                }
            out["paired_vs_random"][n] = diff
    return out
