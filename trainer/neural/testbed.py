"""The neural learner on a synthetic pool, with the three disjoint task sets a fair comparison needs.

* the **training pool** (what the scheduler chooses from),
* **held-out, seen environments**: unseen tasks of the training environments (the generator's
  held-out split, never in the pool),
* **held-out, unseen environments**: tasks of environments the pool does not contain (the
  ``unseen`` family of the generator: other domains, other words),
* the **warm-start pool**: a third family of environments (``warmstart``), used only for the short
  behaviour-cloning start, never for RL or evaluation.

The warm start depends only on the seed and the configs, so it is computed once per seed and
cached (every scheduler of a seed starts from the same weights).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from envs.registry import load_synthetic
from trainer.neural.learner import NeuralConfig, NeuralLearner


@dataclass(frozen=True)
class TestbedConfig:
    warmstart_envs: int = 12
    warmstart_tasks_per_env: int = 40
    eval_samples: int = 16  # sampled episodes per held-out task (standard error ~0.005 at 16)


def warmstart_pool(seed: int, config: TestbedConfig = TestbedConfig()):
    """The disjoint pool of the behaviour-cloning warm start (the generator's ``warmstart`` family)."""
    return load_synthetic(
        "warmstart",
        family="warmstart",
        n_envs=config.warmstart_envs,
        tasks_per_env=config.warmstart_tasks_per_env,
        heldout_per_env=0,
        seed=seed + 1000,
    )


def _cache_dir() -> Path:
    d = Path(os.environ.get("ENVSCHED_CACHE", Path.home() / ".cache" / "envsched")) / "neural-warmstart"
    d.mkdir(parents=True, exist_ok=True)
    return d


GRPO_ONLY = ("loss_denominator", "dual_clip", "train_forced_stop", "overrun_penalty")


def warm_start_key(seed: int, testbed: TestbedConfig, neural: NeuralConfig) -> str:
    """The warm-start cache key. The GRPO_ONLY settings act on GRPO updates only, so the warm start
    (and its cache) ignore them: every such setting of a seed starts from the same weights (and the
    keys of caches written before a new GRPO-only setting existed still hold)."""
    settings = {k: v for k, v in asdict(neural).items() if k not in GRPO_ONLY}
    return hashlib.sha256(
        json.dumps(
            {"seed": seed, "testbed": asdict(testbed), "neural": settings, "v": 1}, sort_keys=True
        ).encode()
    ).hexdigest()[:16]


class NeuralTestbed:
    def __init__(
        self,
        environments: list[dict],
        heldout: list[dict],
        seed: int,
        config: TestbedConfig = TestbedConfig(),
        neural: NeuralConfig = NeuralConfig(),
        log=None,
    ):
        """``environments``: the pool's and the unseen split's environment rows; ``heldout``: task
        rows with ``split`` "seen" or "unseen" (the pool's evaluation rows)."""
        self.config, self.seed = config, seed
        self.warm = warmstart_pool(seed, config)
        envs = {e["env_id"]: e for e in environments}
        overlap = set(envs) & {e["env_id"] for e in self.warm.environments}
        if overlap:
            raise ValueError(f"warm-start environments overlap the training pool: {sorted(overlap)[:3]}")
        envs.update({e["env_id"]: e for e in self.warm.environments})
        self.heldout_seen = [t for t in heldout if t.get("split", "seen") == "seen"]
        self.heldout_unseen = [t for t in heldout if t.get("split") == "unseen"]
        self.learner = NeuralLearner(envs, neural, seed=seed)
        self._warm_start(neural, log)

    def _warm_start(self, neural: NeuralConfig, log) -> None:
        key = warm_start_key(self.seed, self.config, neural)
        path = _cache_dir() / f"{key}.pt"
        if path.exists():
            self.learner.load_bytes(path.read_bytes())
            self.warm_info = {"warm_start": "cached", "warm_start_tasks": len(self.warm.tasks)}
            return
        self.warm_info = self.learner.warm_start(self.warm.tasks, log=log)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(self.learner.state_bytes())
        os.replace(tmp, path)

    # ------------------------------------------------------------------ the bench interface
    def rollout(self, tasks: list[dict], group_size: int, rng: np.random.Generator) -> dict:
        return self.learner.rollout(tasks, group_size, seed=int(rng.integers(2**62)))

    def learn(self) -> dict:
        return self.learner.learn()

    def probe(self, tasks: list[dict], group_size: int, seed: int) -> np.ndarray:
        return self.learner.probe(tasks, group_size, seed)

    def evaluate(self, seed: int) -> dict:
        n = self.config.eval_samples
        return {
            "seen": self.learner.evaluate(self.heldout_seen, n, seed=seed),
            "unseen": self.learner.evaluate(self.heldout_unseen, n, seed=seed + 1),
        }

    def close(self) -> None:
        self.learner.close()
