"""``features``: six TF-IDF views per task (instruction, check text, check code, initial state,
tools touched, state footprint)."""

import dagster as dg

from envsched_pipeline.assets._common import PoolSelection, pool_name
from envsched_pipeline.graph.store import build_features
from envsched_pipeline.orchestration.metadata import md_table
from envsched_pipeline.resources.lake import LakeResource


@dg.asset(
    deps=["tasks"],
    group_name="graph",
    kinds={"scikitlearn", "parquet"},
    description="Six per-task TF-IDF views (sparse CSR artifacts + a row per task and view).",
)
def features(
    context: dg.AssetExecutionContext, config: PoolSelection, lake: LakeResource
) -> dg.MaterializeResult:

    lk = lake.lake_for(context)
    out = build_features(lk, pool_name(config, lk))
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": out["rows"],
            "seconds": out["seconds"],
            "views": dg.MetadataValue.md(
                md_table([{"view": v, "vocabulary": n} for v, n in out["vocabulary"].items()])
            ),
        }
    )
