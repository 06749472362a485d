"""``envsched`` command line.

    envsched train --pool synthetic --policy simulated --steps 20     the Dagster loop, in-process
    envsched sql "select env_id, avg(reward) from rollouts group by 1"
    envsched pool list
    envsched status

Every command takes ``--lake DIR`` (default ``$ENVSCHED_LAKE`` or ``warehouse/lake``). Errors a
user can act on exit non-zero with one line naming what to fix, never a traceback.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


class UsageError(RuntimeError):
    pass


def _lake(args):
    from envsched_pipeline.lake import Lake

    lake = Lake(args.lake)
    os.environ["ENVSCHED_LAKE"] = str(lake.root)  # the Dagster resources and the trainer see it
    return lake


def dagster_home() -> Path:
    home = os.environ.get("DAGSTER_HOME")
    if not home:
        local = Path.cwd() / "dagster_home"
        home = str(local if local.exists() else REPO_ROOT / "dagster_home")
        os.environ["DAGSTER_HOME"] = home
    path = Path(home).resolve()
    path.mkdir(parents=True, exist_ok=True)
    os.environ["DAGSTER_HOME"] = str(path)
    if not (path / "dagster.yaml").exists():
        (path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    return path


# ---------------------------------------------------------------------------- train
STEP_COLUMNS = ("step", "batch_variance", "zero_variance_fraction", "envs_touched", "mean_reward", "heldout", "seconds")


def _fmt(v, width=10):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-".rjust(width)
    if isinstance(v, float):
        return f"{v:.4f}".rjust(width)
    return str(v).rjust(width)


def _header() -> str:
    names = ("step", "batch_var", "zero_var", "envs", "mean_rew", "heldout", "seconds")
    return " ".join(n.rjust(10) for n in names)


def _row(r: dict, seconds: float | None = None) -> str:
    vals = [r.get(c) for c in STEP_COLUMNS]
    if seconds is not None:
        vals[-1] = seconds
    return " ".join(_fmt(v) for v in vals)


def run_loop(lake, target_steps: int, instance=None, out=sys.stdout, quiet_dagster: bool = True) -> int:
    """Drive the Dagster jobs in-process until the lake holds ``target_steps`` steps."""
    import dagster as dg

    from envsched_pipeline.definitions import defs
    from envsched_pipeline.partitions import training_steps
    from envsched_pipeline.service import next_action, step_summary

    instance = instance or dg.DagsterInstance.get()
    run_config = {"loggers": {"console": {"config": {"log_level": "WARNING" if quiet_dagster else "INFO"}}}}
    jobs = {name: defs.resolve_job_def(name) for name in ("select_job", "train_job")}
    done_rows = {r["step"]: r for r in step_summary(lake)}
    print(_header(), file=out)
    for s in sorted(done_rows):
        if s < target_steps:
            print(_row(done_rows[s]) + "  (in lake)", file=out)
    step_t0: dict[int, float] = {}
    while True:
        action = next_action(lake)
        if action is None or action[1] >= target_steps:
            break
        kind, step = action
        if kind == "wait":
            raise UsageError(f"step {step} waits for an external trainer's rollouts (`envsched step ingest`)")
        key = str(step)
        if not instance.has_dynamic_partition(training_steps.name, key):
            instance.add_dynamic_partitions(training_steps.name, [key])
        step_t0.setdefault(step, time.perf_counter())
        job = jobs["select_job" if kind == "select" else "train_job"]
        kw = {"asset_selection": [dg.AssetKey("reward_statistics")]} if kind == "stats" else {}
        result = job.execute_in_process(partition_key=key, instance=instance, run_config=run_config,
                                        raise_on_error=False, **kw)
        if not result.success:
            msgs = [e.message for e in result.all_events if e.is_failure]
            detail = msgs[-1] if msgs else "see the run in the Dagster UI"
            raise UsageError(f"step {step} ({kind}) failed: {detail} (run {result.run_id})")
        if kind in ("train", "stats"):
            rows = {r["step"]: r for r in step_summary(lake)}
            if step in rows:
                print(_row(rows[step], time.perf_counter() - step_t0[step]), file=out, flush=True)
    return 0


def _policy_config(args) -> dict:
    pc: dict = {}
    if args.sim_mode != "auto":
        pc["mode"] = args.sim_mode
    if args.model_path:
        pc["model_path"] = str(Path(args.model_path).resolve())
    if args.max_new_tokens:
        pc["max_new_tokens"] = args.max_new_tokens
    if args.lr is not None:
        pc["lr"] = args.lr
    if args.policy == "hf" and not args.model_path:
        raise UsageError("--policy hf needs --model-path DIR (a local Qwen3 checkpoint); use hf-tiny for a random-init one")
    return pc


def cmd_train(args) -> int:
    from envsched_pipeline.service import RunSpec, ensure_pool, start_run

    lake = _lake(args)
    dagster_home()
    spec = RunSpec(
        pool=args.pool, policy=args.policy, scheduler=args.scheduler, seed=args.seed,
        batch_size=args.batch_size, group_size=args.group_size, max_steps=max(args.steps, args.max_steps or 0),
        trainer="subprocess", policy_config=_policy_config(args),
        prior_lake=str(Path(args.prior_lake).resolve()) if args.prior_lake else "", prior_discount=args.prior_discount,
        scheduler_config={"cost_aware": True} if args.cost_aware else {},
    )
    spec = start_run(lake, spec)
    if not lake.has("tasks", pool=spec.pool):
        print(f"importing pool {spec.pool} into {lake.root} ...", flush=True)
        _materialize_pool(spec.pool, lake)
        ensure_pool(lake, spec.pool)
    print(f"run {spec.run_id}: pool={spec.pool} policy={spec.policy} scheduler={spec.scheduler} "
          f"B={spec.batch_size} G={spec.group_size} steps={args.steps} lake={lake.root}", flush=True)
    if spec.policy == "simulated":
        print("note: the policy is the SIMULATED learner (ALGORITHM.md section 8), not a neural network.")
    elif spec.policy == "hf-tiny":
        print("note: hf-tiny is a random-init tiny Qwen3 (real agent loop + real GRPO update on CPU).")
    t0 = time.perf_counter()
    run_loop(lake, args.steps)
    print(f"done in {time.perf_counter() - t0:.1f}s. Next: `make ui` (Dagster UI on 127.0.0.1:3000) or "
          f"`envsched sql \"select * from step_summary\"`")
    return 0


def _materialize_pool(pool: str, lake) -> None:
    import dagster as dg

    from envsched_pipeline.definitions import defs

    job = defs.resolve_job_def("pool_job")
    res = job.execute_in_process(
        instance=dg.DagsterInstance.get(),
        run_config={
            "ops": {name: {"config": {"pool": pool}} for name in ("pool_tables", "topologies", "features", "task_graph")},
            "loggers": {"console": {"config": {"log_level": "WARNING"}}},
        },
        raise_on_error=False,
    )
    if not res.success:
        msgs = [e.message for e in res.all_events if e.is_failure]
        raise UsageError(f"importing pool {pool} failed: {msgs[-1] if msgs else res.run_id}")


# ---------------------------------------------------------------------------- sql
def cmd_sql(args) -> int:
    import duckdb

    lake = _lake(args)
    try:
        table = lake.sql(args.query)
    except duckdb.Error as exc:
        raise UsageError(f"SQL error: {exc}") from exc
    rows = table.to_pylist()
    cols = table.column_names
    if args.format == "json":
        for r in rows:
            print(json.dumps(r, default=str))
    elif args.format == "csv":
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(cols)
        for r in rows:
            w.writerow([r[c] for c in cols])
    else:
        widths = [max(len(c), *(len(_cell(r[c])) for r in rows)) if rows else len(c) for c in cols]
        print(" | ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
        print("-+-".join("-" * w for w in widths))
        for r in rows:
            print(" | ".join(_cell(r[c]).ljust(w) for c, w in zip(cols, widths, strict=True)))
        print(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return 0


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return "NULL" if v is None else str(v)


# ---------------------------------------------------------------------------- pool / status
def cmd_pool_list(args) -> int:
    from envs.registry import POOLS

    lake = _lake(args)
    imported = set(lake.pools())
    print(f"{'pool':<16} {'in lake':<8} description")
    for name, (_, desc) in sorted(POOLS.items()):
        print(f"{name:<16} {'yes' if name in imported else 'no':<8} {desc}")
    for name in sorted(imported - set(POOLS)):
        print(f"{name:<16} {'yes':<8} imported pool")
    return 0


def cmd_status(args) -> int:
    from envsched_pipeline.service import status

    print(json.dumps(status(_lake(args)), indent=2, default=str))
    return 0


# ---------------------------------------------------------------------------- pool import / env run
def cmd_pool_import(args) -> int:
    from envs.envscaler import PoolFormatError, load_envscaler, validate_buildable
    from envs.registry import derive_latents
    from envsched_pipeline.service import import_pool

    lake = _lake(args)
    try:
        data = load_envscaler(args.scenarios, args.env_metadata, args.name)
    except PoolFormatError as exc:
        raise UsageError(str(exc)) from exc
    print(f"parsed {len(data.environments)} environments, {len(data.tasks)} tasks; building each environment "
          "once in the sandbox ...", file=sys.stderr, flush=True)
    report = validate_buildable(data)
    data.latents = derive_latents(data)
    counts = import_pool(lake, data)
    print(json.dumps({**counts, "broken_environments": report["broken_environments"],
                      "empty_checklists": report["empty_checklists"]}))
    return 0


def cmd_env_run(args) -> int:
    from envs.registry import episode_spec
    from envs.sandbox import SandboxPool

    lake = _lake(args)
    if not lake.has("tasks", pool=args.pool):
        raise UsageError(f"pool {args.pool!r} is not in {lake.root}")
    tasks = lake.read("tasks", pool=args.pool)
    rows = [r for r in tasks.to_pylist() if r["task_id"] == args.task]
    if not rows:
        raise UsageError(f"task {args.task!r} is not in pool {args.pool!r}")
    env = [e for e in lake.read("environments", pool=args.pool).to_pylist() if e["env_id"] == rows[0]["env_id"]]
    if not env:
        raise UsageError(f"environment {rows[0]['env_id']!r} of task {args.task!r} is not in pool {args.pool!r}")
    try:
        actions = json.loads(Path(args.actions).read_text())
    except FileNotFoundError as exc:
        raise UsageError(f"{args.actions}: no such file") from exc
    except json.JSONDecodeError as exc:
        raise UsageError(f"{args.actions}: invalid JSON ({exc.msg} at line {exc.lineno})") from exc
    if not isinstance(actions, list) or not all(isinstance(a, dict) and "name" in a for a in actions):
        raise UsageError(f"{args.actions}: expected a JSON list of {{\"name\", \"arguments\"}} objects")
    with SandboxPool(workers=1) as pool:
        res = pool.run_episode(episode_spec(env[0], rows[0]), actions, args.answer)
    print(json.dumps({"task_id": args.task, "reward": res.get("reward", 0.0),
                      "checks": [{k: c.get(k) for k in ("item", "passed", "error")} for c in res.get("checks", [])],
                      "error": res.get("error")}, default=str))
    return 0


# ---------------------------------------------------------------------------- pool create / step protocol
def cmd_pool_create(args) -> int:
    from envs.registry import load_synthetic
    from envsched_pipeline.service import import_pool

    lake = _lake(args)
    data = load_synthetic(args.name, n_envs=args.envs, tasks_per_env=args.tasks_per_env, seed=args.seed)
    counts = import_pool(lake, data)
    print(json.dumps(counts))
    return 0


def _step_run(lake, args):
    from envsched_pipeline.service import RunSpec, load_run, start_run

    run = load_run(lake)
    if run is not None and run.pool != args.pool:
        raise UsageError(f"{lake.root} holds a run on pool {run.pool!r}, not {args.pool!r}; use another --lake")
    if not lake.has("tasks", pool=args.pool):
        if args.pool != "synthetic":
            raise UsageError(f"pool {args.pool!r} is not in {lake.root} (`envsched pool create` or `pool import`)")
        from envsched_pipeline.service import ensure_pool

        ensure_pool(lake, "synthetic")
    spec = RunSpec(pool=args.pool, policy=run.policy if run else "external", trainer="external",
                   scheduler=getattr(args, "scheduler", None) or (run.scheduler if run else "envsched"),
                   seed=args.seed if getattr(args, "seed", None) is not None else (run.seed if run else 0),
                   batch_size=getattr(args, "batch_size", None) or (run.batch_size if run else 64),
                   group_size=getattr(args, "group_size", None) or (run.group_size if run else 8),
                   max_steps=run.max_steps if run else 1_000_000)
    return start_run(lake, spec)


def cmd_step_select(args) -> int:
    from envsched_pipeline.service import select_step

    lake = _lake(args)
    _step_run(lake, args)
    if not lake.has("selections", step=args.step):
        select_step(lake, args.step)
    for r in lake.read("selections", step=args.step).sort_by("slot").to_pylist():
        print(json.dumps({k: r[k] for k in ("task_id", "env_id", "half", "score", "pred_var", "p_nonzero")}, default=float))
    audit = lake.read("audits", step=args.step).to_pylist()[0]
    print(json.dumps({"step": args.step, "predicted_yield": audit.get("predicted_yield"),
                      "oversampling_factor": audit.get("oversampling_factor")}), file=sys.stderr)
    return 0


def cmd_step_ingest(args) -> int:
    from envsched_pipeline.service import ingest_rollouts, require_run

    lake = _lake(args)
    run = require_run(lake)
    if run.pool != args.pool:
        raise UsageError(f"{lake.root} holds a run on pool {run.pool!r}, not {args.pool!r}")
    print(json.dumps(ingest_rollouts(lake, args.step, args.rollouts), default=float))
    return 0


def cmd_step_status(args) -> int:
    from envsched_pipeline.service import status

    lake = _lake(args)
    st = status(lake)
    if st["run"] and st["run"]["pool"] != args.pool:
        raise UsageError(f"{lake.root} holds a run on pool {st['run']['pool']!r}, not {args.pool!r}")
    print(json.dumps({k: st[k] for k in ("last_selected", "last_ingested", "last_statistics")}))
    return 0


# ---------------------------------------------------------------------------- report
def cmd_report(args) -> int:
    from envsched_pipeline.report import build_report

    lake = _lake(args)
    index = build_report(lake, Path(args.out), baselines=not args.no_baselines,
                         log=lambda m: print(m, file=sys.stderr, flush=True))
    print(f"wrote {index}")
    return 0


# ---------------------------------------------------------------------------- bench
def cmd_bench_scheduler(args) -> int:
    from envsched_pipeline.bench import run_benchmark

    names = [s.strip() for s in args.schedulers.split(",") if s.strip()]
    print(f"benchmark (SIMULATED learner): {', '.join(names)} | {args.envs} envs x {args.tasks} tasks/env, "
          f"{args.steps} steps, B={args.batch_size} G={args.group_size}, seeds {args.seed}..{args.seed + args.seeds - 1}",
          flush=True)
    out = run_benchmark(names, steps=args.steps, seed=args.seed, envs=args.envs, tasks_per_env=args.tasks,
                        seeds=args.seeds, batch_size=args.batch_size, group_size=args.group_size,
                        log=lambda m: print(m, flush=True))
    doc = {"schedulers": out["schedulers"], "setup": out["setup"]}
    if args.series:
        doc["series"] = out["series"]
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=2))
    base = out["schedulers"].get("random")
    print(f"{'scheduler':<16} {'batch_var':>10} {'vs_random':>9} {'zero_var':>9} {'envs':>6} {'median_r':>9} "
          f"{'heldout':>8} {'steps_to_rb':>11} {'sel_ms':>8}")
    for name, m in out["schedulers"].items():
        ratio = m["batch_variance"] / base["batch_variance"] if base else float("nan")
        st = "-" if m["steps_to_random_best"] is None else f"{m['steps_to_random_best']:.0f}"
        print(f"{name:<16} {m['batch_variance']:>10.4f} {ratio:>9.2f} {m['zero_variance_fraction']:>9.3f} "
              f"{m['envs_touched']:>6.1f} {m['median_reward']:>9.3f} {m['heldout_final']:>8.4f} {st:>11} "
              f"{1000 * m['select_seconds_median']:>8.2f}")
    return 0


def cmd_bench_replay(args) -> int:
    from envsched_pipeline.lake import Lake
    from envsched_pipeline.replay import replay

    lake = Lake(args.replay_lake) if args.replay_lake else _lake(args)
    names = [s.strip() for s in args.schedulers.split(",") if s.strip()]
    out = replay(lake, names, window=args.window, log=lambda m: print(m, file=sys.stderr, flush=True))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))
    return 0


# ---------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    from envsched_pipeline.scheduler import SCHEDULERS

    p = argparse.ArgumentParser(prog="envsched", description="Environment-aware rollout scheduling for agent RL.")
    p.add_argument("--lake", default=None, help="lake root (default: $ENVSCHED_LAKE or warehouse/lake)")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="run the scheduled training loop through the Dagster jobs, in-process")
    t.add_argument("--pool", default="synthetic")
    t.add_argument("--policy", default="simulated", help="simulated (CPU testbed) | hf-tiny | hf | vllm | openai")
    t.add_argument("--steps", type=int, default=20, help="total steps the lake should hold (resumes)")
    t.add_argument("--max-steps", type=int, default=None,
                   help="the run's length for the sensor (default --steps): `--steps 1 --max-steps 40` runs one "
                        "step here and lets the loop sensor in `make ui` drive the rest")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--batch-size", type=int, default=64)
    t.add_argument("--group-size", type=int, default=8)
    t.add_argument("--scheduler", default="envsched" if "envsched" in SCHEDULERS else "random",
                   choices=sorted(SCHEDULERS))
    t.add_argument("--model-path", default=None, help="local Qwen3 checkpoint folder (hf / vllm policies)")
    t.add_argument("--max-new-tokens", type=int, default=None, help="tokens per assistant turn (torch policies)")
    t.add_argument("--lr", type=float, default=None, help="learning rate (torch policies; default 1e-6)")
    t.add_argument("--prior-lake", default="", help="start the estimates from another run's lake (cross-run prior)")
    t.add_argument("--prior-discount", type=float, default=0.5, help="weight of the prior run's statistics")
    t.add_argument("--cost-aware", action="store_true", help="score informativeness per predicted rollout second")
    t.add_argument("--sim-mode", default="auto", choices=["auto", "latent", "real"],
                   help="simulated policy: latent model of the checks (synthetic) or gold actions corrupted "
                        "and run through the real runtime + verifier (default for package pools)")
    t.set_defaults(func=cmd_train)

    s = sub.add_parser("sql", help="run SQL over the lake's DuckDB views")
    s.add_argument("query")
    s.add_argument("--format", choices=("table", "csv", "json"), default="table")
    s.set_defaults(func=cmd_sql)

    pool = sub.add_parser("pool", help="task pools")
    psub = pool.add_subparsers(dest="pool_command", required=True)
    pl = psub.add_parser("list", help="registered and imported pools")
    pl.set_defaults(func=cmd_pool_list)

    b = sub.add_parser("bench", help="benchmarks")
    bsub = b.add_subparsers(dest="bench_command", required=True)
    bs = bsub.add_parser("scheduler", help="every scheduler against the same simulated learner, pool and seeds")
    bs.add_argument("--pool", default="synthetic", choices=["synthetic"])
    bs.add_argument("--steps", type=int, default=200)
    bs.add_argument("--seed", type=int, default=0)
    bs.add_argument("--seeds", type=int, default=1, help="average over seeds seed..seed+N-1")
    bs.add_argument("--schedulers", default="random,envsched,exploit-only,coverage-only,variance-greedy,greso,mopps,dps,oracle")
    bs.add_argument("--envs", type=int, default=51)
    bs.add_argument("--tasks", type=int, default=50, help="tasks per environment")
    bs.add_argument("--batch-size", type=int, default=64)
    bs.add_argument("--group-size", type=int, default=8)
    bs.add_argument("--json", default=None, help="write the result document here")
    bs.add_argument("--series", action="store_true", help="include per-step series in the JSON")
    bs.set_defaults(func=cmd_bench_scheduler)

    pi = psub.add_parser("import", help="import a pool from files")
    pi.add_argument("kind", choices=["envscaler"])
    pi.add_argument("--scenarios", required=True)
    pi.add_argument("--env-metadata", required=True)
    pi.add_argument("--name", required=True)
    pi.set_defaults(func=cmd_pool_import)

    env = sub.add_parser("env", help="environments")
    esub = env.add_subparsers(dest="env_command", required=True)
    er = esub.add_parser("run", help="run a list of tool calls against a task, then verify")
    er.add_argument("--pool", required=True)
    er.add_argument("--task", required=True)
    er.add_argument("--actions", required=True, help='JSON list of {"name", "arguments"}')
    er.add_argument("--answer", default=None, help="final answer text (reasoning_gym)")
    er.set_defaults(func=cmd_env_run)

    pc = psub.add_parser("create", help="make a synthetic pool under a name")
    pc.add_argument("kind", choices=["synthetic"])
    pc.add_argument("--name", required=True)
    pc.add_argument("--envs", type=int, default=51)
    pc.add_argument("--tasks-per-env", type=int, default=50)
    pc.add_argument("--seed", type=int, default=0)
    pc.set_defaults(func=cmd_pool_create)

    step = sub.add_parser("step", help="step-by-step protocol for an external trainer")
    ssub = step.add_subparsers(dest="step_command", required=True)
    sel = ssub.add_parser("select", help="write manifest T and print its picks as JSON lines")
    sel.add_argument("--pool", required=True)
    sel.add_argument("--step", type=int, required=True)
    sel.add_argument("--scheduler", default=None, choices=sorted(SCHEDULERS))
    sel.add_argument("--seed", type=int, default=None)
    sel.add_argument("--batch-size", type=int, default=None)
    sel.add_argument("--group-size", type=int, default=None)
    sel.set_defaults(func=cmd_step_select)
    ing = ssub.add_parser("ingest", help="validate and write rollouts of step T (.jsonl or .parquet)")
    ing.add_argument("--pool", required=True)
    ing.add_argument("--step", type=int, required=True)
    ing.add_argument("--rollouts", required=True)
    ing.set_defaults(func=cmd_step_ingest)
    sst = ssub.add_parser("status", help="last selected and last ingested step")
    sst.add_argument("--pool", required=True)
    sst.set_defaults(func=cmd_step_status)

    rp = sub.add_parser("report", help="HTML report with plots of the lake's run")
    rp.add_argument("--out", required=True)
    rp.add_argument("--no-baselines", action="store_true", help="skip re-running baselines in the simulator")
    rp.set_defaults(func=cmd_report)

    br = bsub.add_parser("replay", help="offline evaluation of schedulers on a logged run (no new rollouts)")
    br.add_argument("--lake", dest="replay_lake", default=None, help="the logged run's lake")
    br.add_argument("--schedulers", default="random,envsched,exploit-only,greso,mopps,dps")
    br.add_argument("--window", type=int, default=4, help="steps within which a task's logged variance is reused")
    br.add_argument("--json", default=None)
    br.set_defaults(func=cmd_bench_replay)

    st = sub.add_parser("status", help="the lake's run and its last steps")
    st.set_defaults(func=cmd_status)
    return p


def main(argv: list[str] | None = None) -> int:
    import warnings

    warnings.filterwarnings("ignore", message=".*is currently in (preview|beta).*")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    parser = build_parser()
    args = parser.parse_args(argv)
    from envsched_pipeline.lake import LakeError
    from envsched_pipeline.service import StepError

    try:
        return int(args.func(args) or 0)
    except (UsageError, StepError, LakeError, KeyError, ValueError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"envsched: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
