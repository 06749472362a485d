"""Held-out over repeated attempts on the default learner: random and the recommended form re-run at
the seeds of their records, with each task's evaluation episodes kept, so the last evaluation gives
the share of tasks solved in one attempt, in any of k (pass@k) and in all k (pass^k)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from envsched_pipeline.analysis.bench import first_departure, provenance_text, run_benchmark
from envsched_pipeline.analysis.plots import _plt, write_png
from sections.common import BESIDE_ORACLE, HERE, write_section
from sections.records import record_of, recorded_kw, recorded_seeds, seed_span, t_half

KINDS = ("seen", "unseen")
# (summary field, what the row says); the K of pass_any / pass_all is the episodes a task had
ROWS = (
    ("final", "mean reward (the held-out score)"),
    ("final_solved", "solved in one attempt (pass@1)"),
    ("final_pass_any", "solved in any of K (pass@K)"),
    ("final_pass_all", "solved in all K (pass^K)"),
)


def section_neural_passk(runs: str, base_runs: str, steps: int) -> None:
    """The form against random over the seeds both have in ``runs`` (re-runs with episodes kept),
    each re-run checked against its record in ``base_runs``; a table per held-out kind and a plot
    of pass@k and pass^k against k."""
    form = BESIDE_ORACLE[-1]
    seeds = sorted(set(recorded_seeds(runs, "random")) & set(recorded_seeds(runs, form)))
    if len(seeds) < 2:
        print(f"neural_passk: {len(seeds)} seeds with random and the form in {runs}; section left as it was")
        return
    out = run_benchmark(["random", form], cache_dir=runs, **recorded_kw(seeds, steps))
    per = {n: {s: out["per_seed"][n][s] for s in seeds} for n in ("random", form)}
    k = per["random"][seeds[0]]["heldout_passk_k"]
    repeats = [(n, s) for n in ("random", form) for s in seeds if repeats_record(base_runs, runs, n, s)]
    rows = [
        "| held-out | measure | random | the form | the form - random (± s.e. over seeds) [95% t] | seeds above |",
        "|---|---|---|---|---|---|",
    ]
    for kind in KINDS:
        for field, what in ROWS:
            key = f"heldout_{kind}_{field}"
            a = np.array([per[form][s][key] for s in seeds])
            b = np.array([per["random"][s][key] for s in seeds])
            d = a - b
            half = t_half(d)
            rows.append(
                f"| {kind} | {what.replace('K', str(k))} | {b.mean():.4f} | {a.mean():.4f} | "
                f"{d.mean():+.4f} ± {d.std(ddof=1) / np.sqrt(len(d)):.4f} [{d.mean() - half:+.4f}, "
                f"{d.mean() + half:+.4f}] | {(d > 0).sum()}/{len(d)} |"
            )
    rivals, shared, rival_rows = rivals_table(runs, form, steps)
    png = Path(passk_plot(runs, form, seeds, HERE / "neural_passk.png"))
    write_section(
        "neural_passk",
        "\n".join(
            [
                "## Held-out over repeated attempts: pass@k and pass^k on the neural learner",
                "",
                f"Learner: the **neural** learner, default settings; random and the recommended form (`{form}`) "
                f"re-run at seeds {seed_span(seeds)}, 200 steps, held-out every 50 "
                f"(`bench/runs/neural-noforced-passk/`), keeping each held-out task's {k} evaluation episodes so "
                "the last evaluation gives the share of tasks solved (reward 1: every check passed) in one attempt, "
                f"in any of {k} (pass@{k}) and in all {k} (pass^{k}, tau-bench's reliability), each the unbiased "
                "estimate averaged over the split's tasks (`envsched_pipeline/analysis/passk.py`). The held-out "
                "score of the tables above is the mean reward, partial credit included. "
                f"{len(repeats)} of {2 * len(seeds)} re-runs repeat their records in `bench/runs/neural-noforced/` "
                "step for step (the same batches, rewards and held-out), so these are the records' runs seen "
                "through one more measure. " + provenance_text(out["provenance"]),
                "",
                *rows,
                "",
                f"![pass@k and pass^k]({png.name})",
                *(
                    [
                        "",
                        f"Against other schedulers ({', '.join(rivals)}), re-run the same way "
                        f"({rival_repeats(base_runs, runs, rivals, shared)}): each one's means over the seeds "
                        "it shares with the form, and the form's paired difference from it. Whether the form's "
                        "gain in tasks solved is its own or any schedule's that seeks spread, and whether the "
                        "paper's narrow ablation (exploit-only) buys reliability (pass^K) with its focus"
                        + (" (`envsched`: the paper's constants)" if "envsched" in rivals else "")
                        + ":",
                        *rival_rows,
                    ]
                    if rivals
                    else []
                ),
            ]
        ),
        after="neural_noforced_seeds",
    )


# the rows closest to the form's on the default learner's tables, the paper's two ablations, and the
# rest of the ablation table (variance-greedy, the paper's constants, DPS)
RIVALS = ("greso", "mopps", "exploit-only", "coverage-only", "variance-greedy", "envsched", "dps")


def rivals_table(runs: str, form: str, steps: int) -> tuple[list[str], dict[str, list[int]], list[str]]:
    """The form against each scheduler re-run in ``runs`` (random and RIVALS), each pair over the
    seeds both have: (the rivals there, each one's seeds, a table per held-out kind: each
    scheduler's means and the form's paired difference from it); no rows when no rival has two
    seeds with the form."""
    have = set(recorded_seeds(runs, form))
    seeds = {n: sorted(have & set(recorded_seeds(runs, n))) for n in ("random", *RIVALS)}
    seeds = {n: v for n, v in seeds.items() if len(v) >= 2}
    rivals = [n for n in RIVALS if n in seeds]
    if not rivals:
        return [], seeds, []
    every = sorted(set().union(*seeds.values()))
    out = run_benchmark(["random", *rivals, form], cache_dir=runs, **recorded_kw(every, steps))
    per = out["per_seed"]
    k = per[form][every[0]]["heldout_passk_k"]
    rows = []
    for kind in KINDS:
        rows += [
            "",
            f"Held-out {kind}:",
            "",
            "| scheduler | seeds | "
            + " | ".join(
                f"{what.replace('K', str(k))} | the form - it [95% t] (seeds above)" for _, what in ROWS
            )
            + " |",
            "|---|---|" + "---|---|" * len(ROWS),
        ]
        for n in ("random", *rivals):
            cells = []
            for field, _ in ROWS:
                key = f"heldout_{kind}_{field}"
                theirs = np.array([per[n][s][key] for s in seeds[n]])
                d = np.array([per[form][s][key] for s in seeds[n]]) - theirs
                half = t_half(d)
                cells.append(
                    f"{theirs.mean():.4f} | {d.mean():+.4f} [{d.mean() - half:+.4f}, {d.mean() + half:+.4f}] "
                    f"({(d > 0).sum()}/{len(d)})"
                )
            rows.append(f"| {n} | {seed_span(seeds[n])} | " + " | ".join(cells) + " |")
    return rivals, seeds, rows


def rival_repeats(base_runs: str, runs: str, rivals: list[str], seeds: dict[str, list[int]]) -> str:
    """How many of the rivals' re-runs repeat their records, in words."""
    same = sum(repeats_record(base_runs, runs, n, s) for n in rivals for s in seeds[n])
    total = sum(len(seeds[n]) for n in rivals)
    return f"{same} of their {total} re-runs repeat their records step for step"


def repeats_record(base_runs: str, runs: str, name: str, seed: int) -> bool:
    """Whether the re-run of ``name`` at ``seed`` repeats its record: every step's mean reward and the
    last evaluation's held-out means the same."""
    rec, again = record_of(base_runs, name, seed), record_of(runs, name, seed)
    if rec is None or again is None or first_departure(rec, again) is not None:
        return False
    a, b = rec["evals"][-1], again["evals"][-1]
    return all(abs(a[f"{k}_mean"] - b[f"{k}_mean"]) < 1e-12 for k in KINDS)


def passk_plot(runs: str, form: str, seeds: list[int], path):
    """pass@k (solid) and pass^k (dashed) against k at the last evaluation, the mean over ``seeds``,
    one panel per held-out kind, random and the form."""
    fig, axes = _plt().subplots(1, 2, figsize=(11, 3.8))
    for ax, kind in zip(axes, KINDS, strict=True):
        for name, colour in (("random", "#7f7f7f"), (form, "#d62728")):
            last = [record_of(runs, name, s)["evals"][-1] for s in seeds]
            ks = sorted(last[0][f"{kind}_pass_at"], key=int)
            x = [int(k) for k in ks]
            for field, style, what in (("pass_at", "-", "pass@k"), ("pass_hat", "--", "pass^k")):
                y = [np.mean([e[f"{kind}_{field}"][k] for e in last]) for k in ks]
                label = f"{'the form' if name == form else name}: {what}"
                ax.plot(x, y, style, color=colour, marker="o", ms=3, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [str(v) for v in x])
        ax.set_xlabel("k (attempts at a task)")
        ax.set_ylabel("share of tasks solved")
        ax.set_title(f"held-out {kind}: mean over seeds {seed_span(seeds)}")
        ax.legend(fontsize=8)
    return write_png(fig, path)
