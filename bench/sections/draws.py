"""Two runs of every seed: how much of a seed's verdict is the run's luck, and the recommended form
against every rival run twice."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from scipy import stats

from envsched_pipeline.analysis.bench import (
    provenance,
    provenance_text,
    run_benchmark,
    run_environment,
)
from envsched_pipeline.analysis.plots import draws_plot
from envsched_pipeline.analysis.spread import (
    every_seed_chance,
    every_seed_needs,
    two_draws,
)
from sections.common import BESIDE_ORACLE, COMPARED, HERE, write_section
from sections.records import mean_se_wins, recorded_seeds, seed_span, t_half


def by_draw(
    names: tuple[str, ...],
    runs: str | tuple[str, ...],
    steps: int,
    draw: int,
    evals: tuple[int, ...] = (50,),
    learner_config: dict | None = None,
) -> dict:
    """The records of ``names`` in ``runs`` (one directory or several, the first found kept) at one
    draw (`bench scheduler --draw`), every seed on record: the bench's summary per scheduler and
    seed. ``evals``: the held-out schedules (`--eval-every`) to look under, the first found kept;
    evaluating leaves training as it was, so a run's final held-out is the same under each.
    ``learner_config``: the learner setting the runs were made with (None: the default learner)."""
    out: dict[str, dict] = {}
    for folder in (runs,) if isinstance(runs, str) else runs:
        for n, by_seed in _by_draw_in(names, folder, steps, draw, evals, learner_config).items():
            for s, summary in by_seed.items():
                out.setdefault(n, {}).setdefault(s, summary)
    return out


def _by_draw_in(
    names: tuple[str, ...],
    runs: str,
    steps: int,
    draw: int,
    evals: tuple[int, ...],
    learner_config: dict | None,
) -> dict:
    """:func:`by_draw` in one directory."""
    last = max((s for n in names for s in recorded_seeds(runs, n)), default=None)
    out: dict[str, dict] = {}
    if last is None:
        return out
    for every in evals:
        found = run_benchmark(
            list(names),
            steps=steps,
            seed=0,
            seeds=last + 1,
            learner="neural",
            eval_every=every,
            recorded_only=True,
            log=lambda _m: None,
            cache_dir=runs,
            draw=draw,
            learner_config=learner_config,
        )["per_seed"]
        for n, by_seed in found.items():
            for s, summary in by_seed.items():
                out.setdefault(n, {}).setdefault(s, summary)
    return out


def _share(parts: dict) -> str:
    """The run's share of a two-draw split in words: above 1 when the draws do not correlate over
    seeds (the seed's part is then estimated at 0, within its sampling error)."""
    if parts["run_share"] >= 1:
        return "all of its variance over seeds: the two draws do not correlate"
    return f"{parts['run_share']:.0%} of its variance over seeds"


def section_draws(runs: str, base_runs: str, steps: int) -> None:
    """Random and the recommended form run twice at every seed: their records (draw 0) and
    `--draw 1` (the same pool, split, warm start and held-out samples; other rollout-sampling and
    selection streams). How far each scheduler's own held-out moves from run to run, how much of
    the paired difference's spread over seeds is the runs' (random's included), and the point-4
    targets on the second draw."""
    lr = BESIDE_ORACLE[-1]
    names = ("random", lr)
    read = (*names, *RIVALS)  # the rivals' records are read with the form's and random's, once a draw
    # draw 0: the records, and any record run later with held-out at the start and the end only
    first = by_draw(read, (base_runs, runs), steps, 0, evals=(50, steps))
    second = by_draw(read, runs, steps, 1, evals=(50, steps))
    seeds = sorted(set.intersection(*(set(d.get(n, {})) for d in (first, second) for n in names)))
    if len(seeds) < 3:
        print(
            f"neural_draws: {len(seeds)} seeds with both draws of {', '.join(names)}; section left as it was"
        )
        return
    draws = (first, second)

    def level(d: dict, n: str, key: str) -> np.ndarray:
        return np.array([d[n][s][key] for s in seeds])

    def delta(d: dict, kind: str) -> np.ndarray:
        key = f"heldout_{kind}_final"
        return level(d, lr, key) - level(d, "random", key)

    def ratio(d: dict, key: str) -> float:  # of the means over seeds, as in the tables above
        return float(level(d, lr, key).mean() / level(d, "random", key).mean())

    zvr = [ratio(d, "zero_variance_fraction") for d in draws]  # per draw
    bvr = [ratio(d, "batch_variance") for d in draws]

    du = [delta(d, "unseen") for d in draws]
    ds = [delta(d, "seen") for d in draws]
    rows = [
        "| seed | random unseen: draw 0 | draw 1 | form unseen: draw 0 | draw 1 | Δ unseen: draw 0 | draw 1 | "
        "Δ unseen, mean of the draws | Δ seen: draw 0 | draw 1 | zero-var × random: draw 0 | draw 1 |",
        "|" + "---|" * 12,
    ]
    zv = [
        level(d, lr, "zero_variance_fraction") / level(d, "random", "zero_variance_fraction") for d in draws
    ]
    for i, s in enumerate(seeds):
        rows.append(
            f"| {s} | {first['random'][s]['heldout_unseen_final']:.4f} | "
            f"{second['random'][s]['heldout_unseen_final']:.4f} | {first[lr][s]['heldout_unseen_final']:.4f} | "
            f"{second[lr][s]['heldout_unseen_final']:.4f} | {du[0][i]:+.4f} | {du[1][i]:+.4f} | "
            f"{(du[0][i] + du[1][i]) / 2:+.4f} | {ds[0][i]:+.4f} | {ds[1][i]:+.4f} | {zv[0][i]:.2f} | {zv[1][i]:.2f} |"
        )

    def wins(x) -> str:
        x = np.asarray(x)
        return f"{x.mean():+.4f} ({(x > 0).sum()}/{len(x)})"

    mean_of = lambda d, n: level(d, n, "heldout_unseen_final").mean()  # noqa: E731
    rows.append(
        f"| mean (wins) | {mean_of(first, 'random'):.4f} | {mean_of(second, 'random'):.4f} | "
        f"{mean_of(first, lr):.4f} | {mean_of(second, lr):.4f} | {wins(du[0])} | {wins(du[1])} | "
        f"{wins((du[0] + du[1]) / 2)} | {wins(ds[0])} | {wins(ds[1])} | {zvr[0]:.2f} | {zvr[1]:.2f} |"
    )
    n = len(seeds)

    def met(ok: bool) -> str:
        return "**met**" if ok else "**missed**"

    both_u, both_s = np.concatenate(du), np.concatenate(ds)
    targets = [
        "| target (point 4, against random) | draw 0 (the records) | draw 1 | both draws (2 runs a seed) |",
        "|---|---|---|---|",
        f"| seen above random in every run | {met((ds[0] > 0).all())} ({(ds[0] > 0).sum()}/{n}) | "
        f"{met((ds[1] > 0).all())} ({(ds[1] > 0).sum()}/{n}) | {(both_s > 0).sum()}/{2 * n} |",
        f"| unseen above random in every run | {met((du[0] > 0).all())} ({(du[0] > 0).sum()}/{n}) | "
        f"{met((du[1] > 0).all())} ({(du[1] > 0).sum()}/{n}) | {(both_u > 0).sum()}/{2 * n} |",
        f"| batch variance >= 1.5x | {met(bvr[0] >= 1.5)} ({bvr[0]:.2f}x) | "
        f"{met(bvr[1] >= 1.5)} ({bvr[1]:.2f}x) | — |",
        f"| zero-variance share <= 0.6x | {met(zvr[0] <= 0.6)} ({zvr[0]:.2f}x) | "
        f"{met(zvr[1] <= 0.6)} ({zvr[1]:.2f}x) | — |",
    ]
    # each scheduler's own run-to-run sd at one seed: the run's part of its two draws' levels
    own = {
        (nm, kind): two_draws(
            level(first, nm, f"heldout_{kind}_final"), level(second, nm, f"heldout_{kind}_final")
        )["run_sd"]
        for nm in names
        for kind in ("unseen", "seen")
    }
    parts = {"unseen": two_draws(du[0], du[1]), "seen": two_draws(ds[0], ds[1])}
    u = parts["unseen"]
    mu_u = float(both_u.mean())
    plot = draws_plot(
        {
            k: {s: [float(d[i]) for d in v] for i, s in enumerate(seeds)}
            for k, v in (("unseen", du), ("seen", ds))
        },
        HERE / "neural_draws.png",
    )
    reading = (
        f"Reading: at one seed random's own held-out moves from run to run by sd {own[('random', 'unseen')]:.4f} on "
        f"unseen environments and {own[('random', 'seen')]:.4f} on seen tasks; the form's by "
        f"{own[(lr, 'unseen')]:.4f} and {own[(lr, 'seen')]:.4f}. Both runs of a paired difference carry their own "
        f"luck, so the paired unseen difference varies between the two draws of a seed by sd {u['run_sd']:.4f} "
        f"(`two_draws` in `envsched_pipeline/analysis/spread.py`: {_share(u)}, "
        f"the seed's part sd {u['seed_sd']:.4f}, the draws correlate {u['correlation']:.2f}); on seen tasks "
        f"{parts['seen']['run_sd']:.4f} ({_share(parts['seen'])}). The unseen difference is above random in "
        f"{u['positive'][0]} and {u['positive'][1]} of {n} seeds, in both draws at {u['both_positive']}. With the "
        f"seed's part gone altogether, all 10 seeds above random with a chance of 0.9 would need a mean unseen "
        f"effect of {every_seed_needs(u['run_sd']):+.4f}; with it, {every_seed_needs(u['sd']):+.4f}. At the form's measured {mu_u:+.4f} (both "
        f"draws) and this spread, all 10 seeds come out above random with a chance of about "
        f"{every_seed_chance(mu_u, u['sd']):.0%} (a variance from {n} seeds is uncertain by about "
        f"{math.sqrt(2 / (n - 1)):.0%} of its size). "
        + (
            f"At seed(s) {', '.join(map(str, flips))} the same two schedules come out on either side of random "
            "on unseen environments in the two draws. "
            if (flips := [s for i, s in enumerate(seeds) if (du[0][i] > 0) != (du[1][i] > 0)])
            else ""
        )
        + "The two draws of the form alone (the section on the unseen spread above) put random's single run "
        "in the seed's part; with random drawn again too, the seed's part (which environments are held out, the "
        "pool, the warm start) is "
        + (
            "the smaller one, and the every-seed unseen target asks ten runs' luck to fall the same way."
            if u["run_share"] > 0.5
            else "still the larger one."
        )
    )
    rival_lines = _draws_against_rivals(RIVALS, lr, first, second, seeds)
    write_section(
        "neural_draws",
        "\n".join(
            [
                "## Two runs of every seed: how much of a seed's verdict is the run's luck",
                "",
                f"Random and `{lr}` (default learner) ran again at seeds {', '.join(map(str, seeds))} with "
                "`envsched bench scheduler --draw 1`: the same pool, held-out split, warm start and held-out "
                "samples as their records (draw 0, `bench/runs/neural-noforced/`), other streams of rollout "
                "sampling and of selection tie-breaks (runs in "
                f"`bench/runs/{Path(runs).name}/`, most with held-out only at the start and the end: evaluating "
                "leaves training as it was, as the 48-environment re-runs above show step for step). Until now each seed had one random run, so random's own "
                "run-to-run noise sat inside every seed's verdict unmeasured. Final held-out (step "
                f"{steps}). "
                + provenance_text(
                    provenance(
                        [
                            json.loads(f.read_text()).get("environment")
                            for f in sorted(Path(runs).glob("*.json"))
                        ],
                        run_environment(),
                    )
                ),
                "",
                *rows,
                "",
                *targets,
                "",
                *rival_lines,
                reading,
                "",
                f"![two draws]({Path(plot).name})",
            ]
        ),
        after="neural_patterns",
    )


# the rows nearest the form on the records: their per-seed differences are shown in full
NEAREST_RIVALS = ("greso", "mopps", "dps")
# every other scheduler of the comparison (COMPARED), nearest first
RIVALS = (*NEAREST_RIVALS, "envsched", "exploit-only", "coverage-only", "variance-greedy")


def _draws_against_rivals(
    rivals: tuple[str, ...],
    lr: str,
    first: dict,
    second: dict,
    seeds: list[int],
) -> list[str]:
    """The form against each of ``rivals`` in both draws, at the seeds where that rival ran twice
    too (per seed for ``NEAREST_RIVALS``, a summary row for every rival), and the sixth target
    among the schedulers with a second draw; without such seeds, a line saying the sixth target is
    not judged."""
    got = {}
    for rival in rivals:
        r0, r1 = first.get(rival, {}), second.get(rival, {})
        both = [s for s in seeds if s in r0 and s in r1]
        if len(both) >= 3:
            got[rival] = ((r0, r1), both)
    if not got:
        return [
            "The sixth target, the best mean held-out of all eight schedulers, needs every scheduler's "
            "second draw (not run: it needs all eight schedulers run again).",
            "",
        ]

    def wins(x: np.ndarray) -> str:
        return f"{x.mean():+.4f} ({(x > 0).sum()}/{len(x)})"

    lines = []
    summary = [
        "| rival | seeds run twice | form − rival unseen: draw 0 | draw 1 | mean of the draws ± s.e. | "
        "form − rival seen: draw 0 | draw 1 | mean of the draws ± s.e. | rival − random, mean of the "
        "draws: unseen | seen |",
        "|" + "---|" * 10,
    ]
    for rival, (draws, both) in got.items():
        g = {  # the form minus the rival, draw i, at the seeds ``both``
            (i, k): np.array(
                [
                    (first, second)[i][lr][s][f"heldout_{k}_final"] - draws[i][s][f"heldout_{k}_final"]
                    for s in both
                ]
            )
            for i in (0, 1)
            for k in ("unseen", "seen")
        }
        n = len(both)
        pooled = {k: (g[0, k] + g[1, k]) / 2 for k in ("unseen", "seen")}  # a seed's mean over its draws
        se = {k: float(pooled[k].std(ddof=1) / math.sqrt(n)) for k in pooled}
        crit = float(stats.t.ppf(0.975, n - 1))  # the 95% t interval's half-width, in standard errors
        verdict = {
            k: "resolved"
            if abs(pooled[k].mean()) > t_half(pooled[k])
            else f"not resolved (the 95% t interval, ±{crit:.2f} standard errors, holds zero)"
            for k in pooled
        }
        summary.append(
            f"| {rival} | {seed_span(both)} | "
            + " | ".join(
                f"{wins(g[0, k])} | {wins(g[1, k])} | {pooled[k].mean():+.4f} ± {se[k]:.4f}"
                + (" (resolved)" if verdict[k] == "resolved" else "")
                for k in ("unseen", "seen")
            )
            + " | "
            + " | ".join(_over_random(draws, (first, second), both, k) for k in ("unseen", "seen"))
            + " |"
        )
        if rival not in NEAREST_RIVALS:
            continue
        rows = [
            f"| seed | form − {rival} unseen: draw 0 | draw 1 | form − {rival} seen: draw 0 | draw 1 |",
            "|---|---|---|---|---|",
            *(
                f"| {s} | {g[0, 'unseen'][j]:+.4f} | {g[1, 'unseen'][j]:+.4f} | {g[0, 'seen'][j]:+.4f} | "
                f"{g[1, 'seen'][j]:+.4f} |"
                for j, s in enumerate(both)
            ),
            f"| mean (wins) | {wins(g[0, 'unseen'])} | {wins(g[1, 'unseen'])} | {wins(g[0, 'seen'])} | "
            f"{wins(g[1, 'seen'])} |",
        ]
        lines += [
            f"`{rival}` ran a second draw too, at seeds {', '.join(map(str, both))}: the form against it, "
            "final held-out.",
            "",
            *rows,
            "",
            f"Averaged over a seed's two draws, the form minus {rival}: {pooled['unseen'].mean():+.4f} ± "
            f"{se['unseen']:.4f} unseen, {pooled['seen'].mean():+.4f} ± {se['seen']:.4f} seen (± standard error "
            f"over the {n} seeds; {verdict['unseen']} on unseen, {verdict['seen']} on seen).",
            "",
        ]
    if len(got) > len(set(got) & set(NEAREST_RIVALS)):
        lines += [
            "Every rival that ran a second draw, the form minus it (mean over the seeds it ran twice, in "
            "how many of them the form is ahead; the mean of a seed's two draws ± its standard error over "
            "seeds, *resolved* where its 95% t interval over the seeds is clear of zero: beyond about 2.1 "
            "standard errors at 15 seeds, 2.3 at 10, where earlier versions of this table used two):",
            "",
            *summary,
            "",
        ]
    judged = [_sixth_target(got, lr, second, seeds)]
    longest = {r: v for r, v in got.items() if v[1] == seeds}  # the rivals run twice at every seed
    if len(longest) < len(got) and longest:
        judged.append(_sixth_target(longest, lr, second, seeds))
    return lines + [" ".join(judged), "", *_on_records(first, lr, rivals)]


def _sixth_target(got: dict, lr: str, second: dict, seeds: list[int]) -> str:
    """The sixth target on draw 1 among random, the form and the rivals of ``got``, over the seeds
    all of them ran twice: each one's mean held-out, highest first."""
    common = [s for s in seeds if all(s in both for _draws, both in got.values())]
    best = []
    for kind in ("seen", "unseen"):
        key = f"heldout_{kind}_final"
        means = {
            "random": float(np.mean([second["random"][s][key] for s in common])),
            **{r: float(np.mean([d[1][s][key] for s in common])) for r, (d, _both) in got.items()},
            "the form": float(np.mean([second[lr][s][key] for s in common])),
        }
        best.append(_ranked(means, kind))
    ran = 2 + len(got)
    among = (
        f"among all {len(COMPARED)} schedulers and the form"
        if set(COMPARED) <= {"random", *got}
        else f"among the {ran} schedulers that ran it at these seeds (the form included)"
    )
    return (
        f"The sixth target on draw 1, {among}, over seeds {seed_span(common)}: the highest mean "
        f"held-out {best[0]}; {best[1]}."
    )


def _ranked(means: dict[str, float], kind: str) -> str:
    """``on seen tasks: best (each one's mean, highest first)``."""
    where = "seen tasks" if kind == "seen" else "unseen environments"
    ranked = sorted(means.items(), key=lambda kv: -kv[1])
    return f"on {where}: {ranked[0][0]} ({', '.join(f'{k} {v:.4f}' for k, v in ranked)})"


def _on_records(first: dict, lr: str, rivals: tuple[str, ...]) -> list[str]:
    """Draw 0 (the records, with any recorded later at the start and the end only): each of
    ``rivals`` and the form against random over the seeds every one of them has (a table), and the
    sixth target among them there."""
    rows = ("random", *rivals, lr)
    common = sorted(set.intersection(*(set(first.get(n, {})) for n in rows)))
    if len(common) < 3:
        return []

    def per(n: str, key: str) -> np.ndarray:
        return np.array([first[n][s][key] for s in common])

    table = [
        "| scheduler | Δ held-out seen ± s.e. (seeds above random) | Δ held-out unseen ± s.e. | mean seen | "
        "mean unseen | batch var × random | zero-var × random |",
        "|" + "---|" * 7,
    ]
    for n in rows:
        cells = []
        for k in ("seen", "unseen"):
            key = f"heldout_{k}_final"
            cells.append("—" if n == "random" else mean_se_wins(per(n, key) - per("random", key)))
        ratios = [
            f"{per(n, key).mean() / per('random', key).mean():.2f}"
            for key in ("batch_variance", "zero_variance_fraction")
        ]
        table.append(
            f"| {'the form' if n == lr else n} | {cells[0]} | {cells[1]} | "
            f"{per(n, 'heldout_seen_final').mean():.4f} | {per(n, 'heldout_unseen_final').mean():.4f} | "
            f"{ratios[0]} | {ratios[1]} |"
        )
    best = [
        _ranked(
            {("the form" if n == lr else n): float(per(n, f"heldout_{k}_final").mean()) for n in rows},
            k,
        )
        for k in ("seen", "unseen")
    ]
    return [
        "Draw 0 (the records: those in `bench/runs/neural-noforced/`, with held-out every 50 steps, and "
        "those recorded later beside the second draws, with held-out at the start and the end), "
        f"{'all ' if set(COMPARED) <= set(rows) else ''}{len(rows) - 1} schedulers and the form over seeds "
        f"{seed_span(common)}, final held-out (± standard error over seeds):",
        "",
        *table,
        "",
        f"The sixth target on draw 0 over these seeds: the highest mean held-out {best[0]}; {best[1]}.",
        "",
    ]


def _over_random(draws: tuple[dict, dict], base: tuple[dict, dict], seeds: list[int], kind: str) -> str:
    """A rival minus random on final held-out (``kind``), a seed's two draws averaged: mean ± its
    standard error over ``seeds``, and in how many seeds it is above random."""
    key = f"heldout_{kind}_final"
    return mean_se_wins(
        np.array([np.mean([draws[i][s][key] - base[i]["random"][s][key] for i in (0, 1)]) for s in seeds])
    )
