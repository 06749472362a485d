"""Thin Dagster assets: read inputs from the lake resource, call the pure packages, write outputs,
return ``MaterializeResult`` metadata (counts, markdown tables, plots)."""
