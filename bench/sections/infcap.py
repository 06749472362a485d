"""The useful-breadth quota (C3 counted over informative groups; issue 17's third suggested
mechanism), against the recommended form re-run on the same machine at the same seeds."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from envsched_pipeline.analysis.bench import provenance_text
from envsched_pipeline.analysis.plots import breadth_window_plot
from envsched_pipeline.analysis.trace import window_concentration
from sections.common import HERE, write_section
from sections.paired import paired_with_form

INFCAP = "envsched@success+adaptive+covsampled+lr+infcap2"


def section_infcap(runs: str, base_runs: str, steps: int, n_envs: int = 51) -> None:
    """The useful-breadth quota and the form, both recorded in ``runs`` (one machine, their pick
    traces in ``runs``/traces), paired seed by seed; ``base_runs``: the form's own records."""
    pair = paired_with_form(runs, base_runs, INFCAP, steps)
    if pair is None:
        return
    seeds, per, form = pair.seeds, pair.per, pair.form
    rows = [
        "| seed | form seen | infcap2 seen | Δ seen | form unseen | infcap2 unseen | Δ unseen | "
        "zero-var: form | infcap2 | batch var: form | infcap2 | effective envs: form | infcap2 | "
        "most-served env's informative groups per 3 steps: form | infcap2 | informative groups above "
        "twice the fair share: form | infcap2 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    windows = {name: [] for name in (form, INFCAP)}  # at the seeds where both runs left a trace
    for s in seeds:
        cells = list(pair.heldout_cells(s))
        for metric, nd in (("zero_variance_fraction", 3), ("batch_variance", 4), ("effective_envs", 1)):
            cells += [f"{per[name][s][metric]:.{nd}f}" for name in (form, INFCAP)]
        traces = {name: Path(runs) / "traces" / f"{name}-s{s}.parquet" for name in windows}
        w = {name: window_concentration(t, n_envs) if t.exists() else None for name, t in traces.items()}
        for key, nd in (("most_served", 1), ("above_twice_fair", 3)):
            cells += [f"{w[name][key]:.{nd}f}" if w[name] else "—" for name in windows]
        if all(w.values()):
            for name in windows:
                windows[name].append(w[name])
        rows.append(f"| {s} | {' | '.join(cells)} |")
    concentration = ""
    if windows[form]:

        def mean_of(name: str, key: str) -> float:
            return float(np.mean([w[key] for w in windows[name]]))

        concentration = (
            f"At the {len(windows[form])} seeds where both runs left a pick trace, the most-served "
            f"environment of a 3-step window held {mean_of(INFCAP, 'most_served'):.1f} informative groups "
            f"under the quota against {mean_of(form, 'most_served'):.1f} under the form, and "
            f"{mean_of(INFCAP, 'above_twice_fair'):.1%} of the informative groups sat above twice the "
            f"fair share against {mean_of(form, 'above_twice_fair'):.1%}. "
        )
    plot = breadth_window_plot(
        {
            ("the quota" if n == INFCAP else "the form"): list(np.mean([w["by_window"] for w in ws], axis=0))
            for n, ws in windows.items()
            if ws
        },
        {k: dict(zip(seeds, pair.delta[k], strict=True)) for k in pair.delta},
        HERE / "neural_infcap.png",
    )
    against_random = (
        "Against random's records, made on the AVX-512 machines (random's runs do not repeat step for "
        "step here either, docs/experiments.md; so each seed pairs the same pool, split and warm start "
        "with independent run luck, like a second draw): the form re-run here "
        f"{pair.over_random(form, 'seen')} seen, {pair.over_random(form, 'unseen')} unseen; the quota "
        f"{pair.over_random(INFCAP, 'seen')} seen, {pair.over_random(INFCAP, 'unseen')} unseen. "
    )
    against_random += pair.beside_random_here("the quota")
    relax = {name: [per[name][s]["relaxations"] for s in seeds] for name in (form, INFCAP)}
    body = [
        "## Experiment: a useful-breadth quota counted over informative groups (default learner)",
        "",
        f"`{INFCAP}`: the recommended form with C3 also counted over informative groups (issue 17's "
        "third suggested mechanism; docs/algorithm.md §6): an environment's groups with spread at the "
        "two previous steps, plus this step's picks in it counted by their predicted chance of spread, "
        "stay under twice the fair share (those steps' informative groups per step, times 3, over the "
        "51 environments). The pick quotas spread picks, not the signal. "
        + pair.machine_sentence("neural-noforced-avx2"),
        "",
        *rows,
        "",
        f"![the most-served environment per window, and the quota against the form per seed]({Path(plot).name})",
        "",
        "Effective envs: the exponential of the entropy of the run's informative groups over "
        "environments (51 at most). "
        + concentration
        + against_random
        + pair.summary("The quota")
        + f"; zero-variance share {pair.ratio('zero_variance_fraction'):.2f}x the form's, batch "
        f"variance {pair.ratio('batch_variance'):.2f}x; "
        + (
            "no step of either had to relax a constraint (the quota always left enough candidates)"
            if not any(relax[form] + relax[INFCAP])
            else f"{np.mean(relax[INFCAP]):.2f} relaxations a step (the form {np.mean(relax[form]):.2f})"
        )
        + ". Verdict: "
        f"**{pair.verdict()}** (kept only if ahead on both kinds beyond the 95% t interval over seeds). "
        + provenance_text(pair.provenance),
    ]
    write_section("neural_infcap", "\n".join(body), after="neural_valslice")
