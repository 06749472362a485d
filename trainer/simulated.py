"""Simulated learner (docs/algorithm.md §8): a *simulation* of how a policy improves under GRPO.

It stands in for the GPU policy on the CPU testbed so the scheduler can be measured over hundreds
of steps. Everything reported from it must say it is simulated.

Model. Task i has latent abstract patterns z_i (multi-hot), a difficulty d_i, K_i checks and a
number of "easy" checks e_i. The policy has a skill per pattern and a familiarity per environment.
A rollout solves the task's crux with probability

    p_i = sigmoid(skill . z_i / |z_i| + familiarity_e - d_i)

A solved rollout passes every check (or, with a small probability, all but one); a failed one
usually earns the task's fixed partial credit e_i / K_i (the same checks fail every time), and
otherwise a random number of checks. So a group is informative only when p_i is away from 0 and 1,
which is exactly the quantity a scheduler has to predict.

Learning. After each step every trained group moves the skills of its patterns and its
environment's familiarity by a learning rate times the group's reward standard deviation (GRPO:
zero-variance groups carry no gradient), with slow forgetting towards zero.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

import numpy as np

from envsched_pipeline.run import LEARNING_SIGNALS
from envsched_pipeline.settings import check_settings


@dataclass(frozen=True)
class SimLearnerConfig:
    skill_lr: float = 0.03  # skill step per unit of group reward std, per pattern
    familiarity_lr: float = 0.015  # environment familiarity step per unit of group reward std
    forget: float = 0.002  # per-step relative decay of skills and familiarity
    near_miss: float = 0.03  # a solved rollout still fails one check
    partial_stick: float = 0.97  # a failed rollout earns exactly the task's easy-check credit
    saturation: float = 6.0  # skills and familiarity stay in [-s, s]
    # Phenomena the default model lacks (off by default; docs/algorithm.md §8, bench "simulated learner sweep"):
    env_skill_share: float = (
        0.0  # share of pattern skill that is environment-specific (learned only in that env)
    )
    memorization: float = 0.0  # share of each group's learning that goes to that very task (memorised, never
    # reaching held-out tasks) instead of the shared pattern skills
    learning_signal: str = "std"  # std: a group teaches in proportion to its reward std | normalized: every
    # informative group teaches the same (GRPO's std-normalised advantages), scaled to a typical std of 0.25

    def __post_init__(self):
        check_settings(self, "simulated learner setting ", SIM_BOUNDS, {"learning_signal": LEARNING_SIGNALS})


SIM_BOUNDS = {  # every numeric setting
    **dict.fromkeys(("skill_lr", "familiarity_lr"), (0, True, 10)),
    **dict.fromkeys(
        ("forget", "near_miss", "partial_stick", "env_skill_share", "memorization"), (0, True, 1)
    ),
    "saturation": (0, False, 1000),
}


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class SimulatedLearner:
    """Vectorized simulated policy over one pool's latents (train and held-out tasks).

    ``latents`` rows: task_id, env_id, split, z (list of floats), difficulty, n_checks, easy_checks.
    """

    def __init__(self, latents: list[dict], config: SimLearnerConfig = SimLearnerConfig()):
        if not latents:
            raise ValueError("simulated learner needs task latents (none given)")
        self.config = config
        self.task_ids = np.array([r["task_id"] for r in latents])
        self.index = {t: i for i, t in enumerate(self.task_ids)}
        envs = sorted({r["env_id"] for r in latents})
        self.env_ids = envs
        env_index = {e: i for i, e in enumerate(envs)}
        self.env = np.array([env_index[r["env_id"]] for r in latents], dtype=np.int64)
        z = np.array([np.asarray(r["z"], dtype=float) for r in latents])
        self.z = z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-9)
        self.difficulty = np.array([float(r["difficulty"]) for r in latents])
        self.n_checks = np.array([int(r["n_checks"]) for r in latents])
        self.easy = np.array([int(r["easy_checks"]) for r in latents])
        self.heldout = np.array([r["split"] == "heldout" for r in latents])
        self.unseen = np.array([r["split"] == "unseen" for r in latents])
        # simulated rollout cost (seconds): longer for multi-pattern tasks, per-environment speed
        rng = np.random.default_rng(1234)
        env_speed = np.exp(rng.normal(0.0, 0.6, len(envs)))
        n_pat = (z > 0).sum(axis=1)
        self.cost = (1.0 + 0.8 * n_pat) * env_speed[self.env] * np.exp(rng.normal(0.0, 0.3, len(latents)))
        self.skill = np.zeros(self.z.shape[1])
        self.familiarity = np.zeros(len(envs))
        self.env_skill = np.zeros((len(envs), self.z.shape[1]))
        self.memo = np.zeros(len(latents))
        self.version = 0

    # ------------------------------------------------------------ the policy
    def solve_prob(self, idx: np.ndarray) -> np.ndarray:
        s = self.config.env_skill_share
        shared = self.z[idx] @ self.skill
        own = (self.z[idx] * self.env_skill[self.env[idx]]).sum(axis=1) if s else 0.0
        logit = (
            (1 - s) * shared
            + s * own
            + self.familiarity[self.env[idx]]
            + self.memo[idx]
            - self.difficulty[idx]
        )
        return _sigmoid(logit)

    def expected_reward(self, idx: np.ndarray) -> np.ndarray:
        c = self.config
        p = self.solve_prob(idx)
        k = self.n_checks[idx]
        solved = (1 - c.near_miss) + c.near_miss * (k - 1) / k
        failed = c.partial_stick * self.easy[idx] / k + (1 - c.partial_stick) * 0.5 * (k - 1) / k
        return p * solved + (1 - p) * failed

    def true_variance(self, idx: np.ndarray) -> np.ndarray:
        """Expected population variance of a group's rewards (the oracle baseline uses it)."""
        c = self.config
        p = self.solve_prob(idx)
        k = self.n_checks[idx].astype(float)
        # two-point approximation: solved ~ 1, failed ~ easy/k
        gap = 1.0 - self.easy[idx] / k
        base = p * (1 - p) * gap**2
        noise = (1 - p) * (1 - c.partial_stick) * (1.0 / 12.0) + p * c.near_miss * (1 / k) ** 2
        return base + noise

    def rollout(self, task_ids: list[str] | np.ndarray, group_size: int, rng: np.random.Generator) -> dict:
        """Sample G rewards per task. Returns arrays of shape (n, G): reward, checks_passed, n_checks."""
        c = self.config
        idx = np.array([self.index[t] for t in task_ids], dtype=np.int64)
        n, g = len(idx), group_size
        p = self.solve_prob(idx)[:, None]
        k = self.n_checks[idx][:, None]
        solved = rng.random((n, g)) < p
        near = rng.random((n, g)) < c.near_miss
        stick = rng.random((n, g)) < c.partial_stick
        random_pass = np.floor(rng.random((n, g)) * k).astype(int)  # 0..k-1 checks
        passed = np.where(
            solved,
            np.where(near, k - 1, k),
            np.where(stick, self.easy[idx][:, None], random_pass),
        )
        reward = np.round(passed / k, 4)
        seconds = self.cost[idx][:, None] * np.exp(rng.normal(0.0, 0.1, (n, g)))
        return {
            "reward": reward,
            "checks_passed": passed,
            "n_checks": np.broadcast_to(k, (n, g)).copy(),
            "seconds": seconds,
        }

    def learn(self, task_ids: list[str] | np.ndarray, rewards: np.ndarray) -> dict:
        """One simulated GRPO update from the groups of this step (rewards: (n, G))."""
        c = self.config
        idx = np.array([self.index[t] for t in task_ids], dtype=np.int64)
        std = rewards.std(axis=1)
        if c.learning_signal == "normalized":
            w = np.where(np.ptp(rewards, axis=1) > 1e-6, 0.25, 0.0)
        else:  # "std" (the config refuses anything else)
            w = std
        for arr in (self.skill, self.familiarity, self.env_skill, self.memo):
            arr *= 1 - c.forget
        general = 1.0 - c.memorization
        self.skill += general * c.skill_lr * (w[:, None] * self.z[idx]).sum(axis=0) / max(len(idx), 1) * 8
        if c.env_skill_share:
            np.add.at(
                self.env_skill, self.env[idx], c.skill_lr * 8 / max(len(idx), 1) * w[:, None] * self.z[idx]
            )
        if c.memorization:  # the same step size a task's own patterns would get, kept by the task alone
            np.add.at(self.memo, idx, c.memorization * c.skill_lr * 8 * w)
        np.add.at(self.familiarity, self.env[idx], c.familiarity_lr * w)
        for arr in (self.skill, self.familiarity, self.env_skill, self.memo):
            np.clip(arr, -c.saturation, c.saturation, out=arr)
        self.version += 1
        return {"trained_groups": int((std > 1e-9).sum()), "signal": float(std.sum())}

    def unseen_score(self) -> float:
        """Expected reward on tasks of environments never trained on (nan if the pool has none)."""
        idx = np.flatnonzero(self.unseen)
        return float(self.expected_reward(idx).mean()) if len(idx) else float("nan")

    def heldout_score(self) -> float:
        """Expected reward over held-out tasks of every environment (mean of env means)."""
        idx = np.flatnonzero(self.heldout)
        if len(idx) == 0:
            idx = np.arange(len(self.task_ids))
        r = self.expected_reward(idx)
        env = self.env[idx]
        sums = np.bincount(env, weights=r, minlength=len(self.env_ids))
        cnt = np.bincount(env, minlength=len(self.env_ids))
        return float((sums[cnt > 0] / cnt[cnt > 0]).mean())

    # ------------------------------------------------------------ checkpoint
    def to_bytes(self) -> bytes:

        blob = {
            "skill": self.skill.tolist(),
            "familiarity": self.familiarity.tolist(),
            "env_skill": self.env_skill.tolist(),
            "memo": self.memo.tolist(),
            "task_ids": self.task_ids.tolist(),
            "env_ids": list(self.env_ids),
            "version": self.version,
            "config": asdict(self.config),
        }
        return json.dumps(blob).encode()

    def digest(self, data: bytes | None = None) -> str:
        """A hash of the checkpoint (its bytes are a pure function of the state; ``data``: those
        bytes, when the caller has made them already): the step records it, so a checkpoint the
        lake no longer keeps can be made again and checked (:mod:`trainer.remake`)."""
        return hashlib.sha256(self.to_bytes() if data is None else data).hexdigest()

    def load_bytes(self, data: bytes) -> None:
        """Restore a checkpoint. Per-environment and per-task state is matched by id, so a pool that
        gained, lost or renamed tasks or environments since the checkpoint keeps what still exists
        (new ones start untrained)."""
        blob = json.loads(data)
        self.skill = np.asarray(blob["skill"], dtype=float)
        old_envs = blob.get("env_ids", self.env_ids)
        env_rows = {e: i for i, e in enumerate(old_envs)}
        fam = np.asarray(blob["familiarity"], dtype=float)
        self.familiarity = np.array([fam[env_rows[e]] if e in env_rows else 0.0 for e in self.env_ids])
        if "env_skill" in blob:
            es = np.asarray(blob["env_skill"], dtype=float).reshape(len(old_envs), -1)
            for j, e in enumerate(self.env_ids):
                self.env_skill[j] = es[env_rows[e]] if e in env_rows else 0.0
            memo = np.asarray(blob["memo"], dtype=float)
            old_tasks = blob.get("task_ids", self.task_ids.tolist())
            by_task = dict(zip(old_tasks, memo.tolist(), strict=True))
            self.memo = np.array([by_task.get(t, 0.0) for t in self.task_ids.tolist()])
        self.version = int(blob["version"])
