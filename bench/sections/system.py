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
from sections.common import HERE, PAPER_SELECT_SECONDS, machine, write_section

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
    # the step service and the plots load only for this section
    import tempfile

    import envsched_pipeline.lake as lake_module
    from envs.registry import load_synthetic
    from envsched_pipeline.analysis import plots
    from envsched_pipeline.core.loop import step_summary
    from envsched_pipeline.core.pools import import_pool
    from envsched_pipeline.run import RunSpec, start_run

    base_steps = 10
    rows = [
        "| steps in the lake | Parquet files | every view per query, s | the views a query reads, s | "
        "those views over cached reads (now), s | now / every view |",
        "|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as d:
        lake = lake_module.Lake(os.path.join(d, "lake"))
        import_pool(lake, load_synthetic("synthetic", n_envs=12, tasks_per_env=20))
        start_run(
            lake,
            RunSpec(pool="synthetic", policy="simulated", batch_size=16, group_size=8, max_steps=base_steps),
        )
        _steps_in_process(lake, base_steps, "step views bench")
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
            for mode in ("every view", "read", "cached"):
                lake_module._views_needed = real if mode != "every view" else (lambda queries, derived: None)
                # before 2026-12-06 every query read its files (no cache): the cache turned off
                os.environ["ENVSCHED_LAKE_CACHE_MB"] = "256" if mode == "cached" else "0"
                try:
                    work()  # warm: imports, fonts, file cache
                    t0 = time.perf_counter()
                    for _ in range(repeats):
                        work()
                    seconds[mode] = (time.perf_counter() - t0) / repeats
                finally:
                    lake_module._views_needed = real
                    os.environ.pop("ENVSCHED_LAKE_CACHE_MB", None)
            rows.append(
                f"| {n} | {files} | {seconds['every view']:.2f} | {seconds['read']:.2f} | "
                f"{seconds['cached']:.2f} | {seconds['cached'] / seconds['every view']:.2f}x |"
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
                "queries naming none still get all); since 2026-12-06 those views read a table's files "
                "once per process and keep them (`$ENVSCHED_LAKE_CACHE_MB`), so a query re-reads only "
                f"files written since. Mean of {repeats} rounds after a warm one; lakes "
                "of N steps made from a 10-step simulated run (B = 16, G = 8) whose partitions are "
                f"written again under later step numbers. Machine: {machine()}.",
                "",
                *rows,
            ]
        ),
        after="resident_neural",
    )


REQUEST_S = 0.02  # a round trip to a real object store, for the projection (not measured here)


def _whole_partition(self, rel, columns=None):
    """An object-store partition read as before 2026-12-06's thirty-second session: a whole GET
    every time (the benches' "before" modes put it in place of ``_ObjectStore.read_partition``)."""
    return self.read_parquet(rel, columns=columns)


def _s3_server(bucket: str):
    """A context: moto's S3 server on a free port of this machine with ``bucket`` made, its
    endpoint and credentials in this process's environment (as a deployment sets them) until the
    block ends; then the server stopped and the environment as it was."""
    # the S3 server and its clients load only for the object-store sections
    import contextlib
    import socket
    import subprocess
    import sys

    import boto3
    import s3fs

    from envsched_pipeline.orchestration.driver import environment

    @contextlib.contextmanager
    def serve():
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        env = {
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        try:
            for _ in range(100):
                with socket.socket() as sock:
                    if sock.connect_ex(("127.0.0.1", port)) == 0:
                        break
                time.sleep(0.1)
            with environment(env):
                # s3fs keeps its filesystems by their arguments: one made for an earlier section's
                # server would still talk to that server's port
                s3fs.S3FileSystem.clear_instance_cache()
                boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"]).create_bucket(Bucket=bucket)
                yield env
        finally:
            s3fs.S3FileSystem.clear_instance_cache()
            server.terminate()
            server.wait(timeout=10)

    return serve()


def section_lake_bytes(steps: int = 8) -> None:
    """Bytes the driver's process reads from an object-store lake a step, at the default pool's
    size (2550 tasks, B = 64, G = 8): every partition read a whole GET (as before 2026-12-06's
    thirty-second session) against today's GET conditional on the ETag this process read it at,
    which an unchanged partition (the pool's tasks and graph, read by several ops of every step)
    answers with 304 and no body. Both in one run, through the Dagster jobs in-process."""
    # the S3 server, Dagster, the loop driver and s3fs load only for this section
    import collections
    import tempfile

    import dagster as dg
    import s3fs

    import envsched_pipeline.lake as lake_module
    from envsched_pipeline.core.pools import ensure_pool
    from envsched_pipeline.orchestration.driver import environment, run_loop
    from envsched_pipeline.run import RunSpec, start_run

    got: collections.Counter = collections.Counter()  # body bytes by table
    asked = [0]
    real_call = s3fs.S3FileSystem._call_s3

    async def counting(self, method, *args, **kwargs):
        asked[0] += 1
        out = await real_call(self, method, *args, **kwargs)  # a 304 raises: no bytes
        if (method if isinstance(method, str) else method.__name__) == "get_object":
            got[kwargs["Key"].split("/")[1].split("=")[0]] += int(out.get("ContentLength") or 0)
        return out

    results: dict[str, dict] = {}
    real = lake_module._ObjectStore.read_partition
    with _s3_server("bench-bytes"):
        s3fs.S3FileSystem._call_s3 = counting
        try:
            for mode in ("whole", "conditional"):
                lake_module._ObjectStore.read_partition = _whole_partition if mode == "whole" else real
                per_step: list[dict] = []
                with (
                    tempfile.TemporaryDirectory() as d,
                    environment({"ENVSCHED_LOCAL_DIR": d}),
                    dg.instance_for_test() as instance,
                ):
                    lake = lake_module.Lake(f"s3://bench-bytes/{mode}")
                    print(f"lake bytes bench: {mode}: importing the default pool", flush=True)
                    ensure_pool(lake, "synthetic")
                    start_run(lake, RunSpec(pool="synthetic", policy="simulated", max_steps=steps))
                    t0 = [time.perf_counter()]

                    def on_step(step, _wall, per_step=per_step, t0=t0, mode=mode):
                        now = time.perf_counter()
                        per_step.append({"bytes": dict(got), "requests": asked[0], "wall": now - t0[0]})
                        print(
                            f"lake bytes bench: {mode}: step {step + 1}/{steps}, "
                            f"{sum(got.values()) / 1e6:.2f} MB in {asked[0]} requests",
                            flush=True,
                        )
                        got.clear()
                        asked[0] = 0
                        t0[0] = now

                    got.clear()
                    asked[0] = 0
                    run_loop(lake, steps, instance=instance, on_step=on_step)
                results[mode] = per_step
        finally:
            lake_module._ObjectStore.read_partition = real
            s3fs.S3FileSystem._call_s3 = real_call
    steady = range(2, steps)  # step 0 reads the pool and builds the graph; step 1 warms up

    def mean(mode: str, what) -> float:
        return float(np.mean([what(results[mode][t]) for t in steady]))

    def mb(row: dict, tables=None) -> float:
        return sum(v for k, v in row["bytes"].items() if tables is None or k in tables) / 1e6

    pool_tables = {"tasks", "edges", "features", "topologies", "environments", "task_latents"}
    rows = [
        "| reads | MB a step | of it the pool's tables | requests a step | wall s a step |",
        "|---|---|---|---|---|",
    ]
    for mode, label in (("whole", "a whole GET each (before)"), ("conditional", "conditional GET (now)")):
        rows.append(
            f"| {label} | {mean(mode, mb):.2f} | {mean(mode, lambda r: mb(r, pool_tables)):.2f} | "
            f"{mean(mode, lambda r: r['requests']):.0f} | {mean(mode, lambda r: r['wall']):.2f} |"
        )
    top = collections.Counter()
    for t in steady:
        top.update(results["whole"][t]["bytes"])
    biggest = ", ".join(f"{k} {v / len(steady) / 1e3:.0f} KB" for k, v in top.most_common(4))
    ratio = mean("conditional", mb) / mean("whole", mb)
    load = os.getloadavg()[0]
    write_section(
        "lake_bytes",
        "\n".join(
            [
                "## What a step reads from an object-store lake, at the default pool's size",
                "",
                f"A simulated run of {steps} steps of the default synthetic pool (2550 tasks, B = 64, "
                "G = 8) on an `s3://` lake served by moto's S3 server on this machine, through the "
                "Dagster jobs in-process; the bytes of every GET's body and the requests counted at "
                "s3fs's one entry point in the driver's process (selection, statistics, checks, "
                f"plots), averaged over steps {steady.start}-{steady.stop - 1}. Before: every read of "
                "one partition a whole GET; now: a GET conditional on the ETag this process last read "
                "the partition at (`If-None-Match`), answered 304 with no body while it is unchanged. "
                f"Both in one run. Machine: {machine()}; load average {load:.1f} at the end (the wall "
                "seconds are the machine's with that load).",
                "",
                *rows,
                "",
                f"Now / before: **{ratio:.3f}x** the bytes a step. Before, the largest were {biggest} "
                "a step: the pool's tasks and graph, read whole by several ops of every step though "
                "they change only when the pool is imported again. The requests stay one per read.",
            ]
        ),
        after="lake_requests",
    )


def section_lake_requests(steps: int = 30) -> None:
    """Requests to the object store per step of a run on an ``s3://`` lake (moto's S3 server on
    this machine), counted in the driver's process, as the run grows: the listings, scheduler-state
    lookups and cached reads of 2026-12-06 against what came before (s3fs's glob, one lookup per
    step's state, every query reading every file), both in one run; and, in the run of today's
    code, the trainer step's own process (counted by a ``sitecustomize`` the bench puts on its
    path)."""
    # Dagster, the loop driver and s3fs load only for this section
    import contextlib
    import shutil
    import tempfile

    import dagster as dg
    import s3fs

    import envsched_pipeline.core.loop as loop_module
    import envsched_pipeline.lake as lake_module
    from envs.registry import load_synthetic
    from envsched_pipeline.analysis.plots import per_step_plot
    from envsched_pipeline.core.pools import import_pool
    from envsched_pipeline.core.state_store import has_state
    from envsched_pipeline.orchestration.driver import run_loop
    from envsched_pipeline.run import RunSpec, start_run

    calls: list[str] = []
    real_call = s3fs.S3FileSystem._call_s3

    async def counting(self, method, *args, **kwargs):
        calls.append(method if isinstance(method, str) else method.__name__)
        return await real_call(self, method, *args, **kwargs)

    def before_glob(self, pattern):  # s3fs's glob: one listing per folder a wildcard matches
        self.fs.invalidate_cache()
        return sorted(p[len(self.base) + 1 :] for p in self.fs.glob(self._key(pattern)))

    real_done = loop_module._done

    def before_done(lake, external):  # the loop once looked up each step's state
        sel, roll, stats = real_done(lake, external)
        for s in stats:
            has_state(lake, s)
        return sel, roll, stats

    @contextlib.contextmanager
    def before_snapshot(self):  # every read asked the store
        yield self

    def before_get(self, rel):  # s3fs's cat_file: a HEAD for the size, then the GET
        try:
            return self.fs.cat_file(self._key(rel))
        except (FileNotFoundError, IsADirectoryError):
            return None

    saved = {
        k: os.environ.get(k)
        for k in [
            "ENVSCHED_LOCAL_DIR",
            "ENVSCHED_LAKE_CACHE_MB",
            "PYTHONPATH",
            "ENVSCHED_BENCH_REQUESTS",
        ]
    }
    hook = tempfile.mkdtemp()  # the trainer's process counts its requests into a file
    child_log = os.path.join(hook, "requests.log")
    with open(os.path.join(hook, "sitecustomize.py"), "w") as f:
        f.write(
            "import os\n"
            "if os.environ.get('ENVSCHED_BENCH_REQUESTS'):\n"
            "    import s3fs\n"
            "    _real = s3fs.S3FileSystem._call_s3\n"
            "    async def _counted(self, method, *args, **kwargs):\n"
            "        with open(os.environ['ENVSCHED_BENCH_REQUESTS'], 'a') as log:\n"
            "            log.write('.')\n"
            "        return await _real(self, method, *args, **kwargs)\n"
            "    s3fs.S3FileSystem._call_s3 = _counted\n"
        )

    def child_requests() -> int:  # the trainer's requests since the last call
        try:
            with open(child_log) as log:
                n = len(log.read())
        except FileNotFoundError:
            return 0
        os.remove(child_log)
        return n

    results: dict[str, dict[str, list[float]]] = {}
    stack = contextlib.ExitStack()
    try:
        stack.enter_context(_s3_server("bench-lake"))
        s3fs.S3FileSystem._call_s3 = counting
        pool = load_synthetic("mini", n_envs=4, tasks_per_env=6, seed=0)
        for mode in ("before", "now"):
            patched = mode == "before"
            real = (
                lake_module._ObjectStore.glob,
                lake_module._ObjectStore.get,
                lake_module._ObjectStore.read_partition,
                loop_module._done,
                lake_module.Lake.snapshot,
            )
            if patched:
                lake_module._ObjectStore.glob = before_glob
                lake_module._ObjectStore.get = before_get
                lake_module._ObjectStore.read_partition = _whole_partition
                loop_module._done = before_done
                lake_module.Lake.snapshot = before_snapshot
                os.environ["ENVSCHED_LAKE_CACHE_MB"] = "0"
            else:
                os.environ["ENVSCHED_BENCH_REQUESTS"] = child_log
                os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [hook, saved["PYTHONPATH"]]))
            try:
                with tempfile.TemporaryDirectory() as d, dg.instance_for_test() as instance:
                    os.environ["ENVSCHED_LOCAL_DIR"] = d
                    lake = lake_module.Lake(f"s3://bench-lake/{mode}")
                    import_pool(lake, pool)
                    start_run(
                        lake,
                        RunSpec(pool="mini", policy="simulated", batch_size=6, group_size=4, max_steps=steps),
                    )
                    counts: list[float] = []
                    walls: list[float] = []
                    trainer: list[float] = []

                    def on_step(step, _wall, counts=counts, walls=walls, trainer=trainer):
                        counts.append(len(calls))
                        walls.append(time.perf_counter())
                        trainer.append(child_requests())
                        calls.clear()

                    calls.clear()
                    child_requests()
                    walls.append(time.perf_counter())
                    run_loop(lake, steps, instance=instance, on_step=on_step)
                    results[mode] = {
                        "requests": counts,
                        "wall": [b - a for a, b in zip(walls, walls[1:], strict=False)],
                        "trainer": trainer,
                    }
                    print(f"lake requests bench: {mode}: {counts[:3]} ... {counts[-3:]}", flush=True)
            finally:
                (
                    lake_module._ObjectStore.glob,
                    lake_module._ObjectStore.get,
                    lake_module._ObjectStore.read_partition,
                    loop_module._done,
                    lake_module.Lake.snapshot,
                ) = real
                os.environ.pop("ENVSCHED_LAKE_CACHE_MB", None)
                os.environ.pop("ENVSCHED_BENCH_REQUESTS", None)
    finally:
        shutil.rmtree(hook, ignore_errors=True)
        s3fs.S3FileSystem._call_s3 = real_call
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        stack.close()
    marks = sorted({1, steps // 3, 2 * steps // 3, steps - 1})
    rows = [
        "| step | requests, before | requests, now | now / before | wall s, before | wall s, now | "
        "the trainer process's requests, now |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in marks:
        b, n = results["before"], results["now"]
        rows.append(
            f"| {t} | {b['requests'][t]:.0f} | {n['requests'][t]:.0f} | "
            f"{n['requests'][t] / b['requests'][t]:.2f}x | {b['wall'][t]:.2f} | {n['wall'][t]:.2f} | "
            f"{n['trainer'][t]:.0f} |"
        )

    def fit(
        mode: str, key: str = "requests"
    ) -> tuple[float, float]:  # a + b x step (least squares, steps 1..)
        y = np.array(results[mode][key][1:])
        b, a = np.polyfit(np.arange(1, len(y) + 1), y, 1)
        return float(a), float(b)

    def at_1000(mode: str) -> float:  # seconds of round trips in the step at step 1000, 20 ms each
        a, b = fit(mode)
        return (a + b * 1000) * REQUEST_S

    per_step_plot(
        {
            "requests to the store in the step": {m: r["requests"] for m, r in results.items()},
            "wall seconds of the step": {m: r["wall"] for m, r in results.items()},
        },
        HERE / "lake_requests.png",
    )
    write_section(
        "lake_requests",
        "\n".join(
            [
                "## An object-store lake's requests per step as the run grows",
                "",
                f"A simulated run of {steps} steps (pool of 4 environments x 6 tasks, B = 6, G = 4) on an "
                "`s3://` lake served by moto's S3 server on this machine, through the Dagster jobs "
                "in-process; requests counted at s3fs's one entry point in the driver's process "
                "(selection, statistics, plots, checks) and, in today's run, in the trainer step's "
                "own process (the manifest, the run, the pool's latents, the policy checkpoint, the "
                "rollouts and metrics it writes; the same code in both modes). "
                "Before: s3fs's glob (one listing per step folder a wildcard matches), one lookup per "
                "step's scheduler state, every read a HEAD and a GET, and every query reading every "
                "Parquet object of its tables; now (2026-12-06): one recursive listing per glob, no "
                "lookup of the states (a step with statistics has folded its state), one GET per "
                "read, each object read once per process (`$ENVSCHED_LAKE_CACHE_MB`), and the "
                "loop's planning passes, the selection, the statistics, the checks and a step's "
                "views each asking the store once per object, listing and partition "
                "(`Lake.snapshot`); the statistics drop the state two steps back unless kept for good "
                "(a delete a step). "
                f"Both modes in one run. Machine: {machine()}.",
                "",
                *rows,
                "",
                f"Requests added per step of the run: before **{fit('before')[1]:.1f}**, now "
                f"**{fit('now')[1]:.1f}**. moto answers in about a millisecond; a real object store "
                f"in tens of milliseconds. At {REQUEST_S * 1000:.0f} ms a request, the line fitted "
                f"to each mode puts the step at step 1000 at {at_1000('before') / 60:.1f} minutes of "
                f"requests before and {at_1000('now'):.1f} seconds now (requests run one after another "
                "in the driver; the concurrent reads of new objects are counted one each). The "
                f"trainer's process asks {np.mean(results['now']['trainer'][1:]):.0f} times a step "
                f"on average and adds **{fit('now', 'trainer')[1]:.1f}** a step of the run.",
                "",
                "![requests per step](lake_requests.png)",
            ]
        ),
        after="step_views",
    )


def _steps_in_process(lake, steps: int, label: str, every: int = 1) -> None:
    """Select, train and fold steps 0..steps-1 of the lake's run in this process, with progress."""
    # the step service and the trainer load only for the sections that run steps
    from envsched_pipeline.core.select import select_manifest
    from envsched_pipeline.core.statistics import statistics_step
    from trainer.step import run_step

    for t in range(steps):
        select_manifest(lake, t)
        run_step(lake, t, log=lambda *_: None)
        statistics_step(lake, t)
        if t % every == every - 1:
            print(f"{label}: step {t + 1}/{steps}", flush=True)


def _farthest_dropped(kept, steps: int) -> int:
    """Of steps 0..steps-1, the one not in ``kept`` with the most steps since the kept one before
    it (the latest of equals): the most a fold or a remake has to do."""
    return max(
        (t for t in range(steps) if t not in kept), key=lambda t: (t - max(k for k in kept if k < t), t)
    )


def _neural_remake(steps: int = 24) -> dict:
    """A neural run of ``steps`` steps of the default pool (B = 64, G = 8), in-process; then its
    checkpoint with the most steps since a kept one made again (each of those steps run again and
    checked against the digest it recorded)."""
    # the pool, the step service and the trainer load only for this section
    import tempfile

    from envs.registry import load_synthetic
    from envsched_pipeline.core.build import new_run
    from envsched_pipeline.core.pools import import_pool
    from envsched_pipeline.lake import Lake
    from envsched_pipeline.run import start_run
    from trainer.remake import remake
    from trainer.step import CHECKPOINT_FILES, checkpoint_rel

    with tempfile.TemporaryDirectory() as d:
        lake = Lake(os.path.join(d, "lake"))
        import_pool(lake, load_synthetic("synthetic"))
        start_run(lake, new_run(pool="synthetic", policy="neural", max_steps=steps))
        _steps_in_process(lake, steps, "state keep bench (neural)")
        kept = lake.artifact_steps("checkpoints")
        after = _farthest_dropped(kept, steps)
        first = sum(lake.read("train_metrics", step=t).to_pylist()[0]["seconds"] for t in range(1, after + 1))
        t0 = time.perf_counter()
        out = remake(lake, after, log=lambda m: print(f"state keep bench (neural): {m.strip()}", flush=True))
        return {
            "run_steps": steps,
            "kept": kept,
            "after": after,
            "from": out["from"],
            "steps": len(out["remade"]),
            "seconds": time.perf_counter() - t0,
            "first_seconds": first * len(out["remade"]) / after,
            "bytes": len(lake.read_bytes(checkpoint_rel(after, CHECKPOINT_FILES["neural"]))),
        }


def section_state_keep(steps: int = 100) -> None:
    """What the scheduler states and the policy checkpoints cost the lake: a simulated run of the
    default pool in-process, the bytes of every state and checkpoint it wrote (each step's, all
    kept before 2026-12-06) against the bytes the lake holds at the end (step 0's, every
    KEEP_EVERY-th, the newest two), and what asking for a state no longer kept costs (it is folded
    again from the kept one before it)."""
    # the pool and the step service load only for this section
    import tempfile
    from pathlib import Path

    import envsched_pipeline.core.state_store as state_store
    from envs.registry import load_synthetic
    from envsched_pipeline.core.build import new_run
    from envsched_pipeline.core.fold import load_state, states_before
    from envsched_pipeline.core.pools import import_pool
    from envsched_pipeline.lake import KEEP_EVERY, Lake
    from envsched_pipeline.run import start_run
    from trainer.remake import remake

    kinds = ("state", "checkpoints")
    written: dict[str, list[int]] = {k: [] for k in kinds}
    real_write = Lake.write_bytes

    def counted(self, rel, data):
        if rel.split("/", 1)[0] in kinds:
            written[rel.split("/", 1)[0]].append(len(data))
        return real_write(self, rel, data)

    def folder(root: Path) -> int:
        return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())

    pool = load_synthetic("synthetic")
    with tempfile.TemporaryDirectory() as d:
        lake = Lake(os.path.join(d, "lake"))
        import_pool(lake, pool)
        spec = start_run(lake, new_run(pool="synthetic", policy="simulated", max_steps=steps))
        Lake.write_bytes = counted
        try:
            _steps_in_process(lake, steps, "state keep bench", every=10)
        finally:
            Lake.write_bytes = real_write
        n_tasks = len(lake.read("tasks"))
        kept = sorted(state_store.state_steps(lake))
        by_folder = {f.name: folder(f) for f in lake.root.iterdir() if f.is_dir()}
        stepped = {n for n in by_folder if any((lake.root / n).glob("step=*"))}
        lake_bytes = folder(lake.root)
        timings: dict[int, float] = {}
        for t in range(steps):
            t0 = time.perf_counter()
            load_state(lake, spec, t)
            timings[t] = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in states_before(lake, spec, range(1, steps)):
            pass
        one_pass = time.perf_counter() - t0
        ckpt_worst = _farthest_dropped(set(lake.artifact_steps("checkpoints")), steps)
        t0 = time.perf_counter()
        sim_made = remake(lake, ckpt_worst, log=lambda *_: None)
        sim_made["seconds"] = time.perf_counter() - t0
    neural = _neural_remake()
    dropped = [t for t in range(steps) if t not in kept]
    base = {t: max(k for k in kept if k < t) for t in dropped}
    read_s, fold_s = np.mean([timings[t] for t in kept]), np.mean([timings[t] for t in dropped])
    worst = _farthest_dropped(kept, steps)
    total = {k: sum(v) for k, v in written.items()}
    late = {k: float(np.mean(v[-10:])) for k, v in written.items()}
    before_lake = lake_bytes + sum(total[k] - by_folder[k] for k in kinds)
    rows = [
        "| | every one kept (before) | now | now / before |",
        "|---|---|---|---|",
        f"| scheduler states in the lake after {steps} steps | {steps} | {len(kept)} | {len(kept) / steps:.2f}x |",
        *(
            f"| {label}, KB per step | {total[k] / steps / 1024:.1f} | {by_folder[k] / steps / 1024:.1f} | "
            f"{by_folder[k] / total[k]:.2f}x |"
            for k, label in (
                ("state", "scheduler states"),
                ("checkpoints", "the simulated policy's checkpoints"),
            )
        ),
        f"| the whole lake (its pool included), KB per step | {before_lake / steps / 1024:.0f} | "
        f"{lake_bytes / steps / 1024:.0f} | {lake_bytes / before_lake:.2f}x |",
    ]
    per_step = {n: b for n, b in by_folder.items() if n in stepped}
    folders = [
        "| folder | KB after the run | KB per step | share of the steps' bytes |",
        "|---|---|---|---|",
        *(
            f"| {n} | {b / 1024:.0f} | {b / steps / 1024:.1f} | {b / sum(per_step.values()):.0%} |"
            for n, b in sorted(per_step.items(), key=lambda nb: -nb[1])
        ),
        f"| (the pool: {', '.join(sorted(n for n in by_folder if n not in per_step))}) | "
        f"{sum(b for n, b in by_folder.items() if n not in per_step) / 1024:.0f} | | |",
    ]
    state_10k = {k: late[k] * 10000 for k in kinds}
    write_section(
        "state_keep",
        "\n".join(
            [
                "## What the scheduler states and the policy checkpoints cost the lake",
                "",
                f"A simulated run of {steps} steps of the default synthetic pool ({n_tasks} tasks, "
                "B = 64, G = 8, the recommended envsched form) in-process. Before 2026-12-06 the "
                "lake kept the scheduler state and the simulated policy's checkpoint of every step; "
                f"now both keep step 0's, every {KEEP_EVERY}th (19, 39, ...) and the newest two (the "
                "neural learner's checkpoints follow the same rule), and a state no longer kept is "
                "folded again from the kept one before it when asked (`envsched explain`, a rewind, "
                "replay), checked against the digest its step's statistics recorded. The bytes of "
                "every state and checkpoint the run wrote against what the lake holds at the end, "
                f"one run. Machine: {machine()}.",
                "",
                *rows,
                "",
                f"Asking for a state: a kept one reads in {read_s * 1000:.0f} ms on average, one no "
                f"longer kept is folded again in {fold_s * 1000:.0f} ms on average, most of it "
                f"reading the pool and building the scheduler once (the most steps folded, "
                f"{worst - base[worst]} for the state after step {worst}: {timings[worst] * 1000:.0f} ms). "
                f"Replay's pass over every step's state folds each step once: {one_pass:.1f} s for "
                f"{steps - 1} states. At the last ten steps' sizes ({late['state'] / 1024:.0f} KB a "
                f"state, {late['checkpoints'] / 1024:.0f} KB a checkpoint), a 10,000-step run kept "
                f"{sum(state_10k.values()) / 1024**3:.1f} GB of them before and keeps about "
                f"{sum(late.values()) * (10000 / KEEP_EVERY + 2) / 1024**2:.0f} MB now.",
                "",
                "A policy checkpoint no longer kept is made again when a rewind needs it (`envsched "
                "rewind`, `rewind_job`; `python -m trainer.remake`) from the kept one before it, each "
                "step in between done again and checked against the checkpoint digest it recorded "
                "(before 2026-12-06 a rewind went back only to a step just after a kept checkpoint). "
                f"In this run, the simulated policy after step {ckpt_worst} ({len(sim_made['remade'])} "
                f"steps from step {sim_made['from']}'s, each update applied again to the rewards its "
                f"rollouts recorded): {sim_made['seconds'] * 1000:.0f} ms. The neural learner's steps "
                "are run again, rollouts and update (seeded by the run's seed and the step): in a "
                f"second run, {neural['run_steps']} steps of the "
                f"neural learner on the same pool (B = 64, G = 8; checkpoints kept "
                f"{', '.join(map(str, neural['kept']))}; {neural['bytes'] / 1024:.0f} KB each), the "
                f"checkpoint after step {neural['after']} was made again from step {neural['from']}'s "
                f"in {neural['seconds']:.1f} s ({neural['steps']} steps, every one the checkpoint its "
                f"step recorded; those steps took {neural['first_seconds']:.1f} s of rollouts and "
                f"updates the first time).",
                "",
                "What the lake holds after the run, by folder (the Dagster assets' plots live "
                'under `Lake.local` and the event log in the Dagster instance: RESULTS "What a step '
                "adds to the Dagster event log and the lake's plots\"):",
                "",
                *folders,
            ]
        ),
        after="event_log",
    )


def section_event_log(steps: int = 20) -> None:
    """What a step adds to the Dagster instance's event log (SQLite here) and to the lake's plots
    folder: a simulated run through the Dagster jobs in-process, its plots written as matplotlib's
    RGBA PNGs and its markdown stored with the step output as well as the materialization (before
    2026-12-06) against palette PNGs in the materialization alone, both in one run."""
    # Dagster, the loop driver and the plots load only for this section
    import sqlite3
    import tempfile
    from contextlib import closing
    from pathlib import Path

    import dagster as dg

    import envsched_pipeline.analysis.plots as plots
    import envsched_pipeline.assets.manifest as manifest_assets
    import envsched_pipeline.assets.training as training_assets
    from envs.registry import load_synthetic
    from envsched_pipeline.core.pools import import_pool
    from envsched_pipeline.lake import Lake
    from envsched_pipeline.orchestration.driver import run_loop
    from envsched_pipeline.run import RunSpec, start_run

    def both_events(context, metadata):  # before 2026-12-06: in the step output's event as well
        return dg.MaterializeResult(metadata=metadata)

    def rgba_png(fig, path, dpi=90, margins=None):  # what every figure was written as before 2026-12-06
        del margins  # then every figure was laid out by tight_layout, a step's plots too
        fig.set_dpi(dpi)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=dpi)
        plots._plt().close(fig)
        return str(path)

    def folder_bytes(root: Path) -> int:
        return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())

    def event_bytes(root: Path) -> int:  # each event once, as one event log table holds them (Postgres)
        def stored(db: Path) -> int:
            with closing(sqlite3.connect(db)) as con:
                (size,) = con.execute("select coalesce(sum(length(event)), 0) from event_logs").fetchone()
            return size

        # SQLite's index database repeats the asset events
        return sum(stored(db) for db in (root / "history" / "runs").glob("*.db") if db.name != "index.db")

    pool = load_synthetic("synthetic", n_envs=12, tasks_per_env=20, seed=0)
    real, real_materialized = plots.write_png, training_assets.materialized
    events: dict[str, float] = {}
    results: dict[str, dict[str, list[float]]] = {}
    for mode, writer in (("before", rgba_png), ("now", real)):
        spent = [0.0]

        def timed(fig, path, dpi=90, margins=None, writer=writer, spent=spent):
            t0 = time.perf_counter()
            try:
                return writer(fig, path, dpi, margins)
            finally:
                spent[0] += time.perf_counter() - t0

        plots.write_png = timed
        for module in (manifest_assets, training_assets):
            module.materialized = both_events if mode == "before" else real_materialized
        try:
            with (
                tempfile.TemporaryDirectory() as d,
                tempfile.TemporaryDirectory() as home,
                dg.instance_for_test(temp_dir=home) as inst,
            ):
                lake = Lake(os.path.join(d, "lake"))
                import_pool(lake, pool)
                start_run(
                    lake,
                    RunSpec(
                        pool="synthetic", policy="simulated", batch_size=16, group_size=8, max_steps=steps
                    ),
                )
                home, plots_dir = Path(home), Path(d) / "lake" / "plots"
                series: dict[str, list[float]] = {"event log KB": [], "plots KB": [], "plot writing s": []}
                last = {"log": folder_bytes(home), "plots": 0}

                def on_step(
                    _step, _wall, series=series, last=last, home=home, plots_dir=plots_dir, spent=spent
                ):
                    log, png = folder_bytes(home), folder_bytes(plots_dir) if plots_dir.exists() else 0
                    series["event log KB"].append((log - last["log"]) / 1024)
                    series["plots KB"].append((png - last["plots"]) / 1024)
                    series["plot writing s"].append(spent[0])
                    last.update(log=log, plots=png)
                    spent[0] = 0.0

                run_loop(lake, steps, instance=inst, on_step=on_step)
                results[mode] = series
                events[mode] = event_bytes(home) / steps / 1024
                print(f"event log bench: {mode}: {series['event log KB'][-3:]} KB", flush=True)
        finally:
            plots.write_png = real
            for module in (manifest_assets, training_assets):
                module.materialized = real_materialized
    late = slice(steps // 2, None)  # after SQLite's first pages and the run's first-step assets

    def mean(mode: str, key: str) -> float:
        return float(np.mean(results[mode][key][late]))

    rows = [
        f"| per step (mean of steps {steps // 2}-{steps - 1}) | before | now | now / before |",
        "|---|---|---|---|",
    ]
    for key in ("event log KB", "plots KB", "plot writing s"):
        b, n = mean("before", key), mean("now", key)
        rows.append(
            f"| {key} | {b:.{2 if key.endswith('s') else 0}f} | {n:.{2 if key.endswith('s') else 0}f} | {n / b:.2f}x |"
        )
    rows.append(
        f"| events stored, KB (each once, mean of all {steps} steps) | {events['before']:.0f} | "
        f"{events['now']:.0f} | {events['now'] / events['before']:.2f}x |"
    )
    per_1000 = {m: mean(m, "event log KB") * 1000 / 1024 for m in results}
    stored_1000 = {m: events[m] * 1000 / 1024 for m in events}
    write_section(
        "event_log",
        "\n".join(
            [
                "## What a step adds to the Dagster event log and the lake's plots",
                "",
                f"A simulated run of {steps} steps (pool of 12 environments x 20 tasks, B = 16, G = 8) "
                "through the Dagster jobs in-process, on a fresh SQLite instance; the bytes its files "
                "grew by in each step (run, event and index databases), the bytes of the step's plots "
                "in the lake, and the seconds spent laying out, rendering and encoding them. A "
                "step's four plots sit inline in its assets' metadata. Before 2026-12-06 they were "
                "matplotlib's RGBA PNGs, returned with the asset's result, which Dagster stores in "
                "the step output's event as well as the materialization's; now they are palette PNGs "
                "of at most 128 colours, given to the materialization alone (with the step's other "
                "markdown: picks, near misses, rendered rollouts); since 2026-12-08 a step's plots "
                "are laid out at fixed margins (one render each, where `tight_layout` measured every "
                "label in a render of its own first). Both modes in one run. Machine: "
                f"{machine()}.",
                "",
                *rows,
                "",
                "The event log's files grow by more than the events they store: SQLite keeps a "
                "database per Dagster run (two a step) and a copy of each asset event "
                "in its index database; an instance on Postgres (docs/deployment.md) stores each event "
                "once, the last row. At these rates a 1000-step run adds about "
                f"**{per_1000['before']:.0f} MB** of SQLite files before and **{per_1000['now']:.0f} MB** "
                f"now, about **{stored_1000['before']:.0f} MB** of events before and "
                f"**{stored_1000['now']:.0f} MB** now.",
            ]
        ),
        after="lake_requests",
    )
