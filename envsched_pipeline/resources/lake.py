"""The lake as a Dagster resource (the Parquet/DuckDB code itself is :mod:`envsched_pipeline.lake`)."""

import dagster as dg
from pydantic import Field

from envsched_pipeline.lake import Lake


class LakeResource(dg.ConfigurableResource):
    """Parquet rollout lake + in-memory DuckDB views."""

    root: str = Field(
        default="",
        description="Lake root folder. Empty: $ENVSCHED_LAKE, else warehouse/lake.",
    )

    def lake(self) -> Lake:
        return Lake(self.root or None)
