"""How a run's held-out moves between evaluations: random and the recommended form re-run with
held-out every 5 steps, to split a run's luck into what a few nearby checkpoints would average away
and what they would not."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from envsched_pipeline.analysis.plots import within_run_plot
from envsched_pipeline.analysis.spread import every_seed_needs, two_draws, within_run
from sections.common import BESIDE_ORACLE, HERE, write_section
from sections.draws import by_draw
from sections.records import recorded_files

KINDS = ("seen", "unseen")


def _evals(runs: Path, name: str) -> dict[int, list[dict]]:
    """The held-out evaluations of each recorded run of ``name`` in ``runs``, by seed."""
    return {s: json.loads(f.read_text())["evals"] for s, f in recorded_files(runs, name).items()}


def section_within_run(runs: str, base_runs: str, draws_runs: str, steps: int) -> None:
    """Random and the form at the seeds recorded in ``runs`` (`--eval-every 5`): each run's held-out
    every 5 steps, checked against its record in ``base_runs`` at the last step, and the paired
    difference's fast part set beside the run-to-run spread of the two draws (``draws_runs``)."""
    lr = BESIDE_ORACLE[-1]
    names = ("random", lr)
    got = {n: _evals(Path(runs), n) for n in names}
    seeds = sorted(set(got["random"]) & set(got[lr]))
    if not seeds:
        print(f"neural_within_run: no seed with both {', '.join(names)} in {runs}; section left as it was")
        return
    records = by_draw(names, base_runs, steps, 0)
    since, late = steps // 2, steps - 50
    series: dict[str, dict[int, tuple[list[int], list[float]]]] = {k: {} for k in KINDS}
    own_rows = [
        "| scheduler | seed | held-out | step 200 | its record | evaluation s.e. | fast part (sd) | "
        f"moves over steps {since}-{steps} (sd) | lowest .. highest |",
        "|" + "---|" * 9,
    ]
    pair_rows = [
        f"| seed | held-out | Δ at step {steps} | Δ averaged over steps {late}-{steps} | lowest .. highest Δ, "
        f"steps {since}-{steps} | points with Δ > 0 | fast part of Δ (sd) |",
        "|" + "---|" * 7,
    ]
    fast: dict[str, list[float]] = {k: [] for k in KINDS}
    late_means: dict[str, list[float]] = {k: [] for k in KINDS}
    eval_se: dict[str, list[float]] = {k: [] for k in KINDS}
    departs: list[str] = []  # (scheduler, seed, kind) whose step-200 held-out is not its record's
    for s in seeds:
        a, b = got["random"][s], got[lr][s]
        if [e["step"] for e in a] != [e["step"] for e in b]:
            raise ValueError(f"{runs}: the two runs of seed {s} were evaluated at different steps")
        st = [e["step"] for e in a]
        for n, ev in ((names[0], a), (names[1], b)):
            for k in KINDS:
                w = within_run(st, [e[f"{k}_mean"] for e in ev], since=since)
                rec = records.get(n, {}).get(s, {}).get(f"heldout_{k}_final")
                se = float(np.mean([e[f"{k}_se"] for e in ev if e["step"] >= since]))
                eval_se[k].append(se)
                if rec is not None and abs(rec - w["final"]) > 1e-9:
                    departs.append(f"{n} seed {s} {k}")
                own_rows.append(
                    f"| {'the form' if n == lr else n} | {s} | {k} | {w['final']:.4f} | "
                    f"{'—' if rec is None else f'{rec:.4f}'} | {se:.4f} | {w['jitter_sd']:.4f} | "
                    f"{w['swing_sd']:.4f} | {w['low']:.4f} .. {w['high']:.4f} |"
                )
        for k in KINDS:
            d = [y[f"{k}_mean"] - x[f"{k}_mean"] for x, y in zip(a, b, strict=True)]
            w = within_run(st, d, since=since)
            fast[k].append(w["jitter_sd"])
            late_means[k].append(w["late_mean"])
            series[k][s] = (st, d)
            pair_rows.append(
                f"| {s} | {k} | {w['final']:+.4f} | {w['late_mean']:+.4f} | {w['low']:+.4f} .. {w['high']:+.4f} | "
                f"{w['positive']}/{w['points']} | {w['jitter_sd']:.4f} |"
            )
    plot = within_run_plot(series, HERE / "neural_within_run.png")
    first, second = records, by_draw(names, draws_runs, steps, 1, evals=(50, steps))
    both = sorted(set.intersection(*(set(d.get(n, {})) for d in (first, second) for n in names)))
    reading = []
    if len(both) >= 3:
        key = "heldout_unseen_final"
        diff = [np.array([d[lr][s][key] - d["random"][s][key] for s in both]) for d in (first, second)]
        run_sd = two_draws(*diff)["run_sd"]
        f_sd = float(np.sqrt(np.mean(np.square(fast["unseen"]))))
        slow = float(np.sqrt(max(run_sd**2 - f_sd**2, 0.0)))
        points = sum(1 for x in series["unseen"][seeds[0]][0] if x >= late)
        averaged = float(np.sqrt(slow**2 + f_sd**2 / points))
        reading = [
            "",
            f"Reading: inside one run the unseen held-out moves from one evaluation to the next by sd "
            f"{f_sd:.4f} in the paired difference (its fast part, against "
            f"the evaluation's own s.e. of {np.mean(eval_se['unseen']):.4f} per scheduler), and the two draws above put the paired "
            f"unseen difference's run-to-run sd at {run_sd:.4f}. If the fast part were independent between "
            f"runs, the slow part (where a run's training took it, which no averaging of nearby checkpoints "
            f"removes) would be sd {slow:.4f}; judging each run by the mean of its last {points} evaluations "
            f"(steps {late}-{steps}) would leave sd about {averaged:.4f}, and all 10 seeds above random "
            f"with a chance of 0.9 would still need a mean unseen effect of about "
            f"{every_seed_needs(averaged):+.4f} (at one checkpoint: {every_seed_needs(run_sd):+.4f}). "
            f"At seed(s) {', '.join(map(str, seeds))} the form's unseen difference averaged over steps "
            f"{late}-{steps} is {', '.join(f'{m:+.4f}' for m in late_means['unseen'])}.",
        ]
    write_section(
        "neural_within_run",
        "\n".join(
            [
                "## How a run's held-out moves between evaluations: every 5 steps",
                "",
                f"Random and `{lr}` (default learner) re-run at seed(s) {', '.join(map(str, seeds))} with "
                "`envsched bench scheduler --eval-every 5` (runs in "
                f"`bench/runs/{Path(runs).name}/`): "
                + (
                    "the same runs as their records (evaluating leaves training as it was: the "
                    f"step-{steps} column equals the record's), seen from every fifth step. "
                    if not departs
                    else f"re-runs of their records; at step {steps} they depart from them in "
                    f"{', '.join(departs)}. "
                )
                + "Fast part: "
                "each point's sd around a quadratic through its neighbours within 20 steps (itself left out), "
                "what averaging a few nearby checkpoints would remove; moves: the sd of the points around a "
                f"straight line over steps {since}-{steps}.",
                "",
                *own_rows,
                "",
                "The form minus random at the same steps (Δ):",
                "",
                *pair_rows,
                *reading,
                "",
                f"![held-out every 5 steps]({Path(plot).name})",
            ]
        ),
        after="neural_draws",
    )
