"""The step loop over the lake, without Dagster.

These functions are what the Dagster assets call (thin wrappers), what the CLI's ``step``
commands call, and what the Python API (:mod:`envsched_pipeline.api`) builds on:

* :func:`import_pool`       pool records -> ``environments``/``tasks``/``task_latents``
* :func:`select_step`       state after t-1 -> manifest ``selections[t]`` + ``audits[t]``
* :func:`statistics_step`   state after t-1 + ``rollouts[t]`` -> state after t + ``statistics[t]``

The training itself (``rollouts[t]``, ``train_metrics[t]``) is :mod:`trainer.step`, launched as
its own process.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields

import numpy as np
import pyarrow as pa

from envsched_pipeline.lake import Lake, LakeError
from envsched_pipeline.scheduler import GRAPH_SCHEDULERS, SCHEDULERS, make_scheduler
from envsched_pipeline.scheduler.config import SchedulerConfig
from envsched_pipeline.scheduler.core import Pick
from envsched_pipeline.scheduler.state import Observations, SchedulerState

RUN_FILE = "run.json"


class StepError(RuntimeError):
    """A step cannot run yet or its inputs are wrong; the message says which step and why."""


@dataclass
class RunSpec:
    """The training run a lake holds. Written once; every step reads it."""

    pool: str = "synthetic"
    policy: str = "simulated"
    scheduler: str = "envsched"
    seed: int = 0
    batch_size: int = 64
    group_size: int = 8
    max_steps: int = 20
    trainer: str = "subprocess"  # subprocess | external (rollouts ingested by an outside trainer)
    run_id: str = ""  # set when the run starts; part of every sensor run_key
    prior_lake: str = ""  # start the estimates from this lake's final scheduler state (cross-run prior)
    prior_discount: float = 0.5
    scheduler_config: dict = field(default_factory=dict)
    policy_config: dict = field(default_factory=dict)

    def config(self) -> SchedulerConfig:
        return SchedulerConfig.from_dict(self.scheduler_config).with_overrides(
            batch_size=self.batch_size, group_size=self.group_size)

    @classmethod
    def from_dict(cls, d: dict) -> RunSpec:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


# ---------------------------------------------------------------------------- run spec
def load_run(lake: Lake) -> RunSpec | None:
    d = lake.read_json(RUN_FILE)
    return RunSpec.from_dict(d) if d else None


def start_run(lake: Lake, spec: RunSpec) -> RunSpec:
    """Bind the lake to a run, or check a resumed run matches. Returns the stored spec."""
    if spec.scheduler not in SCHEDULERS:
        raise StepError(f"unknown scheduler {spec.scheduler!r}; choose one of {', '.join(SCHEDULERS)}")
    current = load_run(lake)
    if current is not None and lake.steps("selections"):
        fixed = ("pool", "policy", "scheduler", "seed", "batch_size", "group_size")
        diff = [f"{k}: lake has {getattr(current, k)!r}, asked {getattr(spec, k)!r}"
                for k in fixed if getattr(current, k) != getattr(spec, k)]
        if diff:
            raise StepError(
                f"{lake.root} already holds a run with other settings ({'; '.join(diff)}). "
                "Use another lake (--lake DIR or ENVSCHED_LAKE) or the same settings to resume."
            )
        current.max_steps = max(current.max_steps, spec.max_steps)
        spec = current
    elif current is not None and current.run_id:
        spec.run_id = current.run_id
    if not spec.run_id:
        import uuid

        spec.run_id = uuid.uuid4().hex[:8]
    lake.write_json(RUN_FILE, asdict(spec))
    return spec


def require_run(lake: Lake) -> RunSpec:
    spec = load_run(lake)
    if spec is None:
        raise StepError(f"no run in {lake.root}: start one with `envsched train` or `envsched step select`")
    return spec


# ---------------------------------------------------------------------------- pools
def import_pool(lake: Lake, data) -> dict:
    """Write a pool's tables (replacing that pool's partitions). Returns counts."""
    if not data.tasks:
        raise StepError(f"pool {data.name!r} has no tasks")
    lake.write("environments", data.environments, pool=data.name)
    lake.write("tasks", data.tasks, pool=data.name)
    if data.latents:
        lake.write("task_latents", data.latents, pool=data.name)
    return {"pool": data.name, "environments": len(data.environments), "tasks": len(data.tasks)}


def ensure_pool(lake: Lake, name: str) -> None:
    if not lake.has("tasks", pool=name):
        from envs.registry import load_pool

        import_pool(lake, load_pool(name))


def pool_tasks(lake: Lake, pool: str) -> pa.Table:
    t = lake.read("tasks", pool=pool)
    if t.num_rows == 0:
        raise StepError(f"pool {pool!r} is not in {lake.root}: import it first (`envsched pool list`)")
    return t.sort_by("task_id")


# ---------------------------------------------------------------------------- state
def state_path(lake: Lake, step: int):
    return lake.artifact_path("state", step, "scheduler.npz")


def load_state(lake: Lake, spec: RunSpec, step: int) -> SchedulerState:
    """State after ``step`` (a fresh state for step -1)."""
    tasks = pool_tasks(lake, spec.pool)
    ids = tasks.column("task_id").to_pylist()
    envs = tasks.column("env_id").to_pylist()
    hashes = tasks.column("content_hash").to_pylist()
    if step < 0:
        if spec.prior_lake:
            return prior_state(spec, ids, envs, hashes)
        return SchedulerState.new(ids, envs, hashes)
    path = state_path(lake, step)
    if not path.exists():
        raise StepError(f"scheduler state after step {step} is missing ({path}); materialize statistics[{step}] first")
    state = SchedulerState.load(path)
    stored = state.arrays.get("content_hash")
    if stored is None or list(state.task_ids.astype(str)) != ids or list(np.asarray(stored).astype(str)) != hashes:
        # the pool was re-imported with edits: re-key the history by content hash
        from envsched_pipeline.scheduler.state import align_state

        state, report = align_state(state, ids, envs, hashes)
        state.extra["last_alignment"] = report
    return state


def prior_state(spec: RunSpec, ids, envs, hashes) -> SchedulerState:
    from envsched_pipeline.scheduler.state import prior_from

    prev = Lake(spec.prior_lake)
    done = [s for s in prev.steps("statistics") if state_path(prev, s).exists()]
    if not done:
        raise StepError(f"prior lake {prev.root} has no scheduler state to start from")
    return prior_from(SchedulerState.load(state_path(prev, done[-1])), ids, envs, hashes, spec.prior_discount)


def build_scheduler(lake: Lake, spec: RunSpec, state: SchedulerState | None = None):
    graph = None
    if spec.scheduler in GRAPH_SCHEDULERS:
        from envsched_pipeline.graph_io import load_graph

        graph = load_graph(lake, spec.pool, state)
    return make_scheduler(spec.scheduler, spec.config(), graph=graph)


def step_rng(spec: RunSpec, step: int, salt: int = 0) -> np.random.Generator:
    return np.random.default_rng([spec.seed, step, salt])


# ---------------------------------------------------------------------------- select
def select_step(lake: Lake, step: int) -> dict:
    """Materialize manifest ``step``. Deterministic for (run seed, step, state): re-running
    replaces the partition with identical rows."""
    spec = require_run(lake)
    if step < 0:
        raise StepError(f"step must be >= 0, got {step}")
    if step > 0 and not lake.has("rollouts", step=step - 1):
        raise StepError(f"cannot select step {step}: rollouts of step {step - 1} are missing")
    if step > 0 and not state_path(lake, step - 1).exists():
        statistics_step(lake, step - 1)  # an external trainer ingested t-1: fold it in now
    state = load_state(lake, spec, step - 1)
    sched = build_scheduler(lake, spec, state)
    t0 = time.perf_counter()
    picks = sched.select(state, spec.batch_size, step_rng(spec, step), step)
    seconds = time.perf_counter() - t0
    rows = manifest_rows(step, picks, spec)
    yield_pred = predicted_yield(state, picks)
    lake.write("selections", rows, step=step)
    audit = {
        "step": step,
        "scheduler": spec.scheduler,
        "history_steps": int(state.step + 1),
        "tasks_observed": int(state.observed.sum()),
        "pool_tasks": int(state.n_tasks),
        "retired": int((state.arrays["retired"] > 0).sum()),
        "select_seconds": seconds,
        "relaxations": json.dumps(getattr(sched, "last_relaxations", [])),
        "quarantined": json.dumps(getattr(sched, "last_quarantined", [])),
        "config_hash": spec.config().hash(),
        "predicted_yield": yield_pred,
        "oversampling_factor": oversampling_factor(lake, step, yield_pred),
    }
    lake.write("audits", [audit], step=step)
    return {"picks": picks, "rows": rows, "audit": audit}


def manifest_rows(step: int, picks: list[Pick], spec: RunSpec) -> list[dict]:
    h = spec.config().hash()
    return [
        {
            "step": int(step),
            "slot": j,
            "task_id": p.task_id,
            "env_id": p.env_id,
            "half": p.half,
            "score": float(p.score),
            "pred_var": float(p.pred_var),
            "p_nonzero": float(p.p_nonzero),
            "propensity": float(p.propensity),
            "reason": json.dumps(p.reason, default=float, sort_keys=True),
            "scheduler": spec.scheduler,
            "config_hash": h,
        }
        for j, p in enumerate(picks)
    ]


# ---------------------------------------------------------------------------- yield
def predicted_yield(state: SchedulerState, picks: list[Pick]) -> float:
    """Predicted share of this batch's groups with non-zero reward variance: the mean of the picks'
    predicted non-zero-variance probabilities (schedulers without one: the decayed observed share)."""
    p = [x.p_nonzero for x in picks if x.p_nonzero == x.p_nonzero]
    if p:
        return float(np.mean(np.clip(p, 0.0, 1.0)))
    W = state.arrays["W"]
    return float(state.arrays["Xd"].sum() / W.sum()) if W.sum() > 0 else 0.5


def yield_calibration(lake: Lake, before_step: int, window: int = 8) -> float:
    """realized / predicted yield over the last ``window`` steps (1.0 without history)."""
    if not lake.steps("yields"):
        return 1.0
    rows = [r for r in lake.read("yields").to_pylist() if before_step - window <= r["step"] < before_step]
    pred = sum(r["predicted_yield"] for r in rows)
    real = sum(r["realized_yield"] for r in rows)
    return float(real / pred) if rows and pred > 0 else 1.0


def oversampling_factor(lake: Lake, step: int, yield_pred: float, cap: float = 8.0) -> float:
    """How many times B tasks to roll out so that, after dropping zero-variance groups (DAPO-style
    dynamic sampling), B informative groups remain: 1 / calibrated predicted yield, capped."""
    calibrated = yield_pred * yield_calibration(lake, step)
    return float(min(cap, 1.0 / max(calibrated, 1.0 / cap)))


# ---------------------------------------------------------------------------- statistics
def observations_from_rollouts(state: SchedulerState, step: int, rollouts: pa.Table) -> Observations:
    """Group rollouts by task. Rollouts with an infrastructure error class are not evidence about
    the task: they are excluded from the task's statistics (exposure still counts them)."""
    cols = rollouts.column_names
    task_ids = rollouts.column("task_id").to_pylist()
    rewards = np.asarray(rollouts.column("reward").to_pylist(), dtype=float)
    err = rollouts.column("error_class").to_pylist() if "error_class" in cols else ["none"] * len(task_ids)
    hack = (np.asarray(rollouts.column("hack_flag").to_pylist(), dtype=float)
            if "hack_flag" in cols else np.zeros(len(task_ids)))
    order: dict[str, list[int]] = {}
    for j, t in enumerate(task_ids):
        order.setdefault(t, []).append(j)
    tids = list(order)
    idx = state.index_of(tids)
    outcome = np.array([e in ("none", "task", None) for e in err])
    secs = (np.asarray(rollouts.column("seconds").to_pylist(), dtype=float)
            if "seconds" in cols else np.full(len(task_ids), np.nan))
    groups, flags, spent, cost = [], [], [], []
    for t in tids:
        js = np.array(order[t])
        ok = js[outcome[js]]
        groups.append(rewards[ok])
        flags.append(float(hack[ok][rewards[ok] > 0].sum()))
        spent.append(len(js))
        cost.append(float(np.nanmean(secs[js])) if np.isfinite(secs[js]).any() else np.nan)
    obs = Observations.from_groups(step, idx, groups, hack_flags=flags)
    obs.spent = np.asarray(spent, dtype=float)  # exposure counts every rollout spent
    obs.cost = np.asarray(cost, dtype=float)
    return obs


def statistics_step(lake: Lake, step: int) -> dict:
    spec = require_run(lake)
    if not lake.has("rollouts", step=step):
        raise StepError(f"cannot compute statistics for step {step}: its rollouts are missing")
    if not lake.has("selections", step=step):
        raise StepError(f"cannot compute statistics for step {step}: its manifest is missing")
    state = load_state(lake, spec, step - 1)
    if state.step >= step:
        raise StepError(f"state after step {step - 1} already includes step {state.step}")
    sched = build_scheduler(lake, spec, state)
    rollouts = lake.read("rollouts", step=step)
    manifest = lake.read("selections", step=step)
    obs = observations_from_rollouts(state, step, rollouts)
    pred = dict(zip(manifest.column("task_id").to_pylist(), manifest.column("pred_var").to_pylist(), strict=True))
    u = np.array([pred.get(t, np.nan) for t in state.task_ids[obs.task_idx]], dtype=float)
    t0 = time.perf_counter()
    sched.update(state, obs, predicted_u=None if np.isnan(u).all() else np.nan_to_num(u))
    seconds = time.perf_counter() - t0
    state.save(state_path(lake, step))
    a = state.arrays
    i = obs.task_idx
    w = np.maximum(a["W"][i], 1e-12)
    # what the scheduler now believes about these tasks (graph/environment prior and blend)
    prior_var = hat_var = np.full(len(i), np.nan)
    if hasattr(sched, "predict"):
        pred = sched.predict(state)
        prior_var, hat_var = pred["prior_s2"][i], pred["hat_s2"][i]
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
    }
    lake.write("statistics", pa.table(rows), step=step)
    audit = lake.read("audits", step=step).to_pylist()
    realized = float((obs.dispersion > 0).mean()) if len(i) else 0.0
    pred_y = float(audit[0]["predicted_yield"]) if audit and audit[0].get("predicted_yield") is not None else float("nan")
    lake.write("yields", [{"step": step, "predicted_yield": pred_y, "realized_yield": realized, "groups": len(i)}],
               step=step)
    return {
        "predicted_yield": pred_y,
        "realized_yield": realized,
        "tasks_updated": len(i),
        "tasks_observed": int(state.observed.sum()),
        "retired": int((a["retired"] > 0).sum()),
        "update_seconds": seconds,
        "batch_variance": float(obs.var.mean()) if len(i) else 0.0,
        "zero_variance_fraction": float((obs.dispersion == 0).mean()) if len(i) else 0.0,
    }


# ---------------------------------------------------------------------------- status
def status(lake: Lake) -> dict:
    spec = load_run(lake)
    sel, roll, stats = lake.steps("selections"), lake.steps("rollouts"), lake.steps("statistics")
    return {
        "lake": str(lake.root),
        "run": asdict(spec) if spec else None,
        "last_selected": sel[-1] if sel else None,
        "last_ingested": roll[-1] if roll else None,
        "last_statistics": stats[-1] if stats else None,
    }


def next_action(lake: Lake) -> tuple[str, int] | None:
    """What the loop should do next: ("select", t), ("train", t), ("stats", t), ("wait", t)
    (an external trainer has not ingested step t yet) or None when the run is complete.

    The lake is the single source of truth, so the sensor, the CLI and a resumed run agree.
    """
    spec = load_run(lake)
    if spec is None:
        return None
    sel = set(lake.steps("selections"))
    roll = set(lake.steps("rollouts")) & set(lake.steps("train_metrics")) if spec.trainer != "external" \
        else set(lake.steps("rollouts"))
    stats = set(lake.steps("statistics"))
    t = 0
    while t < spec.max_steps:
        if t not in sel:
            return ("select", t)
        if t not in roll:
            return ("wait", t) if spec.trainer == "external" else ("train", t)
        if t not in stats or not state_path(lake, t).exists():
            return ("train", t) if spec.trainer == "external" else ("stats", t)
        t += 1
    return None


def step_summary(lake: Lake) -> list[dict]:
    """Per-step table for the CLI (computed from the lake, so a resumed run prints every step)."""
    con = lake.connect()
    try:
        # the documented step_summary view (warehouse/views.sql) + timing and held-out score
        q = """
        select s.step, s.batch_variance, s.zero_variance_fraction, s.envs_touched, s.mean_reward,
               tm.seconds as seconds, ev.score as heldout
        from step_summary s
        left join train_metrics tm on tm.step = s.step
        left join (select step, avg(score) as score from evals group by step) ev on ev.step = s.step
        order by s.step
        """
        cur = con.execute(q)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    except Exception as exc:
        raise LakeError(f"cannot summarize steps in {lake.root}: {exc}") from exc
    finally:
        con.close()


# ---------------------------------------------------------------------------- ingest (external trainers)
INGEST_REQUIRED = ("task_id", "rollout", "reward")


def _load_rollout_file(path) -> list[dict]:
    """Rows of a .jsonl or .parquet rollout file; errors name the file and the line / row."""
    from pathlib import Path

    import pyarrow.parquet as pq

    path = Path(path)
    if not path.exists():
        raise StepError(f"{path}: no such file")
    rows: list[dict] = []
    if path.suffix == ".parquet":
        try:
            table = pq.read_table(path)
        except Exception as exc:
            raise StepError(f"{path}: cannot read Parquet ({exc})") from exc
        rows = table.to_pylist()
        for j, r in enumerate(rows):
            r["_where"] = f"{path} row {j}"
    elif path.suffix in (".jsonl", ".json", ".ndjson"):
        with open(path) as fh:
            for ln, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise StepError(f"{path} line {ln}: invalid JSON ({exc.msg})") from exc
                if not isinstance(r, dict):
                    raise StepError(f"{path} line {ln}: expected a JSON object")
                r["_where"] = f"{path} line {ln}"
                rows.append(r)
    else:
        raise StepError(f"{path}: expected a .jsonl or .parquet file")
    return rows


def ingest_rollouts(lake: Lake, step: int, rows_or_path) -> dict:
    """Validate an external trainer's rollouts for ``step`` and write them atomically.

    Every task must be in manifest ``step``, rewards finite and in [0, 1], (task_id, rollout)
    unique. A bad input is refused with the line/row named, and nothing is written.
    """
    import math

    spec = require_run(lake)
    if not lake.has("selections", step=step):
        raise StepError(f"cannot ingest step {step}: it has no manifest (run `envsched step select --step {step}`)")
    rows = _load_rollout_file(rows_or_path) if isinstance(rows_or_path, (str, bytes)) or hasattr(rows_or_path, "__fspath__") \
        else [dict(r, _where=f"record {j}") for j, r in enumerate(rows_or_path)]
    if not rows:
        raise StepError(f"step {step}: no rollouts given")
    manifest = lake.read("selections", step=step)
    env_of = dict(zip(manifest.column("task_id").to_pylist(), manifest.column("env_id").to_pylist(), strict=True))
    seen: set[tuple[str, int]] = set()
    out = []
    for r in rows:
        where = r.pop("_where")
        missing = [k for k in INGEST_REQUIRED if k not in r or r[k] is None]
        if missing:
            raise StepError(f"{where}: missing field(s) {', '.join(missing)}")
        tid = r["task_id"]
        if not isinstance(tid, str):
            raise StepError(f"{where}: task_id must be a string")
        if tid not in env_of:
            raise StepError(f"{where}: task {tid!r} is not in manifest {step}")
        try:
            rollout = int(r["rollout"])
            reward = float(r["reward"])
        except (TypeError, ValueError) as exc:
            raise StepError(f"{where}: rollout must be an integer and reward a number ({exc})") from exc
        if isinstance(r["reward"], bool) or not math.isfinite(reward) or not 0.0 <= reward <= 1.0:
            raise StepError(f"{where}: reward {r['reward']!r} is not a finite number in [0, 1]")
        if (tid, rollout) in seen:
            raise StepError(f"{where}: duplicate rollout ({tid!r}, {rollout})")
        seen.add((tid, rollout))
        err = r.get("error_class") or "none"
        if err not in ERROR_CLASSES:
            raise StepError(f"{where}: error_class {err!r} is not one of {', '.join(ERROR_CLASSES)}")
        extra = {k: v for k, v in r.items() if k not in INGEST_REQUIRED and k not in ("step", "env_id")}
        out.append({
            "step": int(step), "task_id": tid, "rollout": rollout, "env_id": env_of[tid], "reward": reward,
            "error_class": err, "error_message": str(r.get("error_message") or ""),
            "hack_flag": bool(r.get("hack_flag", False)),
            "tokens": int(r.get("tokens") or 0), "seconds": float(r.get("seconds") or 0.0),
            "trajectory": json.dumps(r["trajectory"]) if isinstance(r.get("trajectory"), (dict, list))
            else str(r.get("trajectory") or ""),
            "extra": json.dumps({k: v for k, v in extra.items() if k not in (
                "error_class", "error_message", "hack_flag", "tokens", "seconds", "trajectory")}, default=str),
        })
    rewards = np.array([r["reward"] for r in out])
    by_task: dict[str, list[float]] = {}
    for r in out:
        by_task.setdefault(r["task_id"], []).append(r["reward"])
    spread = [np.ptp(v) > 1e-6 for v in by_task.values()]
    lake.write("rollouts", out, step=step)
    metrics = {
        "step": int(step), "policy": f"external ({spec.policy})", "seconds": float("nan"),
        "reward_mean": float(rewards.mean()), "reward_median": float(np.median([np.mean(v) for v in by_task.values()])),
        "batch_variance": float(np.mean([np.var(v) for v in by_task.values()])),
        "zero_variance_fraction": float(1 - np.mean(spread)), "envs_touched": len({env_of[t] for t in by_task}),
        "rollouts": len(out), "groups": len(by_task), "missing_groups": len(set(env_of) - set(by_task)),
    }
    lake.write("train_metrics", [metrics], step=step)
    return metrics


ERROR_CLASSES = ("none", "task", "timeout", "env_crash", "verifier_error", "infra")
