"""Learner-setting experiments on the neural learner (one RESULTS section each: the whole-batch
denominator, dual-clip, the overrun penalty, no forced stop, clip-higher) and why the forced-stop learner's
held-out falls late."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from envsched_pipeline.analysis.bench import (
    provenance_text,
    run_benchmark,
)
from envsched_pipeline.analysis.plots import heldout_plots
from envsched_pipeline.scheduler.variants import RECOMMENDED
from sections.common import COMPARED, FORCED_STOP, HERE, NO_FORCED_STOP, LearnerExperiment, fmt, write_section
from sections.neural import (
    LATE_DECLINE,
    beside_paper,
    gain_correlations,
    neural_tables,
    neural_targets,
    training_diet,
    variant_block,
)
from sections.records import mean_over, paired_mean, ratio_over, recorded_seeds, recorded_variants


def _against_noise(mean: float, sd: float, n: int) -> str:
    """A mean paired difference over ``n`` seeds (sd ``sd``) against two of its standard errors."""
    if n < 2:
        return "one seed: no spread over seeds to judge it by"
    se2 = 2 * sd / np.sqrt(n)
    return f"two standard errors {se2:.4f}: {'outside' if abs(mean) > se2 else 'inside'} the noise"


def _capped_cell(setting: dict, default: dict) -> str:
    """Mean share of episodes the max_actions cap ended in the last quarter of the steps, under the
    setting and (in brackets) the forced-stop learner, over the seeds that recorded it."""

    def mean(per_seed):
        v = [x["capped_last_quarter"] for x in per_seed.values() if "capped_last_quarter" in x]
        return f"{np.mean(v):.2f}" if v else "—"

    return f"{mean(setting)} ({mean(default)})"


def learner_experiment(
    exp: LearnerExperiment, runs: str, baseline_runs: str, seeds: int, steps: int, extra: list[str] | None
) -> dict | None:
    """The schedulers recorded in ``runs`` under the experiment's learner settings, their own paired
    table and targets, and what the setting did to each of them against the forced-stop learner's runs in
    ``baseline_runs``, paired by seed. Built from recorded runs only."""
    name, cfg, label, title = exp.section, exp.config, exp.label, exp.title
    names = [n for n in COMPARED + (extra or []) if recorded_seeds(runs, n)]
    if "random" not in names or "envsched" not in names:
        print(f"{name}: random and envsched runs are needed in {runs}; section left as it was")
        return None
    quiet = lambda _m: None  # noqa: E731
    kw = dict(
        steps=steps, seed=0, seeds=seeds, learner="neural", eval_every=50, recorded_only=True, log=quiet
    )
    out = run_benchmark(names, cache_dir=runs, learner_config=cfg, **kw)
    base = run_benchmark(names, cache_dir=baseline_runs, learner_config=FORCED_STOP, **kw)
    plot = heldout_plots(out, HERE / exp.plot_file)
    S, P = out["schedulers"], out["paired_vs_random"]
    rows, speed = neural_tables(S, P, out["per_seed"])
    trows, resolution = neural_targets(S, P)
    # the setting's own effect on each scheduler: this setting minus the forced-stop learner, same seed
    effect = [
        f"| scheduler | seeds | held-out seen: {label} − forced stop (± sd), higher in | held-out unseen: {label} − "
        "forced stop, higher in | seen, mean over steps 50..200 | unseen, mean over steps 50..200 | "
        f"zero-var frac: {label} / forced stop | episodes the action cap ended, last quarter: {label} (forced stop) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    moved: dict[tuple[str, str], float] = {}  # (scheduler, metric) -> mean change from the setting
    for n in names:
        a, b = out["per_seed"].get(n, {}), base["per_seed"].get(n, {})
        common = sorted(set(a) & set(b))
        if not common:  # a variant tried only under this setting: nothing to pair it with
            continue
        cells = []
        for metric in (
            "heldout_seen_final",
            "heldout_unseen_final",
            "heldout_seen_auc",
            "heldout_unseen_auc",
        ):
            d = [a[s][metric] - b[s][metric] for s in common]
            if d:
                moved[(n, metric)] = float(np.mean(d))
            cells.append(
                f"{np.mean(d):+.4f} ± {np.std(d, ddof=1) if len(d) > 1 else 0.0:.4f}, {sum(x > 0 for x in d)}/{len(d)}"
                if d
                else "—"
            )
        zv = (
            S[n]["zero_variance_fraction"] / base["schedulers"][n]["zero_variance_fraction"]
            if n in base["schedulers"]
            else None
        )
        effect.append(f"| {n} | {len(common)} | {' | '.join(cells)} | {fmt(zv, 2)} | {_capped_cell(a, b)} |")
    # reading: envsched's gain under this setting, how much of it is random moving, and which
    # (setting, scheduler) has the best absolute held-out
    pe = P["envsched"]
    both = {(n, "forced-stop"): m for n, m in base["schedulers"].items() if n in S}
    both.update({(n, label): m for n, m in S.items()})
    reading = []
    for k, kind in (("heldout_seen_final", "seen"), ("heldout_unseen_final", "unseen")):
        d = pe[k]
        best = max(both, key=lambda x: both[x][k])
        judged = _against_noise(d["mean"], d["sd"], d["n"])
        reading.append(
            f"{kind} environments: envsched {d['mean']:+.4f} against random under this setting ({judged}); the setting "
            f"moved random by {moved.get(('random', k), float('nan')):+.4f} and envsched by "
            f"{moved.get(('envsched', k), float('nan')):+.4f}; the best absolute held-out of both settings among "
            f"this table's schedulers is {best[0]} with the {best[1]} learner ({both[best][k]:.4f})"
        )
    setup = out["setup"]
    settings = ", ".join(f"`{k}={json.dumps(v)}`" for k, v in cfg.items())
    write_section(
        name,
        "\n".join(
            [
                f"## Experiment: {title}",
                "",
                exp.intro,
                f"Same pool, seeds, warm start and schedulers as the table above, learner settings {settings} "
                f"(docs/algorithm.md §8b); {setup['steps']} steps, B = {setup['batch_size']}, G = "
                f"{setup['group_size']}; runs in `bench/runs/{Path(runs).name}/`. Columns as in the table above. "
                + provenance_text(out["provenance"])
                + " "
                + provenance_text(base["provenance"], what="The forced-stop learner's runs beside it"),
                "",
                *rows,
                "",
                *speed,
                "",
                f"What the setting did to each scheduler (this table's runs minus the forced-stop learner's, same seed; "
                f'"{label}" = this setting):',
                "",
                *effect,
                "",
                "Reading: " + "; ".join(reading) + ".",
                "",
                "Beside the paper's real-model ablation and the simulated learner, as ratios to random "
                "(this learner setting's rows):",
                "",
                *beside_paper(S),
                "",
                resolution,
                "",
                'Targets (issue 17) under this learner setting ("all schedulers" = the ablation rows of this '
                "table, variants aside):",
                "",
                *trows,
                "",
                *variant_block(S, P),
                *gain_correlations(out["per_seed"]),
                *training_diet(out["series"]),
                f"![held-out curves, {title}]({Path(plot).name})",
            ]
        ),
        after="neural",
    )
    return out


def _block_cells(series: dict, lo: int, hi: int) -> list[str]:
    """One 25-step block of a run's update statistics (records from before they were kept: dashes)."""

    def part(k):
        v = np.asarray(series.get(k, [])[lo:hi], dtype=float)
        v = v[np.isfinite(v)]
        return v if len(v) else None

    stop, norm, kl, top = (
        part(f"update_{k}") for k in ("forced_stop_logp", "grad_norm", "kl", "log_ratio_max")
    )
    return [
        f"{stop.mean():.1f}" if stop is not None else "—",
        f"{np.median(norm):.2f} / {norm.max():.3g}" if norm is not None else "—",
        f"{kl.max():.3g}" if kl is not None else "—",
        f"{top.max():.1f}" if top is not None else "—",
        f"{np.mean(series['forced_stop_share'][lo:hi]):.2f}" if series.get("forced_stop_share") else "—",
    ]


def section_forced_stop(
    noforced_runs: str, default_runs: str, updates_runs: str, steps: int, every: int = 25
) -> None:
    """Why the forced-stop learner's held-out falls late: its update statistics step by step (its
    runs re-run to record them, in ``updates_runs``), and every run recorded with
    ``train_forced_stop=false`` paired with the forced-stop learner's run of the same scheduler and seed.
    Built from recorded runs only."""
    names = [n for n in COMPARED + recorded_variants(noforced_runs) if recorded_seeds(noforced_runs, n)]
    if "random" not in names:
        print(f"neural_forced_stop: random's runs are needed in {noforced_runs}; section left as it was")
        return
    quiet = lambda _m: None  # noqa: E731
    seeds = sorted({s for n in names for s in recorded_seeds(noforced_runs, n)})
    kw = dict(steps=steps, learner="neural", eval_every=50, recorded_only=True, log=quiet)

    def runs_of(cache: str, cfg: dict | None, seed: int, n_seeds: int = 1) -> dict:
        return run_benchmark(names, cache_dir=cache, learner_config=cfg, seed=seed, seeds=n_seeds, **kw)

    lo, hi = min(seeds), max(seeds)
    nf = runs_of(noforced_runs, NO_FORCED_STOP, lo, hi - lo + 1)
    base = runs_of(default_runs, FORCED_STOP, lo, hi - lo + 1)
    # step by step: the forced-stop learner's runs that record their updates, beside the same run without
    # the forced stop in the loss
    dyn = [
        "| run | steps | forced stop's log-prob when imposed (mean) | grad norm before clipping (median / max) "
        "| KL to the sampling policy (max) | largest log-ratio | episodes the cap ended |",
        "|---|---|---|---|---|---|---|",
    ]
    shown = []
    for n in names:
        for s in recorded_seeds(updates_runs, n):
            one = runs_of(updates_runs, FORCED_STOP, s)["series"].get(n, {})
            if "update_grad_norm" not in one:
                continue
            other = runs_of(noforced_runs, NO_FORCED_STOP, s)["series"].get(n, {})
            shown.append((n, s))
            for label, ser in (("forced stop", one), ("no forced stop", other)):
                if not ser:
                    continue
                for b in range(0, steps, every):
                    dyn.append(
                        f"| {n} seed {s}, {label} | {b}..{b + every - 1} | {' | '.join(_block_cells(ser, b, b + every))} |"
                    )
    # every pair: held-out at the end, late declines, against random under each setting
    pairs = [
        "| scheduler | seeds | held-out seen: forced stop → none | held-out unseen: forced stop → none "
        "| late declines: forced stop / none | seen Δ vs random (± sd), wins: forced stop / none | unseen Δ vs "
        "random (± sd), wins: forced stop / none | zero-var frac × random: forced stop / none |",
        "|---|---|---|---|---|---|---|---|",
    ]
    fell = {"default": 0, "nf": 0}
    for n in names:
        a, b = nf["per_seed"].get(n, {}), base["per_seed"].get(n, {})
        common = sorted(set(a) & set(b))
        if not common:
            continue
        ra, rb = nf["per_seed"].get("random", {}), base["per_seed"].get("random", {})
        both = [s for s in common if s in ra and s in rb]

        drops_b = [s for s in common if b[s]["heldout_seen_drop"] > LATE_DECLINE]
        drops_a = [s for s in common if a[s]["heldout_seen_drop"] > LATE_DECLINE]
        fell["default"] += len(drops_b)
        fell["nf"] += len(drops_a)
        pairs.append(
            f"| {n} | {', '.join(map(str, common))} | {mean_over(b, 'heldout_seen_final', common):.4f} → "
            f"{mean_over(a, 'heldout_seen_final', common):.4f} | {mean_over(b, 'heldout_unseen_final', common):.4f} → "
            f"{mean_over(a, 'heldout_unseen_final', common):.4f} | {len(drops_b)} ({', '.join(map(str, drops_b)) or '-'}) / "
            f"{len(drops_a)} ({', '.join(map(str, drops_a)) or '-'}) | "
            + (
                f"{paired_mean(b, rb, 'heldout_seen_final', both)} / "
                f"{paired_mean(a, ra, 'heldout_seen_final', both)} | "
                f"{paired_mean(b, rb, 'heldout_unseen_final', both)} / "
                f"{paired_mean(a, ra, 'heldout_unseen_final', both)} | "
                f"{ratio_over(b, rb, 'zero_variance_fraction', both):.2f} / "
                f"{ratio_over(a, ra, 'zero_variance_fraction', both):.2f} (seeds {', '.join(map(str, both))}) |"
                if n != "random" and both
                else "— | — | — |"
            )
        )
    write_section(
        "neural_forced_stop",
        "\n".join(
            [
                "## Why the forced-stop learner's held-out falls late: the trained forced stop",
                "",
                "The forced-stop learner trains the stop that the 8-action cap imposes as if the policy had "
                "sampled it (`train_forced_stop`, docs/algorithm.md §8b). A sampled decision that negative "
                "advantages push down gets sampled less, so the push stops; the imposed stop is trained in "
                "every capped episode whatever its probability, so nothing bounds the push: its log-probability "
                "can fall for the whole run, with the logits behind it growing. Runs now record each "
                "step's update statistics (`update_*` series). Forced-stop learner runs re-run to record them "
                f"(`bench/runs/{Path(updates_runs).name}/`; a re-run of a record kept before package versions "
                "were can depart from it, so these stand beside the records, not in their place), each beside "
                "the same run with `train_forced_stop=false` (everything else as the forced-stop learner; runs in "
                f"`bench/runs/{Path(noforced_runs).name}/`: the learner's default since 2026-12), per {every} steps:",
                "",
                *(dyn if shown else ["(no forced-stop learner run on record carries update statistics yet)"]),
                "",
                "Every run recorded without the forced stop in the loss, against the forced-stop learner's run of "
                "the same scheduler and seed (final held-out, late declines as in the tables above, and the "
                "paired difference against random under each setting over the seeds where random has both):",
                "",
                *pairs,
                "",
                f"Late declines over these pairs: {fell['default']} with the forced stop trained, {fell['nf']} "
                "without it.",
            ]
        ),
        after="neural_seeds",
    )


# DAPO's clip-higher on the default learner (section neural_cliphigher)
CLIP_HIGHER = {**NO_FORCED_STOP, "clip_eps_high": 0.28}


def _late(series: dict, name: str, metric: str) -> float:
    """The mean of a per-step series (its mean over the seeds) over the last quarter of the steps."""
    values = np.asarray(series[name][metric], dtype=float)
    return float(np.nanmean(values[len(values) * 3 // 4 :]))


def section_cliphigher(runs: str, base_runs: str, seeds: int, steps: int) -> dict | None:
    """Random and the recommended form with clip-higher (the upper clip range 0.28 over the lower
    0.2) against the same schedulers on the default learner, paired by seed; recorded runs only."""
    names = ["random", RECOMMENDED]
    have = sorted(set(recorded_seeds(runs, "random")) & set(recorded_seeds(runs, RECOMMENDED)))
    if len(have) < 2:
        print(f"neural_cliphigher: random and {RECOMMENDED} at two seeds or more are needed in {runs}")
        return None
    kw = dict(
        steps=steps,
        seed=0,
        seeds=seeds,
        learner="neural",
        eval_every=50,
        recorded_only=True,
        log=lambda _m: None,
    )
    out = run_benchmark(names, cache_dir=runs, learner_config=CLIP_HIGHER, **kw)
    base = run_benchmark(names, cache_dir=base_runs, learner_config=NO_FORCED_STOP, **kw)
    per, per0 = out["per_seed"], base["per_seed"]
    over = sorted(set(per["random"]) & set(per[RECOMMENDED]) & set(per0["random"]) & set(per0[RECOMMENDED]))
    kinds = (("heldout_seen_final", "seen"), ("heldout_unseen_final", "unseen"))
    rows = [
        "| learner | scheduler | held-out seen | Δ vs random (± sd), higher in | held-out unseen | Δ vs random, "
        "higher in | batch variance / random's | zero-variance / random's |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, p in (("default", per0), ("clip-higher 0.28", per)):
        for n in names:
            cells = []
            for metric, _kind in kinds:
                cells += [
                    fmt(mean_over(p[n], metric, over)),
                    "—" if n == "random" else paired_mean(p[n], p["random"], metric, over),
                ]
            ratios = [
                "—" if n == "random" else fmt(ratio_over(p[n], p["random"], m, over), 2)
                for m in ("batch_variance", "zero_variance_fraction")
            ]
            rows.append(f"| {label} | {n} | {' | '.join(cells)} | {' | '.join(ratios)} |")
    effect = [
        "| scheduler | held-out seen: clip-higher − default (± sd), higher in | held-out unseen | seen, mean over "
        "steps 50..200 | unseen, mean over steps 50..200 | policy entropy, last quarter: clip-higher (default) | "
        "clipped share, last quarter: clip-higher (default) |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in names:
        cells = [
            paired_mean(per[n], per0[n], metric, over)
            for metric in (
                "heldout_seen_final",
                "heldout_unseen_final",
                "heldout_seen_auc",
                "heldout_unseen_auc",
            )
        ]
        ent = f"{_late(out['series'], n, 'update_entropy'):.3f} ({_late(base['series'], n, 'update_entropy'):.3f})"
        clip = (
            f"{_late(out['series'], n, 'update_clip_fraction'):.3f} "
            f"({_late(base['series'], n, 'update_clip_fraction'):.3f})"
        )
        effect.append(f"| {n} | {' | '.join(cells)} | {ent} | {clip} |")
    reading = []
    for metric, kind in kinds:
        gain = [per[RECOMMENDED][s][metric] - per["random"][s][metric] for s in over]
        gain0 = [per0[RECOMMENDED][s][metric] - per0["random"][s][metric] for s in over]
        change = np.array(gain) - np.array(gain0)
        judged = _against_noise(float(np.mean(change)), float(np.std(change, ddof=1)), len(change))
        moved = {n: mean_over(per[n], metric, over) - mean_over(per0[n], metric, over) for n in names}
        reading.append(
            f"{kind}: the form {np.mean(gain):+.4f} against random with clip-higher ({sum(g > 0 for g in gain)}/"
            f"{len(gain)} seeds), {np.mean(gain0):+.4f} on the default learner at the same seeds; the change "
            f"{np.mean(change):+.4f} ({judged}); clip-higher moved random by "
            f"{moved['random']:+.4f} and the form by {moved[RECOMMENDED]:+.4f}"
        )
    write_section(
        "neural_cliphigher",
        "\n".join(
            [
                "## Experiment: the neural learner with clip-higher",
                "",
                "DAPO's clip-higher widens only the upper side of PPO's clip range (here 0.28 over the lower "
                "0.2), so a positive advantage can raise an unlikely decision's probability further in one "
                "update before its gradient stops; DAPO reports that it keeps the policy's entropy from "
                "collapsing. Does the recommended form's lead over random hold when the learner changes like "
                f"this? Random and the form, seeds {', '.join(map(str, over))}, the default learner (no forced "
                f"stop in the loss) with `clip_eps_high=0.28` (`envsched train --clip-eps-high 0.28` in the "
                f"product), each paired by seed with the same scheduler's record on the default learner; "
                f"{steps} steps, B = 64, G = 8; runs in `bench/runs/{Path(runs).name}/`. "
                + provenance_text(out["provenance"])
                + " "
                + provenance_text(base["provenance"], what="The default learner's runs beside it"),
                "",
                *rows,
                "",
                "What clip-higher did to each scheduler (its runs minus the default learner's, same seed; entropy "
                "and clipped share are the update's, averaged over the seeds):",
                "",
                *effect,
                "",
                "Reading: " + "; ".join(reading) + ".",
            ]
        ),
        after="neural_noforced",
    )
    return out
