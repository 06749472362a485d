"""``topologies``: each task's identifier-free abstract topology (LLM or offline extractor)."""

from collections import Counter

import dagster as dg

from envsched_pipeline.assets._common import PoolSelection, pool_name, progress_logger
from envsched_pipeline.graph.store import build_topologies
from envsched_pipeline.orchestration.metadata import md_table
from envsched_pipeline.resources.lake import LakeResource
from envsched_pipeline.resources.llm import LLMResource


@dg.asset(
    deps=["tasks"],
    group_name="graph",
    kinds={"parquet", "openai"},
    description="Abstract task topologies: operation categories, entity counts, constraints, check types.",
)
def topologies(
    context: dg.AssetExecutionContext, config: PoolSelection, lake: LakeResource, llm: LLMResource
) -> dg.MaterializeResult:

    lk = lake.lake_for(context)
    pool = pool_name(config, lk)
    extractor = llm.extractor(lk) if llm.enabled() else None
    out = build_topologies(lk, pool, extractor=extractor, progress=progress_logger(context))
    tab = lk.read("topologies", pool=pool)
    ops = Counter(o for s in tab.column("operations").to_pylist() for o in s.split(",") if o)
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": out["tasks"],
            "extractor": out["extractor"],
            "distinct_topologies": out["distinct_topologies"],
            "seconds": out["seconds"],
            **({"llm_usage": dg.MetadataValue.json(extractor.usage)} if extractor is not None else {}),
            "operation_counts": dg.MetadataValue.md(
                md_table([{"operation": k, "tasks": v} for k, v in ops.most_common()])
            ),
        }
    )
