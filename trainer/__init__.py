"""GRPO trainer side: rollout engines, the simulated learner, and the step entry point run
through Dagster Pipes. Nothing here imports Dagster (only ``dagster_pipes`` in the entry point)."""
