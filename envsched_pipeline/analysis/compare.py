"""A run against runs in other lakes (``envsched report --against LAKE``): the same pool, policy and
batch shape trained with another scheduler (random, most often), so the comparison is of real runs
rather than of baselines re-run in the simulated learner.

* :func:`against_runs` checks that each other lake holds a run that can be compared with this one
  and names what differs without blocking (seed, configs, length).
* :func:`step_verdicts` compares the per-step headline metrics over the steps both runs hold, with
  the moving-block bootstrap interval of the per-step difference.
* :func:`heldout_verdicts` compares the held-out scores at the last evaluation both runs made: from
  the evaluation episodes when both lakes keep them (one standard error per run from the episodes'
  own noise when they evaluated the same tasks; the spread over tasks when they evaluated different
  subsets), else from the ``evals`` rows' standard errors. It also gives the paper's step count:
  the first evaluation at which this run reached the other run's best held-out score.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from envsched_pipeline.analysis.passk import episodes_by_split
from envsched_pipeline.core.loop import partner
from envsched_pipeline.errors import ConfigError
from envsched_pipeline.lake import Lake
from envsched_pipeline.run import RunSpec, check_partner, require_run
from envsched_pipeline.scheduler.variants import scheduler_label

Z95 = 1.96
VERDICT_WORD = {True: "better", False: "worse", None: "no clear difference"}  # a verdict's ``better``
NOT_HELDOUT = ("batch_mean_reward",)  # the training batch's own reward, logged beside the evaluations
# the per-step headline metrics two runs are compared on: (step_summary column, label, which
# direction is better for the scheduler's purpose)
HEADLINES = (
    ("batch_variance", "Batch reward variance", "higher"),
    ("zero_variance_fraction", "Zero-variance group fraction", "lower"),
    ("envs_touched", "Environments touched per step", "higher"),
)


def interval_text(ci) -> str:
    """`` [lo, hi]`` of a verdict's 95% interval, or "" where it has none (a comparison over one
    step: NaN, or null once stored)."""
    if not ci or any(x is None or not math.isfinite(x) for x in ci):
        return ""
    return f" [{ci[0]:+.4g}, {ci[1]:+.4g}]"


def relation(sign: bool | None, other: str, words: tuple[str, str] = ("higher than", "lower than")) -> str:
    """How a value stands to ``other``'s: ``sign`` True above it, False below it, None when the
    interval holds both (``words``: the phrases for above and below)."""
    return (
        f"no clear difference from {other}" if sign is None else f"{words[0] if sign else words[1]} {other}"
    )


def short_label(spec: RunSpec) -> str:
    return scheduler_label(spec.scheduler, spec.scheduler_config).split(" (")[0]


def _tasks(lake: Lake, table: str, pool: str) -> set[tuple[str, str]]:
    """(task id, what the task is) of a pool table: its content hash where the table keeps one,
    else its instruction (a re-generated pool reuses task ids for other tasks)."""
    if not lake.has(table, pool=pool):
        return set()
    t = lake.read(table, pool=pool)
    what = "content_hash" if "content_hash" in t.column_names else "instruction"
    return set(zip(t.column("task_id").to_pylist(), t.column(what).to_pylist(), strict=True))


def against_runs(lake: Lake, spec: RunSpec, others: Sequence[Lake], flag: str = "--against") -> list[dict]:
    """Each lake of ``others`` with its run, checked against this one: ``lake``, ``spec``, ``name``
    (its scheduler, made unique) and ``notes`` (settings that differ without making the comparison
    meaningless). Raises :class:`ConfigError` naming the lake (after ``flag``, the option that named
    it) and the setting that does."""
    out: list[dict] = []
    mine = {t: _tasks(lake, t, spec.pool) for t in ("tasks", "eval_tasks")}
    for other in others:
        where = f"{flag} {other.root}"
        o = check_partner(lake, spec, other.require(), where) or require_run(other)
        for table, what in (("tasks", "training"), ("eval_tasks", "held-out")):
            theirs = _tasks(other, table, o.pool)
            if theirs != mine[table]:
                differ = len({t for t, _ in theirs ^ mine[table]})
                raise ConfigError(
                    f"{where}: pool {o.pool!r} there holds other {what} tasks than this lake's "
                    f"({differ} tasks differ), so the runs are not on one pool"
                )
        notes = [f"seed {o.seed} (this run: {spec.seed})"] if o.seed != spec.seed else []
        changed = changed_settings(spec.policy_config, o.policy_config, "this run", mine_first=False)
        if changed:
            notes.append("policy settings " + ", ".join(changed))
        if o.select_lag != spec.select_lag:  # the same scheduler chooses from staler statistics
            notes.append(
                f"selects {o.select_lag} step(s) ahead of its rollouts (this run: {spec.select_lag})"
            )
        out.append({"lake": other, "spec": o, "name": short_label(o), "notes": notes})
    _unique_names(out, spec)
    return out


def recorded_against(spec: RunSpec) -> tuple[list[Lake], list[str]]:
    """The lakes the run is to be compared with (its ``against``: `envsched train --against`) that
    hold steps, and why each other one is left out for now (its run has not started, has no steps
    yet or cannot be read); a lake whose run cannot be compared is refused where it is compared."""
    ready, waiting = [], []
    for p in map(partner, spec.against):
        if p["state"] == "unreadable":
            waiting.append(f"{p['lake']} cannot be read ({p['problem']})")
        elif p["state"] == "not started":
            waiting.append(f"{p['lake']} holds no run yet")
        elif not p["steps"]:
            waiting.append(f"{p['lake']}'s run has no steps yet")
        else:
            ready.append(Lake(p["lake"]))
    return ready, waiting


def changed_settings(mine: dict, theirs: dict, other: str, mine_first: bool = True) -> list[str]:
    """The settings two runs do not share, each as ``key=value (<other>: value)``, in key order:
    this run's value first (``mine_first``), else the other run's with this run's in brackets."""
    first, second = (mine, theirs) if mine_first else (theirs, mine)
    return [
        f"{k}={first.get(k)!r} ({other}: {second.get(k)!r})"
        for k in sorted(set(mine) | set(theirs))
        if mine.get(k) != theirs.get(k)
    ]


def _unique_names(runs: list[dict], spec: RunSpec) -> None:
    """Two runs of one scheduler (or one of this run's) read apart by seed, then by lake folder."""
    taken = [short_label(spec)]
    for add in (lambda r: f" seed {r['spec'].seed}", lambda r: f" ({r['lake'].root.name})"):
        names = taken + [r["name"] for r in runs]
        for r in runs:
            if names.count(r["name"]) > 1:
                r["name"] += add(r)
    names = taken + [r["name"] for r in runs]
    for i, r in enumerate(runs):  # the same folder name under two parents: number them
        if names.count(r["name"]) > 1:
            r["name"] += f" #{i + 1}"


def aligned(a: dict[str, list], b: dict[str, list], key: str) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The steps both series hold a finite ``key`` at, and the two runs' values there."""
    va = {s: v for s, v in zip(a["step"], a[key], strict=True) if v is not None and math.isfinite(v)}
    vb = {s: v for s, v in zip(b["step"], b[key], strict=True) if v is not None and math.isfinite(v)}
    steps = sorted(set(va) & set(vb))
    return steps, np.array([va[s] for s in steps], float), np.array([vb[s] for s in steps], float)


# ---------------------------------------------------------------------------- held-out
def compare_reliability(mine: list[dict], theirs: list[dict]) -> list[dict]:
    """Two independent runs' rows of one split side by side at the k both have: each estimate's
    difference, its standard error (the two runs' combined) and verdict (``better`` True / False
    past 1.96 standard errors, else None; None without an error)."""
    by_k = {r["k"]: r for r in theirs}
    out = []
    for r in mine:
        o = by_k.get(r["k"])
        if o is None:
            continue
        row = {"k": r["k"]}
        for name in ("pass_at_k", "pass_hat_k"):
            diff = r[name] - o[name]
            se = None
            if r[f"{name}_se"] is not None and o[f"{name}_se"] is not None:
                se = math.hypot(r[f"{name}_se"], o[f"{name}_se"])
            better = None
            if se is not None and abs(diff) > Z95 * se:
                better = diff > 0
            row.update({name: r[name], f"other_{name}": o[name], f"{name}_diff": diff})
            row.update({f"{name}_diff_se": se, f"{name}_better": better})
        out.append(row)
    return out


def _episodes(lake: Lake, step: int, split: str) -> dict[str, np.ndarray]:
    """Task id -> its evaluation episodes' rewards at ``step`` (empty when the lake keeps none)."""
    return {t: np.array(v) for t, v in episodes_by_split(lake, step).get(split, {}).items()}


def _sampling_var(episodes: dict[str, np.ndarray]) -> float:
    """Variance of the mean of task means from the episodes' own noise (the tasks a fixed set)."""
    n = len(episodes)
    within = [np.var(v, ddof=1) / len(v) for v in episodes.values() if len(v) > 1]
    return float(sum(within)) / n**2


def episode_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict:
    """This run's mean held-out minus the other's from their episodes, with its standard error: the
    episodes' own noise when both evaluated the same tasks, the spread over tasks when not."""
    ma = np.array([v.mean() for v in a.values()])
    mb = np.array([v.mean() for v in b.values()])
    diff = float(ma.mean() - mb.mean())
    if set(a) == set(b):
        return {"diff": diff, "se": math.sqrt(_sampling_var(a) + _sampling_var(b)), "basis": "same tasks"}
    if min(len(ma), len(mb)) < 2:
        return {"diff": diff, "se": float("nan"), "basis": "different tasks"}
    se = math.sqrt(ma.var(ddof=1) / len(ma) + mb.var(ddof=1) / len(mb))
    return {"diff": diff, "se": se, "basis": "different tasks"}


def heldout_scores(lake: Lake) -> dict[str, dict[int, tuple[float, float]]]:
    """Benchmark -> step -> (score, se) of the lake's evaluations (se NaN when not recorded)."""
    if not lake.steps("evals"):
        return {}
    out: dict[str, dict[int, tuple[float, float]]] = {}
    for r in lake.read("evals").to_pylist():
        score, se = r["score"], r.get("se")
        if r["benchmark"] in NOT_HELDOUT or score is None or not math.isfinite(score):
            continue
        out.setdefault(r["benchmark"], {})[r["step"]] = (
            float(score),
            float("nan") if se is None else float(se),
        )
    return out


def steps_to_reach(mine: dict[int, tuple[float, float]], theirs: dict[int, tuple[float, float]]) -> dict:
    """The paper's count: the other run's best score and its step, and the first evaluation step at
    which this run scored at least that (None when it never did). A point estimate."""
    best_step = max(sorted(theirs), key=lambda s: theirs[s][0])  # the earliest of equal bests
    best = theirs[best_step][0]
    reached = next((s for s in sorted(mine) if mine[s][0] >= best), None)
    ratio = best_step / reached if reached else float("nan")
    return {"best": best, "best_step": best_step, "reached_at": reached, "ratio": ratio}


def heldout_verdicts(lake: Lake, other: Lake, name: str) -> list[dict]:
    """One verdict per held-out benchmark both runs evaluated, at the last step both evaluated
    (``curve``: both runs' mean over every evaluation both made)."""
    mine, theirs = heldout_scores(lake), heldout_scores(other)
    out = []
    for bench in sorted(set(mine) & set(theirs)):
        common = sorted(set(mine[bench]) & set(theirs[bench]))
        if not common:
            continue
        step = common[-1]
        (ra, sa), (rb, sb) = mine[bench][step], theirs[bench][step]
        diff, se, basis = ra - rb, math.sqrt(sa**2 + sb**2), "recorded standard errors"
        split = bench.removeprefix("heldout_")
        if split != bench:
            ea, eb = _episodes(lake, step, split), _episodes(other, step, split)
            if ea and eb:
                d = episode_difference(ea, eb)
                diff, se, basis = d["diff"], d["se"], d["basis"]
        if math.isfinite(se):
            ci = [diff - Z95 * se, diff + Z95 * se]
            good = None if ci[0] <= 0 <= ci[1] else diff > 0
            word = relation(good, name, ("above", "below"))
            band = f" ± {se:.4f} (s.e., {basis})" if se > 0 else " (recorded without sampling error)"
        else:
            good, word, band, ci = None, "no standard error recorded to judge it by", "", None
        reach = steps_to_reach(mine[bench], theirs[bench])
        # a difference below the fourth decimal keeps its digits (a verdict on "-0.0000" reads as a tie)
        shown = f"{diff:+.4f}" if diff == 0 or abs(diff) >= 5e-5 else f"{diff:+.2g}"
        text = f"{bench} at step {step}: {ra:.4f} vs {name} {rb:.4f}, difference {shown}{band}: {word}."
        if reach["reached_at"] is None:
            text += f" Never reached {name}'s best ({reach['best']:.4f}, its step {reach['best_step']})."
        else:
            if reach["reached_at"] == reach["best_step"]:
                speed = f", the step {name} reached it at"
            elif math.isfinite(reach["ratio"]):
                speed = f"; {name} needed {reach['ratio']:.2f}x as many steps"
            else:
                speed = ""
            text += (
                f" Reached {name}'s best ({reach['best']:.4f}, its step {reach['best_step']}) at step "
                f"{reach['reached_at']}{speed}."
            )
        out.append(
            {
                "metric": f"Held-out {bench} (last common evaluation)",
                "benchmark": bench,
                "baseline": name,
                "step": step,
                "run": ra,
                "base": rb,
                "ratio": ra / rb if rb else float("nan"),
                "diff": diff,
                "se": se,
                "ci": ci,
                "better": good,
                "reach": reach,
                # the whole curve: the mean over every evaluation both runs made (steps both hold)
                "curve": {
                    "evaluations": len(common),
                    "run": float(np.mean([mine[bench][s][0] for s in common])),
                    "base": float(np.mean([theirs[bench][s][0] for s in common])),
                },
                "text": text,
            }
        )
    return out
