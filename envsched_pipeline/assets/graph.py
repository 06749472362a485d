"""``task_graph``: within-environment and cross-environment top-k candidate edges."""

import dagster as dg

from envsched_pipeline.analysis.plots import embed, graph_report
from envsched_pipeline.assets._common import PoolSelection, pool_name, progress_logger
from envsched_pipeline.graph.store import build_task_graph
from envsched_pipeline.resources.lake import LakeResource


@dg.asset(
    deps=["features", "topologies"],
    group_name="graph",
    kinds={"scipy", "parquet"},
    description="Dual-relation graph: within-env edges (six-view TF-IDF) and cross-env edges (topologies).",
)
def task_graph(
    context: dg.AssetExecutionContext, config: PoolSelection, lake: LakeResource
) -> dg.MaterializeResult:

    lk = lake.lake_for(context)
    pool = pool_name(config, lk)
    out = build_task_graph(lk, pool, progress=progress_logger(context))
    report = graph_report(lk, pool, out["graph"])
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": out["within_edges"] + out["cross_edges"],
            "within_edges": out["within_edges"],
            "cross_edges": out["cross_edges"],
            "seconds": out["seconds"],
            "similarity_plot": dg.MetadataValue.md(embed(report["plot"], "similarity")),
            "cross_env_examples": dg.MetadataValue.md(report["examples_md"]),
        }
    )
