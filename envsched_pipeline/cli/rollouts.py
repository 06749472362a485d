"""``envsched rollouts show``: what a rollout did."""

from __future__ import annotations

from envsched_pipeline.analysis.rollouts_view import render
from envsched_pipeline.cli.common import COUNT, INDEX, HelpFormatter, UsageError, at_least, lake_of
from envsched_pipeline.run import require_run


def add_parser(sub) -> None:
    r = sub.add_parser("rollouts", help="look at rollouts")
    rsub = r.add_subparsers(dest="rollouts_command", required=True)
    show = rsub.add_parser(
        "show",
        help="print rollouts of a step: actions, outputs, checks, reward",
        formatter_class=HelpFormatter,
    )
    show.add_argument("--step", type=INDEX, required=True, help="step")
    show.add_argument(
        "--heldout",
        action="store_true",
        help="the step's held-out evaluation episodes (neural and LM policies) instead of its training rollouts",
    )
    show.add_argument("--task", default=None, help="only this task")
    show.add_argument(
        "--rollout", type=INDEX, default=None, help="only this rollout index (with --heldout: sample index)"
    )
    show.add_argument("--limit", type=COUNT, default=3, help="at most this many rollouts")
    show.add_argument("--width", type=at_least(40), default=100, help="line width")
    show.set_defaults(func=cmd_show)


def cmd_show(args) -> int:
    lake = lake_of(args).require()
    spec = require_run(lake)
    table, index, what = (
        ("eval_rollouts", "sample", "held-out rollouts")
        if args.heldout
        else ("rollouts", "rollout", "rollouts")
    )
    if not lake.has(table, step=args.step):
        have = lake.steps(table)
        raise UsageError(
            f"step {args.step} has no {what} in {lake.root}"
            + (f" (steps with {what}: {_steps(have)})" if have else "")
        )
    rows = lake.read(table, step=args.step).to_pylist()
    if args.task is not None:
        rows = [r for r in rows if r["task_id"] == args.task]
        if not rows:
            raise UsageError(f"task {args.task!r} has no {what} at step {args.step}")
    if args.rollout is not None:
        ids = sorted({r[index] for r in rows})
        rows = [r for r in rows if r[index] == args.rollout]
        if not rows:
            whose = f"of task {args.task!r} " if args.task is not None else ""
            raise UsageError(
                f"no {index} {args.rollout} {whose}at step {args.step} ({index}s {ids[0]}..{ids[-1]})"
            )
    rows.sort(key=lambda r: (r.get("split", ""), r["task_id"], r[index]))
    tasks = {
        t["task_id"]: t
        for t in lake.read(
            "eval_tasks" if args.heldout else "tasks", pool=spec.pool, columns=["task_id", "instruction"]
        ).to_pylist()
    }
    shown = rows[: max(1, args.limit)]
    for j, r in enumerate(shown):
        if j:
            print("-" * min(args.width, 100))
        print(render(r, tasks.get(r["task_id"]), width=args.width))
    if len(rows) > len(shown):
        print(f"({len(rows) - len(shown)} more; narrow with --task/--rollout or raise --limit)")
    return 0


def _steps(steps: list[int]) -> str:
    """``0..19`` for a run of steps, else the first few of them (held-out steps: 0, 10, 19)."""
    if steps == list(range(steps[0], steps[-1] + 1)):
        return f"{steps[0]}..{steps[-1]}"
    return ", ".join(map(str, steps[:12])) + (", ..." if len(steps) > 12 else "")
