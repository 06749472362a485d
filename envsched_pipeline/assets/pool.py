"""Pool assets: environment metadata and tasks imported into the lake."""

import dagster as dg
from pydantic import Field

from envs.registry import POOLS, PoolData, load_pool
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.orchestration.metadata import md_table
from envsched_pipeline.resources.lake import LakeResource
from envsched_pipeline.run import load_run


class PoolConfig(dg.Config):
    pool: str = Field(
        default="", description="Pool to import; empty: the pool of the lake's run (else synthetic)."
    )
    allow_edit: bool = Field(
        default=False,
        description="Re-import the pool of a live run (edit-tolerant: unchanged tasks keep their history).",
    )


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            "environments",
            group_name="pool",
            kinds={"parquet"},
            description="Environment metadata: summary, rules, tool schemas, class code.",
        ),
        dg.AssetSpec(
            "tasks",
            group_name="pool",
            kinds={"parquet"},
            deps=["environments"],
            description="Tasks: instruction, initial state, checks, gold actions, content hash.",
        ),
    ],
)
def pool_tables(context: dg.AssetExecutionContext, config: PoolConfig, lake: LakeResource):

    lk = lake.lake_for(context)
    run = load_run(lk)
    name = config.pool or (run.pool if run else "synthetic")
    if name not in POOLS and lk.has("tasks", pool=name):
        # imported from files (`envsched pool import`): the lake copy is the source; report it
        context.log.info(f"pool {name} was imported from files; re-import it with `envsched pool import`")
        data = PoolData(
            name=name,
            environments=lk.read("environments", pool=name).to_pylist(),
            tasks=lk.read("tasks", pool=name).to_pylist(),
        )
    else:
        data = load_pool(name)
    counts = (
        import_pool(lk, data, allow_edit=config.allow_edit)
        if name in POOLS
        else {"pool": name, "environments": len(data.environments), "tasks": len(data.tasks)}
    )
    per_env: dict[str, int] = {}
    for t in data.tasks:
        per_env[t["env_id"]] = per_env.get(t["env_id"], 0) + 1
    sample = [
        {"env_id": e["env_id"], "tasks": per_env.get(e["env_id"], 0), "summary": e["summary"]}
        for e in data.environments
    ]
    context.log.info(f"imported pool {name}: {counts}")
    yield dg.MaterializeResult(
        asset_key="environments",
        metadata={
            "pool": name,
            "dagster/row_count": counts["environments"],
            "environments": dg.MetadataValue.md(md_table(sample, limit=60)),
        },
    )
    yield dg.MaterializeResult(
        asset_key="tasks",
        metadata={
            "pool": name,
            "dagster/row_count": counts["tasks"],
            "examples": dg.MetadataValue.md(
                md_table(
                    [{"task_id": t["task_id"], "instruction": t["instruction"]} for t in data.tasks[:10]]
                )
            ),
        },
    )
