"""Section ``pipeline_neural``: the neural learner through the product rather than the benchmark's
own loop. `envsched train --policy neural --resident` runs the recommended form and random side by
side (each its own lake and Dagster instance, the default synthetic pool, 64 x 8), and
`envsched report --against` compares them: what a user who asks "does the schedule help my run?"
is shown. One seed of each is one draw (the neural tables give the spread over seeds); the section
also measures what a step costs through the Dagster jobs. Its record (``bench/runs/pipeline``) is
committed, so RESULTS is rebuilt from it without the runs (about 25 minutes on 2 cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from envsched_pipeline.analysis.compare import VERDICT_WORD
from sections.common import HERE, machine, write_section

RECORDS = HERE / "runs" / "pipeline"
RUNS = (("the form", []), ("random", ["--scheduler", "random"]))
PLAN_EFFECTS = (0.01, 0.02)  # held-out differences the over-seeds reading plans for


def record_path(seed: int, steps: int) -> Path:
    return RECORDS / f"neural-s{seed}-{steps}.json"


def start_train(folder: Path, seed: int, steps: int, eval_every: int, extra: list[str], label: str):
    """`envsched train --policy neural --resident` of the default pool started in ``folder`` (its
    lake, its own Dagster instance, its log; ``extra`` flags after the rest), announced as
    ``label``: (the process, its open log, its start time)."""
    (folder / "dagster_home").mkdir(parents=True)
    env = dict(os.environ, DAGSTER_HOME=str(folder / "dagster_home"), PYTHONUNBUFFERED="1")
    cmd = [
        sys.executable, "-m", "envsched_pipeline.cli", "--lake", str(folder / "lake"), "train",
        "--pool", "synthetic", "--policy", "neural", "--resident", "--seed", str(seed),
        "--steps", str(steps), "--eval-every", str(eval_every), *extra,
    ]  # fmt: skip
    log = open(folder / "train.log", "w")  # noqa: SIM115 - closed once the process ends
    started = (subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log, time.time())
    print(f"{label} ({' '.join(cmd[3:])})", flush=True)
    return started


def run_pair(seed: int, steps: int, eval_every: int) -> dict:
    """Both runs at once through `envsched train`, then the report of the form against random."""
    from envsched_pipeline.lake import Lake  # the step service: this section only

    with tempfile.TemporaryDirectory() as d:
        procs = {
            name: start_train(
                Path(d, name.replace(" ", "-")),
                seed,
                steps,
                eval_every,
                extra,
                f"pipeline_neural: started {name}",
            )
            for name, extra in RUNS
        }
        walls, codes = {}, {}
        while len(walls) < len(procs):  # each run's own end, whichever finishes first
            for name, (proc, log, t0) in procs.items():
                if name not in walls and proc.poll() is not None:
                    walls[name], codes[name] = time.time() - t0, proc.returncode
                    log.close()
            time.sleep(1)
        for name, rc in codes.items():
            if rc != 0:
                tail = Path(procs[name][1].name).read_text()[-3000:]
                raise RuntimeError(f"`envsched train` for {name} exited {rc}:\n{tail}")
        lakes = {name: Lake(Path(d, name.replace(" ", "-"), "lake")) for name, _ in RUNS}
        return pair_record(lakes, walls, seed, steps, eval_every, Path(d, "report"))


def pair_record(lakes: dict, walls: dict, seed: int, steps: int, eval_every: int, report_dir: Path) -> dict:
    """The record of two finished runs (``lakes``: "the form" and "random"), from the report of the
    form against random, with each run's wall time and its trainer's own seconds."""
    from envsched_pipeline.analysis.passk import heldout_reliability  # the step service: this section only
    from envsched_pipeline.analysis.report import build_report  # the step service: this section only

    index = build_report(lakes["the form"], report_dir, log=print, against=[lakes["random"]])
    summary = json.loads((index.parent / "summary.json").read_text())
    trainer = {
        name: float(sum(r["seconds"] for r in lake.read("train_metrics").to_pylist()))
        for name, lake in lakes.items()
    }
    return {
        "seed": seed,
        "steps": steps,
        "eval_every": eval_every,
        "machine": machine(),
        "recorded": time.strftime("%Y-%m-%d"),
        "wall_seconds": walls,
        "trainer_seconds": trainer,
        "verdicts": summary["verdicts"],
        "heldout_by_env": summary["heldout_by_env"],
        # each run's pass@k and pass^k with their errors at its last evaluation (analysis.passk)
        "heldout_reliability": {name: heldout_reliability(lake) for name, lake in lakes.items()},
        "config": summary["config"],
    }


def reliability_rows(recs: list[dict]) -> list[str]:
    """Held-out over repeated attempts, for the records that keep it (``heldout_reliability``, from
    the 2026-12-07 thirty-ninth session on): each seed's share of tasks solved in one attempt and in
    all K (pass^K, K the episodes a task had), the form's and random's, at the last evaluation."""
    have = [r for r in recs if r.get("heldout_reliability")]
    if not have:
        return []
    rows = [
        "Held-out over repeated attempts (`envsched_pipeline/analysis/passk.py`), where the record keeps it: the "
        "share of tasks solved (reward 1) in one attempt and in all K of a task's evaluation episodes (pass^K), "
        "the form's against random's at the last evaluation (± the form's sampling error at one attempt):",
        "",
        "| seed | held-out | K | solved: the form | random | difference | pass^K: the form | random | difference |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for rec in have:
        rel = rec["heldout_reliability"]
        for kind in ("seen", "unseen"):
            a, b = rel["the form"]["splits"].get(kind), rel["random"]["splits"].get(kind)
            if not a or not b:
                continue
            k = min(a[-1]["k"], b[-1]["k"])
            at = {r["k"]: r for r in a}
            bt = {r["k"]: r for r in b}
            rows.append(
                f"| {rec['seed']} | {kind} | {k} | {at[1]['pass_at_k']:.4f} ± {at[1]['pass_at_k_se']:.4f} | "
                f"{bt[1]['pass_at_k']:.4f} | {at[1]['pass_at_k'] - bt[1]['pass_at_k']:+.4f} | "
                f"{at[k]['pass_hat_k']:.4f} | {bt[k]['pass_hat_k']:.4f} | {at[k]['pass_hat_k'] - bt[k]['pass_hat_k']:+.4f} |"
            )
    return [*rows, ""]


def over_seeds_rows(recs: list[dict]) -> list[str]:
    """The seeds' verdicts judged together, as `envsched compare` judges runs in lakes (the same
    statistics, :func:`envsched_pipeline.analysis.seeds.over_seeds`, on the records' per-seed
    numbers): the mean paired difference by its spread over seeds, and how much of that spread the
    evaluation's sampling explains. Empty with fewer than two seeds."""
    from envsched_pipeline.analysis.seeds import MAX_SEEDS, over_seeds, plan  # scipy: this section only

    if len(recs) < 2:
        return []
    rows = [
        f"Over the {len(recs)} seeds, judged as `envsched compare --runs FORM_LAKES... --against RANDOM_LAKES...` "
        "judges them (mean paired difference ± its standard error over seeds, 95% t interval; for held-out, the sd "
        "of a pair's difference that the evaluation's sampling explains beside the sd over seeds, and the rest's "
        "share of the variance: the runs' luck, which one pair's interval above does not hold):",
        "",
        "| metric | seeds | the form | random | mean difference ± s.e. [95% t interval] | seeds better | sampling sd "
        "/ sd over seeds | runs' luck | seeds to resolve |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    reading = []
    for metric in [v["metric"] for v in recs[0]["verdicts"]]:
        per = [next(v for v in r["verdicts"] if v["metric"] == metric) for r in recs]
        held = metric.startswith("Held-out")
        se = np.array([v["se"] for v in per]) if held else None
        o = over_seeds(np.array([v["diff"] for v in per]), se)
        lower = "Zero-variance" in metric
        better = o["below"] if lower else o["above"]
        split = (
            f"{o['sampling_sd']:.4f} / {o['sd']:.4f} | {100 * o['luck_share']:.0f}%"
            if o["luck_share"] is not None
            else "— | —"
        )
        if held:
            reading.append(
                f"- {metric.split(' ')[1]}: each seed's own verdict {', '.join(VERDICT_WORD[v['better']] for v in per)}; over "
                f"the seeds {VERDICT_WORD[o['better']]}"
                + (
                    f" (about {o['seeds_to_resolve']} seeds would resolve this mean at this spread)."
                    if o["better"] is None and o["seeds_to_resolve"]
                    else f" (no practical number of seeds, over {MAX_SEEDS}, would resolve this mean at this spread)."
                    if o["better"] is None
                    else "."
                )
                + " Planning at this spread (`envsched compare --effect`): a true difference of "
                + "; of ".join(
                    f"{x:+.2f} would be resolved by these {o['n']} seeds with a chance of {p['power_now']:.2f}, "
                    f"with a chance of {p['power']:g} by {p['seeds_for_power'] or f'over {MAX_SEEDS}'} seeds"
                    for x in PLAN_EFFECTS
                    for p in [plan(o, x)]
                )
                + "."
            )
        rows.append(
            f"| {metric} | {o['n']} | {np.mean([v['run'] for v in per]):.4g} | {np.mean([v['base'] for v in per]):.4g} "
            f"| {o['mean']:+.4f} ± {o['se']:.4f} [{o['ci'][0]:+.4f}, {o['ci'][1]:+.4f}] | {better}/{o['n']} | {split} "
            f"| {(o['seeds_to_resolve'] or f'over {MAX_SEEDS}') if o['better'] is None else 'resolved'} |"
        )
    return [*rows, "", *reading, ""]


def section_pipeline_neural(
    seeds: tuple[int, ...] = (0,), steps: int = 200, eval_every: int = 50, rerun: bool = False
) -> None:
    """Run the pairs of ``seeds`` that have no record (or all, with ``rerun``), then write the
    section from every record of ``steps`` steps."""
    for seed in seeds:
        path = record_path(seed, steps)
        if rerun or not path.exists():
            RECORDS.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(run_pair(seed, steps, eval_every), indent=1, default=str))
    recs = sorted(
        (json.loads(p.read_text()) for p in RECORDS.glob(f"neural-s*-{steps}.json")), key=lambda r: r["seed"]
    )
    if not recs:
        return
    rows = [
        "| seed | metric | the form | random | ratio | difference [95% interval] | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    reach, timing = (
        [],
        [
            "| seed | run | wall, min | wall per step, s | trainer per step, s | the rest per step, s |",
            "|---|---|---|---|---|---|",
        ],
    )
    for rec in recs:
        for v in rec["verdicts"]:
            ci = f" [{v['ci'][0]:+.4f}, {v['ci'][1]:+.4f}]" if v.get("ci") else ""
            rows.append(
                f"| {rec['seed']} | {v['metric']} | {v['run']:.4f} | {v['base']:.4f} | {v['ratio']:.2f}x | "
                f"{v['diff']:+.4f}{ci} | {VERDICT_WORD[v['better']]} |"
            )
            if v.get("reach"):
                r = v["reach"]
                where = (
                    f"reached it at step {r['reached_at']}"
                    if r["reached_at"] is not None
                    else f"did not reach it within {steps} steps"
                )
                reach.append(
                    f"- seed {rec['seed']}, {v['metric'].split(' ')[1]}: random's best {r['best']:.4f} (its step "
                    f"{r['best_step']}); the form {where}."
                )
        for name, wall in rec["wall_seconds"].items():
            tr = rec["trainer_seconds"][name]
            if wall is None:  # not measured (the record's notes say why)
                timing.append(f"| {rec['seed']} | {name} | — | — | {tr / steps:.2f} | — |")
                continue
            timing.append(
                f"| {rec['seed']} | {name} | {wall / 60:.1f} | {wall / steps:.2f} | {tr / steps:.2f} | "
                f"{(wall - tr) / steps:.2f} |"
            )
    over = over_seeds_rows(recs)
    solved = reliability_rows(recs)
    dates = sorted({r["recorded"] for r in recs})
    machines = sorted({r["machine"] for r in recs})
    write_section(
        "pipeline_neural",
        "\n".join(
            [
                "## The neural learner through the product: the form against random, `envsched report --against`",
                "",
                f"Learner: the **neural** learner, run by `envsched train --policy neural --resident --seed S "
                f"--steps {steps} --eval-every {recs[0]['eval_every']}` on the default synthetic pool (64 tasks x 8 "
                "rollouts), once with the default scheduler (the recommended form) and once with `--scheduler random`, "
                "each in its own lake and Dagster instance, both at once on this machine; then `envsched report --out "
                f"DIR --against RANDOM_LAKE`. Seeds {', '.join(str(r['seed']) for r in recs)}, recorded "
                f"{', '.join(dates)} on {'; '.join(machines)} (`bench/runs/pipeline/`). Each seed is one draw: the "
                "neural tables above give the spread over seeds (on unseen environments a paired held-out difference "
                "moves by about 0.02 between two runs of one seed), so this is what a user is shown, not evidence by "
                "itself. The product's loop is not the benchmark's, so its numbers are not the benchmark's records of "
                "the same seeds (its held-out at step 0 is measured after that step's update, for one).",
                "",
                "Per-step metrics are compared over all steps (95% moving-block bootstrap interval of the per-step "
                "difference); held-out at the last evaluation both runs made, from their evaluation episodes on the "
                "same tasks (95% interval from the episodes' sampling error).",
                "",
                *rows,
                "",
                *over,
                *solved,
                "The paper's count (the first evaluation at which the form scored at least random's best):",
                "",
                *reach,
                "",
                "What a step costs through the Dagster jobs (the two runs shared the machine's cores; the wall is "
                "the whole command's, the pool import, graph, warm start and the resident worker's start included):",
                "",
                *timing,
                *[f"\nSeed {r['seed']}: {r['notes']}." for r in recs if r.get("notes")],
            ]
        ),
        after="resident_neural",
    )
