"""One GRPO step with a neural policy: agent-loop rollouts in the sandboxed environments, then
the torch update (``hf-tiny``, ``hf``, ``vllm``), or rollouts only (``openai``)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from tqdm import tqdm

from envs.hack import flag_trajectory
from envs.registry import episode_spec
from envs.sandbox import SandboxPool
from envsched_pipeline.lake import BEST_CHECKPOINT, Lake, atomic_write_bytes, best_record
from envsched_pipeline.rollouts import batch_metrics
from envsched_pipeline.run import SAMPLER_METRICS, RunSpec
from trainer import ranks, world
from trainer.agent import AgentLoop, Episode
from trainer.engines import HFEngine, OpenAIEngine, VLLMEngine
from trainer.grpo import group_advantages, overrun_rewards
from trainer.heldout import due, heldout_tasks, summarize
from trainer.model import load_policy, qwen3_tokenizer
from trainer.realenv import episode_rows, every_environment
from trainer.update import GRPOConfig, GRPOTrainer, out_of_memory

LM_EVAL_EVERY = 10  # held-out evaluation every 10 steps and at the last (policy_config.eval_every)
LM_EVAL_SAMPLES = 2  # episodes per held-out task (policy_config.eval_samples)


def sampling_seed(seed: int, step: int, rank: int, purpose: str) -> int:
    """The seed an engine samples a step's ``purpose`` ("train" or "heldout") episodes from."""
    return int(np.random.default_rng([seed, step, rank, 1 if purpose == "train" else 2]).integers(2**62))


def best_checkpoint(lake: Lake) -> tuple[Path, dict | None]:
    """The folder of the best held-out policy (``checkpoints/best``) and its record, or None."""
    return lake.local / BEST_CHECKPOINT, best_record(lake)


def checkpoint_dirs(lake: Lake) -> tuple[Path, Path]:
    root = lake.local / "checkpoints"
    return root / "latest", root


def kept_checkpoints(lake: Lake) -> list[tuple[int, Path]]:
    """Every checkpoint on disk with the step it was written after: the rolling ``latest`` first,
    then the periodic ones in order."""
    latest, root = checkpoint_dirs(lake)
    kept = []
    for c in [latest, *sorted(root.glob("step=*/policy"))]:
        meta = c / "trainer.json"
        if meta.exists():
            kept.append((int(json.loads(meta.read_text())["step"]), c))
    return kept


def drop_old_checkpoints(lake: Lake, keep: int | None, log=print) -> list[int]:
    """Delete the periodic checkpoints (``checkpoints/step=K``) but the newest ``keep`` (None: keep
    all); the rolling ``latest`` and ``best`` are not periodic ones. Returns the steps dropped."""
    if keep is None:
        return []
    _, root = checkpoint_dirs(lake)
    periodic = sorted(s for s, c in kept_checkpoints(lake) if c.parent.parent == root)
    dropped = periodic[: max(len(periodic) - keep, 0)]
    for s in dropped:
        shutil.rmtree(root / f"step={s}", ignore_errors=True)
    if dropped:
        log(f"dropped the checkpoints after step(s) {', '.join(map(str, dropped))} (keep_checkpoints {keep})")
    return dropped


def latest_checkpoint(lake: Lake, before_step: int) -> tuple[Path | None, int]:
    """Newest checkpoint written at a step < before_step: the rolling ``latest`` or a periodic one
    (``latest`` at a tie)."""
    best, best_step = None, -1
    for s, c in kept_checkpoints(lake):
        if best_step < s < before_step:
            best, best_step = c, s
    return best, best_step


class PolicySession:
    """The policy, its optimizer and its rollout engine, loaded once. One-process-per-step mode
    builds a session per step (from the newest checkpoint) and saves ``checkpoints/latest`` after
    each update so the next process can load it; the resident worker (:mod:`trainer.resident`)
    keeps one session across steps and checkpoints every ``checkpoint_every`` steps and at the end."""

    def __init__(self, lake: Lake, spec: RunSpec, before_step: int, log=print, resident: bool = False):
        self.lake, self.spec, self.resident = lake, spec, resident
        t_load = time.perf_counter()
        pc = spec.policy_settings()
        self.pc = pc
        self.cfg = GRPOConfig.from_dict(pc.set_values())
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.ranks = ranks.init(self.device)  # torchrun / deepspeed launcher: data-parallel ranks
        self.tok = qwen3_tokenizer()
        ckpt, ckpt_step = latest_checkpoint(lake, before_step)
        self.loaded_from = ckpt_step
        if before_step > 0 and ckpt is None and spec.policy != "openai":
            log(f"no checkpoint before step {before_step}: starting from the initial policy")
        if spec.policy == "openai":
            self.model = None
        elif ckpt is not None:
            self.model = load_policy(str(ckpt), device=self.device)
            log(f"resumed policy from {ckpt} (step {ckpt_step})")
        else:
            self.model = load_policy(pc.model_path or None, seed=spec.seed, device=self.device)
        self.trainer = (
            GRPOTrainer(self.model, self.tok, self.cfg, self.device) if self.model is not None else None
        )
        if self.trainer is not None and ckpt is not None:
            self.trainer.load_optimizer(ckpt)
        if self.model is not None:
            ranks.sync_parameters(self.model)  # every rank starts from rank 0's weights
        if spec.policy == "vllm":
            self.engine = VLLMEngine(str(ckpt) if ckpt else pc.model_path)
        elif spec.policy == "openai":
            key = os.environ.get(pc.api_key_env, "") if pc.api_key_env else ""
            self.engine = OpenAIEngine(pc.base_url, pc.model or "default", key or "none")
        else:
            self.engine = HFEngine(self.model, self.tok, device=self.device)
        self.load_seconds = time.perf_counter() - t_load  # paid once per session
        self.save_seconds = 0.0

    def checkpoint(self, step: int, force: bool = False, log=print) -> Path | None:
        """Periodic (every ``checkpoint_every`` steps and at the run's last step; the newest
        ``keep_checkpoints`` of them kept) and, in one-process-per-step mode, the rolling ``latest``:
        model, optimizer and tokenizer."""
        if self.trainer is None or not self.ranks.main:
            return None  # rank 0 writes checkpoints; the other ranks hold the same weights
        t0 = time.perf_counter()
        latest, root = checkpoint_dirs(self.lake)
        path = None
        self.lake.guard()  # saved to a folder, not through the lake: check the step is still ours
        if not self.resident:
            self.trainer.save(latest, step, tokenizer=self.tok)
        if force or (step + 1) % self.cfg.checkpoint_every == 0 or step + 1 >= self.spec.max_steps:
            path = root / f"step={step}" / "policy"
            self.trainer.save(path, step, tokenizer=self.tok)
            drop_old_checkpoints(self.lake, self.pc.keep_checkpoints, log)
        self.save_seconds = time.perf_counter() - t0
        return path

    def keep_best(self, step: int, evals: list[dict], log=print) -> bool:
        """Save the policy as ``checkpoints/best`` when its held-out score (the mean over the splits
        evaluated) beats every earlier step's; True when it did. A record from step ``step`` or
        later (undone by a rewind or a redo) does not count."""
        scores = [e["score"] for e in evals if e["benchmark"].startswith("heldout_")]
        if self.trainer is None or not self.ranks.main or not scores:
            return False
        score = float(np.mean(scores))
        path, record = best_checkpoint(self.lake)
        if record is not None and record["step"] < step and record["score"] >= score:
            return False
        self.lake.guard()  # saved to a folder, not through the lake: check the step is still ours
        self.trainer.save(path / "policy", step, tokenizer=self.tok)
        atomic_write_bytes(
            path / "best.json",
            json.dumps(
                {"step": step, "score": score, **{e["benchmark"]: e["score"] for e in evals}}
            ).encode(),
        )
        log(f"best held-out so far ({score:.4f}): policy saved to {path / 'policy'}")
        return True

    steps_run = 0

    def step(self, step: int, manifest: pa.Table, log=print) -> dict:
        out = _run_step(self, step, manifest, log)
        self.steps_run += 1
        return out


def run_policy(lake: Lake, spec: RunSpec, step: int, manifest: pa.Table, log=print) -> dict:
    """One-process-per-step mode: load, roll out, update, save, exit."""
    return PolicySession(lake, spec, step, log).step(step, manifest, log)


def agent_loop(engine, tok, cfg: GRPOConfig) -> AgentLoop:
    """The agent loop a run's settings ask for (actions, tokens per turn, temperature, context)."""
    return AgentLoop(
        engine,
        tok,
        max_actions=cfg.max_actions,
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        max_context=cfg.max_context,
    )


def _run_step(sess: PolicySession, step: int, manifest: pa.Table, log) -> dict:
    lake, spec, cfg, pc, tok = sess.lake, sess.spec, sess.cfg, sess.pc, sess.tok
    trainer, engine, model, device = sess.trainer, sess.engine, sess.model, sess.device
    t0 = time.perf_counter()
    all_task_ids = manifest.column("task_id").to_pylist()
    rk = sess.ranks
    task_ids = all_task_ids[world.group_slice(len(all_task_ids), rk.rank, rk.world)]  # this rank's groups
    g = spec.group_size
    tasks, envs = episode_rows(lake, spec.pool, task_ids)
    loop = agent_loop(engine, tok, cfg)
    t_roll = time.perf_counter()
    workers = pc.workers or 2
    # sampling starts from the run's seed, the step and the rank: a retried step, a resident
    # worker and a fresh process sample alike, and held-out evaluation changes no later step
    engine.reseed(sampling_seed(spec.seed, step, rk.rank, "train"))
    eps = [Episode(task_id=t, rollout=r, session=None) for t in task_ids for r in range(g)]
    _roll_out(
        loop, eps, {t: episode_spec(envs[tasks[t]["env_id"]], tasks[t]) for t in task_ids}, workers, log
    )
    rollout_seconds = time.perf_counter() - t_roll
    verified = np.array([float(e.result.get("reward", 0.0)) for e in eps])
    rewards = overrun_rewards(verified, [e.truncated for e in eps], pc.overrun_penalty)
    n = len(task_ids)
    upd = {"loss": float("nan"), "grad_norm": float("nan"), "clip_fraction": float("nan"), "seconds": 0.0}
    if trainer is not None:
        if spec.policy == "vllm":
            engine.sleep()  # colocated: vLLM's memory goes to the update
        trainer.use_lr(pc.lr_at(step, cfg.lr))
        try:
            upd = trainer.update(
                [e.ids for e in eps], [e.mask for e in eps], rewards, g, [e.logprobs for e in eps]
            )
        except torch.OutOfMemoryError as exc:  # one line that says which setting to change
            raise out_of_memory(exc, cfg, [e.ids for e in eps]) from exc
        sess.checkpoint(step, log=log)
        if spec.policy == "vllm":
            engine.sync_weights(model)  # wakes vLLM and pushes the new weights
    every = LM_EVAL_EVERY if pc.eval_every is None else pc.eval_every
    held = heldout_evaluation(sess, step, loop, log) if due(step, spec.max_steps, every) else None
    adv = group_advantages(rewards.reshape(n, g)).reshape(-1)
    tokens = np.array([len(e.ids) for e in eps])
    gen_tokens = np.array([e.generated_tokens for e in eps])
    rollouts = {
        "step": np.full(n * g, step, dtype=np.int64),
        "task_id": np.array([e.task_id for e in eps]),
        "rollout": np.array([e.rollout for e in eps], dtype=np.int64),
        "env_id": np.array([tasks[e.task_id]["env_id"] for e in eps]),
        "reward": rewards,
        "advantage": adv,
        **_outcome_columns(eps),
        "hack_flag": np.array(
            [
                bool(
                    r > 0
                    and flag_trajectory(
                        e.tool_log,
                        json.loads(tasks[e.task_id].get("init_state") or "{}"),
                        tasks[e.task_id].get("instruction", ""),
                    )
                )
                for e, r in zip(eps, rewards, strict=True)
            ]
        ),
        "tokens": tokens.astype(np.int64),
        "seconds": np.full(n * g, rollout_seconds / max(n * g, 1)),
        "policy_version": np.full(n * g, trainer.version - 1 if trainer else 0, dtype=np.int64),
        "rank": np.full(n * g, rk.rank, dtype=np.int64),
        "trajectory": _trajectories(eps, spec.policy, verified),
    }
    table = pa.table(rollouts)
    parts = ranks.gather(
        {
            "table": table,
            "gen_tokens": gen_tokens,
            "parse_errors": int(sum(e.parse_errors for e in eps)),
            "truncated": int(sum(e.truncated for e in eps)),
            "rollout_seconds": rollout_seconds,
        }
    )
    if parts is None:
        return None  # not rank 0: rank 0 writes the step
    if len(parts) > 1:  # contiguous slices in rank order: the manifest's order again
        table = pa.concat_tables([p["table"] for p in parts])
        gen_tokens = np.concatenate([p["gen_tokens"] for p in parts])
        rewards = np.asarray(table.column("reward").to_numpy(), dtype=float)
        tokens = np.asarray(table.column("tokens").to_numpy())
        rollout_seconds = max(p["rollout_seconds"] for p in parts)
    n = len(all_task_ids)
    r2 = rewards.reshape(n, g)
    seconds = time.perf_counter() - t0
    metrics = {
        "step": step,
        "policy": spec.policy,
        "loss": upd["loss"],
        "grad_norm": upd["grad_norm"],
        "skipped_updates": int(upd.get("skipped_updates", 0)),
        "lr": upd.get("lr", float("nan")),  # this step's (the run's schedule); none without an update
        "clip_fraction": upd.get("clip_fraction", float("nan")),
        "approx_kl": upd.get("approx_kl", float("nan")),
        "kl": upd.get("kl", float("nan")),
        "entropy": upd.get("entropy", float("nan")),
        **{k: upd.get(k, float("nan")) for k in SAMPLER_METRICS},
        **batch_metrics(r2),
        "response_length_mean": float(gen_tokens.mean()) if len(gen_tokens) else 0.0,
        "response_length_max": int(gen_tokens.max()) if len(gen_tokens) else 0,
        "trained_tokens_per_second": upd.get("trained_tokens_per_second", float("nan")),
        "padding_fraction": upd.get("padding_fraction", float("nan")),
        "envs_touched": len(set(manifest.column("env_id").to_pylist())),
        "world_size": rk.world,
        "rollouts": n * g,
        "tokens": int(tokens.sum()),
        "generated_tokens": int(gen_tokens.sum()),
        "tokens_per_second": float(gen_tokens.sum() / max(rollout_seconds, 1e-9)),
        "rollout_seconds": rollout_seconds,
        "update_seconds": upd.get("seconds", 0.0),
        "seconds": seconds,
        "parse_errors": sum(p["parse_errors"] for p in parts),
        "truncated": sum(p["truncated"] for p in parts),
        "device": device,
        "resumed_from_step": int(sess.loaded_from),
        "resident": bool(sess.resident),
        "load_seconds": sess.load_seconds if not sess.resident or sess.steps_run == 0 else 0.0,
        "save_seconds": sess.save_seconds,
    }
    if device == "cuda":
        metrics["max_memory_gb"] = float(torch.cuda.max_memory_allocated() / 1e9)
    evals = [{"step": step, "benchmark": "batch_mean_reward", "score": float(rewards.mean())}]
    out = {"rollouts": table, "metrics": metrics, "evals": evals}
    if held is not None:
        evals += held["evals"]
        out["eval_rollouts"] = held["rollouts"]
        metrics["eval_seconds"] = held["seconds"]
        metrics["eval_episodes"] = held["rollouts"].num_rows
        metrics["heldout_best"] = sess.keep_best(step, held["evals"], log)
    return out


def _roll_out(
    loop: AgentLoop, eps: list[Episode], specs: dict[str, dict], workers: int, log, what=""
) -> None:
    """Run ``eps`` through the agent loop in the sandbox: ``specs`` maps a task to its episode spec.
    A session holds a worker for its whole episode, so the episodes run in waves of ``workers``."""
    bar = tqdm(
        total=len(eps), desc=f"{what}agent rollouts", unit="episode", leave=False, disable=None
    )  # None: no bar off a terminal
    with SandboxPool(workers=workers) as pool:
        for s in range(0, len(eps), workers):
            wave = eps[s : s + workers]
            for e in wave:
                e.session = pool.session(specs[e.task_id])
            try:
                loop.run(wave)
            finally:
                for e in wave:
                    e.session.close()
            bar.update(len(wave))
            log(f"{what}rollouts {min(s + workers, len(eps))}/{len(eps)}")
    bar.close()


def _outcome_columns(eps: list[Episode]) -> dict:
    """What the verifier and the loop made of each episode (training and held-out rollouts alike)."""
    err = [e.result.get("error_class") or ("none" if not e.result.get("error") else "task") for e in eps]
    return {
        "checks_passed": np.array(
            [sum(c.get("passed", False) for c in e.result.get("checks", [])) for e in eps], dtype=np.int64
        ),
        "checks_total": np.array([len(e.result.get("checks", [])) for e in eps], dtype=np.int64),
        "turns": np.array([e.turns for e in eps], dtype=np.int64),
        "tool_calls": np.array([e.actions for e in eps], dtype=np.int64),
        "terminated": np.array([not e.truncated for e in eps], dtype=bool),
        "truncated": np.array([e.truncated for e in eps], dtype=bool),
        "error_class": np.array(err, dtype=str),
        "error_message": np.array([str(e.result.get("error") or "")[:500] for e in eps], dtype=str),
    }


def _trajectories(eps: list[Episode], engine: str, verified=None) -> np.ndarray:
    """Each episode's record in the lake; ``verified``: the verifiers' rewards, kept beside a
    training reward the overrun penalty lowered (held-out rewards are the verifiers' own)."""
    return np.array(
        [
            json.dumps(
                {
                    "engine": engine,
                    "messages": e.messages[-12:],
                    "tool_calls": e.tool_log[:40],
                    "parse_errors": e.parse_errors,
                    **({} if verified is None else {"verifier_reward": float(verified[k])}),
                },
                default=str,
            )[:20000]
            for k, e in enumerate(eps)
        ],
        dtype=str,
    )


def heldout_evaluation(
    sess: PolicySession, step: int, loop: AgentLoop, log, seed: int | None = None
) -> dict | None:
    """Held-out evaluation after the step's update (trainer/heldout.py): ``eval_samples`` episodes of
    each chosen evaluation task, in this rank's share; rank 0 gets every rank's and sums them up
    (the other ranks get None). It samples from its own seed (from the run's, or ``seed``'s; the
    tasks are chosen by the run's); the next step reseeds for training."""
    lake, spec, pc, rk = sess.lake, sess.spec, sess.pc, sess.ranks
    t0 = time.perf_counter()
    chosen = heldout_tasks(
        lake.read("eval_tasks", pool=spec.pool).to_pylist(), spec.seed, pc.eval_tasks or spec.batch_size
    )
    if not chosen:  # a pool without an evaluation split (every rank reads the same lake)
        return None
    greedy = pc.eval_temperature == 0
    samples = 1 if greedy else pc.eval_samples or LM_EVAL_SAMPLES  # greedy: every sample the same
    if pc.eval_temperature is not None:  # the evaluation's own sampling temperature
        loop = copy.copy(loop)
        loop.temperature = pc.eval_temperature
    items = [(split, row) for split, rows in chosen.items() for row in rows]
    mine = items[world.group_slice(len(items), rk.rank, rk.world)]
    envs = every_environment(lake, spec.pool)
    eps = [
        Episode(task_id=row["task_id"], rollout=k, session=None) for _, row in mine for k in range(samples)
    ]
    specs = {row["task_id"]: episode_spec(envs[row["env_id"]], row) for _, row in mine}
    loop.engine.reseed(sampling_seed(spec.seed if seed is None else seed, step, rk.rank, "heldout"))
    _roll_out(loop, eps, specs, pc.workers or 2, log, what="held-out ")
    rows = {
        "step": np.full(len(eps), step, dtype=np.int64),
        "split": np.array([split for split, _ in mine for _ in range(samples)], dtype=str),
        "task_id": np.array([e.task_id for e in eps], dtype=str),
        "sample": np.array([e.rollout for e in eps], dtype=np.int64),
        "env_id": np.array([row["env_id"] for _, row in mine for _ in range(samples)], dtype=str),
        "reward": np.array([float(e.result.get("reward", 0.0)) for e in eps]),
        **_outcome_columns(eps),
        "tokens": np.array([len(e.ids) for e in eps], dtype=np.int64),
        "trajectory": _trajectories(eps, spec.policy),
    }
    parts = ranks.gather(pa.table(rows))
    if parts is None:
        return None
    table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    evals = []
    for split in chosen:
        mask = np.array(table.column("split").to_pylist()) == split
        rewards = np.asarray(table.column("reward").to_numpy())[mask].reshape(-1, samples)
        res = summarize(rewards)
        evals.append({"step": step, "benchmark": f"heldout_{split}", "score": res["mean"], "se": res["se"]})
        log(
            f"held-out ({split} environments): {res['mean']:.4f} ± {res['se']:.4f} over {res['tasks']} tasks "
            f"x {samples} samples"
        )
    return {"evals": evals, "rollouts": table, "samples": samples, "seconds": time.perf_counter() - t0}
