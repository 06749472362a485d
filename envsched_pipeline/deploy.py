"""``envsched deploy render``: the files that run envsched on a cluster, from the current config.

    envsched deploy render --target k8s --out DIR            Helm values (official Dagster chart), RBAC,
                                                              secrets template, the trainer pod, Dockerfiles
    envsched deploy render --target docker --out DIR         dagster.yaml (DockerRunLauncher) + compose file
    envsched deploy render --target dagster-cloud --out DIR  dagster_cloud.yaml for a hybrid agent (gpu queue)

Settings come from the environment (``ENVSCHED_IMAGE``, ``ENVSCHED_TRAINER_IMAGE``,
``ENVSCHED_K8S_NAMESPACE``, ``ENVSCHED_K8S_GPUS``, ``ENVSCHED_GPU_NODE_SELECTOR`` as key=value,
``ENVSCHED_LAKE``) with defaults that produce a complete, schema-valid deployment. These files are
rendered and validated offline (Kubernetes schemas, hadolint); they have not been applied to a
cluster by this repository.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from deploy import template
from envsched_pipeline.errors import ConfigError
from envsched_pipeline.resources.trainer import trainer_pod_spec

TARGETS = ("k8s", "docker", "dagster-cloud")


@dataclass
class DeployConfig:
    image: str = "ghcr.io/example/envsched:latest"
    trainer_image: str = "ghcr.io/example/envsched-gpu:latest"
    namespace: str = "envsched"
    gpus: int = 1
    node_selector: dict = field(default_factory=lambda: {"nvidia.com/gpu.present": "true"})
    lake: str = "s3://envsched-lake/runs/main"
    pg_host: str = "envsched-postgresql"

    @classmethod
    def from_env(cls) -> DeployConfig:
        c = cls()
        c.image = os.environ.get("ENVSCHED_IMAGE", c.image)
        c.trainer_image = os.environ.get("ENVSCHED_TRAINER_IMAGE", c.trainer_image)
        c.namespace = os.environ.get("ENVSCHED_K8S_NAMESPACE", c.namespace)
        try:
            c.gpus = int(os.environ.get("ENVSCHED_K8S_GPUS", c.gpus))
        except ValueError as exc:
            raise ConfigError(f"ENVSCHED_K8S_GPUS must be an integer ({exc})") from exc
        sel = os.environ.get("ENVSCHED_GPU_NODE_SELECTOR")
        if sel:
            c.node_selector = dict(kv.split("=", 1) for kv in sel.split(",") if "=" in kv)
        c.lake = os.environ.get("ENVSCHED_LAKE", c.lake)
        return c


def _env(c: DeployConfig) -> list[dict]:
    return [
        {"name": "ENVSCHED_LAKE", "value": c.lake},
        {"name": "ENVSCHED_TRAINER", "value": "k8s"},
        {"name": "ENVSCHED_TRAINER_IMAGE", "value": c.trainer_image},
    ]


def helm_values(c: DeployConfig) -> dict:
    """Values for the official Dagster Helm chart: K8sRunLauncher, Postgres, our code location,
    compute logs on S3."""
    image = {
        "repository": c.image.rsplit(":", 1)[0],
        "tag": c.image.rsplit(":", 1)[-1],
        "pullPolicy": "Always",
    }
    return {
        "dagster-user-deployments": {
            "enabled": True,
            "deployments": [
                {
                    "name": "envsched",
                    "image": image,
                    "dagsterApiGrpcArgs": ["-m", "envsched_pipeline.definitions"],
                    "port": 4000,
                    "envSecrets": [{"name": "envsched-secrets"}],
                    "env": _env(c),
                }
            ],
        },
        "runLauncher": {
            "type": "K8sRunLauncher",
            "config": {
                "k8sRunLauncher": {
                    "envSecrets": [{"name": "envsched-secrets"}],
                    "envVars": [f"ENVSCHED_LAKE={c.lake}"],
                    "runK8sConfig": {"podSpecConfig": {"serviceAccountName": "dagster"}},
                }
            },
        },
        "postgresql": {"enabled": True, "postgresqlDatabase": "dagster", "postgresqlUsername": "dagster"},
        "computeLogManager": {
            "type": "S3ComputeLogManager",
            "config": {
                "s3ComputeLogManager": {
                    "bucket": c.lake.removeprefix("s3://").split("/", 1)[0],
                    "prefix": "compute-logs",
                }
            },
        },
        "dagsterDaemon": {"enabled": True, "runRetries": {"enabled": True, "maxRetries": 2}},
    }


def trainer_pod(c: DeployConfig) -> dict:
    """The pod the training step runs in (the launcher builds the same spec per step)."""
    spec = trainer_pod_spec(
        c.trainer_image,
        ["python", "-m", "trainer.step", "--lake", c.lake, "--step", "0"],
        gpus=c.gpus,
        node_selector=c.node_selector,
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        secret_env=["envsched-secrets"],
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "envsched-trainer-example",
            "namespace": c.namespace,
            "labels": {"app.kubernetes.io/name": "envsched-trainer"},
        },
        "spec": spec,
    }


def docker_files(c: DeployConfig) -> dict[str, dict]:
    dagster = {
        "run_launcher": {
            "module": "dagster_docker",
            "class": "DockerRunLauncher",
            "config": {
                "env_vars": [
                    "ENVSCHED_LAKE",
                    "ENVSCHED_TRAINER",
                    "ENVSCHED_TRAINER_IMAGE",
                    "DAGSTER_PG_HOST",
                    "DAGSTER_PG_PORT",
                    "DAGSTER_PG_USER",
                    "DAGSTER_PG_PASSWORD",
                    "DAGSTER_PG_DB",
                ],
                "network": "envsched",
                "container_kwargs": {"volumes": ["/var/run/docker.sock:/var/run/docker.sock"]},
            },
        },
        **yaml.safe_load(template("dagster-postgres.yaml")),
    }
    env = {
        "DAGSTER_HOME": "/opt/dagster/home",
        "ENVSCHED_LAKE": c.lake,
        "ENVSCHED_TRAINER": "docker",
        "ENVSCHED_TRAINER_IMAGE": c.trainer_image,
        "DAGSTER_PG_HOST": "postgres",
        "DAGSTER_PG_PORT": "5432",
        "DAGSTER_PG_USER": "dagster",
        "DAGSTER_PG_PASSWORD": "${DAGSTER_PG_PASSWORD}",
        "DAGSTER_PG_DB": "dagster",
    }
    common = {
        "image": c.image,
        "environment": env,
        "networks": ["envsched"],
        "volumes": [
            "./dagster.yaml:/opt/dagster/home/dagster.yaml",
            "/var/run/docker.sock:/var/run/docker.sock",
        ],
    }
    compose = {
        "services": {
            "postgres": {
                "image": "postgres:15",
                "environment": {
                    "POSTGRES_USER": "dagster",
                    "POSTGRES_DB": "dagster",
                    "POSTGRES_PASSWORD": "${DAGSTER_PG_PASSWORD}",
                },
                "networks": ["envsched"],
            },
            "code": {
                **common,
                "command": [
                    "dagster",
                    "api",
                    "grpc",
                    "-h",
                    "0.0.0.0",
                    "-p",
                    "4000",
                    "-m",
                    "envsched_pipeline.definitions",
                ],
            },
            "webserver": {
                **common,
                "command": ["dagster-webserver", "-h", "0.0.0.0", "-p", "3000", "-w", "workspace.yaml"],
                "ports": ["127.0.0.1:3000:3000"],
            },
            "daemon": {**common, "command": ["dagster-daemon", "run", "-w", "workspace.yaml"]},
        },
        "networks": {"envsched": {"name": "envsched"}},
    }
    return {"dagster.yaml": dagster, "compose.yaml": compose}


def dagster_cloud(c: DeployConfig) -> dict:
    """Dagster+ hybrid: the code location runs on an agent serving the ``gpu`` queue."""
    return {
        "locations": [
            {
                "location_name": "envsched",
                "code_source": {"module_name": "envsched_pipeline.definitions"},
                "image": c.image,
                "agent_queue": "gpu",
                "container_context": {
                    "k8s": {
                        "namespace": c.namespace,
                        "env_secrets": ["envsched-secrets"],
                        "env_vars": [
                            f"ENVSCHED_LAKE={c.lake}",
                            "ENVSCHED_TRAINER=k8s",
                            f"ENVSCHED_TRAINER_IMAGE={c.trainer_image}",
                        ],
                        "run_k8s_config": {
                            "container_config": {"resources": {"limits": {"nvidia.com/gpu": c.gpus}}},
                            "pod_spec_config": {"node_selector": c.node_selector},
                        },
                    }
                },
            }
        ]
    }


def render(target: str, out: Path, config: DeployConfig | None = None) -> list[Path]:
    """Write the files of ``target`` into ``out``; returns them."""
    if target not in TARGETS:
        raise ConfigError(f"unknown deploy target {target!r}; choose one of {', '.join(TARGETS)}")
    c = config or DeployConfig.from_env()
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, object] = {}
    if target == "k8s":
        files["values.yaml"] = helm_values(c)
        files["trainer-pod.yaml"] = trainer_pod(c)
        for name in ("rbac.yaml", "secrets.template.yaml"):
            files[name] = template(name).replace("namespace: envsched", f"namespace: {c.namespace}")
    elif target == "docker":
        files.update(docker_files(c))
    else:
        files["dagster_cloud.yaml"] = dagster_cloud(c)
    for name in ("Dockerfile", "Dockerfile.gpu"):
        files[name] = template(name)
    if target == "k8s":
        files["dagster-postgres.yaml"] = template("dagster-postgres.yaml")
    written = []
    for name, body in files.items():
        path = out / name
        path.write_text(body if isinstance(body, str) else yaml.safe_dump(body, sort_keys=False))
        written.append(path)
    return written
