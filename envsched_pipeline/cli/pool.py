"""``envsched pool list|create|import`` and ``envsched env run|sandbox``: pools, their environments
and what confines environment code."""

from __future__ import annotations

import json
import sys

from envs.envscaler import PoolFormatError, load_envscaler, validate_buildable
from envs.isolation import SANDBOX_UID_BASE
from envs.registry import POOLS, PoolData, episode_spec, hold_out, load_synthetic
from envs.sandbox import Limits, SandboxPool
from envs.synthetic import SyntheticConfig
from envsched_pipeline.cli.common import (
    COUNT,
    INDEX,
    HelpFormatter,
    UsageError,
    dumps,
    lake_of,
    local_file,
    read_text_file,
)
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.run import valid_name

F = HelpFormatter


def add_parser(sub) -> None:
    pool = sub.add_parser("pool", help="task pools")
    psub = pool.add_subparsers(dest="pool_command", required=True)
    pl = psub.add_parser("list", help="registered and imported pools", formatter_class=F)
    pl.set_defaults(func=cmd_list)
    pc = psub.add_parser(
        "create",
        help="make a pool under a name: the synthetic generator or a registered package pool",
        formatter_class=F,
    )
    pc.add_argument("kind", choices=sorted(POOLS), help="generator or registered pool (`envsched pool list`)")
    pc.add_argument("--name", required=True, help="pool name (letters, digits, '_' and '-')")
    pc.add_argument("--envs", type=COUNT, default=None, help="synthetic: environments (default 51)")
    pc.add_argument(
        "--tasks-per-env", type=COUNT, default=None, help="synthetic: tasks per environment (default 50)"
    )
    pc.add_argument("--seed", type=INDEX, default=None, help="synthetic: generator seed (default 0)")
    _heldout_flags(pc)
    pc.add_argument(
        "--allow-pool-edit", action="store_true", help="replace the pool of a live run (edit-tolerant)"
    )
    pc.set_defaults(func=cmd_create)
    pi = psub.add_parser("import", help="import a pool from files", formatter_class=F)
    pi.add_argument("kind", choices=["envscaler"], help="file format")
    pi.add_argument("--scenarios", required=True, help="EnvScaler scenario list (JSON)")
    pi.add_argument("--env-metadata", required=True, help="EnvScaler environment metadata (JSON)")
    pi.add_argument("--name", required=True, help="pool name (letters, digits, '_' and '-')")
    _heldout_flags(pi)
    pi.add_argument(
        "--allow-pool-edit", action="store_true", help="replace the pool of a live run (edit-tolerant)"
    )
    pi.set_defaults(func=cmd_import)

    env = sub.add_parser("env", help="environments")
    esub = env.add_subparsers(dest="env_command", required=True)
    er = esub.add_parser(
        "run", help="run a list of tool calls against a task, then verify", formatter_class=F
    )
    er.add_argument("--pool", required=True, help="pool name")
    er.add_argument("--task", required=True, help="task id")
    er.add_argument("--actions", required=True, help='JSON file: a list of {"name", "arguments"}')
    er.add_argument("--answer", default=None, help="final answer text (reasoning_gym)")
    er.add_argument("--verbose", action="store_true", help="print each action's observation and each check")
    er.set_defaults(func=cmd_env_run)
    es = esub.add_parser(
        "sandbox",
        help="what confines environment code on this machine (namespaces, private root, user)",
        formatter_class=F,
    )
    es.add_argument("--network", action="store_true", help="as a pool given the network would run")
    es.set_defaults(func=cmd_env_sandbox)


def cmd_list(args) -> int:
    lake = lake_of(args)
    imported = set(lake.pools())
    print(f"{'pool':<16} {'in lake':<8} description")
    for name, (_, desc) in sorted(POOLS.items()):
        print(f"{name:<16} {'yes' if name in imported else 'no':<8} {desc}")
    for name in sorted(imported - set(POOLS)):
        print(f"{name:<16} {'yes':<8} imported pool")
    return 0


def _heldout_flags(p) -> None:
    p.add_argument(
        "--heldout-tasks",
        type=INDEX,
        default=0,
        help="tasks of each environment kept out of the pool for held-out evaluation (split 'seen'; "
        "each environment keeps at least one to train on)",
    )
    p.add_argument(
        "--heldout-envs",
        type=INDEX,
        default=0,
        help="whole environments kept out of the pool for held-out evaluation (split 'unseen')",
    )
    p.add_argument("--heldout-seed", type=INDEX, default=0, help="seed of the held-out draw")


def _with_heldout(data: PoolData, args) -> PoolData:
    """The pool with the evaluation split the flags ask for taken out (nothing asked: as it is)."""
    if not (args.heldout_tasks or args.heldout_envs):
        return data
    try:
        return hold_out(data, args.heldout_tasks, args.heldout_envs, args.heldout_seed)
    except ValueError as exc:
        raise UsageError(f"--heldout-envs {args.heldout_envs}: {exc}") from exc


def cmd_create(args) -> int:
    lake = lake_of(args)
    valid_name(args.name)
    if args.kind == "synthetic":
        flags = {"n_envs": args.envs, "tasks_per_env": args.tasks_per_env, "seed": args.seed}
        sizes = {k: v for k, v in flags.items() if v is not None}  # the generator's defaults for the rest
        try:
            config = SyntheticConfig(**sizes)
        except ValueError as exc:
            raise UsageError(f"--envs, --tasks-per-env: {exc}") from exc
        print(
            f"generating pool {args.name}: {config.n_envs} environments x {config.tasks_per_env} tasks ...",
            file=sys.stderr,
            flush=True,
        )
        data = load_synthetic(args.name, **sizes)
    else:
        given = [
            f
            for f, v in (
                ("--envs", args.envs),
                ("--tasks-per-env", args.tasks_per_env),
                ("--seed", args.seed),
            )
            if v is not None
        ]
        if given:
            raise UsageError(
                f"{', '.join(given)}: only the synthetic generator takes it; pool {args.kind!r} is what its package holds"
            )
        print(f"loading pool {args.kind} ...", file=sys.stderr, flush=True)
        data = POOLS[args.kind][0](name=args.name)  # the registered pool's loader, under this name
    data = _with_heldout(data, args)
    print(dumps({**import_pool(lake, data, allow_edit=args.allow_pool_edit), **_split_counts(data)}))
    return 0


def _split_counts(data: PoolData) -> dict:
    return {
        "heldout_seen_tasks": sum(r.get("split") == "seen" for r in data.heldout),
        "heldout_unseen_tasks": sum(r.get("split") == "unseen" for r in data.heldout),
        "heldout_environments": len(data.eval_environments),
    }


def cmd_import(args) -> int:
    lake = lake_of(args)
    valid_name(args.name)
    for flag, given in (("--scenarios", args.scenarios), ("--env-metadata", args.env_metadata)):
        local_file(flag, given)
    try:
        data = load_envscaler(args.scenarios, args.env_metadata, args.name)
    except PoolFormatError as exc:
        raise UsageError(str(exc)) from exc
    data = _with_heldout(data, args)
    print(
        f"parsed {len(data.environments)} environments, {len(data.tasks)} tasks; building each environment "
        "once in the sandbox ...",
        file=sys.stderr,
        flush=True,
    )
    report = validate_buildable(data)
    counts = import_pool(lake, data, allow_edit=args.allow_pool_edit)
    print(
        dumps(
            {
                **counts,
                "broken_environments": report["broken_environments"],
                "empty_checklists": report["empty_checklists"],
                **_split_counts(data),
            }
        )
    )
    return 0


def cmd_env_run(args) -> int:
    lake = lake_of(args)
    if not lake.has("tasks", pool=valid_name(args.pool)):
        raise UsageError(f"pool {args.pool!r} is not in {lake.root}")
    tasks = lake.read("tasks", pool=args.pool)
    rows = [r for r in tasks.to_pylist() if r["task_id"] == args.task]
    if not rows:
        raise UsageError(f"task {args.task!r} is not in pool {args.pool!r}")
    env = [
        e for e in lake.read("environments", pool=args.pool).to_pylist() if e["env_id"] == rows[0]["env_id"]
    ]
    if not env:
        raise UsageError(
            f"environment {rows[0]['env_id']!r} of task {args.task!r} is not in pool {args.pool!r}"
        )
    text = read_text_file("--actions", args.actions)
    try:
        actions = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--actions {args.actions}: invalid JSON ({exc.msg} at line {exc.lineno})") from exc
    if not isinstance(actions, list) or not all(isinstance(a, dict) and "name" in a for a in actions):
        raise UsageError(f'--actions {args.actions}: expected a JSON list of {{"name", "arguments"}} objects')
    with SandboxPool(workers=1) as pool:
        res = pool.run_episode(episode_spec(env[0], rows[0]), actions, args.answer)
    if args.verbose:
        for k, call in enumerate(res.get("tool_calls", []), start=1):
            print(f"{k:>2}. {call.get('name')}({json.dumps(call.get('arguments'), default=str)})")
            print(f"    -> {call.get('output')}")
        for c in res.get("checks", []):
            print(
                f"[{'pass' if c.get('passed') else 'FAIL'}] {c.get('item')}"
                + (f" ({c['error']})" if c.get("error") else "")
            )
    print(
        dumps(
            {
                "task_id": args.task,
                "reward": res.get("reward", 0.0),
                "checks": [{k: c.get(k) for k in ("item", "passed", "error")} for c in res.get("checks", [])],
                "error": res.get("error"),
            }
        )
    )
    return 0


def cmd_env_sandbox(args) -> int:
    """One sandbox worker's confinement, a line per layer (exit 0 whatever holds: it is a report)."""
    with SandboxPool(workers=1, limits=Limits(network=args.network)) as pool:
        report = pool.confinement()
    uid = report["uid"]
    user = "root" if uid == 0 else f"uid {uid}" + (" (the worker's own)" if uid >= SANDBOX_UID_BASE else "")
    rows = [
        ("processes", "own PID namespace" if report["pid_namespace"] else "shared with the host"),
        ("network", "none" if report["network"] == "none" else "the host's"),
        ("files", "private root" if report["filesystem"] == "private root" else "the host's"),
        ("user", user),
        ("syscalls", "filtered (seccomp)" if report.get("seccomp") else "all allowed"),
    ]
    for layer, state in rows:
        print(f"{layer:<10} {state}")
    for note in report["notes"]:
        print(f"note: {note}")
    return 0
