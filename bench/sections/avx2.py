"""The top rows of the default learner's table run again on a CPU without AVX-512, where no record
repeats: a third run of every seed (records, `--draw 1`, this machine), and point 4's targets on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from envsched_pipeline.analysis.bench import first_departure, provenance_text, run_benchmark
from envsched_pipeline.analysis.plots import draws_plot
from envsched_pipeline.analysis.spread import every_seed_chance, every_seed_needs, several_draws
from sections.common import BESIDE_ORACLE, COMPARED, HERE, write_section
from sections.draws import by_draw
from sections.records import mean_se_wins, record_of, recorded_kw, recorded_seeds, seed_span

KINDS = ("seen", "unseen")
LABELS = ("records (AVX-512)", "draw 1 (AVX-512)", "re-run on AVX2")


def section_avx2(runs: str, base_runs: str, draws_runs: str, steps: int) -> None:
    """Random, the recommended form and any rival recorded in ``runs`` (one AVX2-only machine),
    paired by seed; beside their records (``base_runs``) and second draws (``draws_runs``)."""
    form = BESIDE_ORACLE[-1]
    rivals = [n for n in COMPARED[1:] if recorded_seeds(runs, n)]
    names = ["random", form, *rivals]
    seeds = sorted(set(recorded_seeds(runs, "random")) & set(recorded_seeds(runs, form)))
    if len(seeds) < 3:
        print(f"neural_avx2: {len(seeds)} seeds with random and the form re-run; section left as it was")
        return
    kw = recorded_kw(seeds, steps)
    out = run_benchmark(names, cache_dir=runs, **kw)
    here = {n: {s: r for s, r in out["per_seed"].get(n, {}).items() if s in seeds} for n in names}
    # the best-mean target compares every row over the seeds they all have
    common = sorted(set(seeds).intersection(*(here[n] for n in rivals)))
    records = by_draw(tuple(names), base_runs, steps, 0, evals=(50, steps))
    second = by_draw(tuple(names), draws_runs, steps, 1, evals=(50, steps))

    def delta(per: dict, n: str, kind: str, over: list[int] | None = None) -> np.ndarray:
        key = f"heldout_{kind}_final"
        return np.array([per[n][s][key] - per["random"][s][key] for s in (seeds if over is None else over)])

    def ratio(per: dict, n: str, key: str) -> float:  # of the means over seeds, as in the tables above
        return float(
            np.mean([per[n][s][key] for s in seeds]) / np.mean([per["random"][s][key] for s in seeds])
        )

    # how far each re-run follows its record: the first step whose mean reward differs ("no record"
    # where the records have no run of the seed)
    def departure(n: str, s: int) -> int | str | None:
        rec = record_of(base_runs, n, s)
        return first_departure(rec, record_of(runs, n, s)) if rec else "no record"

    departs = {n: [departure(n, s) for s in seeds] for n in ("random", form)}
    rows = [
        "| seed | random seen | form seen | Δ seen | random unseen | form unseen | Δ unseen | Δ unseen on "
        "the records | zero-var × random | batch var × random | "
        + "".join(f"{n}: Δ seen | {n}: Δ unseen | " for n in rivals)
        + "first step off the record: random, form |",
        "|" + "---|" * (11 + 2 * len(rivals)),
    ]
    d_here = {k: delta(here, form, k) for k in KINDS}
    d_rec = {k: delta(records, form, k) for k in KINDS}
    for i, s in enumerate(seeds):
        a, r = here[form][s], here["random"][s]
        cells = [
            f"{r['heldout_seen_final']:.4f}",
            f"{a['heldout_seen_final']:.4f}",
            f"{d_here['seen'][i]:+.4f}",
            f"{r['heldout_unseen_final']:.4f}",
            f"{a['heldout_unseen_final']:.4f}",
            f"{d_here['unseen'][i]:+.4f}",
            f"{d_rec['unseen'][i]:+.4f}",
            f"{a['zero_variance_fraction'] / r['zero_variance_fraction']:.2f}",
            f"{a['batch_variance'] / r['batch_variance']:.2f}",
        ]
        for n in rivals:
            cells += [f"{delta(here, n, k, [s])[0]:+.4f}" if s in here[n] else "—" for k in KINDS]
        cells.append(", ".join("repeats" if d[i] is None else str(d[i]) for d in departs.values()))
        rows.append(f"| {s} | {' | '.join(cells)} |")

    # the rows run at every seed, for a second best-mean target over all the seeds
    full = [n for n in rivals if set(here[n]) >= set(seeds)]
    spans = [(common, rivals)] + ([(seeds, full)] if full and full != rivals else [])

    def best(per: dict, kind: str, over: list[int], rows: list[str]) -> tuple[str, float]:
        """The row with the best mean final held-out of ``kind`` over ``over``, and that mean."""
        means = {
            n: float(np.mean([per[n][s][f"heldout_{kind}_final"] for s in over]))
            for n in ["random", form, *rows]
        }
        top = max(means, key=means.get)
        return top, means[top]

    def targets(per: dict) -> list[tuple[str, bool]]:
        d = {k: delta(per, form, k) for k in KINDS}
        zv, bv = ratio(per, form, "zero_variance_fraction"), ratio(per, form, "batch_variance")
        out = [
            (f"{(d['seen'] > 0).sum()}/{len(seeds)}", bool((d["seen"] > 0).all())),
            (f"{(d['unseen'] > 0).sum()}/{len(seeds)}", bool((d["unseen"] > 0).all())),
        ]
        for over, rows in spans:
            tops = {k: best(per, k, over, rows) for k in KINDS}
            out.append(
                (
                    "; ".join(
                        f"{k}: {'the form' if n == form else n} ({m:.4f})" for k, (n, m) in tops.items()
                    ),
                    all(n == form for n, _ in tops.values()),
                )
            )
        return [*out, (f"{bv:.2f}x", bv >= 1.5), (f"{zv:.2f}x", zv <= 0.6)]

    which = ["seen above random in every seed", "unseen above random in every seed"]
    which += [
        f"best mean held-out, both kinds (of {', '.join(['random', 'the form', *rows])}; seeds {seed_span(over)})"
        for over, rows in spans
    ]
    which += ["batch variance ≥ 1.5x random", "zero-variance share ≤ 0.6x random"]
    target_rows = [
        "| target | on AVX2 | met | the records, same seeds | met |",
        "|---|---|---|---|---|",
    ]
    for what, (h, hm), (r, rm) in zip(which, targets(here), targets(records), strict=True):
        target_rows.append(f"| {what} | {h} | {'yes' if hm else 'no'} | {r} | {'yes' if rm else 'no'} |")

    # the form's paired unseen difference in every run of a seed: records, draw 1, this machine
    three = [s for s in seeds if s in second.get(form, {}) and s in second.get("random", {})]
    diffs = {
        k: {
            s: [
                float(per[form][s][f"heldout_{k}_final"] - per["random"][s][f"heldout_{k}_final"])
                for per in (records, second, here)
            ]
            for s in three
        }
        for k in KINDS
    }
    plot = draws_plot(diffs, HERE / "neural_avx2.png", labels=LABELS) if three else None
    split = {k: several_draws([diffs[k][s] for s in three]) for k in KINDS} if len(three) >= 3 else {}
    sd = float(np.std(d_here["unseen"], ddof=1))
    flips = [s for i, s in enumerate(seeds) if (d_here["unseen"][i] > 0) != (d_rec["unseen"][i] > 0)]
    repeats = {n: sum(d is None for d in v) for n, v in departs.items()}
    steps_off = [d for v in departs.values() for d in v if isinstance(d, int)]

    def against_rival(n: str) -> str:
        """A rival against random at its seeds, and the form against the rival there."""
        at = sorted(here[n])
        vs = {k: delta(here, n, k, at) for k in KINDS}
        ahead = {k: delta(here, form, k, at) - vs[k] for k in KINDS}
        return (
            f"{n} {mean_se_wins(vs['seen'])} / {mean_se_wins(vs['unseen'])} at its seeds ({seed_span(at)}), "
            f"and the form against it there {mean_se_wins(ahead['seen'])} / {mean_se_wins(ahead['unseen'])}; "
        )

    reading = (
        f"Against random run on the same machine the form is {mean_se_wins(d_here['seen'])} seen and "
        f"{mean_se_wins(d_here['unseen'])} unseen (on the records at these seeds "
        f"{mean_se_wins(d_rec['seen'])} / {mean_se_wins(d_rec['unseen'])}); "
        + "".join(against_rival(n) for n in rivals if len(here[n]) > 1)
        + f"zero-variance share {ratio(here, form, 'zero_variance_fraction'):.2f}x random's, batch variance "
        f"{ratio(here, form, 'batch_variance'):.2f}x. "
        + (
            f"The unseen verdict differs from the records' at seed(s) {', '.join(map(str, flips))}. "
            if flips
            else "Every seed's unseen verdict is the records'. "
        )
        + (_three_runs(three, split) if split else "")
        + "".join(_three_runs_against(n, form, seeds, (records, second, here)) for n in rivals)
        + f"At this run's mean and spread (sd {sd:.4f} over seeds) all {len(seeds)} seeds above random "
        f"on unseen would come out {every_seed_chance(float(d_here['unseen'].mean()), sd, len(seeds)):.0%} "
        "of the time."
    )
    body = [
        "## The top rows re-run on a CPU without AVX-512 (default learner)",
        "",
        "The default learner's records were made on CPUs with AVX-512; on an AVX2-only CPU the same code "
        "rounds differently in its BLAS and MKL kernels and no record repeats past the first steps "
        f"(re-runs repeating their record: random {repeats['random']}, the form {repeats[form]} of "
        f"{len(seeds)}"
        + (f"; the rest leave it at steps {min(steps_off)}-{max(steps_off)}" if steps_off else "")
        + "). So random and the recommended form"
        + f" were run again on one such machine at seeds {seed_span(seeds)}"
        + "".join(f", {n} at seeds {seed_span(sorted(here[n]))}" for n in rivals)
        + " (same pool, split, warm "
        "start and held-out samples as the records), and are paired here with each other: a third run "
        "of every seed, and point 4's targets on it (`bench/runs/neural-noforced-avx2/`). Final held-out "
        "(step 200).",
        "",
        *rows,
        "",
        *target_rows,
        "",
        reading,
        "",
        *([f"![the form minus random per seed, in each run of it]({Path(plot).name})", ""] if plot else []),
        provenance_text(out["provenance"]),
    ]
    write_section("neural_avx2", "\n".join(body), after="neural_draws")


def _three_runs(seeds: list[int], split: dict) -> str:
    """What three runs of every seed say: runs above random, seed means above it, and the split of
    the paired difference's spread into the seed's part and the run's (``several_draws``)."""
    u, n = split["unseen"], len(seeds)
    below = [f"seed {s} {m:+.4f}" for s, m in zip(seeds, u["seed_means"], strict=True) if m <= 0]
    return (
        f"Over the {n} seeds with three runs ({', '.join(LABELS)}; each run of a seed pairs the same "
        "pool, split and warm start with its own run luck), the form is above random in "
        f"{split['seen']['positive_runs']} of {3 * n} runs on seen and {u['positive_runs']} of {3 * n} "
        f"on unseen; averaged over a seed's three runs, in {split['seen']['positive_seed_means']} of {n} "
        f"seeds on seen and {u['positive_seed_means']} of {n} on unseen"
        + (f" ({', '.join(below)})" if below else "")
        + f". Split over the three runs (`several_draws` in `envsched_pipeline/analysis/spread.py`), the "
        f"paired unseen difference has sd {u['sd']:.4f} over seeds: the run's {u['run_sd']:.4f} "
        f"({u['run_share']:.0%} of the variance), the seed's {u['seed_sd']:.4f}; on seen "
        f"{split['seen']['run_sd']:.4f} and {split['seen']['seed_sd']:.4f}. At that spread all {n} seeds "
        f"above random on unseen in one run each, with a chance of 0.9, needs a mean effect of about "
        f"{every_seed_needs(u['sd'], n):+.4f}; the form's, over the three runs, is {u['mean']:+.4f}. "
    )


def _three_runs_against(rival: str, form: str, seeds: list[int], runs: tuple[dict, dict, dict]) -> str:
    """The form against ``rival``, each seed's difference averaged over the runs of it both have in
    all three (records, draw 1, this machine); mean ± s.e. over those seeds, seeds ahead."""
    both = [s for s in seeds if all(s in per.get(n, {}) for per in runs for n in (rival, form))]
    if len(both) < 3:
        return ""
    cells = []
    for k in KINDS:
        key = f"heldout_{k}_final"
        cells.append(
            mean_se_wins([np.mean([per[form][s][key] - per[rival][s][key] for per in runs]) for s in both])
        )
    return (
        f"Against {rival}, each seed's difference averaged over its three runs (seeds {seed_span(both)}): "
        f"{cells[0]} seen, {cells[1]} unseen. "
    )
