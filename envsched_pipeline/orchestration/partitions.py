"""Partition sets: one dynamic partition per (run, training step), keyed ``<run_id>-<step>``, so two
runs against one Dagster instance never share (or overwrite) a partition."""

import dagster as dg

training_steps = dg.DynamicPartitionsDefinition(name="training_steps")


def partition_key(run_id: str, step: int) -> str:
    return f"{run_id}-{int(step)}"


def parse_key(key: str) -> tuple[str, int]:
    """(run_id, step) of a partition key; a bare step number (older instances) has run id ""."""
    run_id, _, step = key.rpartition("-")
    return run_id, int(step)


def step_of(context) -> int:
    return parse_key(context.partition_key)[1]


def run_of(context) -> str:
    return parse_key(context.partition_key)[0]
