"""Experiment trackers (``--report-to tensorboard,wandb,mlflow``), like TRL's ``report_to``.

After each step's statistics, the step's numbers are logged under the step table's column names
(``batch_variance``, ``zero_variance_fraction``, ``envs_touched``, ``mean_reward``, ``heldout_seen``,
``heldout_unseen``, ``trainer_s``; at an evaluating step the best mean held-out so far,
``heldout_best_score`` and ``heldout_best_step``) plus the trainer's metrics (``loss``, ``grad_norm``,
``clip_fraction``, ``approx_kl``, ``entropy``, ``response_length_mean``, ``tokens_per_second``, ...),
with the run's config logged once. All three work offline: TensorBoard event files, W&B in offline
mode, MLflow's local file store, under ``<lake>/trackers/`` unless a tracker's own environment
variables point elsewhere (``WANDB_DIR``, ``MLFLOW_TRACKING_URI``).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from envsched_pipeline.analysis.passk import episodes_by_split, headline_reliability
from envsched_pipeline.errors import ConfigError
from envsched_pipeline.lake import Lake, best_evaluated
from envsched_pipeline.run import SAMPLER_METRICS, RunSpec

TRACKERS = ("tensorboard", "wandb", "mlflow")
TRAIN_METRICS = (
    "loss",
    "grad_norm",
    "clip_fraction",
    "approx_kl",
    "kl",
    "entropy",
    *SAMPLER_METRICS,
    "lr",
    "response_length_mean",
    "response_length_max",
    "tokens_per_second",
    "trained_tokens_per_second",
    "padding_fraction",
    "rollout_seconds",
    "update_seconds",
    "trained_groups",
    "parse_errors",
    "truncated",
    "errors",
)


def parse(report_to: str | list[str] | None) -> list[str]:
    names = [
        n.strip()
        for n in (report_to.split(",") if isinstance(report_to, str) else report_to or [])
        if n.strip()
    ]
    names = [] if names == ["none"] else names
    bad = [n for n in names if n not in TRACKERS]
    if bad:
        raise ConfigError(f"unknown tracker(s) {', '.join(bad)}; choose from {', '.join(TRACKERS)} or none")
    return names


def step_metrics(lake: Lake, step: int) -> dict[str, float]:
    """The step's numbers, flat, finite floats only."""
    out: dict[str, float] = {}
    summary = lake.sql(f"select * from step_summary where step = {int(step)}").to_pylist()
    if summary:
        r = summary[0]
        for k in ("batch_variance", "zero_variance_fraction", "envs_touched", "mean_reward", "median_reward"):
            out[k] = r.get(k)
    for r in lake.read("evals", step=step).to_pylist():
        b = r.get("benchmark") or ""
        key = (
            "heldout_seen"
            if b.startswith("heldout_seen")
            else "heldout_unseen"
            if b.startswith("heldout_unseen")
            else f"eval/{b}"
        )
        out[key] = r.get("score")
    if "heldout_seen" in out or "heldout_unseen" in out:  # the best so far: what `evaluate --best` scores
        best = best_evaluated(lake, upto=step)
        if best is not None:
            out["heldout_best_score"], out["heldout_best_step"] = best["score"], best["step"]
    # held-out solved in one attempt, in any of K and in all K, where the step kept its episodes
    out.update(headline_reliability(episodes_by_split(lake, step)))
    tm = lake.read("train_metrics", step=step).to_pylist()
    if tm:
        out["trainer_s"] = tm[0].get("seconds")
        for k in TRAIN_METRICS:
            if k in tm[0]:
                out[k] = tm[0][k]
    return {
        k: float(v)
        for k, v in out.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
    }


def log_step(lake: Lake, spec: RunSpec, step: int, names: list[str] | None = None) -> dict[str, float]:
    """Log step ``step`` of the lake's run to every tracker the run reports to."""
    names = parse(spec.report_to) if names is None else names
    if not names:
        return {}
    metrics = step_metrics(lake, step)
    root = Path(lake.local) / "trackers"
    config = {k: v for k, v in spec.to_dict().items() if not isinstance(v, dict)}
    config.update({f"scheduler.{k}": v for k, v in spec.scheduler_config.items()})
    config.update({f"policy.{k}": v for k, v in spec.policy_config.items()})
    for name in names:
        {"tensorboard": _tensorboard, "wandb": _wandb, "mlflow": _mlflow}[name](
            root, spec, step, metrics, config
        )
    return metrics


def _tensorboard(root: Path, spec: RunSpec, step: int, metrics: dict, config: dict) -> None:
    from tensorboard.compat.proto.event_pb2 import Event  # optional extra "trackers"
    from tensorboard.compat.proto.summary_pb2 import Summary  # optional extra "trackers"
    from tensorboard.summary.writer.event_file_writer import EventFileWriter  # optional extra "trackers"

    writer = EventFileWriter(str(root / "tensorboard" / spec.run_id))
    if step == 0:
        text = "\n".join(f"{k}: {v}" for k, v in sorted(config.items()))
        writer.add_event(
            Event(
                wall_time=time.time(),
                step=0,
                summary=Summary(
                    value=[
                        Summary.Value(
                            tag="config",
                            metadata={"plugin_data": {"plugin_name": "text"}},
                            tensor={"dtype": 7, "string_val": [text.encode()], "tensor_shape": {}},
                        )
                    ]
                ),
            )
        )
    writer.add_event(
        Event(
            wall_time=time.time(),
            step=int(step),
            summary=Summary(value=[Summary.Value(tag=k, simple_value=v) for k, v in sorted(metrics.items())]),
        )
    )
    writer.close()


def _wandb(root: Path, spec: RunSpec, step: int, metrics: dict, config: dict) -> None:
    import wandb  # optional extra "trackers"

    os.environ.setdefault("WANDB_SILENT", "true")
    mode = os.environ.get("WANDB_MODE", "offline")
    run = wandb.init(
        project=os.environ.get("WANDB_PROJECT", "envsched"),
        id=spec.run_id,
        name=spec.run_id,
        resume="allow",
        mode=mode,
        config=config,
        dir=os.environ.get("WANDB_DIR", str(root)),
        settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
    )
    run.log(metrics, step=int(step))
    run.finish()


def read_wandb_history(path: str | Path) -> list[dict]:
    """The history rows of an offline W&B run file (``run-*.wandb``: a LevelDB-style log of 32 KiB
    blocks holding protobuf records), to check offline what was logged without a W&B server."""
    from wandb.proto import wandb_internal_pb2  # optional extra "trackers"

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a W&B run file")
    pos, block, rows, pending = 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # block trailer padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            if record.WhichOneof("record_type") == "history":
                rows.append(
                    {
                        item.key or "/".join(item.nested_key): json.loads(item.value_json)
                        for item in record.history.item
                    }
                )
            pending = b""
    return rows


def _mlflow(root: Path, spec: RunSpec, step: int, metrics: dict, config: dict) -> None:
    import mlflow  # optional extra "trackers"

    # the local file store is what works offline with no server; MLflow asks for an explicit opt-in
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI", (root / "mlruns").resolve().as_uri()))
    exp = mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME", "envsched"))
    client = mlflow.MlflowClient()
    found = client.search_runs([exp.experiment_id], filter_string=f"tags.envsched_run_id = '{spec.run_id}'")
    if found:
        run_id = found[0].info.run_id
    else:
        run = client.create_run(
            exp.experiment_id, run_name=spec.run_id, tags={"envsched_run_id": spec.run_id}
        )
        run_id = run.info.run_id
        for k, v in config.items():
            client.log_param(run_id, k, str(v)[:500])
    ts = int(time.time() * 1000)
    from mlflow.entities import Metric  # optional extra "trackers"

    client.log_batch(run_id, metrics=[Metric(k, v, ts, int(step)) for k, v in metrics.items()])
