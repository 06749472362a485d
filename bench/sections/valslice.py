"""The coverage share steered by a validation slice (issue 17's other suggested adaptive share),
against the recommended form re-run on the same machine at the same seeds."""

from __future__ import annotations

import numpy as np

from envsched_pipeline.analysis.bench import provenance_text, run_benchmark
from sections.common import BESIDE_ORACLE, write_section
from sections.records import mean_se_wins, record_of, recorded_seeds

VALSLICE = "envsched@success+adaptive+covsampled+lr+valslice"
KINDS = ("seen", "unseen")


def section_valslice(runs: str, base_runs: str, steps: int, batch: int = 64, group: int = 8) -> None:
    """The validation-slice variant and the form, both recorded in ``runs`` (one machine), paired
    seed by seed; ``base_runs``: the form's own records, to say whether this machine repeats them."""
    form = BESIDE_ORACLE[-1]
    seeds = sorted(set(recorded_seeds(runs, form)) & set(recorded_seeds(runs, VALSLICE)))
    if not seeds:
        return
    kw = {"steps": steps, "learner": "neural", "eval_every": 50, "recorded_only": True, "learner_config": {}}
    kw |= {"seed": seeds[0], "seeds": seeds[-1] - seeds[0] + 1, "log": lambda _m: None}
    out = run_benchmark([form, VALSLICE], cache_dir=runs, **kw)
    per = out["per_seed"]
    base = run_benchmark([form], cache_dir=base_runs, **kw)["per_seed"].get(form, {})
    repeats = [
        s
        for s in seeds
        if s in base and base[s]["heldout_unseen_final"] == per[form][s]["heldout_unseen_final"]
    ]
    rollouts = steps * batch * group
    rows = [
        "| seed | form seen | valslice seen | Δ seen | form unseen | valslice unseen | Δ unseen | "
        "zero-var: form | valslice | slice score: first look | last look | steps at rho (slice stalled) "
        "| slice episodes / training rollouts |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    d = {k: [] for k in KINDS}
    for s in seeds:
        a, b = per[form][s], per[VALSLICE][s]
        cells = []
        for k in KINDS:
            x, y = a[f"heldout_{k}_final"], b[f"heldout_{k}_final"]
            d[k].append(y - x)
            cells += [f"{x:.4f}", f"{y:.4f}", f"{y - x:+.4f}"]
        looks = record_of(runs, VALSLICE, s)["validation"]
        rows.append(
            f"| {s} | {' | '.join(cells)} | {a['zero_variance_fraction']:.3f} | "
            f"{b['zero_variance_fraction']:.3f} | {looks[0]['mean']:.4f} | {looks[-1]['mean']:.4f} | "
            f"{b['validation_stalled_share']:.2f} | {b['validation_episodes'] / rollouts:.3f} |"
        )
    zv = [per[VALSLICE][s]["zero_variance_fraction"] / per[form][s]["zero_variance_fraction"] for s in seeds]
    never = [s for s in seeds if per[VALSLICE][s]["validation_stalled_share"] == 0]
    same = [s for s in never if all(d[k][seeds.index(s)] == 0 for k in KINDS)]
    stalled = np.mean([per[VALSLICE][s]["validation_stalled_share"] for s in seeds])
    verdict = (
        "kept"
        if all(np.mean(d[k]) - 2 * np.std(d[k], ddof=1) / np.sqrt(len(d[k])) > 0 for k in KINDS)
        else "not kept"
    )
    body = [
        "## Experiment: a coverage share steered by a validation slice (default learner)",
        "",
        f"`{VALSLICE}`: the recommended form whose adaptive coverage share falls back to rho while "
        "held-out progress on a validation slice stalls (issue 17's other suggested adaptive share; "
        "docs/algorithm.md §6). Every 10 steps the bench scores the policy on 48 tasks of 12 "
        "unseen-family environments that neither the pool nor the held-out split contains (8 episodes "
        "each, one sampling seed for every look); while the mean of the last three scores is not above "
        "the three before, the share is rho. The main tables' records were made on CPUs with AVX-512; "
        f"this experiment ran where the form's records do not repeat (at {len(repeats)} of its "
        f"{len(seeds)} seeds the form re-run here ends where its record does), so both rows were run "
        f"on one machine at seeds {', '.join(map(str, seeds))} and are paired here, not against the "
        "records (`bench/runs/neural-noforced-avx2/`). Final held-out (step 200).",
        "",
        *rows,
        "",
        f"The slice against the form, mean ± s.e. over seeds (seeds where it is ahead): seen {mean_se_wins(d['seen'])}, "
        f"unseen {mean_se_wins(d['unseen'])}; zero-variance share {np.mean(zv):.2f}x the form's. The slice "
        f"stalled on {stalled:.0%} of the steps on average"
        + (": it kept rising through most runs, so the rule seldom acted" if stalled < 0.25 else "")
        + f"; at {len(never)} of {len(seeds)} seeds it never stalled, and there "
        f"({len(same)} of those) the run is the form's own to the last digit (scoring the slice leaves "
        "training as it was). Verdict: "
        f"**{verdict}** (kept only if ahead on both kinds beyond two standard errors). "
        + provenance_text(out["provenance"]),
    ]
    write_section("neural_valslice", "\n".join(body), after="neural_within_run")
