"""``--policy neural``: one training step of the neural learner inside the loop (``trainer.step``).

Each step runs as its own process (like the simulated learner): it loads the policy and optimizer
from the previous step's checkpoint (or, at step 0, behaviour-clones the warm start on the
``warmstart`` family, which no pool contains, or loads the weights that warm start gave before:
``testbed.warm_started``), rolls out the manifest's tasks G times in the
sandboxed environments, applies one GRPO update, and measures held-out reward on the pool's
evaluation split (seen and unseen environments) every ``eval_every`` steps and at the last step.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from envs.hack import flag_trajectory
from envsched_pipeline.errors import StepError
from envsched_pipeline.lake import Lake, best_evaluated, split_mean
from envsched_pipeline.rollouts import batch_metrics, table
from envsched_pipeline.run import RunSpec, environment_kinds_problem, require_run
from trainer.grpo import group_advantages
from trainer.heldout import due, heldout_tasks
from trainer.neural import UPDATE_DIAGNOSTICS
from trainer.neural.learner import NeuralConfig, NeuralLearner
from trainer.neural.testbed import TestbedConfig, warm_started, warmstart_pool
from trainer.realenv import every_environment
from trainer.step import CHECKPOINT_FILES, checkpoint_rel, previous_checkpoint

EVAL_EVERY = 10
EVAL_SAMPLES = 8


def _config(spec: RunSpec) -> NeuralConfig:
    pc = spec.policy_settings()
    known = {k: v for k, v in pc.set_values().items() if k in NeuralConfig.__dataclass_fields__}
    return NeuralConfig.from_dict(known)


def _checkpoint(step: int) -> str:
    return checkpoint_rel(step, CHECKPOINT_FILES["neural"])


def new_learner(lake: Lake, spec: RunSpec) -> NeuralLearner:
    """An untrained learner with ``spec``'s settings over the pool's environments."""
    envs = every_environment(lake, spec.pool)
    kinds = {e.get("kind") or "envscaler" for e in envs.values()}
    if problem := environment_kinds_problem("neural", spec.pool, kinds):
        raise StepError(problem)
    return NeuralLearner(envs, _config(spec), seed=spec.seed)


def load_learner(lake: Lake, spec: RunSpec, step: int, log) -> NeuralLearner:
    """The learner ``step`` starts from: the checkpoint of the step before, or at step 0 the warm start."""
    learner = new_learner(lake, spec)
    if step > 0:
        learner.load_bytes(previous_checkpoint(lake, "neural", step, "neural"))
        return learner
    warm = warmstart_pool(spec.seed, TestbedConfig())
    overlap = set(learner.envs) & {e["env_id"] for e in warm.environments}
    if overlap:
        raise StepError(f"the warm-start environments overlap pool {spec.pool!r}: {sorted(overlap)[:3]}")
    learner.add_envs({e["env_id"]: e for e in warm.environments})
    info = warm_started(learner, spec.seed, TestbedConfig(), log=log, warm=warm)
    if info["warm_start"] == "cached":
        log(
            f"warm start: the weights a warm start of seed {spec.seed} with these settings gave before "
            f"({info['warm_start_path']}; delete it to make it again)"
        )
    else:
        log(
            f"warm start: {info['warm_start_steps']} behaviour-cloning steps on {info['warm_start_tasks']} tasks "
            f"of {len(warm.environments)} environments the pool does not contain (loss "
            f"{info['warm_start_loss']:.3f})"
            + (
                f", kept in {info['warm_start_path']} for the runs of the same seed"
                if info["warm_start_path"]
                else ""
            )
        )
    return learner


def run_neural(lake: Lake, spec: RunSpec, step: int, manifest: pa.Table, log=print) -> dict:
    """One-process-per-step mode: load the learner, run the step, close it."""
    session = NeuralSession(lake, spec, step, log)
    try:
        return session.step(step, manifest, log)
    finally:
        session.close()


class NeuralSession:
    """The neural learner loaded once from the checkpoint before ``step`` (or warm-started at step
    0): what the resident worker (``--resident``, :mod:`trainer.resident`) keeps in memory across
    steps, saving each step the process start, torch's imports and the environments' build. Every
    step still writes its checkpoint, so a restarted worker or `envsched rewind` loads the step
    before the one it is asked for."""

    def __init__(self, lake: Lake, spec: RunSpec, step: int, log=print):
        self.lake, self.spec = lake, spec
        self.learner = load_learner(lake, spec, step, log)

    def step(self, step: int, manifest: pa.Table, log=print) -> dict:
        env_ids = manifest.column("env_id").to_pylist()
        if missing := sorted(set(env_ids) - set(self.learner.envs)):
            raise StepError(
                f"environments {missing[:3]} of step {step} are not in the loaded learner (the pool "
                "changed under it); the retry reloads it"
            )
        spec = require_run(self.lake)  # today's: a later `--steps` moves the run's last step (its held-out)
        return _neural_step(self.lake, spec, self.learner, step, manifest, log)

    def close(self) -> None:
        self.learner.close()


def roll_and_learn(
    lake: Lake, spec: RunSpec, learner: NeuralLearner, step: int, manifest: pa.Table
) -> tuple[dict, dict, list, dict]:
    """Step ``step``'s rollouts of the manifest's tasks (G each, seeded by the run's seed and the
    step) and its GRPO update: the task rows, the rollouts, their traces, the update's diagnostics. The same
    checkpoint and step give the same update (:mod:`trainer.remake` makes dropped checkpoints so)."""
    task_ids = manifest.column("task_id").to_pylist()
    rows = {
        r["task_id"]: r
        for r in lake.read("tasks", pool=spec.pool).to_pylist()
        if r["task_id"] in set(task_ids)
    }
    out = learner.rollout(
        [rows[t] for t in task_ids],
        spec.group_size,
        seed=int(np.random.default_rng([spec.seed, step, 1]).integers(2**62)),
    )
    traces = learner.last["traces"]
    learner.use_lr(spec.policy_settings().lr_at(step, learner.config.lr))
    return rows, out, traces, learner.learn()


def _neural_step(
    lake: Lake, spec: RunSpec, learner: NeuralLearner, step: int, manifest: pa.Table, log
) -> dict:
    """Roll out the manifest's tasks G times, update, checkpoint, and measure held-out when due."""
    task_ids = manifest.column("task_id").to_pylist()
    env_ids = manifest.column("env_id").to_pylist()
    version = learner.version
    rows, out, traces, info = roll_and_learn(lake, spec, learner, step, manifest)
    rewards = out["reward"]
    g = spec.group_size
    lake.write_bytes(_checkpoint(step), learner.state_bytes())
    # the best held-out policy so far keeps its checkpoint while it is the best (what `envsched status`
    # names and `envsched evaluate --best` reads), as a language model keeps its `best` folder
    best = best_evaluated(lake, upto=step - 1)
    lake.drop_superseded("checkpoints", step, keep=[best["step"]] if best else [])
    n = len(task_ids)
    flags = [
        bool(
            t.result.get("reward", 0) > 0
            and flag_trajectory(
                [{**c, "output": o} for c, o in zip(t.calls, t.outputs, strict=False)],
                json.loads(rows[task_ids[j // g]].get("init_state") or "{}"),
                rows[task_ids[j // g]].get("instruction", ""),
            )
        )
        for j, t in enumerate(traces)
    ]
    rollouts = table(
        {
            "step": np.full(n * g, step),
            "task_id": np.repeat(task_ids, g),
            "rollout": np.tile(np.arange(g), n),
            "env_id": np.repeat(env_ids, g),
            "reward": rewards.reshape(-1),
            "advantage": group_advantages(rewards).reshape(-1),
            "checks_passed": out["checks_passed"].reshape(-1),
            "checks_total": out["n_checks"].reshape(-1),
            "turns": np.ones(n * g, dtype=np.int64),
            "tool_calls": out["tool_calls"].reshape(-1),
            "truncated": np.array([len(t.tool_choice) > learner.config.max_actions for t in traces]),
            "error_class": out["error_class"].reshape(-1),
            "error_message": out["error_message"].reshape(-1),
            "hack_flag": np.array(flags),
            "seconds": out["seconds"].reshape(-1),
            "policy_version": np.full(n * g, version),
            "trajectory": out["trajectory"].reshape(-1),
        },
        n * g,
    )
    metrics = {
        "step": step,
        "policy": "neural",
        **batch_metrics(rewards),
        "envs_touched": len(set(env_ids)),
        "rollouts": n * g,
        "tokens": 0,
        "seconds": out["rollout_seconds"] + info["update_seconds"],
        "rollout_seconds": out["rollout_seconds"],
        "errors": int((out["error_class"] != "none").sum()),
        "parameters": learner.parameters,
        "checkpoint_digest": learner.digest(),
        **{
            k: info[k]
            for k in (
                "loss",
                *UPDATE_DIAGNOSTICS,
                "lr",
                "update_seconds",
                "trained_groups",
                "loss_scale",
                "skipped_updates",
                "forced_stop_share",
            )
        },
    }
    out = {"rollouts": rollouts, "metrics": metrics, "evals": []}
    pc = spec.policy_settings()
    if due(step, spec.max_steps, EVAL_EVERY if pc.eval_every is None else pc.eval_every):
        results, held = heldout_evaluation(lake, spec, learner, step)
        out["evals"] = [
            {"step": step, "benchmark": f"heldout_{split}", "score": res["mean"], "se": res["se"]}
            for split, res in results.items()
        ]
        scores = {split: res["mean"] for split, res in results.items()}
        if best is not None and scores and split_mean(scores) > best["score"]:  # the old best's goes
            lake.drop_unkept("checkpoints", best["step"], step)
        for split, res in results.items():
            log(
                f"held-out ({split} environments): {res['mean']:.4f} ± {res['se']:.4f} over {res['tasks']} tasks"
            )
        if held is not None:
            out["eval_rollouts"] = held
    return out


def heldout_evaluation(
    lake: Lake, spec: RunSpec, learner: NeuralLearner, step: int, seed: int | None = None
) -> tuple[dict[str, dict], pa.Table | None]:
    """The learner's held-out evaluation after ``step`` with the run's settings: each split's
    result (``NeuralLearner.evaluate``) and the episodes (the lake's ``eval_rollouts`` rows; None
    for a pool without a held-out split). It samples from the run's seed, or ``seed``'s (the
    tasks stay the run's choice)."""
    pc = spec.policy_settings()
    ev = lake.read("eval_tasks", pool=spec.pool).to_pylist()
    samples = pc.eval_samples or EVAL_SAMPLES
    results, held = {}, []
    for split, rows in heldout_tasks(ev, spec.seed, pc.eval_tasks).items():
        sampling = (spec.seed if seed is None else seed) * 1000 + step
        results[split] = res = learner.evaluate(rows, samples, seed=sampling, episodes=True)
        held.append(heldout_table(step, split, rows, res))
    return results, pa.concat_tables(held) if held else None


def heldout_table(step: int, split: str, tasks: list[dict], res: dict) -> pa.Table:
    """The held-out episodes of one split (the lake's ``eval_rollouts`` rows)."""
    r, d = res["rewards"], res["details"]
    n, k = r.shape
    return pa.table(
        {
            "step": np.full(n * k, step, dtype=np.int64),
            "split": np.full(n * k, split),
            "task_id": np.repeat([t["task_id"] for t in tasks], k),
            "sample": np.tile(np.arange(k, dtype=np.int64), n),
            "env_id": np.repeat([t["env_id"] for t in tasks], k),
            "reward": r.reshape(-1).astype(float),
            "checks_passed": d["checks_passed"].reshape(-1).astype(np.int64),
            "checks_total": d["n_checks"].reshape(-1).astype(np.int64),
            "tool_calls": d["tool_calls"].reshape(-1).astype(np.int64),
            "error_class": d["error_class"].reshape(-1),
            "error_message": d["error_message"].reshape(-1),
            "trajectory": d["trajectory"].reshape(-1),
        }
    )
