"""Jobs the loop runs, one partition (= training step) per run: the step jobs take the
``training_steps`` partitions of the assets they select.

The step jobs and the report job run their ops in the run's own process (Dagster's in-process
executor), as ``envsched train`` runs them: their ops run one after another anyway, and the
multiprocess executor would start a process (and load this code location again) for each op and
asset check, seconds a step. The GPU work already runs in a process of its own (Pipes, or the
resident worker). ``pool_job`` keeps the multiprocess executor: topologies and features build side
by side."""

import os

import dagster as dg

select_job = dg.define_asset_job(
    "select_job",
    selection=dg.AssetSelection.assets("batch_manifest"),
    description="Materialize the manifest of step t (the scheduler's selection).",
    executor_def=dg.in_process_executor,
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
    executor_def=dg.in_process_executor,
)
report_job = dg.define_asset_job(
    "report_job",
    selection=dg.AssetSelection.assets("run_report"),
    description="Write the run's report page (`run_report`, default config): the loop sensor requests it once "
    "when a run completes.",
    executor_def=dg.in_process_executor,
)
pool_job = dg.define_asset_job(
    "pool_job",
    selection=dg.AssetSelection.groups("pool", "graph"),
    description="Import the pool and build topologies, features and the task graph.",
)
