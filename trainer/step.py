"""One training step, run as its own process (through Dagster Pipes when launched by Dagster).

    python -m trainer.step --lake DIR --step T

Reads manifest T from the lake, rolls out G per task with the run's policy engine, updates the
policy, and writes ``rollouts[T]``, ``evals[T]`` and, last, ``train_metrics[T]`` (the step's
completion marker). Re-running step T starts from the checkpoint of step T-1 with the same seed,
so it replaces the partitions with the same rows: never a duplicate.
"""

from __future__ import annotations

import sys


def _one_line_interrupt(kind, value, tb) -> None:
    if issubclass(kind, KeyboardInterrupt):
        print("trainer: interrupted while starting", file=sys.stderr)
    else:
        sys.__excepthook__(kind, value, tb)


if __name__ == "__main__":  # Ctrl-C while the imports below load (seconds, with torch): no traceback
    sys.excepthook = _one_line_interrupt

import argparse
import json
import os
import time

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from envs.hack import flag_trajectory
from envs.registry import episode_spec
from envs.rollout_backend import episode_pool
from envsched_pipeline.errors import DRIVER_REPORTS_FAILURES, StepError
from envsched_pipeline.lake import Lake
from envsched_pipeline.lease import STALE_SECONDS, step_lock
from envsched_pipeline.rollouts import write_step_result
from envsched_pipeline.run import CHECKPOINT_FILES, RunSpec, require_run, step_rng
from trainer import world
from trainer.grpo import group_advantages
from trainer.realenv import corrupt, episode_rows, tool_names_of
from trainer.simulated import SimLearnerConfig, SimulatedLearner

# a training step whose lock is held waits this long for the holder to finish or go stale (a
# crashed pod's lock on another machine goes stale after STALE_SECONDS): its retry then runs
TRAIN_LOCK_WAIT = STALE_SECONDS + 30.0


def checkpoint_rel(step: int, name: str) -> str:
    """Where a learner's checkpoint of ``step`` lives in the lake."""
    return Lake.artifact_rel("checkpoints", step, name)


def previous_checkpoint(lake: Lake, learner: str, step: int, what: str) -> bytes:
    """The checkpoint ``learner`` (a key of CHECKPOINT_FILES) wrote after step ``step - 1``; when
    the lake lacks it, a StepError naming the ``what`` checkpoint and the rewind that makes it again."""
    rel = checkpoint_rel(step - 1, CHECKPOINT_FILES[learner])
    data = lake.read_bytes(rel)
    if data is None:
        raise StepError(
            f"{what} checkpoint of step {step - 1} is missing ({lake.where(rel)}); `envsched rewind --to {step}` makes it again from a kept one and redoes the run from step {step} (or names the steps it can go back to)"
        )
    return data


def simulated_learner(lake: Lake, spec: RunSpec):

    lat = lake.read("task_latents", pool=spec.pool)
    if lat.num_rows == 0:
        raise StepError(
            f"pool {spec.pool!r} has no task latents in the lake: the simulated policy needs a pool "
            "with a simulator ground truth (synthetic) or derived latents"
        )
    rows = lat.to_pylist()
    for r in rows:
        if isinstance(r.get("z"), str):
            r["z"] = json.loads(r["z"])
    known = set(SimLearnerConfig.__dataclass_fields__)
    settings = spec.policy_settings().set_values()
    learner = SimulatedLearner(rows, SimLearnerConfig(**{k: v for k, v in settings.items() if k in known}))
    learner.source = rows[0].get("source") or "synthetic"
    return learner


def run_simulated(lake: Lake, spec: RunSpec, step: int, manifest: pa.Table, log=print) -> dict:
    learner = simulated_learner(lake, spec)
    if step > 0:
        learner.load_bytes(previous_checkpoint(lake, "simulated", step, "policy"))
    rng = step_rng(spec, step, salt=1)
    t0 = time.perf_counter()
    task_ids = manifest.column("task_id").to_pylist()
    env_ids = manifest.column("env_id").to_pylist()
    # the generator's pools have an analytic model of their checks; real pools run their verifiers
    mode = spec.policy_settings().mode or ("latent" if learner.source == "synthetic" else "real")
    if mode == "real":
        out = real_env_rollouts(lake, spec, learner, task_ids, rng, log)
    else:
        out = learner.rollout(task_ids, spec.group_size, rng)
        n0 = len(task_ids) * spec.group_size
        out.update(
            error_class=np.full(n0, "none"),
            error_message=np.full(n0, ""),
            tool_calls=np.zeros(n0, dtype=np.int64),
            trajectory=np.full(n0, json.dumps({"engine": "simulated", "mode": "latent"})),
            hack_flag=np.zeros(n0, dtype=bool),
        )  # seconds: the simulator's modeled rollout cost
    rewards = out["reward"]
    adv = group_advantages(rewards)
    version = learner.version
    info = learner.learn(task_ids, rewards)
    checkpoint = learner.to_bytes()
    lake.write_bytes(checkpoint_rel(step, CHECKPOINT_FILES["simulated"]), checkpoint)
    lake.drop_superseded("checkpoints", step)  # step 0's, every 20th and the newest two stay
    seconds = time.perf_counter() - t0
    n, g = rewards.shape
    rollouts = {
        "step": np.full(n * g, step, dtype=np.int64),
        "task_id": np.repeat(task_ids, g),
        "rollout": np.tile(np.arange(g, dtype=np.int64), n),
        "env_id": np.repeat(env_ids, g),
        "reward": rewards.reshape(-1),
        "advantage": adv.reshape(-1),
        "checks_passed": out["checks_passed"].reshape(-1).astype(np.int64),
        "checks_total": out["n_checks"].reshape(-1).astype(np.int64),
        "turns": np.zeros(n * g, dtype=np.int64),
        "tool_calls": np.asarray(out["tool_calls"], dtype=np.int64).reshape(-1),
        "terminated": np.ones(n * g, dtype=bool),
        "truncated": np.zeros(n * g, dtype=bool),
        "error_class": np.asarray(out["error_class"]).reshape(-1),
        "error_message": np.asarray(out["error_message"]).reshape(-1),
        "hack_flag": np.asarray(out["hack_flag"], dtype=bool).reshape(-1),
        "tokens": np.zeros(n * g, dtype=np.int64),
        "seconds": np.where(
            np.isnan(np.asarray(out["seconds"], dtype=float).reshape(-1)),
            seconds / max(n * g, 1),
            np.asarray(out["seconds"], dtype=float).reshape(-1),
        ),
        "policy_version": np.full(n * g, version, dtype=np.int64),
        "trajectory": np.asarray(out["trajectory"]).reshape(-1),
    }
    group_var = rewards.var(axis=1)
    metrics = {
        "step": step,
        "policy": "simulated",
        "loss": float("nan"),
        "grad_norm": float("nan"),
        "lr": learner.config.skill_lr,
        "reward_mean": float(rewards.mean()),
        "reward_median": float(np.median(rewards.mean(axis=1))),
        "batch_variance": float(group_var.mean()),
        "zero_variance_fraction": float((np.ptp(rewards, axis=1) <= 1e-6).mean()),
        "envs_touched": len(set(env_ids)),
        "trained_groups": info["trained_groups"],
        "rollouts": n * g,
        "tokens": 0,
        "seconds": seconds,
    }
    metrics["sim_mode"] = mode
    metrics["checkpoint_digest"] = learner.digest(checkpoint)
    metrics["errors"] = int((rollouts["error_class"] != "none").sum())
    evals = [
        {"step": step, "benchmark": "heldout_seen (simulated)", "score": learner.heldout_score(), "se": 0.0}
    ]
    if learner.unseen.any():
        evals.append(
            {
                "step": step,
                "benchmark": "heldout_unseen (simulated)",
                "score": learner.unseen_score(),
                "se": 0.0,
            }
        )
    return {"rollouts": pa.table(rollouts), "metrics": metrics, "evals": evals}


def real_env_rollouts(
    lake: Lake, spec: RunSpec, learner, task_ids: list[str], rng: np.random.Generator, log=print
) -> dict:
    """Gold actions corrupted with the learner's failure probability, executed by the real
    runtime in the sandbox and scored by the real verifier (docs/algorithm.md §8)."""

    g = spec.group_size
    tasks, envs = episode_rows(lake, spec.pool, task_ids)
    idx = np.array([learner.index[t] for t in task_ids])
    p = learner.solve_prob(idx)
    jobs = []
    for t, pi in zip(task_ids, p, strict=True):
        row, env = tasks[t], envs[tasks[t]["env_id"]]
        gold = json.loads(row.get("gold") or "[]") or []
        names = tool_names_of(env)
        for _ in range(g):
            jobs.append((episode_spec(env, row), corrupt(gold, float(pi), rng, names)))

    last = [0]
    bar = tqdm(
        total=len(jobs),
        desc=f"step {spec.pool} rollouts",
        unit="rollout",
        leave=False,
        mininterval=0.5,
        disable=None,
    )

    def progress(done, total):
        bar.update(done - bar.n)
        if done - last[0] >= max(1, total // 4) or done == total:
            last[0] = done
            log(f"rollouts {done}/{total}")

    with episode_pool(workers=spec.policy_settings().workers or 2) as pool:  # ENVSCHED_ROLLOUT_BACKEND
        results = pool.map_episodes(jobs, progress=progress)
    bar.close()
    n = len(task_ids)
    rew = np.array([r.get("reward", 0.0) for r in results], dtype=float).reshape(n, g)
    inits = {t: json.loads(tasks[t].get("init_state") or "{}") for t in task_ids}
    flags = []
    for (spec_j, _), r in zip(jobs, results, strict=True):
        t = spec_j["task"]["task_id"]
        flags.append(
            bool(
                r.get("reward", 0) > 0
                and flag_trajectory(r.get("tool_calls", []), inits[t], tasks[t].get("instruction", ""))
            )
        )
    return {
        "reward": rew,
        "checks_passed": np.array(
            [sum(c.get("passed", False) for c in r.get("checks", [])) for r in results]
        ).reshape(n, g),
        "n_checks": np.array([len(r.get("checks", [])) for r in results]).reshape(n, g),
        "error_class": np.array([r.get("error_class") or "none" for r in results]).reshape(n, g),
        "error_message": np.array([str(r.get("error") or "")[:500] for r in results]).reshape(n, g),
        "tool_calls": np.array([len(r.get("tool_calls", [])) for r in results]).reshape(n, g),
        "hack_flag": np.array(flags).reshape(n, g),
        "seconds": np.array([r.get("seconds", np.nan) for r in results], dtype=float).reshape(n, g),
        "trajectory": np.array(
            [
                json.dumps(
                    {
                        "engine": "simulated",
                        "mode": "real",
                        "tool_calls": r.get("tool_calls", [])[:40],
                        "checks": [
                            {k: c.get(k) for k in ("item", "passed", "error")} for c in r.get("checks", [])
                        ],
                    },
                    default=str,
                )[:20000]
                for r in results
            ]
        ).reshape(n, g),
    }


def _policy_engine(lake, spec, step, manifest, log=print):
    from trainer.policy_step import run_policy  # torch + transformers: only the LM policies load them

    return run_policy(lake, spec, step, manifest, log=log)


def _neural(lake, spec, step, manifest, log=print):
    from trainer.neural.runner import run_neural  # torch: only the neural learner loads it

    return run_neural(lake, spec, step, manifest, log=log)


ENGINES = {
    "neural": _neural,
    "simulated": run_simulated,
    "hf-tiny": _policy_engine,
    "hf": _policy_engine,
    "vllm": _policy_engine,
    "openai": _policy_engine,
}


def run_step(lake: Lake, step: int, log=print) -> dict:
    spec = require_run(lake)
    if not lake.has("manifests", step=step):
        raise StepError(f"manifest of step {step} is missing: select it first")
    manifest = lake.read("manifests", step=step).sort_by("slot")
    if spec.policy not in ENGINES:
        raise StepError(f"unknown policy {spec.policy!r}; available: {', '.join(ENGINES)}")
    place = world.ranks()
    if place.parallel and spec.policy not in ("hf-tiny", "hf", "vllm"):
        raise StepError(
            f"policy {spec.policy!r} runs on one rank; data-parallel ranks are for hf-tiny, hf, vllm"
        )
    if spec.policy_settings().resident and place.parallel:
        raise StepError("--resident runs one process; launch data-parallel ranks per step instead")
    if not place.main:  # the other data-parallel ranks compute; rank 0 holds the lock and writes
        ENGINES[spec.policy](lake, spec, step, manifest, log=log)
        return {}
    # One writer per step: a retry (or a second driver's step) waits for a live holder to finish
    # or go stale, and every write below is fenced on the lock, so a process paused past the
    # lock's stale time stops at its next write instead of writing into the taker's step.
    with step_lock(lake, train_lock_name(step), wait=TRAIN_LOCK_WAIT, log=log) as lock:
        with lake.fenced(lock.check):
            if spec.policy_settings().resident:  # the resident worker writes the partitions itself
                from trainer.resident import run_resident  # its client: sockets only, no torch here

                return run_resident(lake, step, log=log, fence=(lock.name, lock.id))
            result = ENGINES[spec.policy](lake, spec, step, manifest, log=log)
            write_step_result(lake, step, result)  # train_metrics last: it marks the step complete
    return result["metrics"]


def train_lock_name(step: int) -> str:
    """The step lock an internal training step holds (``locks/<name>.lock`` in the lake)."""
    return f"train-step={int(step)}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.step", description=__doc__.splitlines()[0])
    ap.add_argument("--lake", required=True)
    ap.add_argument("--step", type=int, required=True)
    args = ap.parse_args(argv)
    try:
        return _main(args)
    except KeyboardInterrupt:  # Ctrl-C, or Dagster forwarding its run's cancel: one line, no traceback
        print(f"trainer: step {args.step} interrupted", file=sys.stderr)
        return 130


def _main(args) -> int:
    lake = Lake(args.lake)
    try:
        from dagster_pipes import (  # optional: plain runs need no Dagster
            PipesEnvVarParamsLoader,
            open_dagster_pipes,
        )

        under_pipes = PipesEnvVarParamsLoader().is_dagster_pipes_process()
        under_pipes = under_pipes and world.ranks().main  # rank 0 reports
    except ImportError:  # running without dagster-pipes installed: a plain process
        under_pipes = False
    if under_pipes:
        try:
            with open_dagster_pipes() as pipes:
                metrics = run_step(lake, args.step, log=pipes.log.info)
                pipes.report_asset_materialization(
                    metadata={
                        k: v
                        for k, v in metrics.items()
                        if isinstance(v, (int, float, str)) and not (isinstance(v, float) and np.isnan(v))
                    },
                )
        except Exception as exc:  # the pipes context sent it to the Dagster run with its traceback
            first = (str(exc).strip().splitlines() or [""])[0]
            if os.environ.get(DRIVER_REPORTS_FAILURES) != "1":  # else the driver prints this line
                print(
                    f"trainer: step {args.step} failed: {type(exc).__name__}: {first} "
                    "(its traceback is in the Dagster run's logs)",
                    file=sys.stderr,
                )
            return 1
    else:
        try:
            metrics = run_step(lake, args.step)
        except StepError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if metrics:
            print(json.dumps(metrics, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
