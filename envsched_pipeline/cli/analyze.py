"""``envsched status``, ``envsched report``, ``envsched compare`` and ``envsched bench scheduler|replay|variants``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import duckdb

from envsched_pipeline.analysis.ablation import compare_rows, table_markdown, write_rows
from envsched_pipeline.analysis.bench import ORACLE_CANDIDATES, UNSEEN_ENVS, provenance_text, run_benchmark
from envsched_pipeline.analysis.catalog import BASELINE, comparisons, describe, find_lakes, parent_of
from envsched_pipeline.analysis.catalog import table as catalog_table
from envsched_pipeline.analysis.explain import explain_lines, explain_step
from envsched_pipeline.analysis.passk import reliability, split_episodes
from envsched_pipeline.analysis.replay import replay
from envsched_pipeline.analysis.report import build_report, verdict_lines
from envsched_pipeline.analysis.seeds import compare_seeds, mark, markdown_table, seed_table, write_comparison
from envsched_pipeline.analysis.trace import query_traces, summarize_traces, trace_tables
from envsched_pipeline.cli.common import (
    COUNT,
    EVALUATED,
    GROUP,
    INDEX,
    HelpFormatter,
    UsageError,
    dagster_home,
    dumps,
    from_source,
    json_object,
    lake_of,
    names,
    sql_error,
    step_list,
    writable_dir,
    writable_file,
    write_output,
)
from envsched_pipeline.cli.sql import print_table
from envsched_pipeline.cli.train import header, row, training_columns
from envsched_pipeline.core.gates import GATES, halted, resume
from envsched_pipeline.core.loop import best_heldout_text, explain, next_action, status, step_summary
from envsched_pipeline.lake import Lake
from envsched_pipeline.run import EVALUATED_POLICIES, REMADE_CHECKPOINTS, RunSpec, require_run, steps_of
from envsched_pipeline.scheduler.variants import RECOMMENDED, VARIANTS, scheduler_label

F = HelpFormatter
# the paper's ablation, the recommended form (what a new run gets) beside it, and the oracle
ALL = f"random,envsched,{RECOMMENDED},exploit-only,coverage-only,variance-greedy,greso,mopps,dps,oracle"


def add_parser(sub) -> None:
    st = sub.add_parser("status", help="the lake's run and its last steps", formatter_class=F)
    st.add_argument("--last", type=COUNT, default=5, help="how many of the last steps to show")
    st.add_argument("--json", action="store_true", help="the status as JSON (for scripts)")
    st.set_defaults(func=cmd_status)

    rs = sub.add_parser(
        "resume", help="continue a halted run once its failed check passes", formatter_class=F
    )
    rs.add_argument(
        "--redo",
        action="store_true",
        help="drop the failed step's manifest (or rollouts) so the loop redoes that step",
    )
    rs.set_defaults(func=cmd_resume)

    rw = sub.add_parser(
        "rewind",
        help="take the run back to a step and redo it from there (later steps are archived, not deleted)",
        formatter_class=F,
    )
    rw.add_argument(
        "--to",
        type=INDEX,
        required=True,
        help="the first step to redo (a bad checkpoint, a diverged run, a missing partition: go back "
        "to before it); a simulated or neural policy after the step before it that the lake no longer "
        "keeps is made again first, a language model's must be on disk",
    )
    rw.set_defaults(func=cmd_rewind)

    ex = sub.add_parser(
        "explain",
        help="why step T's batch is what it is, and why a task was or was not in it",
        description="Recompute step T's selection from the scheduler state after step T-1 (nothing is "
        "written), check it against the stored manifest, and explain the batch: its halves, "
        "relaxations and quarantines; with --task, that task's estimates, score and rank, the "
        "constraint that blocked it or how far its score fell short, and its history.",
        formatter_class=F,
    )
    ex.add_argument("--step", type=INDEX, required=True, help="the step whose batch to explain")
    ex.add_argument("--task", help="a task of the run's pool (picked or not)")
    ex.add_argument("--json", action="store_true", help="the explanation as JSON")
    ex.set_defaults(func=cmd_explain)

    ev = sub.add_parser(
        "evaluate",
        help="held-out scores of a trained policy's checkpoint (more samples, another draw)",
        description="Evaluate the policy after a step (its checkpoint) on the pool's held-out split: "
        "unseen tasks of the training environments and tasks of environments never trained on, the "
        "mean over tasks of the mean reward of N episodes each, with its standard error. With the "
        "run's settings it repeats the score the run recorded at that step; --samples, --tasks or "
        "--seed look again. Neural and language-model policies; nothing is written to the lake.",
        formatter_class=F,
    )
    which = ev.add_mutually_exclusive_group()
    which.add_argument(
        "--step",
        type=INDEX,
        default=None,
        help="the step whose policy to evaluate (default: the newest kept); a neural step whose "
        "checkpoint the lake dropped is made again from the kept one before it (its steps run again, "
        "each checked against the checkpoint digest it recorded)",
    )
    which.add_argument(
        "--steps",
        type=step_list,
        default=None,
        metavar="LIST",
        help="the policies after several steps, one after the other, e.g. 49,99,149,199, or "
        f"`{EVALUATED}` (every step the run evaluated): a run's held-out curve scored again, e.g. "
        "with more --samples; every step is checked before the first is scored",
    )
    which.add_argument(
        "--best",
        action="store_true",
        help="the best held-out policy: a language model's kept copy; the neural learner's evaluated "
        "step with the best mean held-out score (the earlier at a tie)",
    )
    ev.add_argument(
        "--pool",
        default=None,
        help="score the policy on another pool's held-out split instead of the run's (a pool in the lake: "
        "`envsched pool create` / `import` adds one): a transfer evaluation, with nothing recorded to "
        "show beside it",
    )
    ev.add_argument("--samples", type=COUNT, default=None, help="episodes per task (default: the run's)")
    ev.add_argument("--tasks", type=COUNT, default=None, help="tasks per split (default: the run's)")
    ev.add_argument(
        "--seed",
        type=INDEX,
        default=None,
        help="the sampling seed (default: the run's; the tasks stay the run's)",
    )
    ev.add_argument(
        "--episodes",
        metavar="FILE",
        default=None,
        help="write the episodes (the lake's eval_rollouts columns) to this Parquet file, e.g. for "
        "`duckdb -c \"select * from 'FILE'\"`",
    )
    ev.add_argument(
        "--by-env", action="store_true", help="each held-out environment's score too, weakest first"
    )
    ev.add_argument(
        "--json",
        action="store_true",
        help="the scores as JSON (by environment included; a list of them with --steps)",
    )
    ev.set_defaults(func=cmd_evaluate)

    rp = sub.add_parser("report", help="HTML report with plots of the lake's run", formatter_class=F)
    rp.add_argument("--out", required=True, help="output folder")
    rp.add_argument("--no-baselines", action="store_true", help="skip re-running baselines in the simulator")
    rp.add_argument(
        "--against",
        action="append",
        default=[],
        metavar="LAKE",
        help="compare with the run in another lake (same pool, policy, B and G; another scheduler's, "
        "e.g. `envsched --lake warehouse/random train --scheduler random ...`); repeatable. Real runs "
        "replace the simulated re-runs of baselines. Default: the lakes the run names itself "
        "(`envsched train --against`) that hold steps",
    )
    rp.set_defaults(func=cmd_report)

    ru = sub.add_parser(
        "runs",
        help="the runs in a folder of lakes, and the `envsched compare` commands they allow",
        description="One line per lake (a folder holding run.json) found in each DIR or one level "
        "below it: its scheduler, seed, policy, pool, batch shape, how far it is and its latest numbers; "
        "then, for runs of the same pool, policy, B and G with random's runs at two seeds or more, the "
        "`envsched compare` command that judges each other scheduler against random over those seeds.",
        formatter_class=F,
    )
    ru.add_argument(
        "dirs",
        nargs="*",
        metavar="DIR",
        help="folders of lakes, or lakes; s3://bucket/prefix too (default: the folder or prefix holding "
        "--lake, e.g. warehouse/)",
    )
    ru.add_argument("--json", action="store_true", help="the runs and the comparisons as JSON")
    ru.set_defaults(func=cmd_runs)

    cp = sub.add_parser(
        "compare",
        help="one scheduler's runs against another's, paired by seed: verdicts over seeds",
        description="Pair each run of --runs with the --against run of the same seed (one lake per "
        "run, e.g. `envsched --lake warehouse/form-s1 train --seed 1 ...`) and judge the mean paired "
        "difference of the per-step metrics and of held-out by its spread over seeds. A verdict of one "
        "pair of runs (`envsched report --against`) judges those two runs; this one, the scheduler.",
        formatter_class=F,
    )
    cp.add_argument(
        "--runs",
        nargs="+",
        action="append",
        required=True,
        metavar="LAKE",
        help="one scheduler's runs, one per seed; repeat --runs for another scheduler's runs, and the "
        "schedulers are tabled side by side against --against (the ablation table, over seeds)",
    )
    cp.add_argument(
        "--against",
        nargs="+",
        required=True,
        metavar="LAKE",
        help="another scheduler's runs of the same seeds",
    )
    cp.add_argument(
        "--out",
        metavar="DIR",
        help="write index.html (the page), comparison.md, by_seed.png and summary.json into this folder",
    )
    cp.add_argument(
        "--effect",
        type=float,
        metavar="X",
        help="a held-out difference worth finding (e.g. 0.01): each held-out verdict then says how "
        "many seeds would resolve it with a chance of 0.8 at the measured spread over seeds",
    )
    cp.add_argument("--json", action="store_true", help="print the comparison as JSON")
    cp.set_defaults(func=cmd_compare)

    b = sub.add_parser("bench", help="benchmarks")
    bsub = b.add_subparsers(dest="bench_command", required=True)
    bs = bsub.add_parser(
        "scheduler", help="every scheduler against the same learner, pool and seeds", formatter_class=F
    )
    bs.add_argument("--pool", default="synthetic", choices=["synthetic"], help="pool generator")
    bs.add_argument("--steps", type=COUNT, default=200, help="training steps per run")
    bs.add_argument("--seed", type=INDEX, default=0, help="first seed")
    bs.add_argument("--seeds", type=COUNT, default=1, help="average over seeds seed..seed+N-1")
    bs.add_argument(
        "--schedulers",
        default=None,
        help=f"comma-separated scheduler names (default: {ALL}; the neural learner's default leaves out the "
        "oracle, which costs --oracle-candidates/B times a step's rollouts)",
    )
    bs.add_argument("--envs", type=COUNT, default=51, help="environments in the generated pool")
    bs.add_argument("--tasks", type=COUNT, default=50, help="tasks per environment")
    bs.add_argument("--batch-size", type=COUNT, default=64, help="B")
    bs.add_argument("--group-size", type=GROUP, default=8, help="G")
    bs.add_argument("--json", default=None, help="write the result document here")
    bs.add_argument("--series", action="store_true", help="include per-step series in the JSON")
    bs.add_argument(
        "--learner",
        default="simulated",
        choices=["simulated", "neural"],
        help="simulated: fast model of learning (mechanics only); neural: a pointer policy trained with "
        "GRPO in the real sandboxed environments (the held-out evidence)",
    )
    bs.add_argument(
        "--learner-config",
        default=None,
        metavar="JSON",
        help='learner settings as a JSON object, e.g. \'{"loss_denominator": "batch"}\' (neural) or '
        "'{\"env_skill_share\": 0.5}' (simulated), or a file of them (@settings.json); part of each "
        "recorded run's key",
    )
    bs.add_argument("--jobs", type=COUNT, default=1, help="(scheduler, seed) runs in parallel processes")
    bs.add_argument("--cache", default=None, help="keep finished runs here; a re-run resumes from them")
    bs.add_argument(
        "--recorded-only",
        action="store_true",
        help="run nothing: summarize the runs in --cache (each scheduler over the seeds it has)",
    )
    bs.add_argument(
        "--eval-every", type=COUNT, default=None, help="neural: held-out every N steps (default steps/4)"
    )
    bs.add_argument(
        "--probe-every",
        type=COUNT,
        default=None,
        metavar="N",
        help="every N steps, probe the whole pool with two fresh groups per task (what share of it, of "
        "the batch, and of an oracle's batch has spread: the JSON's `probes`); costs about one pool "
        "rollout per probe, leaves the run unchanged",
    )
    bs.add_argument(
        "--oracle-candidates",
        type=COUNT,
        default=ORACLE_CANDIDATES,
        metavar="N",
        help="neural learner: the oracle rolls one fresh group of N random tasks each step and trains "
        f"on the most varied (a ceiling that pays N/B times a step's rollouts; default {ORACLE_CANDIDATES})",
    )
    bs.add_argument(
        "--unseen-envs",
        type=COUNT,
        default=UNSEEN_ENVS,
        metavar="N",
        help="neural learner: environments in the unseen held-out split (the unseen family has 12 "
        "domains; beyond 12 each domain comes again with other rules, ids and difficulty); the first "
        f"{UNSEEN_ENVS} are the default split's (default {UNSEEN_ENVS})",
    )
    bs.add_argument(
        "--draw",
        type=INDEX,
        default=0,
        metavar="K",
        help="run each (scheduler, seed) again from the same pool, split and warm start with the K-th other "
        "stream of rollout sampling and selection ties (0: the recorded runs; K is part of the run's key): "
        "how far one schedule's held-out moves from run to run at one seed",
    )
    bs.add_argument(
        "--trace",
        default=None,
        metavar="DIR",
        help="write every run's picks beside their groups' outcomes to DIR/<scheduler>-s<seed>.parquet "
        "(read them with `envsched bench trace`, or SQL over them with its --sql); runs already in --cache are run "
        "again for their trace, keep their record, and the log says whether the re-run repeated it",
    )
    bs.set_defaults(func=cmd_bench_scheduler)
    br = bsub.add_parser(
        "replay",
        help="offline evaluation of schedulers on the lake's logged run (no new rollouts)",
        formatter_class=F,
    )
    br.add_argument(
        "--schedulers",
        default=f"random,envsched,{RECOMMENDED},exploit-only,greso,mopps,dps",
        help="comma-separated scheduler names or named variants, each as `envsched train --scheduler` "
        "reads it (the paper's constants and the variant's overrides, at the run's B and G; not the "
        "logged run's own overrides)",
    )
    br.add_argument(
        "--window", type=INDEX, default=4, help="steps within which a task's logged variance is reused"
    )
    br.add_argument("--json", default=None, help="write the result document here")
    br.set_defaults(func=cmd_bench_replay)
    bv = bsub.add_parser(
        "variants",
        help="the named scheduler variants (`<scheduler>@<variant>`) and their config overrides",
        formatter_class=F,
    )
    bv.set_defaults(func=cmd_bench_variants)
    bt = bsub.add_parser(
        "trace",
        help="what the picks of traced runs (`bench scheduler --trace`) found, by quarter of the run: "
        "share with spread by the task's previous group and by half",
        formatter_class=F,
    )
    bt.add_argument("files", nargs="+", help="trace Parquet files (seeds of one scheduler are pooled)")
    bt.add_argument("--json", default=None, help="write the summary here as well")
    bt.add_argument(
        "--sql",
        default=None,
        metavar="QUERY",
        help='instead of the summary, run QUERY over the files as the view "picks", e.g. '
        '"SELECT half, avg(informative::DOUBLE) FROM picks GROUP BY 1"',
    )
    bt.add_argument("--format", choices=("table", "csv", "json"), default="table", help="--sql output format")
    bt.set_defaults(func=cmd_bench_trace)


def cmd_status(args) -> int:
    lake = lake_of(args).require()
    st = status(lake)
    if args.json:
        print(dumps(st, indent=2))
    else:
        print("\n".join(status_lines(lake, st, args.last)))
    return 0


def status_lines(lake, st: dict, last: int) -> list[str]:
    """``envsched status`` for a person: the run, how far it is and what comes next, whatever stops
    it, who drives it, and its last steps' numbers (the table `envsched train` prints)."""
    spec = st["run"]
    if spec is None:
        return [f"no run in {st['lake']}: start one with `envsched train` or `envsched step select`"]
    done = 0 if st["last_statistics"] is None else st["last_statistics"] + 1
    label = scheduler_label(spec["scheduler"], spec["scheduler_config"])
    lines = [
        f"run {spec['run_id'] or '(no id)'} in {st['lake']}",
        f"  pool {spec['pool']}, policy {spec['policy']}, {label}, seed {spec['seed']}, "
        f"B = {spec['batch_size']}, G = {spec['group_size']}, trainer {spec['trainer']}"
        + (f", selects {spec['select_lag']} step(s) ahead of its rollouts" if spec.get("select_lag") else ""),
        *(
            [f"  policy settings: {', '.join(f'{k}={v}' for k, v in sorted(spec['policy_config'].items()))}"]
            if spec.get("policy_config")
            else []
        ),
        f"  steps done: {steps_of(done, spec['max_steps'])} (last selected {_step(st['last_selected'])}, rollouts "
        f"{_step(st['last_ingested'])}, statistics {_step(st['last_statistics'])}); next: {in_words(lake, st['next'])}",
    ]
    if not st["consistent"]:
        lines.append("  not consistent: " + "; ".join(st["problems"]))
    for name, who in [
        ("driver", st["driver"]),
        *((f"step {k} lock", v) for k, v in st["step_locks"].items()),
    ]:
        if who:
            lines.append(
                f"  {name}: {who['kind']} (pid {who['pid']} on {who['host']}: {who['command']}), heartbeat "
                f"{who['heartbeat_age_s']:g} s ago"
                + (" — stale: the next writer takes it over" if who["stale"] else "")
            )
    for p in st["against"]:  # the runs the report compares with (`envsched train --against`)
        if p["state"] == "unreadable":
            where = f"cannot be read: {p['problem']}"
        elif p["state"] == "not started":
            where = "no run there yet"
        else:
            where = f"{p['scheduler']}, {steps_of(p['steps'], p['max_steps'], unit=' steps')}, {p['state']}"
        lines.append(f"  compared with: {p['lake']} ({where})")
    if st["checkpoints"]:
        kept = st["checkpoints"]
        shown = ", ".join(map(str, kept[-12:]))
        uses = "`envsched rewind --to K+1` goes back to one"
        if spec["policy"] in EVALUATED_POLICIES and spec.get("trainer") != "external":
            uses = (
                "`envsched evaluate --step K` scores the policy after any step K (one not kept is made again), "
                if spec["policy"] in REMADE_CHECKPOINTS
                else "`envsched evaluate --step K` scores one again, "
            ) + uses
        lines.append(
            f"  policy kept after steps: {'..., ' * (len(kept) > 12)}{shown} ({len(kept)} kept; {uses})"
        )
    if st["best_heldout"]:
        lines.append(f"  best held-out so far: {best_heldout_text(st['best_heldout'])}")
    if st["patience"]:
        p = st["patience"]
        lines.append(
            f"  early stop: {len(p['evaluations'])} of {p['patience']} evaluations since step {p['since']} "
            f"without a better mean held-out (eval_patience {p['patience']}"
            + ("; spent" if p["stalled"] else "")
            + ")"
        )
    rows = step_summary(lake)[-last:] if done else []
    if rows:
        training = training_columns(RunSpec.from_dict(spec))  # as `envsched train` prints it
        lines += [f"last {len(rows)} step(s):", header(training), *(row(r, training=training) for r in rows)]
    return lines


def _step(t: int | None) -> str:
    return "none" if t is None else str(t)


def cmd_resume(args) -> int:
    from envsched_pipeline.orchestration.driver import get_instance  # Dagster: only here
    from envsched_pipeline.orchestration.plan import halted_job_runs  # Dagster: only here

    lake = lake_of(args).require()
    record = halted(lake)
    failed = []
    if record is not None and record["gate"] not in GATES:  # a job's failures: ask the instance
        dagster_home()
        failed = halted_job_runs(lake, get_instance())
    out = resume(lake, redo=args.redo, failed_runs=failed)
    if not out["resumed"]:
        print(out["reason"])
        return 0
    redo = f"; dropped {', '.join(out['redo'])} of step {out['step']}" if out["redo"] else ""
    print(f"resumed at step {out['step']}{redo}; next: {next_in_words(lake)}")
    return 0


def next_in_words(lake) -> str:
    return in_words(lake, next_action(lake))


def in_words(lake, action: tuple[str, int] | None) -> str:
    """What the loop does next (``next_action``'s answer), in words."""
    return "nothing, the run is complete" if action is None else explain(lake, action)


def cmd_rewind(args) -> int:
    from envsched_pipeline.orchestration.driver import get_instance  # Dagster: only here
    from envsched_pipeline.orchestration.rewind import rewind_run  # Dagster: only here

    lake = lake_of(args).require()
    spec = require_run(lake)
    dagster_home()
    out = rewind_run(lake, get_instance(), args.to, who="envsched rewind", log=lambda m: print(m, flush=True))
    steps = out["steps"]
    span = f"steps {steps[0]}..{steps[-1]}" if steps else "nothing"
    halt = "; the halt is cleared" if out["halt_cleared"] else ""
    again = (
        f"your trainer goes on with `envsched step select --step {args.to}`"
        if spec.trainer == "external"
        else f"`envsched train --steps {spec.max_steps}` redoes them"
    )
    print(
        f"rewound to step {args.to}: {span} moved to {out['archive']}{halt}. Next: {next_in_words(lake)}; {again}"
    )
    return 0


def cmd_explain(args) -> int:
    report = explain_step(lake_of(args).require(), args.step, args.task)
    if args.json:
        print(dumps(report, indent=2))
    else:
        print("\n".join(explain_lines(report)))
    return 0


def cmd_evaluate(args) -> int:
    from trainer.evaluate import evaluate, evaluate_steps, evaluated_steps  # torch: only when evaluating

    lake = lake_of(args).require()
    out = writable_file("--episodes", args.episodes) if args.episodes else None  # before any work
    settings = {"samples": args.samples, "tasks": args.tasks, "seed": args.seed, "pool": args.pool}

    def log(message: str) -> None:  # progress on stderr: stdout holds the table or the JSON
        print(message, file=sys.stderr, flush=True)

    if args.steps is not None:
        steps = evaluated_steps(lake) if args.steps == EVALUATED else args.steps
        results = evaluate_steps(lake, steps, log=log, **settings)
    else:
        results = [evaluate(lake, step=args.step, best=args.best, log=log, **settings)]
    episodes = [res.pop("episodes") for res in results]
    if out is not None:
        import pyarrow as pa  # only when the episodes are written
        import pyarrow.parquet as pq  # as above

        table = pa.concat_tables(episodes, promote_options="default")
        out.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, out)
        print(f"wrote {table.num_rows} episodes to {out}", file=sys.stderr)
    for res, eps in zip(results, episodes, strict=True):
        # solved in one attempt, in any of k and in all k (analysis.passk), from the same episodes
        res["reliability"] = {split: reliability(e) for split, e in split_episodes(eps).items()}
    if args.json:
        print(dumps(results if args.steps is not None else results[0], indent=2))
        return 0
    for res in results:
        print("\n".join(evaluation_lines(res, args.by_env)))
    if len(results) > 1:
        print("\n".join(curve_lines(results)))
    return 0


def evaluation_lines(res: dict, by_env: bool) -> list[str]:
    """One evaluation (``trainer.evaluate.evaluate``'s result) as the table `envsched evaluate` prints."""
    k = max((r["samples"] for r in res["splits"]), default=1)
    lines = [
        f"{res['policy']} policy after step {res['step']} ({res['checkpoint']})"
        + ("" if res["own_pool"] else f", on pool {res['pool']}'s held-out split"),
        f"  {'split':<8} {'tasks':>6} {'samples':>8} {'held-out':>9} {'± se':>8} {'recorded':>9} "
        f"{'solved':>7} {f'pass@{k}':>7} {f'pass^{k}':>7}",
    ]
    for r in res["splits"]:
        recorded = res["recorded"].get(r["split"])
        shown = f"{recorded:.4f}" if recorded is not None else "-"
        rel = {x["k"]: x for x in res["reliability"].get(r["split"], [])}
        cells = ((1, "pass_at_k"), (k, "pass_at_k"), (k, "pass_hat_k"))  # solved, pass@k, pass^k
        solved = [f"{rel[j][name]:.4f}" if j in rel else "-" for j, name in cells]
        lines.append(
            f"  {r['split']:<8} {r['tasks']:>6} {r['samples']:>8} {r['mean']:>9.4f} {r['se']:>8.4f} {shown:>9} "
            + " ".join(f"{x:>7}" for x in solved)
        )
    if by_env:
        lines.append("by environment, weakest first:")
        lines.append(f"  {'split':<8} {'environment':<28} {'tasks':>6} {'episodes':>9} {'held-out':>9}")
        for r in res["by_env"]:
            lines.append(
                f"  {r['split']:<8} {r['env_id']:<28} {r['tasks']:>6} {r['episodes']:>9} {r['mean']:>9.4f}"
            )
    return lines


def curve_lines(results: list[dict]) -> list[str]:
    """The held-out scores of several steps' policies, one line a step (a run's curve, scored again)."""
    splits = [r["split"] for r in results[0]["splits"]]
    lines = [
        "held-out over the steps (each split: the score ± its standard error, then the one the run recorded):",
        "  " + f"{'step':>6}" + "".join(f" {s + ' ± se':>17} {'recorded':>9}" for s in splits),
    ]
    for res in results:
        by = {r["split"]: r for r in res["splits"]}
        cells = []
        for s in splits:
            r, rec = by.get(s), res["recorded"].get(s)
            cells.append(
                (f"{r['mean']:.4f} ± {r['se']:.4f}" if r else "-").rjust(17)
                + " "
                + (f"{rec:.4f}" if rec is not None else "-").rjust(9)
            )
        lines.append("  " + f"{res['step']:>6} " + " ".join(cells))
    return lines


def cmd_report(args) -> int:
    lake = lake_of(args).require()
    out = writable_dir("--out", args.out)
    index = build_report(
        lake,
        out,
        baselines=not args.no_baselines,
        log=lambda m: print(m, file=sys.stderr, flush=True),
        against=[Lake(a) for a in args.against] or None,  # none named: the run's own (train --against)
    )
    print("\n".join(verdict_lines(json.loads((index.parent / "summary.json").read_text()))))
    print(f"wrote {index}")
    return 0


def cmd_runs(args) -> int:
    lake = lake_of(args)
    dirs = args.dirs or [parent_of(lake)]
    for d in dirs:
        if "://" not in d and not Path(d).is_dir():
            raise UsageError(f"{d}: no such folder")
    lakes = find_lakes(dirs)
    if not lakes:
        raise UsageError(
            f"no lake in {', '.join(dirs)} (a lake is a folder holding run.json; start one with "
            "`envsched --lake DIR train ...`)"
        )
    rows = [describe(lk) for lk in lakes]
    found = comparisons(rows)
    if args.json:
        print(dumps({"runs": rows, "comparisons": found}, indent=2))
        return 0
    print("\n".join(markdown_table(*catalog_table(rows))))
    for c in found:
        print(
            f"\n{', '.join(c['schedulers'])} against {BASELINE} over seeds {', '.join(map(str, c['seeds']))} "
            f"(pool {c['pool']}, policy {c['policy']}, B = {c['batch_size']}, G = {c['group_size']}):\n  {c['command']}"
        )
        for note in c["notes"]:
            print(f"  note: {note}")
    return 0


def cmd_compare(args) -> int:
    out = writable_dir("--out", args.out) if args.out else None
    groups = [[Lake(x) for x in g] for g in args.runs]
    return print_comparison(groups, [Lake(x) for x in args.against], args.effect, out, args.json)


def print_comparison(
    groups: list[list[Lake]], against: list[Lake], effect: float | None, out: Path | None, as_json: bool
) -> int:
    """One scheduler's runs (one group) against ``against`` over seeds, or several side by side
    (the ablation table): printed, as JSON with ``as_json``, and its page written to ``out``."""
    if len(groups) > 1:  # several schedulers: the ablation table over seeds
        result = compare_rows(groups, against, effect=effect)
        writer, lines = write_rows, table_markdown(result)
        lines += [f"  note ({r['runs']['name']}): {n}" for r in result["rows"] for n in r["notes"]]
        lines += [f"  {lead['text']}" for lead in result["leaders"]]
    else:
        result = compare_seeds(groups[0], against, effect=effect)
        writer, lines = write_comparison, seed_table(result)
        lines += [f"  note: {n}" for n in result["notes"]]
        lines += [f"  {mark(v['better'])} {v['text']}" for v in result["verdicts"]]
    page = writer(result, out) if out else None
    if as_json:
        print(dumps(result, indent=2))
        return 0
    print("\n".join(lines))
    if page:
        print(f"wrote {page}")
    return 0


def cmd_bench_scheduler(args) -> int:
    default = ALL if args.learner == "simulated" else ALL.removesuffix(",oracle")
    chosen = names(default if args.schedulers is None else args.schedulers)
    if not chosen:
        raise UsageError("--schedulers names no scheduler")
    if args.recorded_only and not args.cache:
        raise UsageError("--recorded-only reads the runs recorded in --cache DIR: name it")
    json_out = writable_file("--json", args.json) if args.json else None  # before hours of runs
    for flag, folder in (("--cache", args.cache), ("--trace", args.trace)):
        if folder and not args.recorded_only:
            writable_dir(flag, folder)
    learner_config = None
    if args.learner_config:
        learner_config = json_object("--learner-config", args.learner_config, '{"loss_denominator": "batch"}')
    label = "SIMULATED learner" if args.learner == "simulated" else "NEURAL learner (real environments)"
    print(
        f"benchmark ({label}): {', '.join(chosen)} | {args.envs} envs x {args.tasks} tasks/env, "
        f"{args.steps} steps, B={args.batch_size} G={args.group_size}, seeds {args.seed}..{args.seed + args.seeds - 1}"
        + (f", draw {args.draw}" if args.draw else ""),
        flush=True,
    )
    try:
        out = run_benchmark(
            chosen,
            steps=args.steps,
            seed=args.seed,
            envs=args.envs,
            tasks_per_env=args.tasks,
            seeds=args.seeds,
            batch_size=args.batch_size,
            group_size=args.group_size,
            log=lambda m: print(m, flush=True),
            learner=args.learner,
            jobs=args.jobs,
            cache_dir=args.cache,
            eval_every=args.eval_every,
            recorded_only=args.recorded_only,
            learner_config=learner_config,
            probe_every=args.probe_every,
            trace_dir=args.trace,
            oracle_candidates=args.oracle_candidates,
            unseen_envs=args.unseen_envs,
            draw=args.draw,
        )
    except ValueError as exc:
        if "learner setting" in str(exc):  # a bad setting read from a file names the file
            raise from_source("--learner-config", args.learner_config, exc) from exc
        raise UsageError(str(exc)) from exc
    if not out["schedulers"]:
        raise UsageError(f"no run of {', '.join(chosen)} is recorded in {args.cache}")
    doc = {
        "schedulers": out["schedulers"],
        "paired_vs_random": out["paired_vs_random"],
        "setup": out["setup"],
        "provenance": out["provenance"],
    }
    if args.series:
        doc["series"] = out["series"]
    for key in ("probes", "traces"):
        if out.get(key):
            doc[key] = out[key]
    if json_out:
        write_output(json_out, dumps(doc, indent=2))
    base = out["schedulers"].get("random")
    print(
        f"{'scheduler':<16} {'seeds':>5} {'batch_var':>10} {'vs_random':>9} {'zero_var':>9} {'envs':>6} "
        f"{'median_r':>9} {'ho_seen':>8} {'ho_unseen':>9} {'eff_envs':>8} {'sel_ms':>8}"
    )
    for name, m in out["schedulers"].items():
        ratio = (
            m["batch_variance"] / base["batch_variance"] if base and base["batch_variance"] else float("nan")
        )
        print(
            f"{name:<16} {m['seeds']:>5} {m['batch_variance']:>10.4f} {ratio:>9.2f} {m['zero_variance_fraction']:>9.3f} "
            f"{m['envs_touched']:>6.1f} {m['median_reward']:>9.3f} {m['heldout_seen_final']:>8.4f} "
            f"{m['heldout_unseen_final']:>9.4f} {m['effective_envs']:>8.1f} {1000 * m['select_seconds_median']:>8.2f}"
        )
    print(provenance_text(out["provenance"]))
    if out.get("traces"):
        print(f"traces: {len(out['traces'])} file(s) in {args.trace} (summary: envsched bench trace FILES)")
    return 0


def cmd_bench_trace(args) -> int:
    json_out = writable_file("--json", args.json) if args.json and not args.sql else None
    try:
        if args.sql:
            print_table(query_traces(args.files, args.sql), args.format)
            return 0
        summary = summarize_traces(args.files)
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from exc
    except duckdb.Error as exc:
        raise sql_error(exc) from exc
    if json_out:
        write_output(json_out, dumps(summary, indent=2))
    print(trace_tables(summary))
    return 0


def cmd_bench_variants(args) -> int:
    """One line per variant: its name, then its overrides as JSON (for `train --scheduler-config`);
    the recommended form is marked."""
    width = max(len(n) for n in VARIANTS)
    for name, overrides in VARIANTS.items():
        mark = "  (recommended: a new run's default)" if name == RECOMMENDED else ""
        print(f"{name:<{width}}  {json.dumps(overrides, sort_keys=True)}{mark}")
    return 0


def cmd_bench_replay(args) -> int:
    json_out = writable_file("--json", args.json) if args.json else None
    try:
        out = replay(
            lake_of(args).require(),
            names(args.schedulers),
            window=args.window,
            log=lambda m: print(m, file=sys.stderr, flush=True),
        )
    except ValueError as exc:  # an unknown scheduler, a lake without completed steps
        raise UsageError(str(exc)) from exc
    text = dumps(out, indent=2)
    if json_out:
        write_output(json_out, text)
    print(text)
    return 0
