"""``batch_manifest[t]``: the scheduler's selection for step t.

It reads the scheduler state after step t-1 from the lake (the sensor orders the loop; see
docs/architecture.md §4: Dagster's asset graph must be acyclic, so the t-1 -> t edge is carried by the lake).
"""

from collections import Counter

import dagster as dg

from envsched_pipeline.analysis.plots import manifest_plot
from envsched_pipeline.assets._common import guard, materialized, plot_md
from envsched_pipeline.core.select import select_manifest
from envsched_pipeline.orchestration.metadata import near_misses_table, picks_table, scalar_metadata
from envsched_pipeline.orchestration.partitions import step_of, training_steps
from envsched_pipeline.resources.lake import LakeResource


@dg.asset(
    partitions_def=training_steps,
    deps=["tasks", "task_graph"],
    group_name="scheduling",
    kinds={"parquet", "numpy"},
    description="Step t's batch: B tasks, each with half, score, predicted variance and a reason record.",
)
def batch_manifest(context: dg.AssetExecutionContext, lake: LakeResource) -> dg.MaterializeResult:
    step = step_of(context)
    lk = lake.lake_for(context)
    with lk.snapshot():  # the lake read once for the selection and its metadata
        guard(context, lk)
        out = select_manifest(lk, step)
        rows, audit = out["rows"], out["audit"]

        halves = Counter(r["half"] for r in rows)
        envs = Counter(r["env_id"] for r in rows)
        return materialized(
            context,
            {
                "dagster/row_count": len(rows),
                "envs_touched": len(envs),
                **{f"half_{k}": v for k, v in halves.items()},
                **scalar_metadata(audit),
                **plot_md(context, "plot", manifest_plot, lk, step, rows),
                "picks": dg.MetadataValue.md(picks_table(rows)),
                "near_misses": dg.MetadataValue.md(near_misses_table(out["near_misses"])),
            },
        )
