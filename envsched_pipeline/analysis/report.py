"""``envsched report --out DIR``: one self-contained HTML page a team can paste into a review.

* The run's configuration (pool, policy, scheduler and its config hash, B, G, seed, run id, steps).
* A verdict sentence per headline metric (batch reward variance, zero-variance fraction,
  environments touched, held-out score) against baselines **re-run on the run's own pool** with the
  same B, G, seed and number of steps, each with a 95% confidence interval of the per-step
  difference (moving-block bootstrap over steps, so autocorrelated steps are not treated as
  independent). Baselines are re-run in the simulated learner; the page says so, and says when they
  cannot be (a run of another policy, a pool without simulator latents).
* Interactive charts drawn by a few lines of embedded JavaScript (hover for values, drag to zoom,
  double-click to reset, click a legend entry to hide it): no network, no CDN, works offline.
  One colour per scheduler on every panel. Panels only for data the lake holds.
* The most informative tasks, ranked among tasks observed in at least ``MIN_GROUPS`` groups.
"""

from __future__ import annotations

import html
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from envsched_pipeline.analysis.bench import run_one
from envsched_pipeline.analysis.compare import (
    HEADLINES,
    VERDICT_WORD,
    against_runs,
    aligned,
    compare_reliability,
    heldout_verdicts,
    interval_text,
    recorded_against,
    relation,
)
from envsched_pipeline.analysis.passk import heldout_reliability
from envsched_pipeline.analysis.plots import SCHEDULER_COLORS, _series, _series_each
from envsched_pipeline.analysis.seeds import mark
from envsched_pipeline.core.gates import STALL_GATE, halted
from envsched_pipeline.core.loop import best_heldout, best_heldout_text
from envsched_pipeline.graph.store import load_graph
from envsched_pipeline.lake import Lake, json_safe
from envsched_pipeline.run import require_run
from envsched_pipeline.scheduler.variants import scheduler_label

BASELINES = ("random", "exploit-only", "greso", "mopps", "dps")
MIN_GROUPS = 3
COLOURS = SCHEDULER_COLORS  # one colour per scheduler, the same as every other plot of the project


def colour(name: str) -> str:
    return COLOURS.get(name.split("@")[0], "#d62728")


SAMPLER_GAP_TITLE = "Sampler vs trainer: |log-probability difference| of the trained tokens"
SAMPLER_GAP = (("sampler_logprob_diff", "mean", 2.6), ("sampler_logprob_diff_max", "largest", 1.4))  # + width


def _finite(values) -> list[float | None]:
    return [
        None if v is None or (isinstance(v, float) and not math.isfinite(v)) else float(v) for v in values
    ]


# ---------------------------------------------------------------------------- baselines
def pool_from_lake(lake: Lake, pool: str) -> dict | None:
    """The run's own pool, graph and simulator latents in the benchmark's shape (None without latents)."""
    latents = lake.read("task_latents", pool=pool).to_pylist()
    if not latents or "z" not in latents[0]:
        return None
    tasks = sorted(lake.read("tasks", pool=pool).to_pylist(), key=lambda t: t["task_id"])
    return {
        "tasks": tasks,
        "graph": load_graph(lake, pool),
        "latents": [dict(r, z=json.loads(r["z"]) if isinstance(r["z"], str) else r["z"]) for r in latents],
    }


def block_bootstrap_ci(
    diff: np.ndarray, block: int = 10, reps: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """95% interval of the mean of an autocorrelated series (moving blocks of ``block`` steps)."""
    n = len(diff)
    if n < 2:
        return (float("nan"), float("nan"))
    b = max(1, min(block, n // 2 or 1))
    starts = np.arange(n - b + 1)
    k = int(np.ceil(n / b))
    rng = np.random.default_rng(seed)
    picks = rng.choice(starts, size=(reps, k))
    idx = (picks[:, :, None] + np.arange(b)[None, None, :]).reshape(reps, -1)[:, :n]
    means = diff[idx].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def verdict(label: str, better: str, run: np.ndarray, base: np.ndarray, base_name: str) -> dict:
    n = min(len(run), len(base))
    r, b = run[:n], base[:n]
    d = r - b
    lo, hi = block_bootstrap_ci(d)
    mean_r, mean_b = float(r.mean()), float(b.mean())
    ratio = mean_r / mean_b if mean_b else float("nan")
    higher = None if not (math.isfinite(lo) and math.isfinite(hi)) or lo <= 0 <= hi else lo > 0
    word = relation(higher, base_name)
    good = None if higher is None else higher == (better == "higher")
    interval = (
        f"95% CI [{lo:+.4g}, {hi:+.4g}] over {n} steps"
        if n >= 2
        else f"over {n} step{'s' * (n != 1)} (an interval needs two or more)"
    )
    text = (
        f"{label}: {mean_r:.4g} vs {base_name} {mean_b:.4g} ({ratio:.2f}×); per-step difference "
        f"{d.mean():+.4g}, {interval}: {word}."
    )
    return {
        "metric": label,
        "baseline": base_name,
        "run": mean_r,
        "base": mean_b,
        "ratio": ratio,
        "diff": float(d.mean()),
        "ci": [lo, hi],
        "better": good,
        "text": text,
    }


# ---------------------------------------------------------------------------- the page
STEP_QUERY = (
    "select step, batch_variance, zero_variance_fraction, envs_touched, mean_reward, median_reward "
    "from step_summary order by step"
)
EVAL_QUERY = "select step, benchmark, avg(score) as score from evals group by 1, 2 order by 2, 1"


def verdict_lines(summary: dict) -> list[str]:
    """A report's verdicts (its ``summary.json``) for the terminal: all of them against other runs,
    else random's, and the runs it names that it could not compare with yet."""
    named = bool(summary["against"])
    lines = [
        f"  {mark(v['better'])} {v['text']}"
        for v in summary["verdicts"]
        if named or v["baseline"] == "random"
    ]
    lines += [f"  not compared yet: {why}" for why in summary["not_compared"]]
    if named:
        lines.append(
            "  (these judge this pair of runs; whether the scheduler is ahead is judged over seeds: "
            "`envsched compare --runs LAKE... --against LAKE...`)"
        )
    return lines


def build_report(
    lake: Lake, out_dir: Path, baselines: bool = True, log=print, against: Sequence[Lake] | None = None
) -> Path:
    """The report page and its ``summary.json`` in ``out_dir``. ``against``: lakes holding runs of the
    same pool, policy and batch shape (another scheduler's, most often random's) to compare with,
    instead of baselines re-run in the simulated learner; None: the lakes the run names itself
    (``run.json``'s ``against``) that hold steps by now. Bad input writes nothing."""
    out_dir = Path(out_dir)
    spec = require_run(lake)
    s = _series(lake, STEP_QUERY)
    if not s.get("step"):
        raise ValueError(f"no steps in {lake.root}: nothing to report")
    flag, waiting = "--against", []
    if against is None:
        (against, waiting), flag = recorded_against(spec), "the run's against"
    others = against_runs(lake, spec, against, flag=flag)
    for o in others:
        o["series"], o["evals"] = _series_each(o["lake"], STEP_QUERY, EVAL_QUERY)
        if not o["series"].get("step"):
            raise ValueError(f"{flag} {o['lake'].root}: its run has no steps to compare with")
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = s["step"]
    n_steps = len(steps)
    manifests = lake.read("manifests", columns=["config_hash"]) if lake.steps("manifests") else None
    hashes = (
        sorted(set(manifests.column("config_hash").to_pylist()))
        if manifests is not None and "config_hash" in manifests.column_names
        else []
    )

    # baselines on the run's own pool
    base_series: dict[str, dict] = {}
    base_note = ""
    if others:
        base_note = (
            "Compared with runs in other lakes (same pool, policy, B and G): "
            + "; ".join(
                f"{o['name']} in {o['lake'].root}"
                + (f" (differs: {', '.join(o['notes'])})" if o["notes"] else "")
                for o in others
            )
            + ". Baselines are not re-run in the simulated learner when other runs are given. These verdicts "
            "judge this pair of runs (a held-out interval is the evaluation's sampling error, not the spread "
            "between two runs of a seed); whether the scheduler is ahead is judged over seeds by `envsched "
            "compare --runs LAKE... --against LAKE...`."
        )
    elif waiting:
        base_note = (
            "Baselines are not re-run in the simulated learner when the run names runs to compare with."
        )
    elif not baselines:
        base_note = "Baselines were not re-run (--no-baselines)."
    elif spec.policy != "simulated":
        base_note = (
            f"Baselines are not re-run for a {spec.policy!r} run (only the simulated learner re-runs in "
            "seconds); compare with another scheduler's run of this policy with `envsched report --against "
            "LAKE`, or schedulers on the neural learner with `envsched bench scheduler --learner neural`."
        )
    else:
        pool = pool_from_lake(lake, spec.pool)
        if pool is None:
            base_note = f"Pool {spec.pool!r} has no simulator latents, so baselines cannot be re-run on it."
        else:
            names = [n for n in BASELINES if n != spec.scheduler]
            log(f"re-running baselines {', '.join(names)} on pool {spec.pool} for {n_steps} steps ...")
            for name in names:
                base_series[name] = run_one(
                    name,
                    pool,
                    n_steps,
                    spec.seed,
                    spec.batch_size,
                    spec.group_size,
                    overrides=spec.scheduler_config if name == spec.scheduler else None,
                )
            base_note = (
                f"Baselines re-run on this run's own pool ({spec.pool!r}, {len(pool['tasks'])} tasks) in the "
                f"simulated learner with B = {spec.batch_size}, G = {spec.group_size}, seed {spec.seed}, "
                f"{n_steps} steps."
            )
    if waiting:  # named by the run, not started or without steps when this report was written
        base_note += f" Not compared yet: {'; '.join(waiting)}."

    run_name = f"this run ({scheduler_label(spec.scheduler, spec.scheduler_config)})"
    run_colour = colour(spec.scheduler)

    def line(values, name=run_name, col=run_colour, width=2.6, x=None):
        return {
            "name": name,
            "color": col,
            "width": width,
            "x": list(x if x is not None else steps),
            "y": _finite(values),
        }

    charts = []
    for key, label, better in HEADLINES:
        series = [line(s[key])]
        for name, ser in base_series.items():
            series.append(
                line(
                    ser[key],
                    name=f"{name} (simulated)",
                    col=colour(name),
                    width=1.2,
                    x=range(len(ser[key])),
                )
            )
        for o in others:
            ser = o["series"]
            series.append(
                line(ser[key], name=o["name"], col=colour(o["spec"].scheduler), width=1.6, x=ser["step"])
            )
        charts.append(
            {"kind": "line", "title": f"{label} ({better} is better)", "xlabel": "step", "series": series}
        )

    ev = _series(lake, EVAL_QUERY)
    heldout_run = None
    if ev.get("step"):
        series = []
        mine = _by_benchmark(ev)
        dashes = {b: i for i, b in enumerate(mine)}
        for bname, (xs, ys) in mine.items():
            series.append(
                {
                    "name": f"this run: {bname}",
                    "color": run_colour,
                    "width": 2.6,
                    "dash": dashes[bname],
                    "x": xs,
                    "y": _finite(ys),
                }
            )
            if "seen" in bname and heldout_run is None:
                heldout_run = (xs, ys)
        for o in others:
            for bname, (xs, ys) in _by_benchmark(o["evals"]).items():
                series.append(
                    {
                        "name": f"{o['name']}: {bname}",
                        "color": colour(o["spec"].scheduler),
                        "width": 1.6,
                        "dash": dashes.get(bname, 0),
                        "x": xs,
                        "y": _finite(ys),
                    }
                )
        for name, ser in base_series.items():
            series.append(
                line(
                    ser["heldout"],
                    name=f"{name} (simulated)",
                    col=colour(name),
                    width=1.2,
                    x=range(len(ser["heldout"])),
                )
            )
        charts.append({"kind": "line", "title": "Held-out score", "xlabel": "step", "series": series})

    tm = _series(lake, "select * from train_metrics order by step")  # external trainers report fewer columns
    for key in ("loss", "grad_norm"):
        vals = _finite(tm.get(key, []))
        if any(v is not None for v in vals):
            charts.append(
                {
                    "kind": "line",
                    "title": "GRPO loss" if key == "loss" else "Gradient norm",
                    "xlabel": "step",
                    "series": [line(vals, x=tm["step"])],
                }
            )
    # a language model's sampler against its trainer (the update's sampler correction): how far apart
    # their log-probabilities of the trained tokens were, on average and at the worst token
    gap = [g for g in SAMPLER_GAP if any(v is not None for v in _finite(tm.get(g[0], [])))]
    if gap:
        charts.append(
            {
                "kind": "line",
                "title": SAMPLER_GAP_TITLE,
                "xlabel": "step",
                "series": [
                    line(tm[k], name=f"{run_name}: {label}", width=width, x=tm["step"])
                    for k, label, width in gap
                ],
            }
        )

    cal = _series(
        lake,
        "select pred_var, realized_variance from pick_reasons "
        "where pred_var is not null and not isnan(pred_var) and realized_variance is not null",
    )
    if cal.get("pred_var"):
        x, y = np.array(cal["pred_var"], dtype=float), np.array(cal["realized_variance"], dtype=float)
        keep = np.random.default_rng(0).permutation(len(x))[:2500]
        q = np.quantile(x, np.linspace(0, 1, 11))
        idx = np.clip(np.searchsorted(q, x, side="right") - 1, 0, 9)
        dec = [(float(x[idx == b].mean()), float(y[idx == b].mean())) for b in range(10) if (idx == b).any()]
        charts.append(
            {
                "kind": "scatter",
                "title": "Predicted vs realized group variance",
                "xlabel": "predicted variance",
                "series": [
                    {
                        "name": "this run: picked groups",
                        "color": run_colour,
                        "points": True,
                        "x": x[keep].tolist(),
                        "y": y[keep].tolist(),
                    },
                    {
                        "name": "decile means",
                        "color": "#000000",
                        "width": 2,
                        "x": [d[0] for d in dec],
                        "y": [d[1] for d in dec],
                    },
                ],
            }
        )

    yl = _series(lake, "select step, predicted_yield, realized_yield from yields order by step")
    if yl.get("step"):
        charts.append(
            {
                "kind": "line",
                "title": "Share of informative groups: predicted vs realized",
                "xlabel": "step",
                "series": [
                    line(yl["predicted_yield"], name="predicted", col="#999999", width=1.5, x=yl["step"]),
                    line(yl["realized_yield"], name="this run: realized", x=yl["step"]),
                ],
            }
        )

    picks = _series(lake, "select env_id, step, count(*) as n from manifests group by 1, 2")
    if picks.get("env_id"):
        envs = sorted(set(picks["env_id"]))
        cols = sorted(set(picks["step"]))
        grid = np.zeros((len(envs), len(cols)), dtype=int)
        for e, st, n in zip(picks["env_id"], picks["step"], picks["n"], strict=True):
            grid[envs.index(e), cols.index(st)] = n
        charts.append(
            {
                "kind": "heatmap",
                "title": "Tasks picked per environment and step",
                "xlabel": "step",
                "rows": envs,
                "cols": cols,
                "values": grid.tolist(),
            }
        )

    # verdicts
    verdicts = []
    for key, label, better in HEADLINES:
        for name, ser in base_series.items():
            verdicts.append(
                verdict(label, better, np.asarray(s[key], float), np.asarray(ser[key], float), name)
            )
    for o in others:
        for key, label, better in HEADLINES:
            steps_ab, a, b = aligned(s, o["series"], key)
            if len(steps_ab):
                verdicts.append(verdict(label, better, a, b, o["name"]))
        verdicts.extend(heldout_verdicts(lake, o["lake"], o["name"]))
    if heldout_run is not None:
        for name, ser in base_series.items():
            final_run, final_base = float(heldout_run[1][-1]), float(ser["heldout"][-1])
            verdicts.append(
                {
                    "metric": "Held-out score (final)",
                    "baseline": name,
                    "run": final_run,
                    "base": final_base,
                    "ratio": final_run / final_base if final_base else float("nan"),
                    "diff": final_run - final_base,
                    "ci": None,
                    "better": final_run > final_base,
                    "text": f"Held-out score at the end: {final_run:.4f} vs {name} {final_base:.4f} "
                    f"({final_run - final_base:+.4f}; the simulated learner's held-out is an expectation, "
                    "without sampling error).",
                }
            )

    top = lake.sql(
        "select task_id, any_value(env_id) as env_id, count(*) as groups, avg(reward_variance) as mean_variance, "
        f"avg(mean_reward) as mean_reward from task_history group by task_id having count(*) >= {MIN_GROUPS} "
        "order by mean_variance desc, groups desc limit 15"
    ).to_pylist()

    # where held-out generalization holds and where it fails: each environment at the last evaluation
    by_env_query = (
        "select split, env_id, tasks, episodes, mean_reward, solved from heldout_by_env "
        "where step = {step} order by split, mean_reward"
    )
    by_env = lake.sql(by_env_query.format(step="(select max(step) from eval_rollouts)")).to_pylist()
    if by_env and others:  # beside the first other run's, at the same evaluation step
        o = others[0]
        last = max(lake.steps("eval_rollouts"))
        if last in o["lake"].steps("eval_rollouts"):
            theirs = {
                (r["split"], r["env_id"]): r["mean_reward"]
                for r in o["lake"].sql(by_env_query.format(step=last)).to_pylist()
            }
            for r in by_env:
                b = theirs.get((r["split"], r["env_id"]))
                r[f"{o['name']} mean_reward"] = b
                r["difference"] = None if b is None else r["mean_reward"] - b

    # solved in one attempt, in any of k and in all k at the last evaluation, beside each other run's
    # at that step (analysis.passk); a chart of both against k
    reliability = heldout_reliability(lake)
    theirs = _theirs(reliability, others)
    rel_rows = reliability_rows(reliability, theirs)
    if rel_rows:
        colours = {o["name"]: colour(o["spec"].scheduler) for o in others}
        charts.append(reliability_chart(reliability, theirs, colours, run_name, run_colour))
        trend = [(run_name, run_colour, 2.6, lake)] + [
            (o["name"], colours[o["name"]], 1.6, o["lake"]) for o in others
        ]
        charts.append(solved_over_steps(trend))

    config = {
        "run id": spec.run_id,
        "pool": spec.pool,
        "policy": spec.policy,
        "scheduler": scheduler_label(spec.scheduler, spec.scheduler_config),
        "scheduler config hash": ", ".join(h[:12] for h in hashes) or "—",
        "scheduler overrides": json.dumps(spec.scheduler_config) if spec.scheduler_config else "none",
        "B (tasks per step)": spec.batch_size,
        "G (rollouts per task)": spec.group_size,
        "seed": spec.seed,
        "steps": n_steps,
        "lake": str(lake.root),
    }
    # the step whose policy scored best on held-out (what `envsched evaluate --best` scores), and each
    # other run's beside it
    best = {run_name: best_heldout(lake), **{o["name"]: best_heldout(o["lake"]) for o in others}}
    for name, b in best.items():
        if b is not None:
            config["best held-out" if name == run_name else f"best held-out ({name})"] = best_heldout_text(b)
    record = halted(lake)
    if record is not None and record["gate"] == STALL_GATE:  # --eval-patience ended the run here
        config["stopped early"] = f"after step {record['step']}: {record['problems'][0]}"
    summary = {
        "config": config,
        "baselines": {"note": base_note, "names": list(base_series) + [o["name"] for o in others]},
        "against": [
            {
                "name": o["name"],
                "lake": str(o["lake"].root),
                "run_id": o["spec"].run_id,
                "notes": o["notes"],
                "best_heldout": best[o["name"]],
            }
            for o in others
        ],
        "not_compared": waiting,
        "means": {k: float(np.nanmean(np.asarray(s[k], float))) for k, _, _ in HEADLINES},
        "verdicts": verdicts,
        "top_tasks": top,
        "best_heldout": best[run_name],
        "heldout_by_env": by_env,
        "heldout_reliability": {"step": reliability["step"], "rows": rel_rows},
        "charts": [c["title"] for c in charts],
    }
    page = _page(config, base_note, verdicts, charts, top, spec, by_env, (reliability["step"], rel_rows))
    index = out_dir / "index.html"
    index.write_text(page)
    (out_dir / "summary.json").write_text(json.dumps(json_safe(summary), indent=2, default=str))
    return index


def _by_benchmark(ev: dict[str, list]) -> dict[str, tuple[list, list]]:
    """An ``EVAL_QUERY`` result as benchmark -> (its steps, its scores), benchmarks in name order."""
    out: dict[str, tuple[list, list]] = {}
    for st, sc, bname in zip(ev.get("step", []), ev.get("score", []), ev.get("benchmark", []), strict=True):
        xs, ys = out.setdefault(bname, ([], []))
        xs.append(st)
        ys.append(sc)
    return dict(sorted(out.items()))


def _theirs(reliability: dict, others: list[dict]) -> list[tuple[str, dict]]:
    """Each other run's pass@k rows at this run's last evaluation step, where it kept episodes."""
    step = reliability["step"]
    return [
        (o["name"], heldout_reliability(o["lake"], step)["splits"])
        for o in others
        if step is not None and step in o["lake"].steps("eval_rollouts")
    ]


def reliability_rows(reliability: dict, theirs: list[tuple[str, dict]]) -> list[dict]:
    """The report's table of pass@k and pass^k (each with its standard error) per split and k, and
    beside each other run's (``theirs``: :func:`_theirs`): its value, the difference with its
    standard error and a verdict."""
    out = []
    for split, rows in reliability["splits"].items():
        compared = {
            other: {c["k"]: c for c in compare_reliability(rows, splits.get(split, []))}
            for other, splits in theirs
        }
        for r in rows:
            row = {"split": split, "k": r["k"], "tasks": r["tasks"]}
            for name, label in (("pass_at_k", "pass@k"), ("pass_hat_k", "pass^k")):
                se = r[f"{name}_se"]
                row[label] = f"{r[name]:.4f}" + (f" ± {se:.4f}" if se is not None else "")
            for other, _ in theirs:
                cmp = compared[other].get(r["k"])
                for name, label in (("pass_at_k", "pass@k"), ("pass_hat_k", "pass^k")):
                    if cmp is None:
                        row[f"{other} {label}"] = "—"
                        continue
                    se = cmp[f"{name}_diff_se"]
                    row[f"{other} {label}"] = f"{cmp[f'other_{name}']:.4f} ({cmp[f'{name}_diff']:+.4f}" + (
                        f" ± {se:.4f}, {VERDICT_WORD[cmp[f'{name}_better']]})" if se is not None else ")"
                    )
            out.append(row)
    return out


def reliability_chart(
    reliability: dict, theirs: list[tuple[str, dict]], colours: dict[str, str], run_name: str, run_colour: str
) -> dict:
    """pass@k (solid) and pass^k (dashed) against k, per split, for this run and each other run
    (``theirs``, drawn in ``colours`` by name)."""
    series = []
    runs = [
        (run_name, run_colour, 2.6, reliability["splits"]),
        *((n, colours[n], 1.6, sp) for n, sp in theirs),
    ]
    for name, col, width, splits in runs:
        for split, rows in splits.items():
            for key, label, dash in (("pass_at_k", "pass@k", 0), ("pass_hat_k", "pass^k", 1)):
                points = [(r["k"], r[key]) for r in rows]
                series.append(_solved_line(f"{name}: {split} {label}", split, col, width, dash, points))
    return {
        "kind": "line",
        "title": f"Held-out solved in any of k attempts (pass@k) and in all k (pass^k), step {reliability['step']}",
        "xlabel": "k (attempts at a task)",
        "series": series,
    }


def _solved_line(name: str, split: str, col: str, width: float, dash: int, points: list[tuple]) -> dict:
    """One line of the held-out solved charts, the unseen split's drawn thinner than the seen's."""
    return {
        "name": name,
        "color": col,
        "width": width if split == "seen" else width * 0.6,
        "dash": dash,
        "x": [x for x, _ in points],
        "y": [y for _, y in points],
    }


SOLVED_QUERY = """
    select step, split, k, pass_at_k, pass_hat_k from heldout_pass_at_k p
    where k = 1 or k = (select max(k) from heldout_pass_at_k q where q.step = p.step and q.split = p.split)
    order by split, step, k
"""


def solved_over_steps(runs: list[tuple[str, str, float, Lake]]) -> dict:
    """Each run's held-out share solved in one attempt (solid) and in all K (pass^K, dashed) at every
    evaluation, per split (``runs``: name, colour, line width, lake)."""
    series = []
    for name, col, width, lk in runs:
        rows = lk.sql(SOLVED_QUERY).to_pylist()
        for split in sorted({r["split"] for r in rows}):
            mine = [r for r in rows if r["split"] == split]
            most = {r["step"]: r["k"] for r in mine}  # the K of each evaluation
            for label, dash, key, pick in (
                ("solved once", 0, "pass_at_k", lambda r: r["k"] == 1),
                ("pass^K", 1, "pass_hat_k", lambda r, most=most: r["k"] == most[r["step"]]),
            ):
                points = [(r["step"], r[key]) for r in mine if pick(r)]
                series.append(_solved_line(f"{name}: {split} {label}", split, col, width, dash, points))
    return {
        "kind": "line",
        "title": "Held-out solved in one attempt and in all K (pass^K), over the steps",
        "xlabel": "step",
        "series": series,
    }


def _reliability_section(step: int | None, rows: list[dict]) -> str:
    """The pass@k table at the run's last evaluation (neural and LM policies)."""
    if not rows:
        return ""
    return (
        f"<section><h2>Held-out over repeated attempts (step {step})</h2><p class='hint'>pass@k: the "
        "share of tasks solved (reward 1) in at least one of k attempts; pass^k: in all k (reliability); "
        "unbiased estimates from each task's evaluation episodes, ± the episodes' own standard error "
        "(none at k = the episodes a task has). Beside another run's: its value, (the difference ± its "
        "standard error, verdict at 1.96 of them). In SQL: <code>select * from heldout_pass_at_k</code>."
        "</p>" + _table(rows) + "</section>"
    )


def _heldout_section(by_env: list[dict]) -> str:
    """Held-out reward per environment at the run's last evaluation (neural and LM policies)."""
    if not by_env:
        return ""
    return (
        "<section><h2>Held-out by environment (last evaluation, lowest first)</h2><p class='hint'>Split "
        "'seen': tasks of the training environments the pool leaves out; 'unseen': environments the "
        "run never trained on. solved: share of episodes with reward 1. Episodes: "
        "<code>envsched rollouts show --step T --heldout</code>.</p>" + _table(list(by_env)) + "</section>"
    )


def _table(rows: list[dict]) -> str:
    if not rows:
        return "<p>None.</p>"
    head = "".join(f"<th>{html.escape(str(k))}</th>" for k in rows[0])
    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(f'{v:.4g}' if isinstance(v, float) else str(v))}</td>" for v in r.values()
        )
        + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _page(
    config: dict,
    base_note: str,
    verdicts: list[dict],
    charts: list[dict],
    top: list[dict],
    spec,
    by_env: list[dict] = (),
    reliability: tuple[int | None, list[dict]] = (None, []),
) -> str:
    sim = (
        "<p class='note'><b>The policy is the simulated learner</b> (docs/algorithm.md §8): a model of "
        "learning for measuring schedulers, not a neural policy.</p>"
        if spec.policy == "simulated"
        else ""
    )
    marks = {True: "✔", False: "✘", None: "·"}
    primary = next((v["baseline"] for v in verdicts if v["baseline"] == "random"), None) or (
        verdicts[0]["baseline"] if verdicts else None
    )
    vitems = "".join(
        f"<li class='v{'' if v['better'] is None else int(v['better'])}'>{marks[v['better']]} "
        f"{html.escape(v['text'])}</li>"
        for v in verdicts
        if v["baseline"] == primary
    )
    vrows = [
        {
            "metric": v["metric"],
            "baseline": v["baseline"],
            "this run": v["run"],
            "baseline value": v["base"],
            "ratio": v["ratio"],
            "difference [95% CI]": f"{v['diff']:+.4g}{interval_text(v['ci'])}",
            "verdict": VERDICT_WORD[v["better"]],
        }
        for v in verdicts
    ]
    chart_divs = "".join(
        f"<section><h2>{html.escape(c['title'])}</h2><div class='chart' id='c{i}'></div></section>"
        for i, c in enumerate(charts)
    )
    data = json.dumps(json_safe(charts)).replace("</", "<\\/")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>envsched report: {html.escape(spec.run_id or spec.pool)}</title>
<style>
body{{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}}
table{{border-collapse:collapse;margin:.5em 0}}td,th{{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}}
.note{{background:#f6f6f6;padding:.6em;border-left:4px solid #999}}
ul.verdicts li{{margin:.3em 0;font-size:14px}} li.v1{{color:#1a7f37}} li.v0{{color:#b42318}}
.chart{{position:relative;width:100%;height:320px}} .chart svg{{width:100%;height:100%;user-select:none}}
.tip{{position:absolute;pointer-events:none;background:rgba(255,255,255,.95);border:1px solid #999;padding:4px 6px;
font-size:12px;display:none;white-space:nowrap;z-index:2}}
.legend span{{cursor:pointer;margin-right:12px;font-size:12px}} .legend span.off{{opacity:.3}}
.hint{{color:#777;font-size:12px}}
</style></head><body>
<h1>envsched run report</h1>
<p class="hint">Generated {time.strftime("%Y-%m-%d %H:%M:%S")}. Charts: hover for values, drag to zoom, double-click to reset, click a legend entry to hide it.</p>
{sim}
<h2>Run</h2>{_table([{"setting": k, "value": v} for k, v in config.items()])}
<h2>Verdicts</h2><p class="note">{html.escape(base_note)}</p>
<ul class="verdicts">{vitems or "<li>No baselines to compare with.</li>"}</ul>
{"<h3>Against every baseline</h3>" + _table(vrows) if vrows else ""}
{chart_divs}
<section><h2>Most informative tasks (observed in at least {MIN_GROUPS} groups)</h2>{_table(top)}</section>
{_heldout_section(by_env)}
{_reliability_section(*reliability)}
<script id="charts" type="application/json">{data}</script>
<script>{_JS}</script>
</body></html>
"""


_JS = r"""
(function(){
const charts = JSON.parse(document.getElementById('charts').textContent);
const NS = 'http://www.w3.org/2000/svg';
function el(tag, attrs, parent){ const e = document.createElementNS(NS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]); if (parent) parent.appendChild(e); return e; }
function fmt(v){ return v === null || v === undefined ? '—' : String(Number(Number(v).toPrecision(4))); }
function ticks(lo, hi, n){ const span = hi - lo || 1; const step = Math.pow(10, Math.floor(Math.log10(span / n)));
  const mult = [1, 2, 5, 10].find(m => span / (step * m) <= n) * step; const out = [];
  for (let t = Math.ceil(lo / mult) * mult; t <= hi + 1e-12; t += mult) out.push(+t.toPrecision(10)); return out; }
function heatmap(div, c){
  const W = div.clientWidth, rowH = Math.max(12, Math.min(22, 600 / c.rows.length));
  const left = 8 + 6.5 * Math.max(...c.rows.map(r => r.length)), H = 40 + rowH * c.rows.length;
  div.style.height = H + 'px';
  const svg = el('svg', {viewBox: `0 0 ${W} ${H}`}, div); const tip = document.createElement('div'); tip.className = 'tip'; div.appendChild(tip);
  const cw = (W - left - 10) / c.cols.length; let max = 1; c.values.forEach(r => r.forEach(v => { if (v > max) max = v; }));
  c.rows.forEach((name, i) => { el('text', {x: left - 4, y: 10 + i * rowH + rowH * 0.7, 'text-anchor': 'end', 'font-size': 11}, svg).textContent = name;
    c.cols.forEach((st, j) => { const v = c.values[i][j]; const r = el('rect', {x: left + j * cw, y: 10 + i * rowH, width: Math.max(cw, 1), height: rowH - 1,
      fill: v ? `rgba(31,119,180,${0.15 + 0.85 * v / max})` : '#f4f4f4', class: 'cell'}, svg);
      r.addEventListener('mousemove', ev => { tip.style.display = 'block'; tip.textContent = `${name}, step ${st}: ${v} task(s)`;
        tip.style.left = (ev.offsetX + 12) + 'px'; tip.style.top = (ev.offsetY + 12) + 'px'; });
      r.addEventListener('mouseleave', () => { tip.style.display = 'none'; }); }); });
  ticks(c.cols[0], c.cols[c.cols.length - 1], 10).forEach(t => { const j = c.cols.indexOf(t); if (j >= 0)
    el('text', {x: left + (j + 0.5) * cw, y: H - 12, 'text-anchor': 'middle', 'font-size': 11}, svg).textContent = t; });
}
function plot(div, c){
  const hidden = new Set(); let view = null;
  const legend = document.createElement('div'); legend.className = 'legend'; div.parentNode.insertBefore(legend, div);
  c.series.forEach((s, k) => { const sp = document.createElement('span'); sp.innerHTML = `<b style="color:${s.color}">━</b> ${s.name}`;
    sp.onclick = () => { hidden.has(k) ? hidden.delete(k) : hidden.add(k); sp.classList.toggle('off'); draw(); }; legend.appendChild(sp); });
  const tip = document.createElement('div'); tip.className = 'tip'; div.appendChild(tip);
  function draw(){
    div.querySelectorAll('svg').forEach(e => e.remove());
    const W = div.clientWidth || 800, H = div.clientHeight || 320, m = {l: 60, r: 12, t: 8, b: 34};
    const svg = el('svg', {viewBox: `0 0 ${W} ${H}`}, div); div.insertBefore(svg, tip);
    const vis = c.series.filter((s, k) => !hidden.has(k));
    let xs = [], ys = [];
    vis.forEach(s => s.x.forEach((x, i) => { if (s.y[i] !== null && (!view || (x >= view[0] && x <= view[1]))) { xs.push(x); ys.push(s.y[i]); } }));
    if (!xs.length) return;
    let x0 = view ? view[0] : Math.min(...xs), x1 = view ? view[1] : Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
    if (x1 === x0) x1 = x0 + 1; if (y1 === y0) { y0 -= 0.5; y1 += 0.5; } const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
    const X = x => m.l + (x - x0) / (x1 - x0) * (W - m.l - m.r), Y = y => H - m.b - (y - y0) / (y1 - y0) * (H - m.t - m.b);
    ticks(y0, y1, 6).forEach(t => { el('line', {x1: m.l, x2: W - m.r, y1: Y(t), y2: Y(t), stroke: '#eee'}, svg);
      el('text', {x: m.l - 6, y: Y(t) + 4, 'text-anchor': 'end', 'font-size': 11}, svg).textContent = fmt(t); });
    ticks(x0, x1, 10).forEach(t => { el('text', {x: X(t), y: H - m.b + 16, 'text-anchor': 'middle', 'font-size': 11}, svg).textContent = fmt(t); });
    el('text', {x: (W + m.l) / 2, y: H - 4, 'text-anchor': 'middle', 'font-size': 12}, svg).textContent = c.xlabel || '';
    const clip = 'clip' + Math.random().toString(36).slice(2); const cp = el('clipPath', {id: clip}, el('defs', {}, svg));
    el('rect', {x: m.l, y: m.t, width: W - m.l - m.r, height: H - m.t - m.b}, cp);
    const g = el('g', {'clip-path': `url(#${clip})`}, svg);
    vis.forEach(s => {
      if (s.points) { s.x.forEach((x, i) => { if (s.y[i] !== null) el('circle', {cx: X(x), cy: Y(s.y[i]), r: 2, fill: s.color, 'fill-opacity': 0.3, class: 'pt'}, g); }); return; }
      let d = '', pen = false; s.x.forEach((x, i) => { const y = s.y[i]; if (y === null) { pen = false; return; }
        d += (pen ? 'L' : 'M') + X(x).toFixed(1) + ',' + Y(y).toFixed(1); pen = true; });
      el('path', {d: d, fill: 'none', stroke: s.color, 'stroke-width': s.width || 1.5, class: 'line',
        'stroke-dasharray': s.dash ? '6,4' : ''}, g); });
    const guide = el('line', {y1: m.t, y2: H - m.b, stroke: '#999', 'stroke-dasharray': '3,3', visibility: 'hidden'}, svg);
    const band = el('rect', {y: m.t, height: H - m.t - m.b, fill: 'rgba(0,0,0,.08)', visibility: 'hidden'}, svg);
    let drag = null; const inv = px => x0 + (px - m.l) / (W - m.l - m.r) * (x1 - x0);
    const pos = ev => { const r = svg.getBoundingClientRect(); return (ev.clientX - r.left) * W / r.width; };
    svg.addEventListener('mousedown', ev => { drag = pos(ev); });
    svg.addEventListener('mousemove', ev => { const px = pos(ev), x = inv(px);
      guide.setAttribute('x1', px); guide.setAttribute('x2', px); guide.setAttribute('visibility', 'visible');
      if (drag !== null) { band.setAttribute('x', Math.min(drag, px)); band.setAttribute('width', Math.abs(px - drag)); band.setAttribute('visibility', 'visible'); }
      const lines = vis.filter(s => !s.points).map(s => { let best = -1, bd = Infinity;
        s.x.forEach((xx, i) => { const dd = Math.abs(xx - x); if (dd < bd && s.y[i] !== null) { bd = dd; best = i; } });
        return best < 0 ? '' : `<span style="color:${s.color}">■</span> ${s.name}: ${fmt(s.y[best])} (x=${fmt(s.x[best])})`; });
      tip.innerHTML = lines.filter(Boolean).join('<br>') || `x=${fmt(x)}`; tip.style.display = 'block';
      const r = div.getBoundingClientRect(); tip.style.left = Math.min(ev.clientX - r.left + 14, r.width - 260) + 'px'; tip.style.top = '10px'; });
    svg.addEventListener('mouseleave', () => { guide.setAttribute('visibility', 'hidden'); tip.style.display = 'none'; drag = null; band.setAttribute('visibility', 'hidden'); });
    svg.addEventListener('mouseup', ev => { const px = pos(ev); if (drag !== null && Math.abs(px - drag) > 5) { const a = inv(Math.min(drag, px)), b = inv(Math.max(drag, px)); view = [a, b]; draw(); } drag = null; });
    svg.addEventListener('dblclick', () => { view = null; draw(); });
  }
  draw(); window.addEventListener('resize', draw);
}
charts.forEach((c, i) => { const div = document.getElementById('c' + i); if (c.kind === 'heatmap') heatmap(div, c); else plot(div, c); });
document.body.setAttribute('data-charts-rendered', String(charts.length));
})();
"""
