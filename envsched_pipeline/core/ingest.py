"""Ingest: an external trainer's rollouts for one step, validated and written atomically.

Every task must be in the step's manifest, rewards finite and in [0, 1], (task_id, rollout)
unique. A bad input is refused with the file and line/row named, and nothing is written.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from envsched_pipeline.errors import StepError
from envsched_pipeline.lake import Lake
from envsched_pipeline.rollouts import ERROR_CLASSES
from envsched_pipeline.run import require_run

INGEST_REQUIRED = ("task_id", "rollout", "reward")


def load_rollout_file(path) -> list[dict]:
    """Rows of a .jsonl or .parquet rollout file; errors name the file and the line / row."""
    path = Path(path)
    if not path.exists():
        raise StepError(f"{path}: no such file")
    rows: list[dict] = []
    if path.suffix == ".parquet":
        try:
            table = pq.read_table(path)
        except Exception as exc:
            raise StepError(f"{path}: cannot read Parquet ({exc})") from exc
        rows = table.to_pylist()
        for j, r in enumerate(rows):
            r["_where"] = f"{path} row {j}"
    elif path.suffix in (".jsonl", ".json", ".ndjson"):
        with open(path) as fh:
            for ln, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise StepError(f"{path} line {ln}: invalid JSON ({exc.msg})") from exc
                if not isinstance(r, dict):
                    raise StepError(f"{path} line {ln}: expected a JSON object")
                r["_where"] = f"{path} line {ln}"
                rows.append(r)
    else:
        raise StepError(f"{path}: expected a .jsonl or .parquet file")
    return rows


def ingest_rollouts(lake: Lake, step: int, rows_or_path) -> dict:
    """Validate an external trainer's rollouts for ``step`` and write them atomically.

    Every task must be in manifest ``step``, rewards finite and in [0, 1], (task_id, rollout)
    unique. A bad input is refused with the line/row named, and nothing is written.
    """
    spec = require_run(lake)
    if not lake.has("manifests", step=step):
        raise StepError(
            f"cannot ingest step {step}: it has no manifest (run `envsched step select --step {step}`)"
        )
    rows = (
        load_rollout_file(rows_or_path)
        if isinstance(rows_or_path, (str, bytes)) or hasattr(rows_or_path, "__fspath__")
        else [dict(r, _where=f"record {j}") for j, r in enumerate(rows_or_path)]
    )
    if not rows:
        raise StepError(f"step {step}: no rollouts given")
    manifest = lake.read("manifests", step=step)
    env_of = dict(
        zip(manifest.column("task_id").to_pylist(), manifest.column("env_id").to_pylist(), strict=True)
    )
    seen: set[tuple[str, int]] = set()
    out = []
    for r in rows:
        where = r.pop("_where")
        missing = [k for k in INGEST_REQUIRED if k not in r or r[k] is None]
        if missing:
            raise StepError(f"{where}: missing field(s) {', '.join(missing)}")
        tid = r["task_id"]
        if not isinstance(tid, str):
            raise StepError(f"{where}: task_id must be a string")
        if tid not in env_of:
            raise StepError(f"{where}: task {tid!r} is not in manifest {step}")
        try:
            rollout = int(r["rollout"])
            reward = float(r["reward"])
        except (TypeError, ValueError) as exc:
            raise StepError(f"{where}: rollout must be an integer and reward a number ({exc})") from exc
        if isinstance(r["reward"], bool) or not math.isfinite(reward) or not 0.0 <= reward <= 1.0:
            raise StepError(f"{where}: reward {r['reward']!r} is not a finite number in [0, 1]")
        if (tid, rollout) in seen:
            raise StepError(f"{where}: duplicate rollout ({tid!r}, {rollout})")
        seen.add((tid, rollout))
        err = r.get("error_class") or "none"
        if err not in ERROR_CLASSES:
            raise StepError(f"{where}: error_class {err!r} is not one of {', '.join(ERROR_CLASSES)}")
        extra = {k: v for k, v in r.items() if k not in INGEST_REQUIRED and k not in ("step", "env_id")}
        out.append(
            {
                "step": int(step),
                "task_id": tid,
                "rollout": rollout,
                "env_id": env_of[tid],
                "reward": reward,
                "error_class": err,
                "error_message": str(r.get("error_message") or ""),
                "hack_flag": bool(r.get("hack_flag", False)),
                "tokens": int(r.get("tokens") or 0),
                "seconds": float(r.get("seconds") or 0.0),
                "trajectory": json.dumps(r["trajectory"])
                if isinstance(r.get("trajectory"), (dict, list))
                else str(r.get("trajectory") or ""),
                "extra": json.dumps(
                    {
                        k: v
                        for k, v in extra.items()
                        if k
                        not in (
                            "error_class",
                            "error_message",
                            "hack_flag",
                            "tokens",
                            "seconds",
                            "trajectory",
                        )
                    },
                    default=str,
                ),
            }
        )
    rewards = np.array([r["reward"] for r in out])
    by_task: dict[str, list[float]] = {}
    for r in out:
        by_task.setdefault(r["task_id"], []).append(r["reward"])
    spread = [np.ptp(v) > 1e-6 for v in by_task.values()]
    lake.write("rollouts", out, step=step)
    metrics = {
        "step": int(step),
        "policy": f"external ({spec.policy})",
        "seconds": float("nan"),
        "reward_mean": float(rewards.mean()),
        "reward_median": float(np.median([np.mean(v) for v in by_task.values()])),
        "batch_variance": float(np.mean([np.var(v) for v in by_task.values()])),
        "zero_variance_fraction": float(1 - np.mean(spread)),
        "envs_touched": len({env_of[t] for t in by_task}),
        "rollouts": len(out),
        "groups": len(by_task),
        "missing_groups": len(set(env_of) - set(by_task)),
    }
    lake.write("train_metrics", [metrics], step=step)
    return metrics
