"""Where the unseen held-out's spread comes from (the split or the run) and where the held-out gain
falls by what tasks ask."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

from envsched_pipeline.analysis.bench import (
    first_departure,
    provenance,
    provenance_text,
    run_environment,
)
from envsched_pipeline.analysis.patterns import pattern_effects, residual_share_correlation
from envsched_pipeline.analysis.spread import (
    every_seed_needs,
    paired_components,
    predicted_sd,
    two_draws,
)
from envsched_pipeline.analysis.trace import query_traces
from sections.common import BESIDE_ORACLE, NO_FORCED_STOP, write_section
from sections.records import record_of, recorded_at_seed, records_keeping


def _domain(env_id: str) -> str:
    """An environment's domain: the generator names the k-th repeat of a domain ``<domain>_<k>``."""
    return re.sub(r"_\d+$", "", env_id)


def _draws_on_all(recs: dict, lr: str, seeds: list[int], pertask_runs: str | None, n_unseen: int) -> str:
    """The two draws on every unseen environment of the larger split: the form's records re-run with
    it after the BLAS fix (``pertask_runs``, the same draw as its records) beside ``recs`` (the other
    draw), against the same random runs and evaluations."""
    if not pertask_runs:
        return ""
    again = {n: records_keeping(pertask_runs, n) for n in recs}
    both = [s for s in seeds if all(s in again[n] for n in recs)]
    same_random = all(
        again["random"][s]["evals"][-1]["unseen_mean"] == recs["random"][s]["evals"][-1]["unseen_mean"]
        for s in both
    )
    if len(both) < 3 or not same_random:
        return ""

    def delta(src: dict, s: int) -> float:
        return src[lr][s]["evals"][-1]["unseen_mean"] - src["random"][s]["evals"][-1]["unseen_mean"]

    c = two_draws(np.array([delta(again, s) for s in both]), np.array([delta(recs, s) for s in both]))
    floor = every_seed_needs(c["run_sd"])
    return (
        f" On all {n_unseen} unseen environments, with the records' draw re-run on that split (`bench/runs/"
        f"{Path(pertask_runs).name}/`, which repeats the records step for step, against the very same random "
        f"evaluations) at {len(both)} seeds: sd over seeds {c['sd']:.4f}, the run's {c['run_sd']:.4f} "
        f"({c['run_share']:.0%}), the seed's {c['seed_sd']:.4f}, correlation {c['correlation']:.2f}; above random "
        f"in {c['positive'][0]} and {c['positive'][1]} of {len(both)} seeds, both at {c['both_positive']}; mean "
        f"{c['mean'][0]:+.4f} and {c['mean'][1]:+.4f}. Four times the environments shrink the seed's part, not the "
        "run's: a run's own luck is common to every environment it is measured on. So whatever the held-out set, "
        f"all 10 seeds above random with a chance of 0.9 needs a mean unseen effect of at least about {floor:+.4f} "
        "(the form's run sd alone, as if the seed's part were gone), and about "
        f"{floor * math.sqrt(2):+.4f} if random's run varies as much as the form's (here random's one run per "
        "seed sits in the seed's part)."
    )


def section_unseen_split(runs: str, base_runs: str, steps: int, pertask_runs: str | None = None) -> None:
    """How much of the paired held-out difference's spread over seeds is the held-out set's own
    (which environments it holds) and how much is the run's: random and the recommended form with a
    larger unseen split (``--unseen-envs``), whose first 12 environments are the default split."""
    lr = BESIDE_ORACLE[-1]
    recs = {n: records_keeping(runs, n) for n in ("random", lr)}
    seeds = sorted(set(recs["random"]) & set(recs[lr]))
    if len(seeds) < 3:
        print(f"neural_unseen_split: {len(seeds)} paired seeds in {runs}; section left as it was")
        return
    last = {n: {s: recs[n][s]["evals"][-1] for s in seeds} for n in recs}
    unseen_envs = sorted(last["random"][seeds[0]]["unseen_by_env"])
    default = set(sorted(unseen_envs, key=lambda e: (e != _domain(e), e))[:12])  # one per domain
    base = {}
    for s in seeds:  # the same runs as recorded with the default split
        base[s] = recorded_at_seed(["random", lr], base_runs, s, NO_FORCED_STOP, steps)

    def diff(kind: str, envs) -> np.ndarray:
        envs = list(envs)
        return np.array(
            [
                [last[lr][s][f"{kind}_by_env"][e] - last["random"][s][f"{kind}_by_env"][e] for e in envs]
                for s in seeds
            ]
        )

    # does each run repeat the run recorded with the default split (training ignores the split)?
    originals = {n: {s: record_of(base_runs, n, s) for s in seeds} for n in recs}
    departs = {
        n: {s: first_departure(originals[n][s], recs[n][s]) for s in seeds if originals[n][s]} for n in recs
    }
    repeat = {n: [s for s in departs[n] if departs[n][s] is None] for n in recs}
    d12, d_all = diff("unseen", sorted(default)).mean(axis=1), diff("unseen", unseen_envs).mean(axis=1)
    seen_envs = sorted(last["random"][seeds[0]]["seen_by_env"])
    d_seen = diff("seen", seen_envs).mean(axis=1)
    zv = {n: {s: float(np.mean(recs[n][s]["zero_variance_fraction"])) for s in seeds} for n in recs}
    rows = [
        f"| seed | {lr} re-run repeats its record | Δ seen: record | Δ seen: re-run | Δ unseen, default 12: "
        f"record | Δ unseen, the same 12: re-run | Δ unseen, all {len(unseen_envs)}: re-run | zero-var × random: "
        "record | re-run |",
        "|" + "---|" * 9,
    ]
    rec_d = {"seen": [], "unseen": [], "zv": []}
    for i, s in enumerate(seeds):
        b = base[s]
        if all(n in b for n in recs):
            rec_d["seen"].append(b[lr]["heldout_seen_final"] - b["random"]["heldout_seen_final"])
            rec_d["unseen"].append(b[lr]["heldout_unseen_final"] - b["random"]["heldout_unseen_final"])
            rec_d["zv"].append((b[lr]["zero_variance_fraction"], b["random"]["zero_variance_fraction"]))
            cells = [
                f"{rec_d['seen'][-1]:+.4f}",
                f"{rec_d['unseen'][-1]:+.4f}",
                f"{rec_d['zv'][-1][0] / rec_d['zv'][-1][1]:.2f}",
            ]
        else:
            cells = ["—", "—", "—"]
        if s not in departs[lr]:
            again = "not on record"
        else:
            again = "yes" if departs[lr][s] is None else f"departs at step {departs[lr][s]}"
        rows.append(
            f"| {s} | {again} | {cells[0]} | {d_seen[i]:+.4f} | {cells[1]} | {d12[i]:+.4f} | {d_all[i]:+.4f} | "
            f"{cells[2]} | {zv[lr][s] / zv['random'][s]:.2f} |"
        )

    def wins(x) -> str:
        x = np.asarray(x)
        return f"{x.mean():+.4f} ({(x > 0).sum()}/{len(x)})"

    rows.append(
        f"| mean (wins) | — | {wins(rec_d['seen'])} | {wins(d_seen)} | {wins(rec_d['unseen'])} | {wins(d12)} | "
        # the mean row's zero-variance ratio is of the means over seeds, as in the tables above
        f"{wins(d_all)} | {np.mean([a for a, _ in rec_d['zv']]) / np.mean([r for _, r in rec_d['zv']]):.2f} | "
        f"{np.mean([zv[lr][s] for s in seeds]) / np.mean([zv['random'][s] for s in seeds]):.2f} |"
    )
    comp_rows = [
        "| held-out | split measured (domains x each) | sd: the run's, every environment | sd: the seed's, per "
        "domain | sd: per environment | of which the evaluation's sampling | sd of the mean Δ over seeds: "
        "default split (predicted) | this split (observed) | 4x the domains of the default (predicted) | "
        "needs (10 seeds): default split / 4x the domains | mean Δ, this split |",
        "|" + "---|" * 11,
    ]
    fits = {}
    for kind, envs in (("unseen", unseen_envs), ("seen", seen_envs)):
        c = paired_components(diff(kind, envs), [_domain(e) for e in envs])
        fits[kind] = c
        # the evaluation's own sampling: a run's held-out s.e. is that of the mean over its environments
        se2 = np.mean([last[n][s][f"{kind}_se"] ** 2 for n in recs for s in seeds])
        sampling = math.sqrt(2 * se2 * len(envs))  # per environment, in a paired difference
        D, V = c["domains"], c["per_domain"]
        each = 1 if kind == "unseen" else V  # the default unseen split: one environment per domain
        default, more = predicted_sd(c, D, each), predicted_sd(c, 4 * D, each)
        comp_rows.append(
            f"| {kind} | {D * V} ({D} x {V}) | {math.sqrt(c['var_seed']):.4f} | "
            f"{math.sqrt(c['var_seed_domain']):.4f} | {math.sqrt(c['var_within_domain']):.4f} | {sampling:.4f} | "
            f"{default:.4f} ({D} x {each}) | {c['observed_sd']:.4f} | {more:.4f} ({4 * D} x {each}) | "
            f"{every_seed_needs(default):+.4f} / {every_seed_needs(more):+.4f} | {c['mean']:+.4f} |"
        )
    u = fits["unseen"]
    share = u["var_seed"] / max(predicted_sd(u, u["domains"], 1) ** 2, 1e-12)
    reading = (
        f"Reading: on the default 12 unseen environments the paired difference's variance over seeds is "
        f"{share:.0%} the run's own (common to every environment) and {1 - share:.0%} which environments the "
        f"split holds (the seed's luck on a domain, and on an environment within it). Holding out "
        f"{len(unseen_envs)} environments of the same 12 domains takes the sd of the mean Δ from "
        f"{predicted_sd(u, u['domains'], 1):.4f} to {predicted_sd(u, u['domains'], u['per_domain']):.4f} (observed "
        f"{u['observed_sd']:.4f}); 48 new domains would take it to {predicted_sd(u, 4 * u['domains'], 1):.4f}. "
        f"Over these {len(seeds)} seeds the variance components rest on {u['df']['seed']} degrees of freedom for the "
        "run's share: a rough split, not a measurement to two digits."
    )
    draws = ""
    both = [
        i for i, s in enumerate(seeds) if departs[lr].get(s) is not None and all(n in base[s] for n in recs)
    ]
    if len(both) >= 3 and len(both) == len(rec_d["unseen"]):
        # the re-runs and the records are two draws of one schedule at each seed, on the same 12
        # unseen environments (and the same seen tasks): how much of the spread is the run's, directly
        parts = {
            kind: two_draws(np.array(rec_d[kind]), np.array([again[i] for i in both]))
            for kind, again in (("unseen", d12), ("seen", d_seen))
        }
        u, sn = parts["unseen"], parts["seen"]
        draws = (
            f"Two draws: at {len(both)} seeds the re-run and the record are the same schedule with other "
            "tie-breaks, against the same random run, on the same 12 unseen environments, so they measure the "
            "run's own share directly (`two_draws` in `envsched_pipeline/analysis/spread.py`: half the variance "
            "of the two draws' difference), without the per-environment fit. Unseen (default 12): sd over "
            f"seeds {u['sd']:.4f}, the run's {u['run_sd']:.4f} ({u['run_share']:.0%} of the variance), the "
            f"seed's {u['seed_sd']:.4f}; the draws correlate {u['correlation']:.2f} over seeds; above random in "
            f"{u['positive'][0]} and {u['positive'][1]} of {len(both)} seeds, in both draws at "
            f"{u['both_positive']}. Seen: sd {sn['sd']:.4f}, the run's {sn['run_sd']:.4f} "
            f"({sn['run_share']:.0%}), correlation {sn['correlation']:.2f}. The random run is evaluated once "
            "with each split, so the evaluation's own sampling (about 0.004 of the draws' difference) counts "
            f"as the run's here. So on unseen environments about {1 - u['run_share']:.0%} of the spread is the "
            "seed's (its held-out environments, pool and warm start, and random's own run, which both draws "
            "share) and about "
            f"{u['run_share']:.0%} the run's, more than the fit's {share:.0%}. Both rest on {len(both) - 1} degrees "
            f"of freedom (a variance from {len(both)} seeds is uncertain by about "
            f"{math.sqrt(2 / (len(both) - 1)):.0%} of its size), and the draws on all {len(unseen_envs)} "
            "environments next, whose run part does not shrink with the environments, say the fit gave the run "
            "too little of the seed-level variance. Whether a given seed comes out above random is partly "
            "the run's luck as well: "
            + (
                f"seed(s) {', '.join(map(str, low))} below random in both draws, the others below it in one at most."
                if (low := [seeds[i] for j, i in enumerate(both) if rec_d["unseen"][j] <= 0 and d12[i] <= 0])
                else "no seed is below random in both draws."
            )
            + " On seen tasks the spread is smaller, and more of it the run's."
        )
        draws += _draws_on_all(recs, lr, seeds, pertask_runs, len(unseen_envs))
    write_section(
        "neural_unseen_split",
        "\n".join(
            [
                "## Where the unseen held-out's spread comes from: the run or the environments held out",
                "",
                "The held-out on environments never trained on is measured on 12 generated environments, one per "
                "domain of the unseen family. Its paired difference against random varies over seeds more than "
                'the seen one (section "Where the spread over seeds comes from"), and the every-seed unseen '
                f"target is the one the recommended form misses on the default learner. Here random and `{lr}` "
                f"(default learner) ran again at seeds {', '.join(map(str, seeds))} with "
                f"`--unseen-envs {len(unseen_envs)}`: each of the 12 domains four times (other rules, ids and "
                "difficulty), the first 12 being the default split. Training does not depend on the split "
                f"(random's runs repeat their records step for step at {len(repeat['random'])} of {len(seeds)} "
                f"seeds). `{lr}`'s runs repeat theirs at {len(repeat[lr])} of {len(seeds)}: "
                + (
                    "these runs were made before commit 24ddfc9, when the task graph depended on the "
                    "OpenBLAS kernels (identical topology vectors split into two groups under the AVX-512 "
                    "ones), under the SkylakeX kernels, and its records under the Haswell ones; the form's "
                    "picks rest on the graph from its first step (random reads no graph). Today's code builds "
                    "the Haswell graph under any kernel, and the form's records repeat with it "
                    '(docs/experiments.md, "BLAS kernels"). So its columns here are the same schedule run on '
                    "the other graph, a second draw of its tie-breaks, beside the records. "
                    if len(repeat[lr]) < len(seeds)
                    else "the same runs as recorded. "
                )
                + "Every evaluation keeps the held-out per environment, so the paired "
                "difference's spread over seeds splits into the run's share, common to every environment "
                "(`envsched_pipeline/analysis/spread.py`), the seed's share on one domain, and the rest. "
                f"Runs in `bench/runs/{Path(runs).name}/`. "
                + provenance_text(
                    provenance(
                        [r.get("environment") for n in recs for r in recs[n].values()], run_environment()
                    )
                ),
                "",
                *rows,
                "",
                *comp_rows,
                "",
                '"needs": the mean paired effect at which all 10 seeds come out above random with a chance of 0.9 '
                "at that sd. The evaluation's sampling column is the part of the per-environment sd that the "
                "held-out's own standard error accounts for (16 episodes a task).",
                "",
                reading,
                *(["", draws] if draws else []),
            ]
        ),
        after="neural_oracle",
    )


def section_patterns(runs: str, base_runs: str) -> None:
    """Where the recommended form's held-out gain over random falls, by what the held-out tasks ask
    (their operation patterns), beside how much more of each pattern it trained on (its traces)."""
    from envs.registry import load_synthetic  # only this section makes pools from their seeds

    lr = BESIDE_ORACLE[-1]
    recs = {n: records_keeping(runs, n, "unseen_by_task") for n in ("random", lr)}
    traces = Path(runs) / "traces"
    seeds = [
        s
        for s in sorted(set(recs["random"]) & set(recs[lr]))
        if all((traces / f"{n}-s{s}.parquet").exists() for n in recs)
    ]
    if len(seeds) < 3:
        print(f"neural_patterns: {len(seeds)} paired seeds with traces in {runs}; section left as it was")
        return
    effects: dict[str, list[dict]] = {"seen": [], "unseen": []}
    repeats = {n: 0 for n in recs}
    n_unseen = len(recs["random"][seeds[0]]["evals"][-1]["unseen_by_env"])
    for s in seeds:
        pool = load_synthetic(
            "synthetic", n_envs=51, tasks_per_env=50, seed=s, unseen_envs=n_unseen
        )  # the runs' pool: its latents name each task's patterns
        patterns = {r["task_id"]: json.loads(r["patterns"]) for r in pool.latents}
        picks = {
            n: query_traces([traces / f"{n}-s{s}.parquet"], "select task_id from picks").column(0).to_pylist()
            for n in recs
        }
        for kind in effects:
            effects[kind].append(
                pattern_effects(
                    recs["random"][s]["evals"][-1][f"{kind}_by_task"],
                    recs[lr][s]["evals"][-1][f"{kind}_by_task"],
                    patterns,
                    picks["random"],
                    picks[lr],
                )
            )
        for n in recs:
            original = record_of(base_runs, n, s)
            repeats[n] += bool(original) and first_departure(original, recs[n][s]) is None
    names = sorted(effects["unseen"][0]["patterns"])
    rows = [
        "| pattern | trained × random (share of picks) | Δ seen | residual seen | Δ unseen | residual unseen (± s.e. over seeds) | "
        "seeds above random, unseen | random's held-out unseen |",
        "|" + "---|" * 8,
    ]

    def col(kind: str, key: str, p: str) -> np.ndarray:  # one pattern's value over the seeds
        return np.array([e["patterns"][p][key] for e in effects[kind]])

    ratio = {p: float(col("unseen", "share_ratio", p).mean()) for p in names}
    resid = {p: float(col("unseen", "residual", p).mean()) for p in names}
    for p in names:
        du, res_se = (
            col("unseen", "diff", p),
            col("unseen", "residual", p).std(ddof=1) / math.sqrt(len(seeds)),
        )
        rows.append(
            f"| {p} | {ratio[p]:.2f} | {col('seen', 'diff', p).mean():+.4f} | "
            f"{col('seen', 'residual', p).mean():+.4f} | {du.mean():+.4f} | {resid[p]:+.4f} ± {res_se:.4f} | "
            f"{(du > 0).sum()}/{len(du)} | {col('unseen', 'baseline', p).mean():.3f} |"
        )
    overall = {k: np.array([e["diff"] for e in effects[k]]) for k in effects}
    rows.append(
        f"| all tasks | 1.00 | {overall['seen'].mean():+.4f} | — | {overall['unseen'].mean():+.4f} | — | "
        f"{(overall['unseen'] > 0).sum()}/{len(seeds)} | — |"
    )
    corr = {k: residual_share_correlation(effects[k]) for k in effects}
    per_seed = ", ".join(f"seed {s} {d:+.4f}" for s, d in zip(seeds, overall["unseen"], strict=True))
    spread_u = np.std([[e["patterns"][p]["residual"] for p in names] for e in effects["unseen"]])
    pairs = [
        row for e in effects["unseen"] for row in e["patterns"].values() if math.isfinite(row["share_ratio"])
    ]
    room = float(np.corrcoef([x["baseline"] for x in pairs], [x["residual"] for x in pairs])[0, 1])
    room_share = float(np.corrcoef([x["baseline"] for x in pairs], [x["share_ratio"] for x in pairs])[0, 1])
    least = sorted(names, key=ratio.get)[:2]
    reading = (
        f"Reading: over the {len(seeds)} seeds x {len(names)} patterns a pattern's residual goes with how much "
        f"more of it the form trained on with r = {corr['seen']:+.2f} on seen tasks and r = {corr['unseen']:+.2f} on "
        "unseen environments. The two patterns the form trained least on against random are "
        + " and ".join(f"{p} ({ratio[p]:.2f}x, unseen residual {resid[p]:+.4f})" for p in least)
        + f"; the one it trained most on is {max(names, key=ratio.get)} ({max(ratio.values()):.2f}x, "
        f"{resid[max(names, key=ratio.get)]:+.4f}). The residuals' sd is {spread_u:.4f}, and the seed's common "
        f"shift on unseen environments ({per_seed}) is "
        + ("larger" if np.std(overall["unseen"]) > spread_u else "no larger")
        + " than what is particular to a pattern. Room goes with it: over the same (seed, pattern) pairs the "
        f"unseen residual goes with random's own held-out on the pattern with r = {room:+.2f}, and the form's "
        f"share ratio with it with r = {room_share:+.2f} (it trains more of what random leaves unsolved), so "
        "the share ratio's own part in the unseen residual is smaller still."
    )
    write_section(
        "neural_patterns",
        "\n".join(
            [
                "## Where the held-out gain falls, by what the tasks ask",
                "",
                f"Random and `{lr}` on the default learner at seeds {', '.join(map(str, seeds))}, run with "
                f"`--unseen-envs {n_unseen} --trace` so that every evaluation keeps its held-out per task and every "
                "pick is kept (runs and traces in "
                f"`bench/runs/{Path(runs).name}/`; they repeat the default-split records step for step at "
                f"{repeats['random']} and {repeats[lr]} of {len(seeds)} seeds). Every synthetic task is made of one "
                "or more operation patterns (the pool's latents name them; the scheduler never reads them). Per "
                "pattern: how much more of it the form trained on than random (its share of the pattern "
                "occurrences in the picks over random's), the paired held-out difference over the held-out "
                "tasks that contain it, and its residual (that difference minus the one over every held-out "
                "task of the seed: what is particular to the pattern once the run's common shift is out; a task "
                "with several patterns counts under each, so the residuals need not average to zero). "
                "Means over seeds (`envsched_pipeline/analysis/patterns.py`). "
                + provenance_text(
                    provenance(
                        [recs[n][s].get("environment") for n in recs for s in seeds], run_environment()
                    )
                ),
                "",
                *rows,
                "",
                reading,
            ]
        ),
        after="neural_unseen_split",
    )
