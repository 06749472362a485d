"""How ``training_step[t]`` gets its rollouts: a launcher resource, chosen by config or by
``ENVSCHED_TRAINER`` (never by editing assets).

* ``subprocess`` (default): ``python -m trainer.step`` as a child process through Dagster Pipes.
* ``k8s``: the same command in its own pod through ``PipesK8sClient``; the pod comes from
  :func:`trainer_pod_spec` (image, ``nvidia.com/gpu`` limit, node selector, tolerations, volumes,
  environment from secrets). Needs RBAC for pods create/get/delete and pods/log
  (``envsched deploy render --target k8s``).
* ``docker``: the same command in a container through ``PipesDockerClient`` with GPU device requests.
* ``external``: an outside trainer ingests rollouts (``envsched step ingest``); the asset verifies.

Every mode streams the trainer's logs and metadata back into the run. The GPU step runs in the
Dagster concurrency pool ``gpu`` (limit 1 in the deploy configs), so two GPU steps never overlap.
"""

from __future__ import annotations

import os
import shlex
import sys

import dagster as dg
from pydantic import Field

MODES = ("auto", "subprocess", "k8s", "docker", "external")


def trainer_pod_spec(
    image: str,
    command: list[str],
    gpus: int = 1,
    cpu: str = "8",
    memory: str = "64Gi",
    node_selector: dict[str, str] | None = None,
    tolerations: list[dict] | None = None,
    lake_claim: str = "",
    lake_mount: str = "/lake",
    secret_env: list[str] | None = None,
    service_account: str = "envsched-trainer",
) -> dict:
    """A Kubernetes PodSpec for the training step (pure: the same inputs give the same spec)."""
    resources = {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}}
    if gpus:
        resources["requests"]["nvidia.com/gpu"] = str(gpus)
        resources["limits"]["nvidia.com/gpu"] = str(gpus)
    volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}]
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if lake_claim:
        volumes.append({"name": "lake", "persistentVolumeClaim": {"claimName": lake_claim}})
        mounts.append({"name": "lake", "mountPath": lake_mount})
    container = {
        "name": "trainer",
        "image": image,
        "command": list(command),
        "resources": resources,
        "volumeMounts": mounts,
        "envFrom": [{"secretRef": {"name": s}} for s in (secret_env or [])],
    }
    spec = {
        "serviceAccountName": service_account,
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": volumes,
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    return spec


class TrainerLauncher(dg.ConfigurableResource):
    mode: str = Field(
        default="auto",
        description="auto (ENVSCHED_TRAINER, else the run's setting) | subprocess | k8s | docker | external",
    )
    python: str = Field(
        default="", description="Interpreter for the trainer process (subprocess mode; default: this one)."
    )
    extra_args: str = Field(default="", description="Extra arguments for trainer.step.")
    image: str = Field(default="", description="k8s/docker: the GPU trainer image (ENVSCHED_TRAINER_IMAGE).")
    namespace: str = Field(
        default="", description="k8s: namespace of the trainer pods (default: the client's)."
    )
    gpus: int = Field(default=1, description="k8s/docker: GPUs per training step.")
    cpu: str = Field(default="8", description="k8s: CPU request of the trainer pod.")
    memory: str = Field(default="64Gi", description="k8s: memory of the trainer pod.")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="k8s: node selector, e.g. a GPU node pool."
    )
    tolerations: list[dict] = Field(
        default_factory=list, description="k8s: tolerations (e.g. nvidia.com/gpu NoSchedule)."
    )
    lake_claim: str = Field(
        default="", description="k8s: PersistentVolumeClaim holding the lake (local-path lakes)."
    )
    lake_mount: str = Field(default="/lake", description="k8s: where that claim is mounted in the pod.")
    secret_env: list[str] = Field(
        default_factory=list, description="k8s: Secrets exposed to the trainer as env vars."
    )

    def resolved_mode(self, run_trainer: str) -> str:
        if run_trainer == "external" and self.mode == "auto":
            return "external"  # the run's rollouts come from an outside trainer, wherever this runs
        mode = self.mode if self.mode != "auto" else os.environ.get("ENVSCHED_TRAINER", "")
        mode = mode or run_trainer
        if mode not in MODES[1:]:
            raise dg.Failure(f"unknown trainer mode {mode!r}; choose one of {', '.join(MODES[1:])}")
        return mode

    def command(self, lake_root: str, step: int, python: str | None = None) -> list[str]:
        cmd = [
            python or self.python or sys.executable,
            "-m",
            "trainer.step",
            "--lake",
            lake_root,
            "--step",
            str(step),
        ]
        return cmd + shlex.split(self.extra_args)

    def _image(self) -> str:
        image = self.image or os.environ.get("ENVSCHED_TRAINER_IMAGE", "")
        if not image:
            raise dg.Failure(
                "the k8s/docker trainer needs an image: set TrainerLauncher.image or ENVSCHED_TRAINER_IMAGE"
            )
        return image

    def pod_spec(self, lake_root: str, step: int) -> dict:
        return trainer_pod_spec(
            self._image(),
            self.command(lake_root, step, python="python"),
            self.gpus,
            self.cpu,
            self.memory,
            self.node_selector,
            self.tolerations,
            self.lake_claim,
            self.lake_mount,
            self.secret_env,
        )

    def launch(
        self,
        context: dg.AssetExecutionContext,
        lake_root: str,
        step: int,
        mode: str = "subprocess",
        client=None,
    ):
        """Run the trainer for one step through Pipes in ``mode``; returns the Pipes invocation.
        ``client`` replaces the Pipes client (tests: a recorder standing in for a cluster)."""
        if mode == "k8s":
            from dagster_k8s import PipesK8sClient  # the deploy extra; only when launching on k8s

            spec = self.pod_spec(lake_root, step)
            return (client or PipesK8sClient()).run(
                context=context,
                image=self._image(),
                command=spec["containers"][0]["command"],
                namespace=self.namespace or None,
                base_pod_spec=spec,
                base_pod_meta={"labels": {"app.kubernetes.io/name": "envsched-trainer"}},
            )
        if mode == "docker":
            from dagster_docker import PipesDockerClient  # the deploy extra; only when launching on Docker

            requests = (
                [{"Driver": "nvidia", "Count": self.gpus, "Capabilities": [["gpu"]]}] if self.gpus else []
            )
            return (client or PipesDockerClient()).run(
                context=context,
                image=self._image(),
                command=self.command(lake_root, step, python="python"),
                container_kwargs={"device_requests": requests, "shm_size": "16g"},
            )
        return (client or dg.PipesSubprocessClient()).run(
            command=self.command(lake_root, step), context=context
        )
