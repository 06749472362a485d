"""Jobs the loop runs, one partition (= training step) per run: the step jobs take the
``training_steps`` partitions of the assets they select."""

import os

import dagster as dg

select_job = dg.define_asset_job(
    "select_job",
    selection=dg.AssetSelection.assets("batch_manifest"),
    description="Materialize the manifest of step t (the scheduler's selection).",
)
# Run-level config for the K8sRunLauncher (read from the run's tags): the run pod of a training step
# asks for the GPU when the trainer runs in-process (subprocess mode inside the run pod).
K8S_TRAIN_CONFIG = {
    "container_config": {
        "resources": {"limits": {"nvidia.com/gpu": os.environ.get("ENVSCHED_K8S_GPUS", "1")}}
    },
    "pod_spec_config": {
        "node_selector": {"nvidia.com/gpu.present": "true"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
}

train_job = dg.define_asset_job(
    "train_job",
    tags={"dagster-k8s/config": K8S_TRAIN_CONFIG},
    selection=dg.AssetSelection.assets("training_step", "reward_statistics"),
    description="Run the GRPO step t (through Pipes) and update the reward statistics.",
)
report_job = dg.define_asset_job(
    "report_job",
    selection=dg.AssetSelection.assets("run_report"),
    description="Write the run's report page (`run_report`, default config): the loop sensor requests it once "
    "when a run completes.",
)
pool_job = dg.define_asset_job(
    "pool_job",
    selection=dg.AssetSelection.groups("pool", "graph"),
    description="Import the pool and build topologies, features and the task graph.",
)
