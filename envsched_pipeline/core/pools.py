"""Pools in the lake: import, lookup, and the simulator's latents for real pools."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from envs.registry import PoolData, load_pool
from envsched_pipeline.errors import PoolError, StepError
from envsched_pipeline.graph.topology import op_category
from envsched_pipeline.lake import Lake
from envsched_pipeline.run import load_run, valid_name

# abstract operation categories the simulated learner's latent patterns are made of
LATENT_CATEGORIES = (
    "lookup",
    "eligibility_check",
    "relation_replacement",
    "dependent_state_validation",
    "create",
    "update",
    "delete",
    "transfer",
    "notify",
    "answer",
)


def import_pool(lake: Lake, data: PoolData, allow_edit: bool = False) -> dict:
    """Write a pool's tables (replacing that pool's partitions). Returns counts.

    Replacing the pool of the lake's run once it has steps would change the tasks under the run;
    that is refused unless ``allow_edit`` (then the run continues on the edited pool: unchanged
    tasks keep their history by content hash, and the change is recorded in ``pool_edits.json``)."""
    valid_name(data.name)
    if not data.tasks:
        raise PoolError(f"pool {data.name!r} has no tasks")
    run = load_run(lake)
    if (
        run is not None
        and run.pool == data.name
        and lake.steps("manifests")
        and lake.has("tasks", pool=data.name)
    ):
        if not allow_edit:
            raise PoolError(
                f"pool {data.name!r} is used by run {run.run_id} in {lake.root} "
                f"({len(lake.steps('manifests'))} steps); re-importing it would change the tasks under "
                "the run. Use another --name or another lake, or allow the edit explicitly "
                "(--allow-pool-edit)"
            )
        edits = lake.read_json("pool_edits.json") or []
        lake.write_json(
            "pool_edits.json",
            edits
            + [{"pool": data.name, "from_step": len(lake.steps("manifests")), "tasks": len(data.tasks)}],
        )
    if not data.latents:
        data.latents = derive_latents(data)
    lake.write("environments", data.environments, pool=data.name)
    lake.write("tasks", data.tasks, pool=data.name)
    lake.write("task_latents", data.latents, pool=data.name)
    if data.heldout:  # evaluation only: never in the pool the scheduler chooses from
        lake.write("eval_tasks", data.heldout, pool=data.name)
    if data.eval_environments:
        lake.write("eval_environments", data.eval_environments, pool=data.name)
    return {"pool": data.name, "environments": len(data.environments), "tasks": len(data.tasks)}


def ensure_pool(lake: Lake, name: str) -> None:
    """Import a registered pool into the lake unless it is there already."""
    if not lake.has("tasks", pool=valid_name(name)):
        try:
            data = load_pool(name)
        except KeyError as exc:
            raise PoolError(str(exc.args[0])) from exc
        import_pool(lake, data)


def environment_kinds(lake: Lake, pool: str) -> set[str]:
    """The kinds of the pool's environments, its evaluation-only ones included (an EnvScaler class
    unless a row says otherwise)."""
    kinds = set()
    for table in ("environments", "eval_environments"):
        t = lake.read(table, pool=pool)
        rows = t.column("kind").to_pylist() if "kind" in t.column_names else [None] * t.num_rows
        kinds.update(k or "envscaler" for k in rows)
    return kinds


def pool_tasks(lake: Lake, pool: str) -> pa.Table:
    t = lake.read("tasks", pool=pool)
    if t.num_rows == 0:
        raise StepError(f"pool {pool!r} is not in {lake.root}: import it first (`envsched pool list`)")
    return t.sort_by("task_id")


def derive_latents(
    data: PoolData, seed: int = 0, env_sd: float = 1.5, task_sd: float = 1.2, shift: float = 0.0
) -> list[dict]:
    """Latents for the simulated learner on a pool without a generator ground truth (docs/algorithm.md,
    the simulated learner): patterns = the operation categories of the task's gold tool calls,
    difficulty = environment offset + task noise + a term for the number of gold actions. (The
    simulator's ground truth may read gold actions; nothing the scheduler sees does.) Seeded;
    stored in ``task_latents`` for the learner only (schedulers never read them)."""
    rng = np.random.default_rng(seed)
    env_off = {e["env_id"]: float(rng.normal(0, env_sd)) for e in data.environments}
    out = []
    for t in data.tasks:
        gold = json.loads(t.get("gold") or "[]") or []
        calls = [c for x in gold for c in (x if isinstance(x, list) else [x]) if isinstance(c, dict)]
        ops = {op_category(str(c.get("name", ""))) for c in calls}
        z = [1.0 if c in ops else 0.0 for c in LATENT_CATEGORIES]
        n_actions = sum(len(x) if isinstance(x, list) else 1 for x in gold)
        if not any(z):
            z[-1] = 1.0
        out.append(
            {
                "pool": data.name,
                "task_id": t["task_id"],
                "env_id": t["env_id"],
                "split": "train",
                "patterns": json.dumps([c for c, v in zip(LATENT_CATEGORIES, z, strict=True) if v]),
                "z": json.dumps(z),
                "difficulty": shift
                + env_off.get(t["env_id"], 0.0)
                + float(rng.normal(0, task_sd))
                + 0.15 * n_actions,
                "n_checks": max(1, len(json.loads(t.get("checks") or "[]"))),
                "easy_checks": 0,
                "n_actions": n_actions,
                "source": "derived",
            }
        )
    return out
