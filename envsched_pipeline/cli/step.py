"""``envsched step select|ingest|eval|status``: the step protocol for an external trainer."""

from __future__ import annotations

import sys

from envsched_pipeline.cli.common import (
    COUNT,
    GROUP,
    INDEX,
    HelpFormatter,
    UsageError,
    dumps,
    json_object,
    lake_of,
)
from envsched_pipeline.core.build import asked_run, new_run, open_run
from envsched_pipeline.core.ingest import ingest_rollouts, record_evals
from envsched_pipeline.core.loop import status
from envsched_pipeline.core.pools import ensure_pool
from envsched_pipeline.core.select import select_manifest
from envsched_pipeline.run import OPEN_ENDED_STEPS, RunSpec, load_run, require_run
from envsched_pipeline.scheduler import SCHEDULERS
from envsched_pipeline.scheduler.variants import RECOMMENDED

F = HelpFormatter


def add_parser(sub) -> None:
    step = sub.add_parser("step", help="step-by-step protocol for an external trainer")
    ssub = step.add_subparsers(dest="step_command", required=True)
    sel = ssub.add_parser(
        "select", help="write manifest T and print its picks as JSON lines", formatter_class=F
    )
    sel.add_argument("--pool", required=True, help="pool name")
    sel.add_argument("--step", type=INDEX, required=True, help="step T")
    sel.add_argument(
        "--scheduler",
        default=None,
        help=f"one of {', '.join(sorted(SCHEDULERS))}, or a named variant `<scheduler>@<variant>` "
        f"(`envsched bench variants` lists them). First call: {RECOMMENDED}, the recommended form "
        "(`envsched` alone: the paper's constants); later calls: the run's own, config included",
    )
    sel.add_argument("--seed", type=INDEX, default=None, help="run seed (first call: 0)")
    sel.add_argument("--batch-size", type=COUNT, default=None, help="B (first call: 64)")
    sel.add_argument("--group-size", type=GROUP, default=None, help="G, >= 2 (first call: 8)")
    sel.add_argument(
        "--select-lag",
        type=INDEX,
        default=None,
        help="how many steps a selection may run ahead of your rollouts (first call: 0): with 1, "
        "step T+1 is selected from the rollouts up to T-1, so your trainer can ask for it while step "
        "T trains (a prefetching data loader, one-step off-policy); step T's picks count as spent",
    )
    sel.set_defaults(func=cmd_select)
    ing = ssub.add_parser(
        "ingest", help="validate and write rollouts of step T (.jsonl or .parquet)", formatter_class=F
    )
    ing.add_argument("--pool", required=True, help="pool name")
    ing.add_argument("--step", type=INDEX, required=True, help="step T")
    ing.add_argument("--rollouts", required=True, help="file with task_id, rollout, reward per row")
    ing.add_argument(
        "--replace",
        action="store_true",
        help="re-ingest a step that was already used: later steps are rolled back (archived)",
    )
    ing.add_argument(
        "--partial-groups",
        action="store_true",
        help="accept groups with fewer than G rollouts (kept out of the variance statistics)",
    )
    ing.set_defaults(func=cmd_ingest)
    ev = ssub.add_parser(
        "eval",
        help="record your evaluation after step T's update (held-out scores, benchmarks)",
        formatter_class=F,
    )
    ev.add_argument("--pool", required=True, help="pool name")
    ev.add_argument("--step", type=INDEX, required=True, help="step T (its rollouts ingested)")
    ev.add_argument(
        "--scores",
        required=True,
        help='JSON object, or @FILE of one: benchmark -> score or {"score", "se"}, e.g. '
        '\'{"heldout_seen": 0.61, "bfcl_v3": {"score": 0.318, "se": 0.004}}\' (heldout_seen / '
        "heldout_unseen fill the step table's held-out columns)",
    )
    ev.set_defaults(func=cmd_eval)
    sst = ssub.add_parser("status", help="last selected and last ingested step", formatter_class=F)
    sst.add_argument("--pool", default=None, help="pool name, checked against the run's when given")
    sst.set_defaults(func=cmd_status)


def _run_for(lake, args) -> RunSpec:
    run = load_run(lake)
    if run is not None and run.pool != args.pool:
        raise UsageError(
            f"{lake.root} holds a run on pool {run.pool!r}, not {args.pool!r}; use another --lake"
        )

    # what this call asks for, over the run's own settings (its scheduler config included), so a
    # plain `step select` resumes a run started by the API or `envsched train` with a variant
    base = run or new_run(policy="external", max_steps=OPEN_ENDED_STEPS)
    try:
        spec = asked_run(
            base,
            args.scheduler,
            pool=args.pool,
            seed=args.seed,
            batch_size=args.batch_size,
            group_size=args.group_size,
            select_lag=args.select_lag,
            trainer="external",
        )
    except ValueError as exc:
        raise UsageError(f"--scheduler: {exc}") from exc
    spec.validate(SCHEDULERS)  # before anything is written
    if not lake.has("tasks", pool=args.pool):
        if args.pool != "synthetic":
            raise UsageError(
                f"pool {args.pool!r} is not in {lake.root} (`envsched pool create` or `pool import`)"
            )
        ensure_pool(lake, "synthetic")
    return open_run(lake, spec)


def cmd_select(args) -> int:
    lake = lake_of(args)
    _run_for(lake, args)
    if not lake.has("manifests", step=args.step):
        select_manifest(lake, args.step)
    for r in lake.read("manifests", step=args.step).sort_by("slot").to_pylist():
        print(dumps({k: r[k] for k in ("task_id", "env_id", "half", "score", "pred_var", "p_nonzero")}))
    audit = lake.read("audits", step=args.step).to_pylist()[0]
    print(
        dumps(
            {
                "step": args.step,
                "predicted_yield": audit.get("predicted_yield"),
                "oversampling_factor": audit.get("oversampling_factor"),
            }
        ),
        file=sys.stderr,
    )
    return 0


def cmd_ingest(args) -> int:
    lake = lake_of(args).require()
    run = require_run(lake)
    if run.pool != args.pool:
        raise UsageError(f"{lake.root} holds a run on pool {run.pool!r}, not {args.pool!r}")
    print(
        dumps(
            ingest_rollouts(
                lake, args.step, args.rollouts, replace=args.replace, partial_groups=args.partial_groups
            )
        )
    )
    return 0


def cmd_eval(args) -> int:
    lake = lake_of(args).require()
    run = require_run(lake)
    if run.pool != args.pool:
        raise UsageError(f"{lake.root} holds a run on pool {run.pool!r}, not {args.pool!r}")
    scores = json_object("--scores", args.scores, '{"heldout_seen": 0.61}')
    where = f"--scores {args.scores[1:]}" if args.scores.startswith("@") else "--scores"
    print(dumps(record_evals(lake, args.step, scores, where=where)))
    return 0


def cmd_status(args) -> int:
    lake = lake_of(args).require()
    st = status(lake)
    if args.pool and st["run"] and st["run"]["pool"] != args.pool:
        raise UsageError(f"{lake.root} holds a run on pool {st['run']['pool']!r}, not {args.pool!r}")
    print(dumps({k: st[k] for k in ("last_selected", "last_ingested", "last_statistics")}))
    return 0
