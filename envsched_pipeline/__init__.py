"""envsched: environment-aware rollout scheduling for agent RL, as a Dagster pipeline.

Importing this package is cheap and imports no Dagster: ``envsched_pipeline.definitions`` is the
Dagster code location, ``envsched_pipeline.scheduler`` the pure algorithm, ``envsched_pipeline.lake``
the Parquet/DuckDB lake.
"""

__version__ = "0.1.0"
