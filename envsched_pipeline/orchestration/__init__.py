"""The Dagster layer besides assets and resources: partitions, jobs, the loop sensor, asset checks,
metadata helpers, and the in-process driver ``envsched train`` uses. Only this layer, the assets,
the resources and ``definitions.py`` import Dagster."""
