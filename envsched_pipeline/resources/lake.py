"""The lake as a Dagster resource (the Parquet/DuckDB code itself is :mod:`envsched_pipeline.lake`)."""

import dagster as dg
from pydantic import Field

from envsched_pipeline.lake import Lake
from envsched_pipeline.orchestration.partitions import parse_key
from envsched_pipeline.run import load_run


class LakeResource(dg.ConfigurableResource):
    """Parquet rollout lake + in-memory DuckDB views."""

    root: str = Field(
        default="",
        description="Lake root folder. Empty: $ENVSCHED_LAKE, else warehouse/lake.",
    )

    def lake(self) -> Lake:
        return Lake(self.root or None)

    def lake_for(self, context) -> Lake:
        """The lake of the run being executed: its ``envsched/lake`` tag (set by the sensor and
        ``envsched train``), else this resource's root. A partition of another envsched run than
        the one the lake holds is refused, so two experiments never write into each other."""
        tags = getattr(getattr(context, "run", None), "tags", None) or {}
        lake = Lake(tags.get("envsched/lake") or self.root or None)
        key = getattr(context, "partition_key", None) if context.has_partition_key else None
        if key:
            run_id = parse_key(key)[0]
            spec = load_run(lake)
            if run_id and spec is not None and spec.run_id != run_id:
                raise dg.Failure(
                    f"partition {key} belongs to envsched run {run_id}, but {lake.root} holds run "
                    f"{spec.run_id}"
                )
        return lake
