"""The rollout table: its schema, error classes and the group metrics every path uses.

A *group* is the G rollouts of one task at one step. It is *informative* when its rewards spread
by more than :data:`SPREAD_EPS` (only then does GRPO's group-normalised advantage carry a
gradient). Every learner (simulated, neural, Qwen3), the external ingest path and the benchmarks
build their rollout rows and batch metrics through this module, so the threshold and the columns
are defined once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import StrEnum

import numpy as np
import pyarrow as pa

SPREAD_EPS = 1e-6  # a group whose max - min reward is at most this has zero variance


class ErrorClass(StrEnum):
    """Why a rollout ended. Only task outcomes are evidence about the task."""

    NONE = "none"  # the episode ran and was verified
    TASK = "task"  # the task itself reported an error (e.g. an empty checklist): still an outcome
    TIMEOUT = "timeout"  # the environment hung past its deadline
    ENV_CRASH = "env_crash"  # environment code crashed its worker
    VERIFIER_ERROR = "verifier_error"  # the verifier failed
    INFRA = "infra"  # anything else outside the task (lost worker, bad protocol)


ERROR_CLASSES = tuple(e.value for e in ErrorClass)
TASK_OUTCOMES = frozenset({ErrorClass.NONE.value, ErrorClass.TASK.value})

# column -> (arrow type, default) of the ``rollouts`` table; step, task_id, rollout, env_id and
# reward are required, the rest default when a path does not produce them.
COLUMNS: dict[str, tuple[pa.DataType, object]] = {
    "step": (pa.int64(), None),
    "task_id": (pa.string(), None),
    "rollout": (pa.int64(), None),
    "env_id": (pa.string(), None),
    "reward": (pa.float64(), None),
    "advantage": (pa.float64(), 0.0),
    "checks_passed": (pa.int64(), 0),
    "checks_total": (pa.int64(), 0),
    "turns": (pa.int64(), 0),
    "tool_calls": (pa.int64(), 0),
    "terminated": (pa.bool_(), True),
    "truncated": (pa.bool_(), False),
    "error_class": (pa.string(), ErrorClass.NONE.value),
    "error_message": (pa.string(), ""),
    "hack_flag": (pa.bool_(), False),
    "tokens": (pa.int64(), 0),
    "seconds": (pa.float64(), 0.0),
    "policy_version": (pa.int64(), 0),
    "trajectory": (pa.string(), ""),
}
REQUIRED = ("step", "task_id", "rollout", "env_id", "reward")


def informative(rewards: np.ndarray) -> np.ndarray:
    """(n, G) rewards -> (n,) bool: the group's rewards spread (non-zero variance)."""
    r = np.asarray(rewards, dtype=float)
    return np.ptp(r, axis=-1) > SPREAD_EPS if r.size else np.zeros(r.shape[:-1], dtype=bool)


def flat_kinds(rewards: np.ndarray) -> np.ndarray:
    """(n, G) rewards -> (n,) str: '' for a group with spread, else what its one value was: "solved"
    (every episode 1), "failed" (every episode 0) or "partial" (all at the same partial credit)."""
    r = np.asarray(rewards, dtype=float)
    kinds = np.full(r.shape[:-1], "", dtype=object)
    if not r.size:
        return kinds
    flat = ~informative(r)
    solved, failed = flat & (r.min(axis=-1) >= 1.0), flat & (r.max(axis=-1) <= 0.0)
    kinds[solved], kinds[failed], kinds[flat & ~solved & ~failed] = "solved", "failed", "partial"
    return kinds


def group_stats(rewards) -> tuple[float, float, float]:
    """(mean, population variance, dispersion) of one group; dispersion is 1.0 if informative."""
    r = np.asarray(rewards, dtype=float)
    if not len(r):
        return 0.0, 0.0, 0.0
    return float(r.mean()), float(r.var()), float(np.ptp(r) > SPREAD_EPS)


def batch_metrics(groups: list[np.ndarray] | np.ndarray) -> dict:
    """The numbers a step is judged by, from its groups' rewards (a list of arrays of any length,
    or an (n, G) array): batch variance (mean within-group variance), zero-variance fraction,
    mean reward over rollouts, median of group means, informative groups."""
    groups = [np.asarray(g, dtype=float) for g in groups]
    groups = [g for g in groups if len(g)]
    if not groups:
        return {
            "batch_variance": 0.0,
            "zero_variance_fraction": 0.0,
            "reward_mean": float("nan"),
            "reward_median": float("nan"),
            "groups": 0,
            "informative_groups": 0,
        }
    stats = np.array([group_stats(g) for g in groups])
    return {
        "batch_variance": float(stats[:, 1].mean()),
        "zero_variance_fraction": float(1.0 - stats[:, 2].mean()),
        "reward_mean": float(np.concatenate(groups).mean()),
        "reward_median": float(np.median(stats[:, 0])),
        "groups": len(groups),
        "informative_groups": int(stats[:, 2].sum()),
    }


def table(rows: Mapping[str, object], n: int) -> pa.Table:
    """A ``rollouts`` table from column arrays (missing optional columns get their defaults);
    extra columns are kept as they are."""
    missing = [c for c in REQUIRED if c not in rows]
    if missing:
        raise ValueError(f"rollout rows lack required column(s): {', '.join(missing)}")
    cols = {}
    for name, (typ, default) in COLUMNS.items():
        values = rows.get(name)
        if values is None:
            values = [default] * n
        cols[name] = pa.array(
            np.asarray(values).tolist() if isinstance(values, np.ndarray) else list(values), type=typ
        )
    for name, values in rows.items():
        if name not in cols:
            cols[name] = pa.array(
                np.asarray(values).tolist() if isinstance(values, np.ndarray) else list(values)
            )
    return pa.table(cols)


def trajectory_json(obj, limit: int = 20_000) -> str:
    """A trajectory as the JSON text stored in the table, cut to ``limit`` characters."""
    return json.dumps(obj, default=str)[:limit]


def write_step_result(lake, step: int, result: dict, metrics: dict | None = None) -> None:
    """A trained step's partitions: its rollouts, its held-out episodes (when it evaluated), its
    evals, and last ``train_metrics`` (``metrics``, else the result's), the step's completion mark."""
    lake.write("rollouts", result["rollouts"], step=step)
    if result.get("eval_rollouts") is not None:
        lake.write("eval_rollouts", result["eval_rollouts"], step=step)
    else:  # a redone step that no longer evaluates must not keep the held-out episodes of before
        lake.delete_partition("eval_rollouts", step=step)
    lake.write("evals", result["evals"], step=step)
    lake.write("train_metrics", [metrics if metrics is not None else result["metrics"]], step=step)
