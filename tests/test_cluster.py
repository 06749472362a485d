"""Cluster launchers and deployment files.

No Kubernetes cluster or Docker daemon exists here, so the k8s/docker Pipes clients are replaced by
recorders that (1) keep exactly what the launcher would send, (2) build the pod body with
dagster-k8s' own ``build_pod_body`` and validate it against the Kubernetes schema, and (3) run the
container's command on this machine so the step really trains and reports back through Pipes.
Everything else (Dagster, the lake, the trainer, schema validation, hadolint) is real.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import kubernetes_validate
import pytest
import yaml
from dagster_docker import PipesDockerClient
from dagster_k8s import PipesK8sClient
from dagster_k8s.pipes import build_pod_body
from kubernetes.client import ApiClient

from envsched_pipeline.deploy import TARGETS, DeployConfig, render
from envsched_pipeline.errors import ConfigError
from envsched_pipeline.orchestration.jobs import K8S_TRAIN_CONFIG
from envsched_pipeline.orchestration.partitions import training_steps
from envsched_pipeline.resources.lake import LakeResource
from envsched_pipeline.resources.trainer import TrainerLauncher, trainer_pod_spec
from envsched_pipeline.run import load_run
from tests.procs import stop

ROOT = Path(__file__).resolve().parents[1]

K8S_VERSION = "1.33"


def _local(command):
    return [sys.executable if c == "python" else c for c in command]


class RecordingK8s(PipesK8sClient):
    """Stands in for a cluster: records the pod, validates it, runs its command here."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def run(self, *, context, image=None, command=None, base_pod_spec=None, base_pod_meta=None, **kw):
        pod = build_pod_body("envsched-test", image, command, {}, base_pod_meta, base_pod_spec)
        body = ApiClient().sanitize_for_serialization(pod)
        body.setdefault("apiVersion", "v1")
        body.setdefault("kind", "Pod")
        kubernetes_validate.validate(body, K8S_VERSION, strict=True)
        self.calls.append({"image": image, "command": list(command), "pod": body, **kw})
        return dg.PipesSubprocessClient().run(command=_local(command), context=context)


class RecordingDocker(PipesDockerClient):
    def __init__(self):
        super().__init__()
        self.calls = []

    def run(self, *, context, image, command=None, container_kwargs=None, **kw):
        self.calls.append({"image": image, "command": list(command), "container_kwargs": container_kwargs})
        return dg.PipesSubprocessClient().run(command=_local(command), context=context)


class Launcher(TrainerLauncher):
    """TrainerLauncher whose Pipes client is a recorder (config stays the real resource's)."""

    def launch(self, context, lake_root, step, mode="subprocess", client=None):
        return super().launch(context, lake_root, step, mode=mode, client=RECORDERS.get(mode))


RECORDERS: dict = {}


def _materialize_step(lake, launcher):
    from envsched_pipeline.assets import manifest, training

    key = f"{load_run(lake).run_id}-0"
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(training_steps.name, [key])
        return dg.materialize(
            dg.load_assets_from_modules([manifest, training]),
            partition_key=key,
            instance=instance,
            resources={"lake": LakeResource(root=str(lake.root)), "trainer": launcher},
            selection=["batch_manifest", "training_step"],
        )


def test_k8s_mode_runs_the_step_in_a_gpu_pod(small_run, monkeypatch):
    monkeypatch.setenv("ENVSCHED_TRAINER", "k8s")
    RECORDERS["k8s"] = rec = RecordingK8s()
    launcher = Launcher(
        image="registry.local/envsched-gpu:1",
        gpus=2,
        node_selector={"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        lake_claim="envsched-lake",
        secret_env=["envsched-secrets"],
    )
    res = _materialize_step(small_run, launcher)
    assert res.success
    (call,) = rec.calls
    pod = call["pod"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "registry.local/envsched-gpu:1"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    assert pod["restartPolicy"] == "Never" and pod["serviceAccountName"] == "envsched-trainer"
    assert {"name": "lake", "mountPath": "/lake"} in container["volumeMounts"]
    assert container["command"][1:5] == ["-m", "trainer.step", "--lake", str(small_run.root)]
    # the trainer ran and reported through Pipes, as it would from the pod
    mat = {
        m.asset_key.to_user_string(): m.materialization.metadata
        for m in res.get_asset_materialization_events()
    }
    assert mat["training_step"]["rollouts"].value == 32
    assert small_run.has("rollouts", step=0)


def test_docker_mode_asks_for_gpus_and_shared_memory(small_run, monkeypatch):
    monkeypatch.setenv("ENVSCHED_TRAINER", "docker")
    RECORDERS["docker"] = rec = RecordingDocker()
    assert _materialize_step(small_run, Launcher(image="envsched-gpu:dev", gpus=1)).success
    (call,) = rec.calls
    assert call["image"] == "envsched-gpu:dev"
    (req,) = call["container_kwargs"]["device_requests"]
    assert req["Count"] == 1 and req["Capabilities"] == [["gpu"]]
    assert call["container_kwargs"]["shm_size"] == "16g"


def test_cluster_modes_without_an_image_fail_with_the_fix(small_run, monkeypatch):
    monkeypatch.setenv("ENVSCHED_TRAINER", "k8s")
    monkeypatch.delenv("ENVSCHED_TRAINER_IMAGE", raising=False)
    RECORDERS["k8s"] = RecordingK8s()
    with pytest.raises(dg.Failure, match="ENVSCHED_TRAINER_IMAGE"):
        _materialize_step(small_run, Launcher())
    assert not small_run.has("rollouts", step=0)


def test_unknown_trainer_mode_is_refused(monkeypatch):
    monkeypatch.setenv("ENVSCHED_TRAINER", "slurm")
    with pytest.raises(dg.Failure, match="unknown trainer mode 'slurm'"):
        TrainerLauncher().resolved_mode("subprocess")
    assert TrainerLauncher().resolved_mode("external") == "external"


def test_pod_spec_is_pure_and_cpu_only_when_asked():
    a = trainer_pod_spec("img", ["python"], gpus=0)
    assert a == trainer_pod_spec("img", ["python"], gpus=0)
    assert "nvidia.com/gpu" not in a["containers"][0]["resources"]["limits"]


@pytest.mark.parametrize("target", TARGETS)
def test_rendered_deployment_is_valid(target, tmp_path):
    files = {p.name: p for p in render(target, tmp_path, DeployConfig(gpus=4))}
    assert {"Dockerfile", "Dockerfile.gpu"} <= set(files)
    for name in ("Dockerfile", "Dockerfile.gpu"):
        lint = subprocess.run(
            [str(Path(sys.executable).parent / "hadolint"), str(files[name])], capture_output=True, text=True
        )
        assert lint.returncode == 0, lint.stdout + lint.stderr
    docs = {name: list(yaml.safe_load_all(p.read_text())) for name, p in files.items() if p.suffix == ".yaml"}
    if target == "k8s":
        for name in ("trainer-pod.yaml", "rbac.yaml", "secrets.template.yaml"):
            for doc in docs[name]:
                kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        pod = docs["trainer-pod.yaml"][0]["spec"]
        assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
        rules = [r for d in docs["rbac.yaml"] if d["kind"] == "Role" for r in d["rules"]]
        assert any("pods/log" in r["resources"] for r in rules)
        values = docs["values.yaml"][0]
        assert values["runLauncher"]["type"] == "K8sRunLauncher"
        assert values["dagster-user-deployments"]["deployments"][0]["dagsterApiGrpcArgs"][-1] == (
            "envsched_pipeline.definitions"
        )
    elif target == "docker":
        compose = docs["compose.yaml"][0]
        assert {"postgres", "code", "webserver", "daemon"} <= set(compose["services"])
        launcher = docs["dagster.yaml"][0]["run_launcher"]
        assert launcher["class"] == "DockerRunLauncher"
        assert (
            docs["dagster.yaml"][0]["storage"]["postgres"]["postgres_db"]["scheme"] == "postgresql+psycopg2"
        )
    else:
        (loc,) = docs["dagster_cloud.yaml"][0]["locations"]
        assert loc["agent_queue"] == "gpu"
        assert loc["container_context"]["k8s"]["run_k8s_config"]["container_config"]["resources"][
            "limits"
        ] == {"nvidia.com/gpu": 4}


def test_rendered_instance_config_is_accepted_by_dagster(tmp_path):
    """The rendered dagster.yaml passes Dagster's own instance-config schema."""
    from dagster._core.instance.config import dagster_instance_config

    render("docker", tmp_path, DeployConfig())
    config, _ = dagster_instance_config(str(tmp_path), "dagster.yaml")
    assert config["run_launcher"]["class"] == "DockerRunLauncher"


def test_render_refuses_unknown_target_and_bad_env(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="unknown deploy target"):
        render("nomad", tmp_path)
    monkeypatch.setenv("ENVSCHED_K8S_GPUS", "two")
    with pytest.raises(ConfigError, match="ENVSCHED_K8S_GPUS"):
        DeployConfig.from_env()


def test_deploy_render_cli(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "envsched_pipeline.cli",
            "deploy",
            "render",
            "--target",
            "k8s",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "values.yaml").exists() and (tmp_path / "trainer-pod.yaml").exists()


@pytest.mark.parametrize("mode", ["k8s", "docker", "subprocess"])
def test_definitions_validate_in_every_trainer_mode(mode, tmp_path):
    env = {"ENVSCHED_TRAINER": mode, "ENVSCHED_TRAINER_IMAGE": "img:1", "DAGSTER_HOME": str(tmp_path)}
    out = subprocess.run(
        [
            str(Path(sys.executable).parent / "dagster"),
            "definitions",
            "validate",
            "-m",
            "envsched_pipeline.definitions",
        ],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


RECORDER = '''
"""K8sRunLauncher whose Kubernetes API is a recorder (no cluster here): everything else, from the
daemon's queue to dagster-k8s' own Job construction, is the real code path."""
import json, os
from kubernetes.client import ApiClient
from dagster_k8s import K8sRunLauncher


class RecordingBatchApi:
    def create_namespaced_job(self, body, namespace, **_):
        out = os.path.join(os.environ["ENVSCHED_K8S_RECORD_DIR"], body.metadata.name + ".json")
        with open(out, "w") as fh:
            json.dump({"namespace": namespace, "job": ApiClient().sanitize_for_serialization(body)}, fh)
        return body


class RecordingK8sRunLauncher(K8sRunLauncher):
    def __init__(self, *args, **kwargs):
        kwargs["k8s_client_batch_api"] = RecordingBatchApi()
        super().__init__(*args, **kwargs)
'''

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""


def test_the_daemon_launches_the_training_step_as_a_gpu_job(small_run, tmp_path):
    """Under the real dagster-daemon (queued run coordinator + K8sRunLauncher), the sensor's
    train_job becomes a Kubernetes Job whose run worker asks for a GPU on a GPU node."""
    from envsched_pipeline.core.select import select_manifest

    select_manifest(small_run, 0)  # the next thing the run needs is the training step
    (tmp_path / "recorder").mkdir()
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "k8s_recorder.py").write_text(RECORDER)
    (tmp_path / "kubeconfig").write_text(KUBECONFIG)
    home = tmp_path / "dh"
    home.mkdir()
    (home / "dagster.yaml").write_text(
        yaml.safe_dump(
            {
                "telemetry": {"enabled": False},
                "run_coordinator": {
                    "module": "dagster.core.run_coordinator",
                    "class": "QueuedRunCoordinator",
                },
                "run_launcher": {
                    "module": "k8s_recorder",
                    "class": "RecordingK8sRunLauncher",
                    "config": {
                        "service_account_name": "envsched",
                        "instance_config_map": "dagster-instance",
                        "dagster_home": "/opt/dagster/dagster_home",
                        "job_image": "ghcr.io/example/envsched:test",
                        "load_incluster_config": False,
                        "kubeconfig_file": str(tmp_path / "kubeconfig"),
                        "job_namespace": "envsched",
                    },
                },
            }
        )
    )
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "ENVSCHED_LAKE": str(small_run.root),
        "ENVSCHED_K8S_RECORD_DIR": str(tmp_path / "recorder"),
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "mods"), str(ROOT)]),
    }
    daemon = subprocess.Popen(
        [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w", str(ROOT / "workspace.yaml")],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "daemon.log", "w"),
        start_new_session=True,
    )
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not list((tmp_path / "recorder").glob("*.json")):
            time.sleep(2)
    finally:
        stop(daemon)
    jobs = [json.loads(p.read_text()) for p in (tmp_path / "recorder").glob("*.json")]
    assert jobs, "the daemon launched nothing: " + (tmp_path / "daemon.log").read_text()[-3000:]
    rec = jobs[0]
    job = rec["job"]
    pod = job["spec"]["template"]["spec"]
    assert rec["namespace"] == "envsched" and job["metadata"]["labels"]["dagster/job"] == "train_job"
    container = pod["containers"][0]
    assert (
        container["resources"]["limits"]["nvidia.com/gpu"]
        == K8S_TRAIN_CONFIG["container_config"]["resources"]["limits"]["nvidia.com/gpu"]
    )
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    assert container["image"] == "ghcr.io/example/envsched:test" and pod["serviceAccountName"] == "envsched"
