"""What in a schedule goes with its held-out gain on the default learner: every paired run on record
(the records, `--draw 1`, the AVX2 re-runs), its held-out differences against random beside its
differences in how the batches were spent, and how far the zero-variance share would have to fall
for the unseen target that the recommended form misses."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np

from envsched_pipeline.analysis.levers import (
    FEATURES,
    KINDS,
    needed_change,
    paired_runs,
    within_correlations,
    zero_variance_fit,
)
from envsched_pipeline.analysis.plots import levers_plot
from envsched_pipeline.analysis.spread import every_seed_needs
from sections.common import BESIDE_ORACLE, COMPARED, HERE, OVERRUN, write_section
from sections.draws import by_draw
from sections.records import recorded_seeds, recorded_variants

# a run that looks before it picks (8x a step's rollouts): shown, but not part of the fit
LOOKS_FIRST = ("oracle",)
FEATURE_NAMES = {
    "zero_variance_fraction": "zero-variance share",
    "zero_variance_solved": "zero-variance, all solved",
    "zero_variance_failed": "zero-variance, all failed",
    "batch_variance": "batch variance",
    "effective_envs": "effective environments (informative groups)",
    "distinct_tasks": "distinct tasks trained",
    "max_task_picks": "most picks of one task",
    "mean_reward": "training reward",
}


def _names(*folders: str) -> tuple[str, ...]:
    """Every scheduler and variant on record in any of ``folders``, random first."""
    found = {n for f in folders for n in recorded_variants(f)}
    found |= {n for f in folders for n in (*COMPARED, *LOOKS_FIRST) if recorded_seeds(f, n)}
    return ("random", *sorted(found - {"random"}))


def _bv_ratio(row: dict) -> float:
    """A paired run's batch variance over random's in its cell."""
    mine = row["value"]["batch_variance"]
    return mine / (mine - row["delta"]["batch_variance"])


@cache  # sections neural_levers and neural_peak read the same records in one `make bench`
def default_groups(base_runs: str, draws_runs: str, avx2_runs: str, steps: int) -> dict:
    """The default learner's runs on record, per set of runs that share a draw and a machine: the
    records (``base_runs`` and draw 0 of ``draws_runs``), the second draw, the AVX2 re-runs. Read
    once per process; no caller changes it."""
    return {
        "records (AVX-512)": by_draw(
            _names(base_runs, draws_runs), (base_runs, draws_runs), steps, 0, (50, steps)
        ),
        "draw 1 (AVX-512)": by_draw(_names(draws_runs), draws_runs, steps, 1, (50, steps)),
        "re-runs (AVX2)": by_draw(_names(avx2_runs), avx2_runs, steps, 0, (50, steps)),
    }


def section_levers(base_runs: str, draws_runs: str, avx2_runs: str, overrun_runs: str, steps: int) -> None:
    """Paired runs of every scheduler on the default learner's records (``base_runs`` and draw 0 of
    ``draws_runs``), its second draw (``draws_runs``) and the AVX2 machine's re-runs (``avx2_runs``);
    the same statistics on the overrun learner's records (``overrun_runs``) beside them."""
    form = BESIDE_ORACLE[-1]
    groups = default_groups(base_runs, draws_runs, avx2_runs, steps)
    rows = paired_runs(groups)
    fitted = [r for r in rows if r["scheduler"] not in LOOKS_FIRST]
    if len({(r["group"], r["seed"]) for r in fitted}) < 5:
        print(
            "neural_levers: fewer than 5 (draw, seed) cells with random and another scheduler; section left as it was"
        )
        return
    fits = {k: zero_variance_fit(fitted, k) for k in KINDS}
    corr = within_correlations(fitted)
    form_d = {
        k: np.array([r["delta"][f"heldout_{k}_final"] for r in rows if r["scheduler"] == form]) for k in KINDS
    }
    targets = {k: every_seed_needs(float(form_d[k].std(ddof=1))) for k in KINDS}
    rnd_zv = float(
        np.mean([s["zero_variance_fraction"] for g in groups.values() for s in g.get("random", {}).values()])
    )
    counts = {label: sum(r["group"] == label for r in rows) for label in groups}
    lines = [
        "## What in a schedule goes with its held-out gain (default learner, every paired run)",
        "",
        "Every run on record on the default learner (no forced stop in the loss) paired with random's at the "
        "same seed and draw (same pool, held-out split, warm start and held-out samples): "
        + ", ".join(f"{label} {n}" for label, n in counts.items())
        + f" paired runs of {len({r['scheduler'] for r in rows})} schedulers and variants. Each run's held-out "
        "difference at step 200 sits beside its differences in how its batches were spent: the share of groups "
        "without reward spread (split into groups all solved and all failed), batch variance, and breadth. "
        "Schedulers differ inside one (draw, seed) cell with that cell's pool and random run in common, so the "
        "correlations are within cells (each cell's mean removed). The line fits the held-out difference on "
        "the zero-variance difference over every run but the oracle's (it pays 8x a step's rollouts to look "
        "before it picks), with standard errors from a bootstrap over cells "
        "(`envsched_pipeline/analysis/levers.py`).",
        "",
        "| scheduler | paired runs | Δ seen | Δ unseen | zero-var | of which all solved | all failed | batch var × random "
        "| effective envs | distinct tasks | most picks of a task | training reward |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    rnd = [s for g in groups.values() for s in g.get("random", {}).values()]

    def stats(runs: list[dict], bv_ratio: float) -> list[str]:
        """Mean levels over ``runs``; batch variance as ``bv_ratio``, its ratio to random's run of
        the same cell averaged over them."""
        v = {f: float(np.mean([r[f] for r in runs])) for f in FEATURES}
        return [
            f"{v['zero_variance_fraction']:.3f}",
            f"{v['zero_variance_solved']:.3f}",
            f"{v['zero_variance_failed']:.3f}",
            f"{bv_ratio:.2f}",
            f"{v['effective_envs']:.1f}",
            f"{v['distinct_tasks']:.0f}",
            f"{v['max_task_picks']:.1f}",
            f"{v['mean_reward']:.3f}",
        ]

    by_name: dict[str, list[dict]] = {}
    for r in rows:
        by_name.setdefault(r["scheduler"], []).append(r)
    order = sorted(by_name, key=lambda n: -np.mean([r["delta"]["heldout_unseen_final"] for r in by_name[n]]))
    for n in order:
        mine = by_name[n]
        d = {k: np.mean([r["delta"][f"heldout_{k}_final"] for r in mine]) for k in KINDS}
        lines.append(
            "| "
            + " | ".join(
                [
                    n + (" (looks first)" if n in LOOKS_FIRST else ""),
                    str(len(mine)),
                    f"{d['seen']:+.4f}",
                    f"{d['unseen']:+.4f}",
                    *stats([r["value"] for r in mine], float(np.mean([_bv_ratio(r) for r in mine]))),
                ]
            )
            + " |"
        )
    lines.append(f"| random | {len(rnd)} | — | — | " + " | ".join(stats(rnd, 1.0)) + " |")
    lines += [
        "",
        "Within a (draw, seed) cell, over the "
        f"{len(fitted)} paired runs of the schedules that see only history: the correlation of each difference "
        "against random with the held-out differences.",
        "",
        "| difference against random in | r with Δ seen | r with Δ unseen |",
        "|---|---|---|",
    ]
    for f in FEATURES:
        lines.append(f"| {FEATURE_NAMES[f]} | {corr[f]['seen']:+.2f} | {corr[f]['unseen']:+.2f} |")
    lines += [
        "",
        "| held-out | intercept (± s.e.) | slope per unit of zero-variance share (± s.e.) | R² | the form's Δ: sd over "
        "its runs | every seed needs (10 seeds) | zero-variance Δ the line needs for it | zero-variance share "
        "that is | the oracle: observed - line |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    oracle = [r for r in rows if r["scheduler"] in LOOKS_FIRST]
    # how far the runs that look first sit above the line (observed minus fitted, their mean)
    above = {
        k: float(
            np.mean(
                [
                    r["delta"][f"heldout_{k}_final"]
                    - (fits[k]["intercept"] + fits[k]["slope"] * r["delta"]["zero_variance_fraction"])
                    for r in oracle
                ]
            )
        )
        for k in KINDS
        if oracle
    }
    needs = {}
    for k in KINDS:
        fit = fits[k]
        needs[k] = needed_change(fit, targets[k])
        off = f"{above[k]:+.4f} ({len(oracle)} runs)" if oracle else "—"
        lines.append(
            f"| {k} | {fit['intercept']:+.4f} ± {fit['intercept_se']:.4f} | {fit['slope']:+.4f} ± {fit['slope_se']:.4f} "
            f"| {fit['r2']:.2f} | {form_d[k].std(ddof=1):.4f} | {targets[k]:+.4f} | {needs[k]:+.3f} | "
            f"{rnd_zv + needs[k]:.3f} | {off} |"
        )
    means = [
        (
            np.mean([r["value"]["zero_variance_fraction"] for r in by_name[n]]),
            np.mean([r["delta"]["heldout_unseen_final"] for r in by_name[n]]),
        )
        for n in by_name
        if n not in LOOKS_FIRST
    ]
    row_r = float(np.corrcoef(np.array(means).T)[0, 1])
    form_zv = float(np.mean([r["value"]["zero_variance_fraction"] for r in by_name[form]]))
    lowest = min(float(np.mean([r["value"]["zero_variance_fraction"] for r in by_name[n]])) for n in by_name)
    best_run = min(r["value"]["zero_variance_fraction"] for r in rows)
    u = fits["unseen"]
    lines += [
        "",
        f"Reading: the difference that goes with held-out gain is the share of groups spent without reward "
        f"spread (within cells r = {corr['zero_variance_fraction']['seen']:+.2f} seen, "
        f"{corr['zero_variance_fraction']['unseen']:+.2f} unseen), and mostly its all-solved part "
        f"({corr['zero_variance_solved']['unseen']:+.2f} unseen against {corr['zero_variance_failed']['unseen']:+.2f} "
        f"for all-failed groups); breadth does not go with gain (effective environments "
        f"{corr['effective_envs']['unseen']:+.2f}, distinct tasks {corr['distinct_tasks']['unseen']:+.2f} unseen), "
        "which fits the breadth mechanisms measured above (the repetition discount, the useful-breadth quota) "
        f"coming out level. Over the rows' means (every row that sees only history) the unseen difference goes "
        f"with the zero-variance share with r = {row_r:+.2f}. Each tenth of the batch moved from groups without spread to groups "
        f"with it goes with {-u['slope'] / 10:+.4f} unseen; the line explains R² = {u['r2']:.2f} of the unseen "
        f"differences, the rest is the luck of each run and of random's run beside it. Random wastes {rnd_zv:.3f} of its groups, the recommended form {form_zv:.3f} "
        f"(the lowest of any row: {lowest:.3f}; of any run: {best_run:.3f}). For every one of 10 seeds to come out "
        f"above random on unseen environments (a mean of {targets['unseen']:+.4f} at the form's spread over runs), "
        f"the line needs a zero-variance share of {rnd_zv + needs['unseen']:.3f}"
        + (
            ", below zero: no schedule on this line gets there"
            if rnd_zv + needs["unseen"] < 0
            else f", {form_zv - rnd_zv - needs['unseen']:.3f} below the form's"
        )
        + ". That is an extrapolation far past every run measured"
        + (
            f", and the oracle, which looks before it picks, sits off the line ({above['unseen']:+.4f} unseen): "
            "what a pick by a fresh look has beyond its share of groups with spread is not in these columns"
            if oracle
            else ""
        )
        + ". The line describes these schedules; it is not a law. "
        "What it says is that on this testbed the schedules' mean held-out differences line up with how many "
        "of their groups carry a learning signal, and that the unseen target asks for far more of that than any "
        "schedule measured here delivers.",
    ]
    lines += _overrun(overrun_runs, steps, corr, fits)
    lines += ["", "![levers](neural_levers.png)"]
    levers_plot(rows, fits, targets, HERE / "neural_levers.png")
    write_section("neural_levers", "\n".join(lines), after="neural_avx2")


def _overrun(runs: str, steps: int, corr: dict, fits: dict) -> list[str]:
    """The same correlations and line on the overrun learner's records, beside the default
    learner's (only the differences every record there carries: its older records have no split
    of the zero-variance share into solved and failed groups)."""
    names = tuple(n for n in _names(runs) if n not in LOOKS_FIRST)
    per = by_draw(names, runs, steps, 0, learner_config=OVERRUN.config)
    every = tuple(f for f in FEATURES if all(f in x for by in per.values() for x in by.values()))
    rows = paired_runs({"overrun": per}, features=every)
    if len({r["seed"] for r in rows}) < 5:
        return []
    theirs = within_correlations(rows, every)
    line = {k: zero_variance_fit(rows, k) for k in KINDS}
    out = [
        "",
        "The same on the overrun learner (overrun penalty 0.1, no forced stop; its records in `bench/runs/"
        f"{Path(runs).name}/`, {len(rows)} paired runs of {len({r['scheduler'] for r in rows})} schedulers and "
        "variants at one draw, the oracle left out):",
        "",
        "| difference against random in | default learner: r with Δ seen | Δ unseen | overrun learner: r with Δ seen "
        "| Δ unseen |",
        "|---|---|---|---|---|",
    ]
    for f in every:
        out.append(
            f"| {FEATURE_NAMES[f]} | {corr[f]['seen']:+.2f} | {corr[f]['unseen']:+.2f} | {theirs[f]['seen']:+.2f} "
            f"| {theirs[f]['unseen']:+.2f} |"
        )
    for k in KINDS:
        out.append(
            f"| the line's slope, {k} (± s.e.) | {fits[k]['slope']:+.4f} ± {fits[k]['slope_se']:.4f} | | "
            f"{line[k]['slope']:+.4f} ± {line[k]['slope_se']:.4f} | |"
        )
    u, lu = theirs["zero_variance_fraction"]["unseen"], line["unseen"]
    resolved = abs(lu["slope"]) > 2 * lu["slope_se"]
    out += [
        "",
        "On the overrun learner the zero-variance share goes with seen held-out too "
        f"(r = {theirs['zero_variance_fraction']['seen']:+.2f}) and more weakly with unseen (r = {u:+.2f}; slope "
        f"{lu['slope']:+.4f} ± {lu['slope_se']:.4f}, {'outside' if resolved else 'inside'} two standard errors of "
        "zero): per unit of the share a slope of the same order as the default learner's, in a smaller part of "
        "the unseen differences. So how far the lever moves unseen held-out is the learner's as much as the "
        "schedule's; on neither learner does breadth go with unseen gain.",
    ]
    return out
