"""``envsched explain --step T [--task ID]``: why the scheduler built step T's batch as it did, and
why a task was or was not in it.

Selection is deterministic given the run's seed, the step and the scheduler state after step
T-1 (``state/step=T-1``), so the selection is recomputed here, without writing anything, and
checked against the stored manifest: the explanation is of the batch that was trained on, or it
says it is not (the pool, the graph or the scheduler config changed since). For the envsched
family the recomputation keeps every task's estimates and the constraints as the batch left them,
so a task that was not picked gets the same numbers a pick's ``reason`` carries, the constraint
that blocked it, or how far its score fell below the exploit picks'. Baselines are explained by
their picks only.
"""

from __future__ import annotations

import json

import numpy as np

from envsched_pipeline.core.build import build_scheduler, scheduler_config
from envsched_pipeline.core.fold import selection_base, selection_state, state_available
from envsched_pipeline.errors import StepError
from envsched_pipeline.lake import Lake
from envsched_pipeline.run import require_run, step_rng
from envsched_pipeline.scheduler.explain import left_out
from envsched_pipeline.scheduler.variants import scheduler_label


def _outcome(lake: Lake, task_id: str, upto: int) -> list[dict]:
    """The task's groups up to step ``upto``: step, mean reward, reward variance, informative."""
    return lake.sql(
        "select step, mean_reward, reward_variance, informative from task_history "
        f"where task_id = '{task_id.replace(chr(39), chr(39) * 2)}' and step <= {int(upto)} order by step"
    ).to_pylist()


def explain_step(lake: Lake, step: int, task: str | None = None) -> dict:
    """The batch of ``step`` explained (and ``task`` in it, when given). Writes nothing."""
    spec = require_run(lake)
    if step < 0 or step not in lake.steps("manifests"):
        have = lake.steps("manifests")
        span = f"steps {have[0]}..{have[-1]}" if have else "no manifest yet"
        raise StepError(f"step {step} has no manifest in {lake.root} ({span})")
    rows = lake.read("manifests", step=step).to_pylist()
    base = selection_base(spec, step)
    if base >= 0 and not state_available(lake, base):
        raise StepError(
            f"the scheduler state after step {base} is missing in {lake.root}, so step {step}'s "
            f"selection cannot be recomputed; materialize statistics[{base}] first"
        )
    state = selection_state(lake, spec, step)
    ids = list(state.task_ids)
    if task is not None and task not in ids:
        raise StepError(
            f'task {task!r} is not in pool {spec.pool!r} (`envsched sql "select task_id from tasks"`)'
        )
    sched = build_scheduler(lake, spec, state)
    selection = sched.select(state, spec.batch_size, step_rng(spec, step), step)
    stored = [r["task_id"] for r in rows]
    hashes = sorted({r.get("config_hash") for r in rows if r.get("config_hash")})
    out: dict = {
        "step": step,
        "scheduler": scheduler_label(spec.scheduler, spec.scheduler_config),
        "reproduced": [p.task_id for p in selection.picks] == stored,
        "config_changed": bool(hashes) and hashes != [scheduler_config(spec).hash()],
        "batch": _batch(rows, selection, sched, state),
    }
    if task is not None:
        out["task"] = _task(lake, step, task, rows, sched, state)
    return out


def _batch(rows: list[dict], selection, sched, state) -> dict:
    halves = {h: sum(r["half"] == h for r in rows) for h in sorted({r["half"] for r in rows})}
    envs: dict[str, int] = {}
    for r in rows:
        envs[r["env_id"]] = envs.get(r["env_id"], 0) + 1
    batch = {
        "picks": len(rows),
        "halves": halves,
        "environments": len(envs),
        "most_picks_in_one_environment": max(envs.values()) if envs else 0,
        "relaxations": selection.relaxations,
        "quarantined": selection.quarantined,
        "retired_tasks": int((state.arrays["retired"] > 0).sum()),
    }
    trace = getattr(sched, "last_trace", None)
    if trace and not trace["cold"]:
        scores = [r["score"] for r in rows if r["half"] == "exploit"]
        values = trace["exploit_values"]
        batch.update(
            {
                "coverage_slots": trace["coverage_slots"],
                "exploit_score_range": [min(scores), max(scores)] if scores else None,
                "lowest_exploit_value": min(values) if values else None,
                "tasks_returning_from_retirement": int(trace["returning"].sum()),
            }
        )
    return batch


def _task(lake: Lake, step: int, task: str, rows: list[dict], sched, state) -> dict:
    i = list(state.task_ids).index(task)
    mine = next((r for r in rows if r["task_id"] == task), None)
    env_id = state.env_ids[state.env[i]]
    out: dict = {
        "task_id": task,
        "env_id": env_id,
        "picked": mine is not None,
        "env_picks": [{"task_id": r["task_id"], "half": r["half"]} for r in rows if r["env_id"] == env_id],
        "history": _outcome(lake, task, step),
    }
    if mine is not None:
        out.update(
            slot=mine["slot"],
            half=mine["half"],
            score=mine["score"],
            reason=json.loads(mine["reason"] or "{}"),
        )
        return out
    trace = getattr(sched, "last_trace", None)
    if not trace:
        out["why"] = f"{sched.name} does not score the tasks it leaves out: only its picks are explained"
        return out
    out.update(left_out(sched, state, i))
    return out


def explain_lines(report: dict) -> list[str]:
    """``explain_step``'s answer as lines for a terminal."""
    b = report["batch"]
    lines = [
        f"step {report['step']}: {report['scheduler']}, {b['picks']} picks from {b['environments']} environments"
    ]
    if not report["reproduced"]:
        lines.append(
            "  note: recomputing this step's selection gives other picks than its manifest (the pool, graph "
            "or scheduler config changed since); the numbers below are today's recomputation"
        )
    elif report["config_changed"]:
        lines.append("  note: the run's scheduler config changed after this step; its picks still reproduce")
    lines.append("  halves: " + ", ".join(f"{h} {n}" for h, n in b["halves"].items()))
    if "coverage_slots" in b:
        rng = b["exploit_score_range"]
        lines.append(
            f"  coverage slots {b['coverage_slots']}; exploit scores "
            + (f"{rng[0]:.4g}..{rng[1]:.4g}" if rng else "none")
            + f"; retired tasks {b['retired_tasks']} ({b['tasks_returning_from_retirement']} returning this step)"
        )
    lines.append(
        f"  most picks from one environment: {b['most_picks_in_one_environment']}; relaxed: "
        + (", ".join(b["relaxations"]) or "nothing")
        + "; quarantined: "
        + (", ".join(q["env_id"] for q in b["quarantined"]) or "none")
    )
    t = report.get("task")
    if t is None:
        return lines
    lines.append(
        f"task {t['task_id']} ({t['env_id']}): "
        + (f"picked, {t['half']} half, slot {t['slot']}" if t["picked"] else "not picked")
    )
    if not t["picked"] and "why" in t:
        lines.append(f"  why: {t['why']}")
    others = [f"{p['task_id']} ({p['half']})" for p in t["env_picks"] if p["task_id"] != t["task_id"]]
    lines.append(f"  its environment's other picks this step: {', '.join(others) or 'none'}")
    if "score" in t:
        extra = f" (rank {t['score_rank']} of {t['tasks']})" if "score_rank" in t else ""
        lines.append(f"  score {t['score']:.4g}{extra}")
    reason = t.get("reason") or {}
    keys = (
        "pred_success",
        "pred_dispersion",
        "pred_var",
        "own_var",
        "prior_var",
        "exposure_discount",
        "decline_factor",
        "hack_factor",
        "similarity_penalty",
        "n_within",
        "n_cross",
        "neighbours",
    )
    shown = [f"{k} {_fmt(reason[k])}" for k in keys if reason.get(k) is not None]
    if shown:
        lines.append("  " + "; ".join(shown))
    hist = t["history"]
    if hist:
        lines.append(
            f"  history: {len(hist)} group{'s' if len(hist) != 1 else ''} up to this step; the last ones:"
        )
        for h in hist[-5:]:
            lines.append(
                f"    step {h['step']}: mean reward {h['mean_reward']:.3f}, variance {h['reward_variance']:.4f}"
                + ("" if h["informative"] else " (no spread)")
            )
    else:
        lines.append("  history: never rolled out up to this step")
    return lines


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if np.isfinite(v) else "—"
    if isinstance(v, list):
        return ", ".join(map(str, v)) or "none"
    return str(v)
