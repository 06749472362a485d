"""The neural learner on a synthetic pool, with the three disjoint task sets a fair comparison needs.

* the **training pool** (what the scheduler chooses from),
* **held-out, seen environments**: unseen tasks of the training environments (the generator's
  held-out split, never in the pool),
* **held-out, unseen environments**: tasks of environments the pool does not contain (the
  ``unseen`` family of the generator: other domains, other words),
* the **warm-start pool**: a third family of environments (``warmstart``), used only for the short
  behaviour-cloning start, never for RL or evaluation.

The warm start depends only on the seed, the configs and the code, so it is computed once per
seed and cached (every scheduler of a seed, in the bench and in `envsched train`, starts from the
same weights).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

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


GRPO_ONLY = ("loss_denominator", "dual_clip", "clip_eps_high", "train_forced_stop", "overrun_penalty")


def warm_start_key(seed: int, testbed: TestbedConfig, neural: NeuralConfig) -> str:
    """The warm-start cache key: the seed, the settings, the code that makes the weights and the
    torch build and CPU kernels it ran on. The GRPO_ONLY settings act on GRPO updates only, so the
    warm start (and its cache) ignore them: every such setting of a seed starts from the same
    weights."""
    settings = {k: v for k, v in asdict(neural).items() if k not in GRPO_ONLY}
    return hashlib.sha256(
        json.dumps(
            {
                "seed": seed,
                "testbed": asdict(testbed),
                "neural": settings,
                "code": _code_digest(),
                "torch": _torch_build(),
                "v": 2,
            },
            sort_keys=True,
        ).encode()
    ).hexdigest()[:16]


@functools.cache
def _code_digest() -> str:
    """Of the sources the warm-start weights come from: the neural learner and the environments
    (the warm-start pool's generator and the sandbox its gold actions run in)."""
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for folder in ("trainer/neural", "envs"):
        for f in sorted((root / folder).rglob("*.py")):
            h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def _torch_build() -> str:
    return f"{torch.__version__}/{torch.backends.cpu.get_cpu_capability()}"


def warm_started(
    learner: NeuralLearner, seed: int, config: TestbedConfig = TestbedConfig(), log=None, warm=None
) -> dict:
    """Behaviour-clone ``learner`` on the warm-start pool of ``seed`` (whose environments it must
    know; ``warm``: that pool, if the caller has it), or load the weights the same warm start gave
    before (``$ENVSCHED_CACHE/neural-warmstart``, keyed by :func:`warm_start_key`). Returns what
    was done, ``warm_start`` "cached" or "computed", and where the weights are kept (None where the
    cache cannot be written: the warm start is made and not kept). A cache file that cannot be read
    is made again."""
    say = log or (lambda _line: None)
    try:
        path = _cache_dir() / f"{warm_start_key(seed, config, learner.config)}.pt"
    except (OSError, RuntimeError) as exc:  # no home, or a cache folder that cannot be made
        say(f"warm start: no cache to keep it in ({type(exc).__name__}: {exc})")
        path = None
    if path is not None and path.exists():
        try:
            learner.load_weights(path.read_bytes())
            return {"warm_start": "cached", "warm_start_path": str(path)}
        except Exception as exc:  # noqa: BLE001 - a damaged or foreign cache file: computed again
            say(f"warm start: the cached weights in {path} cannot be read ({type(exc).__name__}); made again")
    info = learner.warm_start((warm or warmstart_pool(seed, config)).tasks, log=log)
    if path is not None:
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        try:
            tmp.write_bytes(learner.weight_bytes())
            os.replace(tmp, path)
        except OSError as exc:  # a full or read-only disk: this run goes on, the next makes it again
            tmp.unlink(missing_ok=True)
            say(f"warm start: not kept in {path} ({type(exc).__name__}: {exc})")
            path = None
    return {**info, "warm_start": "computed", "warm_start_path": str(path) if path else None}


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
        self.warm_info = warm_started(self.learner, seed, config, log=log, warm=self.warm)

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
