"""Where the picks went: traces of the overrun learner's runs."""

from __future__ import annotations

import json
from pathlib import Path

from envsched_pipeline.analysis.bench import (
    run_benchmark,
)
from envsched_pipeline.analysis.trace import known_informative, summarize_traces
from sections.common import OVERRUN, write_section

TRACED = (
    "random",
    "mopps",
    "envsched@success+adaptive+covscore",
    "envsched@success+adaptive+covscore+memory32",
    "envsched@success+adaptive+covsampled",
    "envsched@success+adaptive+covsampled+lr",
)
_PREVIOUS = ("first look", "spread", "flat, solved", "flat, partial", "flat, failed")


def section_traces(traces: str, recorded: str, steps: int, jobs: int, recorded_only: bool = False) -> None:
    """Where the picks went and what they found: the overrun learner's seed-0 runs of a few
    schedulers traced (`bench scheduler --trace`), every pick beside its group's outcome."""
    tdir = Path(traces)
    repeats_file = tdir / "repeats.json"
    if not recorded_only:
        out = run_benchmark(
            list(TRACED),
            steps=steps,
            seed=0,
            seeds=1,
            learner="neural",
            eval_every=50,
            learner_config=OVERRUN.config,
            jobs=jobs,
            cache_dir=recorded,
            trace_dir=tdir,
            log=lambda m: print(m, flush=True),
        )
        repeats_file.write_text(json.dumps(out["trace_repeats"], indent=1, sort_keys=True) + "\n")
    files = sorted(tdir.glob("*.parquet"))
    if not files:
        print(f"traces: no trace in {tdir}")
        return
    repeats = json.loads(repeats_file.read_text()) if repeats_file.exists() else {}
    summary = summarize_traces(files)
    by = {}
    for r in summary["by_previous"]:
        by.setdefault((r["scheduler"], r["quarter"]), {})[r["what"]] = r
    names = [n for n in TRACED if any(k[0] == n for k in by)]
    head = " | ".join(f"{w}: picks, spread" for w in _PREVIOUS)
    rows = [
        f"| scheduler | quarter | spread, all picks | {head} |",
        "|---|---|---|" + "---|" * len(_PREVIOUS),
    ]
    for n in names:
        for q in range(4):
            cell = by.get((n, q), {})
            total = sum(r["picks"] for r in cell.values())
            if not total:
                continue
            spread = sum(r["picks"] * r["spread"] for r in cell.values()) / total
            parts = [
                f"{cell[w]['picks'] / total:.2f}, {cell[w]['spread']:.2f}" if w in cell else "—"
                for w in _PREVIOUS
            ]
            rows.append(f"| {n} | {q + 1} | {spread:.2f} | {' | '.join(parts)} |")
    at = [50, 100, 150, steps - 1]
    known = {(r["scheduler"], r["step"]): r["tasks"] for r in known_informative(files, at)}
    krows = ["| scheduler | " + " | ".join(f"step {t}" for t in at) + " |", "|---|" + "---|" * len(at)]
    for n in names:
        krows.append(f"| {n} | " + " | ".join(f"{known.get((n, t), 0):.0f}" for t in at) + " |")
    checked = [
        f"{n}: " + ("repeats" if dep is None else f"departs at step {dep}")
        for n, per in repeats.items()
        for dep in per.values()
    ]
    rerun_text = (
        "Each traced run is a re-run of its record in `bench/runs/neural-overrun/`; against it: "
        + "; ".join(checked)
        + " (step for step; where a re-run departs, its trace follows the re-run from that step on, a run "
        "with the same settings that the recording machine did not make)."
        if checked
        else ""
    )
    c, r, m = "envsched@success+adaptive+covscore", "random", "mopps"
    reading = ""
    if (c, 3) in by and (r, 3) in by:
        none = {"picks": 0, "spread": float("nan"), "median_age": None}
        late, late_r = by[(c, 3)], by[(r, 3)]
        tot = sum(x["picks"] for x in late.values())
        solved, prev = late.get("flat, solved", none), late.get("spread", none)
        others = ", ".join(f"{n} {known.get((n, 150), 0):.0f}" for n in (r, m) if (n, 150) in known)
        reading = (
            f"Reading (last quarter of the covscore form's run): {prev['picks'] / tot:.2f} of its picks went to "
            f"tasks whose previous group had spread ({prev['spread']:.2f} of those had spread again) and "
            f"{solved['picks'] / tot:.2f} to tasks whose previous group was all solved, a median "
            f"{solved['median_age'] or 0:.0f} steps earlier ({solved['spread']:.2f} of those had spread; random's picks "
            f"of that kind {late_r.get('flat, solved', none)['spread']:.2f}). "
            f"At step 150 it knew of {known.get((c, 150), 0):.0f} tasks with recent spread ({others}): "
            "it concentrates on fewer tasks and solves them, so the tasks it has just seen with spread no longer "
            "fill a batch, and the other slots go to tasks whose spread the history predicts poorly."
        )
    write_section(
        "neural_traces",
        "\n".join(
            [
                "## Where the picks went: traces of the overrun learner's runs",
                "",
                "Seed 0 of the overrun learner (settings as above) for "
                + ", ".join(names)
                + ", traced with `envsched bench scheduler --trace` (every pick beside its group's outcome; "
                f"files in `bench/runs/{tdir.name}/`, summary also from `envsched bench trace`). {rerun_text} "
                "Per quarter of the run: the share of picks with spread, then for each kind of *previous "
                "group of the same task in the run* (first look: never picked before; spread; flat: all "
                "solved, all at one partial credit, all failed) the share of the quarter's picks it covers "
                "and the share of those with spread.",
                "",
                *rows,
                "",
                "Tasks a scheduler knew to be informative: picked within the 10 steps before the step, "
                "with spread in their latest group (a batch is 64 tasks).",
                "",
                *krows,
                "",
                reading,
            ]
        ),
        after="neural_headroom",
    )
