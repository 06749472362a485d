"""Partition sets: one dynamic partition per training step ("0", "1", ...)."""

import dagster as dg

training_steps = dg.DynamicPartitionsDefinition(name="training_steps")


def step_of(context) -> int:
    return int(context.partition_key)
