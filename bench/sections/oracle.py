"""How many informative groups a step could have had (headroom probes) and the oracle that looks
before it picks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from envsched_pipeline.analysis.bench import (
    ORACLE_CANDIDATES,
    first_departure,
    provenance_text,
    run_benchmark,
)
from envsched_pipeline.analysis.plots import headroom_plot, heldout_plots
from sections.common import BESIDE_ORACLE, HERE, NO_FORCED_STOP, OVERRUN, write_section
from sections.neural import steps_to_random_final
from sections.records import (
    paired_cell,
    paired_mean,
    part_means,
    ratio_over,
    recorded_at_seed,
    recorded_seeds,
)

HEADROOM = (
    "random",
    "mopps",
    "envsched",
    "envsched@success+adaptive+covscore",
    "envsched@success+adaptive+covsampled+lr",
)


def section_headroom(
    runs: str, recorded: str, seeds: int, steps: int, jobs: int, every: int = 50, recorded_only: bool = False
) -> None:
    """How far each scheduler's batches are from the most informative batch that step allowed: the
    overrun learner's runs with the pool probed every ``every`` steps (`--probe-every`)."""
    common = {"steps": steps, "seed": 0, "seeds": seeds, "learner": "neural", "eval_every": 50}
    common["learner_config"] = OVERRUN.config
    out = run_benchmark(
        list(HEADROOM),
        jobs=jobs,
        cache_dir=runs,
        recorded_only=recorded_only,
        probe_every=every,
        log=lambda m: print(m, flush=True),
        **common,
    )
    probes = out.get("probes") or {}
    if not probes:
        print(f"headroom: no probed run in {runs}")
        return
    # the probes leave the run as it was: each probed run should repeat its record without probes
    # (name, seed, first step where the probed run and its record differ or None, the record has its CPU)
    twins = []
    for n, per in out["per_seed"].items():
        for seed in per:
            a = list(Path(runs).glob(f"{n}-s{seed}-*.json"))
            b = list(Path(recorded).glob(f"{n}-s{seed}-*.json"))
            if len(a) == 1 and len(b) == 1:
                rec, probed = (json.loads(f[0].read_text()) for f in (b, a))
                has_cpu = bool((rec.get("environment") or {}).get("cpu"))
                twins.append((n, seed, first_departure(rec, probed), has_cpu))
    departed = [f"{n} seed {seed} from step {k}" for n, seed, k, _ in twins if k is not None]
    # departed runs whose record without probes predates runs keeping their CPU
    older_host = [(n, seed) for n, seed, k, has_cpu in twins if k is not None and not has_cpu]
    twin_text = (
        f"{len(twins) - len(departed)} of {len(twins)} probed runs repeat their run recorded without probes "
        "(`bench/runs/neural-overrun/`) step for step"
        + (
            f"; {', '.join(departed)} depart from theirs, all before the first probe (step {every}), so the "
            "probe is not the cause"
            + (
                f" ({len(older_host)} of them against records made before runs kept their CPU, on an earlier "
                "machine: docs/experiments.md has a re-run without probes departing the same way)"
                if older_host
                else ""
            )
            if departed and all(k < every for _, _, k, _ in twins if k is not None)
            else (f"; {', '.join(departed)} depart from theirs" if departed else "")
        )
        + "."
    )
    rows = [
        "| scheduler | step | spread in the pool (uniform pick) | spread in its batch | its halves: exploit, "
        "coverage | its own predictor's top 64 | spread in the history ceiling's batch | spread in the oracle's "
        "batch | batch / history | history / oracle | batch / oracle | zero-var: batch / pool | zero-var: "
        "oracle / pool |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    of_oracle: dict[str, list[float]] = {}  # batch spread / oracle spread, per probe
    of_history: dict[str, list[float]] = {}  # batch spread / history ceiling's, per probe that has it
    history_of_oracle: list[float] = []
    floor = []  # the oracle's zero-variance share / the pool's, per probe
    for n, ps in probes.items():
        for p in ps:
            zb, zo, zp = 1 - p["batch_spread"], 1 - p["oracle_spread"], 1 - p["pool_spread"]
            of_oracle.setdefault(n, []).append(p["batch_spread"] / max(p["oracle_spread"], 1e-9))
            floor.append(zo / max(zp, 1e-9))
            hist = vs_hist = hist_vs = "—"  # probes recorded before the history ceiling existed
            if "history_spread" in p:
                of_history.setdefault(n, []).append(p["batch_spread"] / max(p["history_spread"], 1e-9))
                history_of_oracle.append(p["history_spread"] / max(p["oracle_spread"], 1e-9))
                hist, vs_hist = f"{p['history_spread']:.3f}", f"{of_history[n][-1]:.2f}"
                hist_vs = f"{history_of_oracle[-1]:.2f}"
            halves = p.get("half_spread") or {}
            split = (
                f"{halves['exploit']:.3f}, {halves['coverage']:.3f}"
                if "exploit" in halves and "coverage" in halves
                else "—"
            )
            own = f"{p['model_spread']:.3f}" if "model_spread" in p else "—"
            rows.append(
                f"| {n} | {p['step']:.0f} | {p['pool_spread']:.3f} | {p['batch_spread']:.3f} | {split} | {own} | {hist} | "
                f"{p['oracle_spread']:.3f} | {vs_hist} | {hist_vs} | {of_oracle[n][-1]:.2f} | "
                f"{zb / max(zp, 1e-9):.2f} | {floor[-1]:.2f} |"
            )
    S = out["schedulers"]
    zr = S["random"]["zero_variance_fraction"] if "random" in S else None
    run_rows = [
        "| scheduler | seeds | zero-var frac (whole run) | × random | mean over the probes: batch | history "
        "ceiling | oracle | pool |"
    ]
    run_rows.append("|---|---|---|---|---|---|---|---|")
    for n, ps in probes.items():
        z = S[n]["zero_variance_fraction"]
        zb, zo, zp = (
            float(np.mean([1 - p[k] for p in ps])) for k in ("batch_spread", "oracle_spread", "pool_spread")
        )
        zh = [1 - p["history_spread"] for p in ps if "history_spread" in p]
        zh_text = f"{np.mean(zh):.3f}" if len(zh) == len(ps) else "—"
        vs_random = f"{z / zr:.2f}" if zr else "—"
        run_rows.append(
            f"| {n} | {S[n]['seeds']} | {z:.3f} | {vs_random} | {zb:.3f} | {zh_text} | {zo:.3f} | {zp:.3f} |"
        )
    last = max(p["step"] for ps in probes.values() for p in ps)
    reading = (
        f"Reading: an oracle with a fresh look at the whole pool leaves {min(floor):.2f}-{max(floor):.2f} of "
        "the pool's zero-variance share at the probes, so in one step the zero-variance target of the table "
        "above (0.6x random's) is within reach of a scheduler that predicted as well as a fresh probe. The "
        "batches' spread as a share of the oracle's, mean over the probes: "
        + ", ".join(f"{n} {np.mean(r):.2f}" for n, r in of_oracle.items())
        + f". It falls for every scheduler as the pool saturates (pool spread at step {last:.0f}: "
        + ", ".join(
            f"{np.mean([p['pool_spread'] for p in ps if p['step'] == last]):.2f}" for ps in probes.values()
        )
        + ")."
    )
    if history_of_oracle:
        reading += (
            " How much of that the run's history holds: the history ceiling (docs/algorithm.md §9; a model "
            "of the history before the step, fitted on a fresh draw of the rest of the pool, which no "
            f"scheduler has) finds {np.median(history_of_oracle):.2f} of the oracle's spread (median over the "
            f"probes; {min(history_of_oracle):.2f}-{max(history_of_oracle):.2f}), and the schedulers' batches "
            "find, of the ceiling's spread (mean over the probes): "
            + ", ".join(f"{n} {np.mean(r):.2f}" for n, r in of_history.items())
            + "."
        )
    own_of_history = {  # the scheduler's own predictor's top |batch| / the ceiling's, per scheduler
        n: [
            p["model_spread"] / max(p["history_spread"], 1e-9)
            for p in ps
            if "model_spread" in p and "history_spread" in p
        ]
        for n, ps in probes.items()
    }
    own_of_history = {n: r for n, r in own_of_history.items() if r}
    if own_of_history:
        reading += (
            " The schedulers' own chance of spread, read without quotas or halves (its top 64), finds of the "
            "ceiling's spread: "
            + ", ".join(f"{n} {np.mean(r):.2f}" for n, r in own_of_history.items())
            + "; where that is near 1, what its batch leaves is spent by the batch's own rules (the "
            "coverage half, the success weighting, the repetition limits), not by what it fails to predict. "
            "These are one-step comparisons: the oracle's and the ceiling's top 64 are taken once, from a "
            "history the scheduler's own rules produced. Taken every step, the most likely tasks are trained "
            "away and the history that tells the next ones apart grows thinner: the variant that spends "
            "nothing on those rules (`envsched@success+covsampled+lr+floor100+rho0.125`, tables above) has "
            "fewer groups without spread late in its runs and more early, and no fewer over a run "
            "(docs/experiments.md)."
        )
    plot = headroom_plot(probes, HERE / "neural_headroom.png")
    write_section(
        "neural_headroom",
        "\n".join(
            [
                "## Headroom: how many informative groups a step could have had (neural learner, overrun setting)",
                "",
                f"The overrun learner's runs (settings as above) with the whole pool probed every {every} steps "
                "(`envsched bench scheduler --probe-every`): two fresh groups of G = 8 episodes of each of the "
                "2550 training tasks at the learner's current weights, nothing learned from them. *Pool*: the "
                "share of tasks whose second group has reward spread (what a uniform pick finds); *batch*: "
                "the same share among the tasks the scheduler picked that step; *oracle*: among the 64 tasks "
                "with the most reward variance in the first group; *its halves*: the batch's share per half (envsched); *its own predictor's top 64*: among the 64 tasks with the highest chance of spread by the scheduler's own estimate (envsched's d_hat, or its spread model's), quotas and halves aside; *history ceiling*: among the 64 tasks a model of the run's history ranks first, fitted on the first group of the rest of the pool (docs/algorithm.md §9). The oracle spends a probe of the whole pool "
                "(40 times a step's rollouts) on one choice, so a scheduler that sees only history is not expected to get "
                "below its zero-variance share. Means over seeds "
                f"{', '.join(str(s) for s in sorted(next(iter(out['per_seed'].values()))))}; runs in "
                f"`bench/runs/{Path(runs).name}/`. {twin_text} {provenance_text(out['provenance'])}",
                "",
                *rows,
                "",
                "Over the whole run (zero-variance shares; the probe columns are means over the probe steps):",
                "",
                *run_rows,
                "",
                reading,
                "",
                f"![headroom]({Path(plot).name})",
            ]
        ),
        after="neural_overrun_seeds",
    )


def _oracle_by_seed(runs: str, config: dict, steps: int) -> list[str]:
    """Per seed, the oracle's recorded runs in ``runs`` (learner ``config``) beside random's and the
    recommended envsched form's at that seed: zero-variance share and held-out against random."""
    seeds = recorded_seeds(runs, "oracle")
    lr = BESIDE_ORACLE[-1]
    rows = [
        "| seed | oracle: zero-var × random | oracle: Δ held-out seen | oracle: Δ held-out unseen | "
        f"{lr}: zero-var × random | Δ seen | Δ unseen |",
        "|---|---|---|---|---|---|---|",
    ]
    below = []  # seeds where the form is below random on unseen held-out: (seed, form's, oracle's)
    per: dict[str, dict[int, dict]] = {n: {} for n in ("random", lr, "oracle")}
    for s in seeds:
        S = recorded_at_seed(["random", lr, "oracle"], runs, s, config, steps)
        if "random" not in S:
            continue
        for n in per:
            if n in S:
                per[n][s] = S[n]
        cells = []
        for n in ("oracle", lr):
            if n not in S:
                cells += ["—"] * 3
                continue
            cells += [f"{S[n]['zero_variance_fraction'] / S['random']['zero_variance_fraction']:.2f}"]
            cells += [
                f"{S[n][k] - S['random'][k]:+.4f}" for k in ("heldout_seen_final", "heldout_unseen_final")
            ]
        rows.append(f"| {s} | " + " | ".join(cells) + " |")
        if lr in S and "oracle" in S and S[lr]["heldout_unseen_final"] < S["random"]["heldout_unseen_final"]:
            d = {
                n: S[n]["heldout_unseen_final"] - S["random"]["heldout_unseen_final"] for n in (lr, "oracle")
            }
            below.append((s, d[lr], d["oracle"]))
    if len(rows) == 2:
        return []
    both = sorted(set(per["random"]) & set(per["oracle"]) & set(per[lr]))
    if len(both) > 1:  # over the seeds every row shares: ratio of means, mean Δ ± sd, seeds above
        cells = []
        for n in ("oracle", lr):
            cells += [f"{ratio_over(per[n], per['random'], 'zero_variance_fraction', both):.2f}"]
            cells += [
                paired_mean(per[n], per["random"], k, both)
                for k in ("heldout_seen_final", "heldout_unseen_final")
            ]
        rows.append(f"| mean over {len(both)} seeds | " + " | ".join(cells) + " |")
    note = "; ".join(f"seed {s}: the form {a:+.4f}, the oracle {b:+.4f}" for s, a, b in below)
    return [
        *rows,
        "",
        (
            f"Where the form is below random on unseen held-out ({note}), the oracle is "
            + (
                "below random too"
                if all(b < 0 for _, _, b in below)
                else "above random"
                if all(b > 0 for _, _, b in below)
                else "above random at some and below at others"
            )
            + "."
        )
        if below
        else "",
    ]


def section_oracle(runs: str, steps: int, default_runs: str | None = None) -> None:
    """A ceiling over whole runs: the neural learner's oracle (each step one fresh group of
    ORACLE_CANDIDATES random tasks, the batch the most varied of them) beside random, MoPPS and the
    recommended envsched form over the oracle's seeds, on the overrun learner; with ``default_runs``,
    the default learner's oracle runs seed by seed. Records only."""
    seeds = recorded_seeds(runs, "oracle")
    if not seeds:
        print(f"neural_oracle: no oracle run in {runs}; section left as it was")
        return
    names = [*BESIDE_ORACLE, "oracle"]
    out = run_benchmark(
        names,
        steps=steps,
        seed=seeds[0],
        seeds=seeds[-1] - seeds[0] + 1,  # every row over the oracle's seeds (a seed range)
        learner="neural",
        eval_every=50,
        recorded_only=True,
        log=lambda _m: None,
        cache_dir=runs,
        learner_config=OVERRUN.config,
    )
    S, P, setup = out["schedulers"], out["paired_vs_random"], out["setup"]
    quarters = {n: part_means(x["zero_variance_fraction"]) for n, x in out["series"].items()}
    trained = setup["batch_size"] * setup["group_size"]
    looked = ORACLE_CANDIDATES * setup["group_size"]
    rnd = S["random"]
    rows = [
        "| scheduler | seeds | batch var × random | zero-var frac | × random | zero-var frac by quarter | distinct "
        "tasks | max picks of a task | held-out seen | Δ vs random (± sd), wins | held-out unseen | Δ vs random, "
        "wins | episodes a step |",
        "|" + "---|" * 13,
    ]

    for n, m in S.items():
        episodes = (
            f"{trained + looked} ({trained} trained + {looked} looked at)" if n == "oracle" else f"{trained}"
        )
        rows.append(
            f"| {n} | {m['seeds']} | {m['batch_variance'] / rnd['batch_variance']:.2f} | "
            f"{m['zero_variance_fraction']:.3f} | {m['zero_variance_fraction'] / rnd['zero_variance_fraction']:.2f} | "
            + " / ".join(f"{x:.2f}" for x in quarters[n])
            + f" | {m['distinct_tasks']:.0f} | {m['max_task_picks']:.1f} | {m['heldout_seen_final']:.4f} | "
            f"{paired_cell(P.get(n), 'heldout_seen_final')} | {m['heldout_unseen_final']:.4f} | "
            f"{paired_cell(P.get(n), 'heldout_unseen_final')} | {episodes} |"
        )
    lr = BESIDE_ORACLE[-1]
    zv = {n: m["zero_variance_fraction"] for n, m in S.items()}
    ratio = zv["oracle"] / zv["random"]
    # the share of the oracle's picks whose look had spread: below 1, its look of ORACLE_CANDIDATES
    # tasks held fewer than B with spread
    look = part_means(np.asarray(out["series"]["oracle"]["predicted_nonzero"], dtype=float))
    quarter_ratio = [a / b for a, b in zip(quarters["oracle"], quarters["random"], strict=True)]
    reading = (
        f"Reading: over whole runs the oracle's groups are without spread {ratio:.2f}x as often as random's "
        f"({'within' if ratio <= 0.6 else 'short of'} the 0.6x target of issue 17)"
        + (
            f", the recommended envsched form's {zv[lr] / zv['random']:.2f}x over the same seeds: looking first "
            + (
                f"leaves {zv['oracle'] / zv[lr]:.2f} of the form's groups without spread"
                if zv["oracle"] < zv[lr]
                else f"wastes {zv['oracle'] / zv[lr]:.2f}x as many groups as the form"
            )
            if lr in zv
            else ""
        )
        + ". Per quarter of the run, the oracle's share against random's: "
        + ", ".join(f"{r:.2f}x" for r in quarter_ratio)
        + "; the share of its picks whose look had spread: "
        + ", ".join(f"{x:.2f}" for x in look)
        + (
            f". Where that is below 1 its look of {ORACLE_CANDIDATES} random tasks held fewer than "
            f"{setup['batch_size']} with spread (about {min(look) * setup['batch_size'] / ORACLE_CANDIDATES:.1%} "
            "of the pool in its worst quarter): training on the most informative tasks first solves them, and "
            "the pool it leaves has less spread to find. "
            if min(look) < 1
            else ". "
        )
        + f"The oracle is not a scheduler: it spends {looked / trained:.0f} times a step's rollouts looking, "
        "never counts in a target's *best of all schedulers*, and picks on spread alone (no coverage half, no "
        "repetition limit), so its held-out columns show what a batch of the most informative groups does to "
        "generalization on this learner, not a bound on it."
    )
    plot = heldout_plots(out, HERE / "neural_oracle.png")
    default = _oracle_by_seed(default_runs, NO_FORCED_STOP, steps) if default_runs else []
    if default:
        default = [
            "On the default learner (no forced stop in the loss, no overrun penalty: what `envsched train` runs; "
            f"runs in `bench/runs/{Path(default_runs).name}/`), seed by seed, against random at the same seed:",
            "",
            *default,
            "",
        ]
    write_section(
        "neural_oracle",
        "\n".join(
            [
                "## A ceiling over whole runs: the oracle that looks before it picks (neural learner, overrun setting)",
                "",
                "The headroom probe above compares one step's batch with the best that step allowed. This asks the "
                "same over whole runs: each step the oracle (`envsched bench scheduler --learner neural --schedulers "
                f"oracle`) rolls one fresh group of G episodes of {ORACLE_CANDIDATES} random pool tasks at the "
                "learner's current weights, learns nothing from them, and trains on the B most varied, rolled "
                "again (its groups' spread is a fresh draw, as every scheduler's). Learner settings "
                f"{', '.join(f'`{k}={json.dumps(v)}`' for k, v in OVERRUN.config.items())}, {setup['steps']} steps, "
                f"B = {setup['batch_size']}, G = {setup['group_size']}; runs in `bench/runs/{Path(runs).name}/`, the "
                f"rows beside the oracle are the records of the tables above over the oracle's seeds "
                f"({', '.join(map(str, seeds))}). " + provenance_text(out["provenance"]),
                "",
                *rows,
                "",
                *steps_to_random_final(out["per_seed"], steps),
                "",
                reading,
                "",
                *default,
                f"![oracle]({Path(plot).name})",
            ]
        ),
        after="neural_headroom",
    )
