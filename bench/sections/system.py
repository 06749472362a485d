"""Sections that measure the system rather than a learner: scheduler latency, incremental graph
updates, rollout backends, the pools' real runtimes and verifiers, the resident policy worker, the
BLAS-kernel audit, a step's metadata on a long run's lake."""

from __future__ import annotations

import json
import os
import resource
import time

import numpy as np
import pyarrow as pa
from kernel_audit import DIR_CONFIGS
from kernel_audit import audit as kernel_audit

from envsched_pipeline.analysis.bench import prepare_pool
from envsched_pipeline.graph.topk import add_tasks, topk_graph
from envsched_pipeline.graph.topology import offline_topology, topology_matrix, topology_text
from envsched_pipeline.graph.views import view_matrices
from envsched_pipeline.scheduler import make_scheduler
from envsched_pipeline.scheduler.config import SchedulerConfig
from envsched_pipeline.scheduler.state import Observations, SchedulerState
from envsched_pipeline.scheduler.variants import RECOMMENDED, resolve
from sections.common import PAPER_SELECT_SECONDS, machine, write_section

# the spread model of the recommended form refits every step on up to 4096 of the run's picks (64 steps
# of B = 64); the latency is read where it fits on all of them
LATENCY_STEPS = 70
LATENCY_READ = 5  # the median of the last this many steps


def section_latency(sizes: list[int]) -> None:
    """Select + state update per step at growing pool sizes, for the paper's envsched and for the
    recommended form (what a new run gets), read after the form's spread model holds a full window."""
    rows = [
        f"| tasks | envs | graph build s | scheduler | select + update s (median of the last {LATENCY_READ} steps) "
        "| select s "
        "| update s | peak RSS GB (process) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    forms = [("envsched (the paper's constants)", "envsched"), ("the recommended form", RECOMMENDED)]
    for n in sizes:
        envs = max(1, n // 50)
        t0 = time.perf_counter()
        pool = prepare_pool(envs, 50, 0, progress=None)
        build = pool["graph_stats"]["build_seconds"]
        tasks = pool["tasks"]
        for shown, form in forms:
            name, overrides = resolve(form)
            state = SchedulerState.new([t["task_id"] for t in tasks], [t["env_id"] for t in tasks])
            sched = make_scheduler(name, SchedulerConfig().with_overrides(**overrides), graph=pool["graph"])
            rng = np.random.default_rng(0)
            sel_t, upd_t = [], []
            for step in range(LATENCY_STEPS):
                a = time.perf_counter()
                picks = sched.select(state, 64, np.random.default_rng([0, step]), step).picks
                b = time.perf_counter()
                idx = np.array([p.index for p in picks])
                # groups with and without spread, so the form's spread model has both labels to fit
                rewards = [rng.choice([0.0, 0.33, 0.67, 1.0], size=8) * (rng.random() < 0.6) for _ in picks]
                sched.update(
                    state,
                    Observations.from_groups(step, idx, rewards),
                    predicted_u=np.array([p.pred_var for p in picks]),
                )
                sel_t.append(b - a)
                upd_t.append(time.perf_counter() - b)
            sel, upd = np.array(sel_t[-LATENCY_READ:]), np.array(upd_t[-LATENCY_READ:])
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
            rows.append(
                f"| {n:,} | {envs:,} | {build:.1f} | {shown} | {np.median(sel + upd):.4f} | {np.median(sel):.4f} "
                f"| {np.median(upd):.4f} | {peak:.1f} |"
            )
            print(
                f"latency {n} {form}: build {build:.1f}s step {np.median(sel + upd):.4f}s "
                f"(total {time.perf_counter() - t0:.0f}s)",
                flush=True,
            )
    write_section(
        "latency",
        "\n".join(
            [
                "## Scheduler latency (EnvSched, select + state update per step, excluding rollouts)",
                "",
                f"Machine: {machine()}. Paper: {PAPER_SELECT_SECONDS} s per step at 2,550 tasks. Targets: ≤ 0.2 s at "
                "2,550 tasks, ≤ 10 s at 250,000. Graph build = six TF-IDF views + topologies + sparse top-k "
                "(24 within / 48 cross candidates per task). Each scheduler runs "
                f"{LATENCY_STEPS} steps of B = 64 on synthetic rewards (six groups in ten with spread); the "
                "recommended form (what a new run gets) refits its spread model every step on up to 4096 "
                "picks, so it is read at the end, once that window is full.",
                "",
                *rows,
            ]
        ),
    )


def section_incremental(sizes: list[int]) -> None:
    """Adding 1% new tasks incrementally vs a full rebuild of the similarity top-k."""

    rows = [
        "| tasks | scenario | full top-k build s | add 1% incrementally s | ratio | peak RSS GB |",
        "|---|---|---|---|---|---|",
    ]
    for n in sizes:
        pool = prepare_pool(max(1, n // 50), 50, 0)
        tasks = pool["tasks"]
        tools = {}
        ids = np.array([t["task_id"] for t in tasks])
        env = np.array([t["env_id"] for t in tasks])
        mats = list(view_matrices(tasks, tools).values())
        topo = topology_matrix([topology_text(offline_topology(t)) for t in tasks])
        t0 = time.perf_counter()
        topk_graph(ids, env, mats, topo)
        full = time.perf_counter() - t0
        rng = np.random.default_rng(0)
        envs_sorted = sorted(set(env.tolist()))
        scenarios = {
            "1% new tasks spread over all environments": np.sort(
                rng.choice(len(ids), size=max(1, len(ids) // 100), replace=False)
            ),
            "1% new tasks as new environments": np.flatnonzero(
                np.isin(env, envs_sorted[-max(1, len(envs_sorted) // 100) :])
            ),
        }
        for label, new in scenarios.items():
            old = np.setdiff1d(np.arange(len(ids)), new)
            base = topk_graph(ids[old], env[old], [m[old] for m in mats], topo[old]).reindex(ids)
            t0 = time.perf_counter()
            add_tasks(base, env, mats, topo, new)
            inc = time.perf_counter() - t0
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
            rows.append(f"| {n:,} | {label} | {full:.2f} | {inc:.2f} | {inc / full:.3f} | {peak:.1f} |")
            print(f"incremental {n} ({label}): full {full:.2f}s, +1% {inc:.2f}s", flush=True)
    write_section(
        "incremental",
        "\n".join(
            [
                "## Incremental graph update (1% new tasks) vs full rebuild",
                "",
                "Same features; the incremental path computes only similarities that involve a new task "
                "(new rows in full, old rows against the new tasks, merged into their candidate lists). "
                "Target: ≤ 5% of a full rebuild. New tasks spread at random touch about half of all environment blocks, "
                "and the per-block work is dominated by fixed sparse-product overhead, which is what limits that scenario; "
                "new environments touch only their own blocks.",
                "",
                *rows,
            ]
        ),
    )


def _step_jobs(name: str, seed: int = 0) -> tuple:
    """One 64 x 8 step of real episodes on pool ``name``: gold actions corrupted with p = 0.6."""
    # the pools' packages and the trainer's episode code load only for the sections that roll out
    from envs.registry import episode_spec, load_pool
    from trainer.realenv import corrupt, tool_names_of

    data = load_pool(name)
    envs = {e["env_id"]: e for e in data.environments}
    rng = np.random.default_rng(seed)
    jobs = []
    for i in rng.choice(len(data.tasks), size=64, replace=False):
        t = data.tasks[i]
        env = envs[t["env_id"]]
        for _ in range(8):
            jobs.append(
                (episode_spec(env, t), corrupt(json.loads(t["gold"] or "[]"), 0.6, rng, tool_names_of(env)))
            )
    return data, jobs


def section_backends(pools: tuple[str, ...] = ("synthetic", "bfcl")) -> None:
    """Rollouts per second, local sandbox pool vs Ray actors hosting sandbox pools, same jobs."""
    # Ray (and the sandbox) start only for this section
    from envs.rollout_backend import RayEpisodePool
    from envs.sandbox import SandboxPool

    rows = [
        "| pool | backend | start s | 64 x 8 step s | rollouts / s | ratio vs local | same rewards |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in pools:
        _, jobs = _step_jobs(name)
        base = None
        for backend in ("local", "ray"):
            t0 = time.perf_counter()
            pool = SandboxPool(workers=2) if backend == "local" else RayEpisodePool(workers=2)
            with pool:
                pool.map_episodes(jobs[:4])  # warm every worker's imports
                start = time.perf_counter() - t0
                t1 = time.perf_counter()
                res = pool.map_episodes(jobs)
                step = time.perf_counter() - t1
            rewards = [round(r["reward"], 6) for r in res]
            base = base or (step, rewards)
            rows.append(
                f"| {name} | {backend} | {start:.1f} | {step:.2f} | {len(jobs) / step:.0f} | "
                f"{base[0] / step:.2f}x | {'yes' if rewards == base[1] else 'NO'} |"
            )
            print(f"backend {backend} on {name}: {step:.2f}s for {len(jobs)} rollouts", flush=True)
    write_section(
        "backends",
        "\n".join(
            [
                "## Rollout backends: local sandbox pool vs Ray (`ENVSCHED_ROLLOUT_BACKEND`)",
                "",
                f"Machine: {machine()}. The same 512 episodes (corrupted gold actions, real runtime and verifier) on 2 "
                "local sandbox workers, then on a local Ray with 2 actors each hosting one sandbox worker. On 2 cores "
                "parity is the expectation: the point of Ray is the same code on a cluster's nodes. `start s` includes "
                "starting Ray and the actors.",
                "",
                *rows,
            ]
        ),
    )


def section_pools() -> None:
    """Rollouts per second with real runtimes and verifiers (gold actions corrupted with p = 0.6),
    one 64 x 8 step per pool on 2 sandbox workers."""
    from envs.sandbox import SandboxPool  # sandbox workers: the sections that roll out only

    rows = [
        "| pool | tasks | environments | 64 x 8 step s | rollouts / s | worker start s | mean reward | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in ("synthetic", "bfcl", "tau2", "reasoning_gym"):
        data, jobs = _step_jobs(name)
        t0 = time.perf_counter()
        with SandboxPool(workers=2) as pool:
            pool.run_episode(*jobs[0][:2])  # warm both the worker and the pool's imports
            pool.run_episode(*jobs[1][:2])
            warm = time.perf_counter() - t0
            t1 = time.perf_counter()
            res = pool.map_episodes(jobs)
            step = time.perf_counter() - t1
        errs = sum(r.get("error_class") not in ("none", "task") for r in res)
        rows.append(
            f"| {name} | {len(data.tasks):,} | {len(data.environments)} | {step:.2f} | {len(jobs) / step:.0f} | "
            f"{warm:.1f} | {np.mean([r['reward'] for r in res]):.3f} | {errs} |"
        )
        print(f"pool {name}: {step:.2f}s for 512 rollouts", flush=True)
    write_section(
        "pools",
        "\n".join(
            [
                "## Rollouts with real runtimes and verifiers (2 sandbox workers)",
                "",
                f"Machine: {machine()}. Each rollout runs a corrupted gold action sequence (keep probability 0.6 per "
                "action) in a sandboxed worker and scores it with the pool's own verifier. Target: one 64 x 8 step on "
                "bfcl ≤ 10 s.",
                "",
                *rows,
            ]
        ),
    )


def section_kernels() -> None:
    """Which graph each graph-reading record was made with (bench/kernel_audit.py, from the first
    batches kept in bench/runs/kernels.json)."""
    write_section("kernels", kernel_audit(list(DIR_CONFIGS)), after="neural_draws")


def _loop_per_mode(policy: str, pool, pc: dict, steps: int, batch: int, group: int) -> dict:
    """For "per-step" and "resident": a fresh lake on ``pool`` (a TaskPool), ``steps`` steps of
    ``policy`` through the Dagster jobs in-process; each mode's per-step walls and train_metrics."""
    # Dagster, the loop driver and the trainer load only for the resident sections' lakes
    import tempfile

    import dagster as dg

    from envsched_pipeline.core.pools import import_pool
    from envsched_pipeline.lake import Lake
    from envsched_pipeline.orchestration.driver import run_loop
    from envsched_pipeline.run import RunSpec, start_run

    out = {}
    for mode in ("per-step", "resident"):
        with tempfile.TemporaryDirectory() as d, dg.instance_for_test() as instance:
            lake = Lake(os.path.join(d, "lake"))
            import_pool(lake, pool)
            config = {**pc, **({"resident": True} if mode == "resident" else {})}
            spec = RunSpec(
                pool=pool.name,
                policy=policy,
                scheduler="random",
                batch_size=batch,
                group_size=group,
                max_steps=steps,
                policy_config=config,
            )
            start_run(lake, spec)
            walls: list[float] = []
            run_loop(lake, steps, instance=instance, on_step=lambda _s, w, walls=walls: walls.append(w))
            out[mode] = (walls, lake.sql("select * from train_metrics order by step").to_pylist())
            print(f"resident bench ({policy}): {mode} walls {[round(w, 2) for w in walls]}", flush=True)
    return out


def section_resident(steps: int = 5) -> None:
    """Per-step overhead of the LM policy path: one process per step vs the resident worker (CPU,
    tiny Qwen3), and the projection for 4B / 8B models on a GPU."""
    from envs.registry import load_synthetic  # with the loop's imports: only this section

    pool = load_synthetic("mini", n_envs=2, tasks_per_env=4, seed=0)
    # no held-out evaluation: the section times the training step's path alone
    settings = {"max_new_tokens": 16, "checkpoint_every": 20, "eval_every": 0}
    runs = _loop_per_mode("hf-tiny", pool, settings, steps, 4, 2)
    results = {}
    for mode, (walls, m) in runs.items():
        results[mode] = {
            "wall": float(np.mean(walls[1:])),
            "first_wall": walls[0],
            "compute": float(np.mean([r["rollout_seconds"] + r["update_seconds"] for r in m[1:]])),
            "load": float(np.mean([r["load_seconds"] for r in m[1:]])),
            "save": float(np.mean([r["save_seconds"] for r in m[1:]])),
        }
    rows = [
        "| mode | wall s per step (steps 1..) | trainer compute s (rollouts + update) | model load s per step | "
        "checkpoint save s per step | everything else s (process start, imports, Dagster, scheduler) |",
        "|---|---|---|---|---|---|",
    ]
    for mode, r in results.items():
        rows.append(
            f"| {mode} | {r['wall']:.2f} | {r['compute']:.2f} | {r['load']:.2f} | {r['save']:.2f} | "
            f"{r['wall'] - r['compute'] - r['load'] - r['save']:.2f} |"
        )
    proj = [
        "| model | weights (bf16) | AdamW state (fp32 m, v + master) | per step, one process per step | "
        "per step, resident (checkpoint every 20) |",
        "|---|---|---|---|---|",
    ]
    for name, params in (("Qwen3-4B", 4.0e9), ("Qwen3-8B", 8.2e9)):
        w_gb, opt_gb = params * 2 / 1e9, params * 12 / 1e9
        io = (w_gb + opt_gb) * 2 / 2.0  # read + write at 2 GB/s
        per_step = io + 90  # + a vLLM engine start (~60-120 s)
        proj.append(
            f"| {name} | {w_gb:.0f} GB | {opt_gb:.0f} GB | ~{per_step:.0f} s (I/O {io:.0f} s + vLLM start "
            f"~90 s) | ~{io / 20:.0f} s amortized (I/O once per 20 steps) |"
        )
    write_section(
        "resident",
        "\n".join(
            [
                "## Resident policy worker vs one process per step (CPU, tiny Qwen3)",
                "",
                f"`hf-tiny`, 4 tasks x 2 rollouts, 16 new tokens per turn, {steps} steps through the Dagster jobs in-process "
                f"(mean of steps 1..{steps - 1}; step 0 pays the resident worker's start). Machine: {machine()}. The "
                "per-step mode reloads the model and optimizer and saves `checkpoints/latest` every step; the resident worker "
                "loads once and checkpoints every 20 steps and at the end.",
                "",
                *rows,
                "",
                "Projection on a GPU node (not measured here: no GPU was available; assumptions: bf16 weights, fp32 AdamW "
                "moments and master weights = 12 bytes per parameter, 2 GB/s checkpoint storage, a vLLM engine start of "
                "~90 s):",
                "",
                *proj,
            ]
        ),
    )


def section_resident_neural(steps: int = 6) -> None:
    """Per-step wall of `envsched train --policy neural` on the default synthetic pool (64 x 8):
    one trainer process per step vs the resident worker, and whether their numbers agree."""
    from envs.registry import load_synthetic  # with the loop's imports: only this section

    runs = _loop_per_mode("neural", load_synthetic("synthetic"), {}, steps, 64, 8)
    rows = [
        "| mode | wall s per step (steps 1..) | trainer compute s (rollouts + update) | everything else s "
        "(process start, imports, environments, Dagster, scheduler) | step 0 wall s (warm start) |",
        "|---|---|---|---|---|",
    ]
    walls_of = {}
    for mode, (walls, m) in runs.items():
        wall, compute = float(np.mean(walls[1:])), float(np.mean([r["seconds"] for r in m[1:]]))
        walls_of[mode] = wall
        rows.append(f"| {mode} | {wall:.2f} | {compute:.2f} | {wall - compute:.2f} | {walls[0]:.2f} |")
    same = [
        a["step"] == b["step"] and a["reward_mean"] == b["reward_mean"] and str(a["loss"]) == str(b["loss"])
        for a, b in zip(runs["per-step"][1], runs["resident"][1], strict=True)
    ]
    write_section(
        "resident_neural",
        "\n".join(
            [
                "## Resident worker for the neural learner (`envsched train --policy neural --resident`)",
                "",
                f"The default synthetic pool, 64 tasks x 8 rollouts, {steps} steps through the Dagster jobs in-process "
                f"(mean of steps 1..{steps - 1}, the last of which also measures held-out; step 0 pays the warm start and the resident worker's start). Machine: "
                f"{machine()}. One process per step starts Python, imports torch (whose optimizer pulls in its "
                "compiler stack) and builds the environments every step; the resident worker does it once and still "
                "writes every step's checkpoint.",
                "",
                *rows,
                "",
                f"Resident / per-step wall per step: **{walls_of['resident'] / walls_of['per-step']:.2f}x**. The two "
                f"modes' steps agree (loss and mean reward) in {sum(same)} of {len(same)} steps.",
            ]
        ),
        after="resident",
    )


def section_step_views(lengths: tuple[int, ...] = (20, 200, 1000), repeats: int = 3) -> None:
    """What a step's metadata costs on a long run's lake: the plots a training step renders and the
    step table `envsched train` prints, with every view of the lake built per query (before
    2026-12-05) against only the views a query reads. A lake of N steps is made from a 10-step
    simulated run whose partitions are written again under later steps (the same rows, renumbered)."""
    # the step service, the simulated trainer and the plots load only for this section
    import tempfile

    import envsched_pipeline.lake as lake_module
    from envs.registry import load_synthetic
    from envsched_pipeline.analysis import plots
    from envsched_pipeline.core.loop import step_summary
    from envsched_pipeline.core.pools import import_pool
    from envsched_pipeline.core.select import select_manifest
    from envsched_pipeline.core.statistics import statistics_step
    from envsched_pipeline.run import RunSpec, start_run
    from trainer.step import run_step

    base_steps = 10
    rows = [
        "| steps in the lake | Parquet files | every view per query, s | the views a query reads, s | ratio |",
        "|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as d:
        lake = lake_module.Lake(os.path.join(d, "lake"))
        import_pool(lake, load_synthetic("synthetic", n_envs=12, tasks_per_env=20))
        start_run(
            lake,
            RunSpec(pool="synthetic", policy="simulated", batch_size=16, group_size=8, max_steps=base_steps),
        )
        for t in range(base_steps):
            select_manifest(lake, t)
            run_step(lake, t, log=lambda *_: None)
            statistics_step(lake, t)
        tables = [t for t in lake_module.STEP_TABLES if lake.steps(t)]
        have = base_steps
        for n in lengths:
            for s in range(have, n):  # step s repeats step s % 10's rows under its own number
                for table in tables:
                    t = lake.read(table, step=s % base_steps)
                    if "step" in t.column_names:
                        t = t.set_column(
                            t.column_names.index("step"), "step", pa.array([s] * t.num_rows, pa.int64())
                        )
                    lake.write(table, t, step=s)
            have = max(have, n)
            files = sum(len(lake.steps(t)) for t in tables)

            def work(n=n):
                last = n - 1
                plots.training_curves(lake, last)
                plots.statistics_trends(lake, "synthetic", last)
                plots.yield_calibration_plot(lake, last)
                step_summary(lake)

            seconds = {}
            real = lake_module._views_needed
            for mode in ("every view", "read"):
                lake_module._views_needed = real if mode == "read" else (lambda queries, derived: None)
                try:
                    work()  # warm: imports, fonts, file cache
                    t0 = time.perf_counter()
                    for _ in range(repeats):
                        work()
                    seconds[mode] = (time.perf_counter() - t0) / repeats
                finally:
                    lake_module._views_needed = real
            rows.append(
                f"| {n} | {files} | {seconds['every view']:.2f} | {seconds['read']:.2f} | "
                f"{seconds['read'] / seconds['every view']:.2f}x |"
            )
            print(f"step views bench: {rows[-1]}", flush=True)
    write_section(
        "step_views",
        "\n".join(
            [
                "## A step's plots and step table on a long run's lake (views built per query)",
                "",
                "Every `Lake.sql` query opens an in-memory DuckDB whose views read the footer of every "
                "Parquet file of their table, so a step's metadata (the three plots a training step "
                "renders, `training_curves`, `statistics_trends`, `yield_calibration`, and the step table "
                "`envsched train` prints) cost more with every step of the run. Since 2026-12-05 a query "
                "builds only the views it names and what they are built on (`show tables` and other "
                f"queries naming none still get all). Mean of {repeats} rounds after a warm one; lakes "
                "of N steps made from a 10-step simulated run (B = 16, G = 8) whose partitions are "
                f"written again under later step numbers. Machine: {machine()}.",
                "",
                *rows,
            ]
        ),
        after="resident_neural",
    )
