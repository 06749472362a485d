"""Jobs the loop runs, one partition (= training step) per run."""

import dagster as dg

from envsched_pipeline.orchestration.partitions import training_steps

select_job = dg.define_asset_job(
    "select_job",
    selection=dg.AssetSelection.assets("batch_manifest"),
    partitions_def=training_steps,
    description="Materialize the manifest of step t (the scheduler's selection).",
)
train_job = dg.define_asset_job(
    "train_job",
    selection=dg.AssetSelection.assets("training_step", "reward_statistics"),
    partitions_def=training_steps,
    description="Run the GRPO step t (through Pipes) and update the reward statistics.",
)
pool_job = dg.define_asset_job(
    "pool_job",
    selection=dg.AssetSelection.groups("pool", "graph"),
    description="Import the pool and build topologies, features and the task graph.",
)
