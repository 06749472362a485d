"""The coverage share steered by a validation slice (issue 17's other suggested adaptive share),
against the recommended form re-run on the same machine at the same seeds."""

from __future__ import annotations

import numpy as np

from envsched_pipeline.analysis.bench import provenance_text
from sections.common import write_section
from sections.paired import KINDS, paired_with_form
from sections.records import record_of

VALSLICE = "envsched@success+adaptive+covsampled+lr+valslice"


def section_valslice(runs: str, base_runs: str, steps: int, batch: int = 64, group: int = 8) -> None:
    """The validation-slice variant and the form, both recorded in ``runs`` (one machine), paired
    seed by seed; ``base_runs``: the form's own records, to say whether this machine repeats them."""
    pair = paired_with_form(runs, base_runs, VALSLICE, steps)
    if pair is None:
        return
    seeds, per, form = pair.seeds, pair.per, pair.form
    rollouts = steps * batch * group
    rows = [
        "| seed | form seen | valslice seen | Δ seen | form unseen | valslice unseen | Δ unseen | "
        "zero-var: form | valslice | slice score: first look | last look | steps at rho (slice stalled) "
        "| slice episodes / training rollouts |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in seeds:
        a, b = per[form][s], per[VALSLICE][s]
        looks = record_of(runs, VALSLICE, s)["validation"]
        rows.append(
            f"| {s} | {' | '.join(pair.heldout_cells(s))} | {a['zero_variance_fraction']:.3f} | "
            f"{b['zero_variance_fraction']:.3f} | {looks[0]['mean']:.4f} | {looks[-1]['mean']:.4f} | "
            f"{b['validation_stalled_share']:.2f} | {b['validation_episodes'] / rollouts:.3f} |"
        )
    never = [s for s in seeds if per[VALSLICE][s]["validation_stalled_share"] == 0]
    same = [s for s in never if all(pair.delta[k][seeds.index(s)] == 0 for k in KINDS)]
    stalled = np.mean([per[VALSLICE][s]["validation_stalled_share"] for s in seeds])
    body = [
        "## Experiment: a coverage share steered by a validation slice (default learner)",
        "",
        f"`{VALSLICE}`: the recommended form whose adaptive coverage share falls back to rho while "
        "held-out progress on a validation slice stalls (issue 17's other suggested adaptive share; "
        "docs/algorithm.md §6). Every 10 steps the bench scores the policy on 48 tasks of 12 "
        "unseen-family environments that neither the pool nor the held-out split contains (8 episodes "
        "each, one sampling seed for every look); while the mean of the last three scores is not above "
        "the three before, the share is rho. " + pair.machine_sentence("neural-noforced-avx2"),
        "",
        *rows,
        "",
        pair.summary("The slice")
        + f"; zero-variance share {pair.ratio('zero_variance_fraction'):.2f}x the form's. The slice "
        f"stalled on {stalled:.0%} of the steps on average"
        + (": it kept rising through most runs, so the rule seldom acted" if stalled < 0.25 else "")
        + f"; at {len(never)} of {len(seeds)} seeds it never stalled, and there "
        f"({len(same)} of those) the run is the form's own to the last digit (scoring the slice leaves "
        "training as it was). Verdict: "
        f"**{pair.verdict()}** (kept only if ahead on both kinds beyond the 95% t interval over seeds). "
        + provenance_text(pair.provenance),
    ]
    write_section("neural_valslice", "\n".join(body), after="neural_within_run")
