"""One training step, run as its own process (through Dagster Pipes when launched by Dagster).

    python -m trainer.step --lake DIR --step T

Reads manifest T from the lake, rolls out G per task with the run's policy engine, updates the
policy, and writes ``rollouts[T]``, ``evals[T]`` and, last, ``train_metrics[T]`` (the step's
completion marker). Re-running step T starts from the checkpoint of step T-1 with the same seed,
so it replaces the partitions with the same rows: never a duplicate.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import pyarrow as pa

from envsched_pipeline.lake import Lake
from envsched_pipeline.service import RunSpec, StepError, require_run, step_rng
from trainer.grpo import group_advantages


def _checkpoint(lake: Lake, step: int, name: str):
    return lake.artifact_path("checkpoints", step, name)


def simulated_learner(lake: Lake, spec: RunSpec):
    from trainer.simulated import SimLearnerConfig, SimulatedLearner

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
    return SimulatedLearner(rows, SimLearnerConfig(**spec.policy_config))


def run_simulated(lake: Lake, spec: RunSpec, step: int, manifest: pa.Table, log=print) -> dict:
    learner = simulated_learner(lake, spec)
    prev = _checkpoint(lake, step - 1, "policy.json")
    if step > 0:
        if not prev.exists():
            raise StepError(f"policy checkpoint of step {step - 1} is missing ({prev}); re-run that step")
        learner.load(prev)
    rng = step_rng(spec, step, salt=1)
    t0 = time.perf_counter()
    task_ids = manifest.column("task_id").to_pylist()
    env_ids = manifest.column("env_id").to_pylist()
    out = learner.rollout(task_ids, spec.group_size, rng)
    rewards = out["reward"]
    adv = group_advantages(rewards)
    version = learner.version
    info = learner.learn(task_ids, rewards)
    learner.save(_checkpoint(lake, step, "policy.json"))
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
        "tool_calls": np.zeros(n * g, dtype=np.int64),
        "terminated": np.ones(n * g, dtype=bool),
        "truncated": np.zeros(n * g, dtype=bool),
        "error_class": np.full(n * g, "none"),
        "error_message": np.full(n * g, ""),
        "hack_flag": np.zeros(n * g, dtype=bool),
        "tokens": np.zeros(n * g, dtype=np.int64),
        "seconds": np.full(n * g, seconds / max(n * g, 1)),
        "policy_version": np.full(n * g, version, dtype=np.int64),
        "trajectory": np.full(n * g, json.dumps({"engine": "simulated"})),
    }
    group_var = rewards.var(axis=1)
    metrics = {
        "step": step,
        "policy": "simulated",
        "loss": float("nan"),
        "grad_norm": float("nan"),
        "lr": spec.policy_config.get("skill_lr", 0.03),
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
    evals = [{"step": step, "benchmark": "heldout_expected_reward (simulated)", "score": learner.heldout_score()}]
    return {"rollouts": pa.table(rollouts), "metrics": metrics, "evals": evals}


ENGINES = {"simulated": run_simulated}


def run_step(lake: Lake, step: int, log=print) -> dict:
    spec = require_run(lake)
    if not lake.has("selections", step=step):
        raise StepError(f"manifest of step {step} is missing: select it first")
    manifest = lake.read("selections", step=step).sort_by("slot")
    if spec.policy not in ENGINES:
        raise StepError(f"unknown policy {spec.policy!r}; available: {', '.join(ENGINES)}")
    result = ENGINES[spec.policy](lake, spec, step, manifest, log=log)
    # train_metrics is written last: it marks the step complete
    lake.write("rollouts", result["rollouts"], step=step)
    lake.write("evals", result["evals"], step=step)
    lake.write("train_metrics", [result["metrics"]], step=step)
    return result["metrics"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.step", description=__doc__.splitlines()[0])
    ap.add_argument("--lake", required=True)
    ap.add_argument("--step", type=int, required=True)
    args = ap.parse_args(argv)
    lake = Lake(args.lake)
    try:
        from dagster_pipes import PipesEnvVarParamsLoader, open_dagster_pipes

        under_pipes = PipesEnvVarParamsLoader().is_dagster_pipes_process()
    except ImportError:  # running without dagster-pipes installed: a plain process
        under_pipes = False
    if under_pipes:
        with open_dagster_pipes() as pipes:
            metrics = run_step(lake, args.step, log=pipes.log.info)
            pipes.report_asset_materialization(
                metadata={k: v for k, v in metrics.items() if isinstance(v, (int, float, str))
                          and not (isinstance(v, float) and np.isnan(v))},
            )
    else:
        try:
            metrics = run_step(lake, args.step)
        except StepError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(metrics, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
