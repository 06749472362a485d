"""Ingest: an external trainer's rollouts for one step, validated and written atomically.

What is refused (with the file and line or row named, and nothing written):

* a run whose rollouts come from the internal trainer (``RunSpec.trainer != "external"``);
* a step without a manifest; a step already *consumed* (its statistics exist, or the next
  manifest was chosen from them), unless ``replace=True``, which first archives every later
  step (manifests, rollouts, statistics, state) so nothing derived from the old data remains;
* another ingest of the same step running at the same time (the second gets a clear error);
* a file with more rows than the step can have (B x G), invalid JSON, a non-object line;
* types that are not what they claim: ``rollout`` an integer, ``reward`` a finite number in
  [0, 1] (not a bool, not a string), ``hack_flag`` a JSON boolean (``"false"`` is refused),
  ``tokens`` a non-negative integer, ``seconds`` a non-negative number, ``error_class`` one of
  the classes;
* a task not in the manifest; a duplicate (task_id, rollout); groups that are not exactly G
  rollouts with ids 0..G-1, and manifest tasks without rollouts, unless ``partial_groups=True``
  (then such groups are recorded as partial and left out of the variance statistics).

Group checks and metrics run as polars expressions over the validated rows.
"""

from __future__ import annotations

import json
import math
import numbers
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from envsched_pipeline.core.state_store import has_state
from envsched_pipeline.errors import StepError
from envsched_pipeline.lake import Lake, read_parquet_file
from envsched_pipeline.lease import step_lock
from envsched_pipeline.rollouts import ERROR_CLASSES, SPREAD_EPS
from envsched_pipeline.run import RunSpec, require_run

INGEST_REQUIRED = ("task_id", "rollout", "reward")
OPTIONAL = ("error_class", "error_message", "hack_flag", "tokens", "seconds", "trajectory")


def _count_rows(path: Path) -> int:
    if path.suffix == ".parquet":
        return pq.ParquetFile(path).metadata.num_rows
    with open(path, "rb") as fh:
        return sum(1 for line in fh if line.strip())


def load_rollout_file(path, max_rows: int | None = None) -> list[dict]:
    """Rows of a .jsonl or .parquet rollout file; errors name the file and the line / row."""
    path = Path(path)
    if not path.exists():
        raise StepError(f"{path}: no such file")
    if path.suffix not in (".parquet", ".jsonl", ".json", ".ndjson"):
        raise StepError(f"{path}: expected a .jsonl or .parquet file")
    try:
        n = _count_rows(path)
    except Exception as exc:
        raise StepError(f"{path}: cannot read ({exc})") from exc
    if max_rows is not None and n > max_rows:
        raise StepError(f"{path}: {n} rows, but this step can have at most {max_rows} (B x G)")
    rows: list[dict] = []
    if path.suffix == ".parquet":
        try:
            rows = read_parquet_file(path).to_pylist()
        except Exception as exc:
            raise StepError(f"{path}: cannot read Parquet ({exc})") from exc
        for j, r in enumerate(rows):
            r["_where"] = f"{path} row {j}"
        return rows
    with open(path, "rb") as fh:
        for ln, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise StepError(f"{path} line {ln}: not UTF-8 text (byte {exc.start} of the line)") from exc
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
    return rows


def _is_int(v) -> bool:
    """An integer, a numpy one included (a trainer's counters often are); never a boolean."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_number(v) -> bool:
    """A finite real number, numpy scalars included (rewards computed with numpy are np.float32 or
    np.float64); never a boolean or a string."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


def validate_row(r: dict, where: str, env_of: dict[str, str], step: int = 0) -> dict:
    """One rollout row, strictly typed; raises StepError naming ``where`` and the field."""
    missing = [k for k in INGEST_REQUIRED if k not in r or r[k] is None]
    if missing:
        raise StepError(f"{where}: missing field(s) {', '.join(missing)}")
    tid = r["task_id"]
    if not isinstance(tid, str):
        raise StepError(f"{where}: task_id must be a string, got {type(tid).__name__}")
    if tid not in env_of:
        raise StepError(f"{where}: task {tid!r} is not in manifest {step}")
    if not _is_int(r["rollout"]) or r["rollout"] < 0:
        raise StepError(f"{where}: rollout must be a non-negative integer, got {r['rollout']!r}")
    if not _is_number(r["reward"]) or not 0.0 <= float(r["reward"]) <= 1.0:
        raise StepError(f"{where}: reward {r['reward']!r} is not a finite number in [0, 1]")
    err = r.get("error_class", "none")
    err = "none" if err is None else err
    if not isinstance(err, str) or err not in ERROR_CLASSES:
        raise StepError(f"{where}: error_class {err!r} is not one of {', '.join(ERROR_CLASSES)}")
    hack = r.get("hack_flag", False)
    hack = bool(hack) if isinstance(hack, np.bool_) else hack
    if not isinstance(hack, bool):
        raise StepError(f"{where}: hack_flag must be true or false (a JSON boolean), got {hack!r}")
    tokens = r.get("tokens", 0)
    if tokens is not None and (not _is_int(tokens) or tokens < 0):
        raise StepError(f"{where}: tokens must be a non-negative integer, got {tokens!r}")
    seconds = r.get("seconds", 0.0)
    if seconds is not None and (not _is_number(seconds) or seconds < 0):
        raise StepError(f"{where}: seconds must be a non-negative number, got {seconds!r}")
    msg = r.get("error_message", "")
    if msg is not None and not isinstance(msg, str):
        raise StepError(f"{where}: error_message must be a string, got {type(msg).__name__}")
    traj = r.get("trajectory")
    if traj is not None and not isinstance(traj, (dict, list, str)):
        raise StepError(f"{where}: trajectory must be an object, a list or a string")
    extra = {k: v for k, v in r.items() if k not in (*INGEST_REQUIRED, *OPTIONAL, "step", "env_id")}
    return {
        "step": 0,
        "task_id": tid,
        "rollout": int(r["rollout"]),
        "env_id": env_of[tid],
        "reward": float(r["reward"]),
        "error_class": err,
        "error_message": msg or "",
        "hack_flag": hack,
        "tokens": int(tokens or 0),
        "seconds": float(seconds or 0.0),
        "trajectory": json.dumps(traj) if isinstance(traj, (dict, list)) else (traj or ""),
        "extra": json.dumps(extra, default=str),
    }


def group_problems(
    df: pl.DataFrame, manifest_tasks: set[str], group_size: int
) -> tuple[list[str], pl.DataFrame]:
    """Duplicates, group sizes and rollout ids (polars). Returns (problems, per-task groups)."""
    problems = []
    dup = df.group_by("task_id", "rollout").len().filter(pl.col("len") > 1)
    if dup.height:
        r = dup.row(0, named=True)
        problems.append(f"duplicate rollout ({r['task_id']!r}, {r['rollout']}) appears {r['len']} times")
    groups = (
        df.group_by("task_id")
        .agg(
            pl.len().alias("n"),
            pl.col("rollout").min().alias("lo"),
            pl.col("rollout").max().alias("hi"),
            pl.col("reward").mean().alias("mean"),
            pl.col("reward").var(ddof=0).alias("var"),
            ((pl.col("reward").max() - pl.col("reward").min()) > SPREAD_EPS).alias("informative"),
        )
        .sort("task_id")
    )
    bad = groups.filter((pl.col("n") != group_size) | (pl.col("lo") != 0) | (pl.col("hi") != group_size - 1))
    if bad.height:
        r = bad.row(0, named=True)
        problems.append(
            f"{bad.height} group(s) are not G = {group_size} rollouts with ids 0..{group_size - 1}, e.g. "
            f"{r['task_id']!r}: {r['n']} rollouts, ids {r['lo']}..{r['hi']} (pass partial_groups / "
            "--partial-groups to ingest incomplete groups)"
        )
    missing = sorted(manifest_tasks - set(groups["task_id"].to_list()))
    if missing:
        problems.append(
            f"{len(missing)} manifest task(s) have no rollouts, e.g. {missing[:3]} (pass partial_groups / "
            "--partial-groups to ingest a step with missing groups)"
        )
    return problems, groups


def consumed(lake: Lake, spec: RunSpec, step: int) -> bool:
    """Step ``step``'s rollouts were already used: its statistics exist, or the first manifest
    chosen from them (the next one; ``select_lag`` further for a run that selects ahead)."""
    return (
        lake.has("statistics", step=step)
        or has_state(lake, step)
        or lake.has("manifests", step=step + 1 + spec.select_lag)
    )


def roll_back(lake: Lake, step: int) -> dict:
    """Archive everything derived from step ``step``'s rollouts (its statistics and state, and every
    later step) into ``archive/``; return what moved."""
    return lake.archive(
        f"rollback-step{step}",
        lambda kind, s: s > step or (s == step and kind in ("statistics", "yields", "state")),
    )


def external_run(lake: Lake, what: str) -> RunSpec:
    """The lake's run, which must take its rollouts from an external trainer (``what`` is for those)."""
    spec = require_run(lake)
    if spec.trainer != "external":
        raise StepError(
            f"{lake.root} holds a run whose rollouts come from the internal trainer ({spec.trainer}); "
            f"{what} is for runs started with `envsched step select` or the Python API"
        )
    return spec


def ingest_rollouts(
    lake: Lake, step: int, rows_or_path, replace: bool = False, partial_groups: bool = False
) -> dict:
    """Validate an external trainer's rollouts for ``step`` and write them atomically."""
    spec = external_run(lake, "`step ingest`")
    if not lake.has("manifests", step=step):
        raise StepError(
            f"cannot ingest step {step}: it has no manifest (run `envsched step select --step {step}`)"
        )
    with step_lock(lake, f"ingest-step={step}") as lock, lake.fenced(lock.check):
        if consumed(lake, spec, step) and not replace:
            raise StepError(
                f"step {step} was already used (its statistics, or a manifest chosen from it, exist); re-ingesting "
                "would leave them derived from the old rollouts. Pass --replace to roll the later steps "
                "back (they are archived) and ingest again"
            )
        return _ingest(lake, spec, step, rows_or_path, replace, partial_groups)


def _records(given, step: int, max_rows: int) -> list[dict]:
    """An external trainer's rollouts given in memory, as rows: records (mappings) from any
    iterable, a pyarrow Table (``to_pylist``) or a polars DataFrame (``to_dicts``); anything else is
    a StepError naming the step (and the record)."""
    what = "expected the rollouts as records ({task_id, rollout, reward}, ...), a table or a file's path"
    if isinstance(given, Mapping):
        raise StepError(f"step {step}: {what}; got one mapping (a list of them is the step's rollouts)")
    for to_rows in ("to_pylist", "to_dicts"):
        if callable(getattr(given, to_rows, None)):
            given = getattr(given, to_rows)()
            break
    try:
        records = iter(given)
    except TypeError:
        raise StepError(f"step {step}: {what}; got {type(given).__name__}") from None
    rows = []
    for j, r in enumerate(records):
        if not isinstance(r, Mapping):
            raise StepError(
                f"step {step} record {j}: expected a mapping with task_id, rollout, reward, got {r!r:.60}"
            )
        if j >= max_rows:
            raise StepError(
                f"step {step}: more than {max_rows} rollouts, but this step can have at most {max_rows} (B x G)"
            )
        rows.append(dict(r, _where=f"record {j}"))
    return rows


def _ingest(lake: Lake, spec: RunSpec, step: int, rows_or_path, replace: bool, partial_groups: bool) -> dict:
    manifest = lake.read("manifests", step=step)
    env_of = dict(
        zip(manifest.column("task_id").to_pylist(), manifest.column("env_id").to_pylist(), strict=True)
    )
    max_rows = len(env_of) * spec.group_size
    source = f"step {step}"
    if isinstance(rows_or_path, (str, bytes)) or hasattr(rows_or_path, "__fspath__"):
        rows = load_rollout_file(rows_or_path, max_rows=max_rows)
        source = f"{rows_or_path} (step {step})"
    else:
        rows = _records(rows_or_path, step, max_rows)
    if not rows:
        raise StepError(f"{source}: no rollouts given")
    out, seen = [], set()
    for r in rows:
        where = r.pop("_where")
        row = validate_row(r, where, env_of, step)
        key = (row["task_id"], row["rollout"])
        if key in seen:
            raise StepError(f"{where}: duplicate rollout {key}")
        seen.add(key)
        row["step"] = int(step)
        out.append(row)
    df = pl.DataFrame(
        {
            "task_id": [r["task_id"] for r in out],
            "rollout": [r["rollout"] for r in out],
            "reward": [r["reward"] for r in out],
        }
    )
    problems, groups = group_problems(df, set(env_of), spec.group_size)
    if partial_groups:
        problems = [p for p in problems if p.startswith("duplicate")]
    if problems:
        raise StepError(
            f"{source}: {problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
        )
    rolled = roll_back(lake, step) if replace and consumed(lake, spec, step) else None
    partial = groups.filter(pl.col("n") != spec.group_size)["task_id"].to_list()
    lake.write_json(
        f"ingest/step={step}.json",
        {
            "partial_groups": partial_groups,
            "partial_tasks": partial,
            "rows": len(out),
            "at": time.time(),
            "rolled_back": rolled,
        },
    )
    lake.write("rollouts", pa.Table.from_pylist(out), step=step)
    full = groups.filter(pl.col("n") == spec.group_size) if partial_groups else groups
    metrics = {
        "step": int(step),
        "policy": f"external ({spec.policy})",
        "seconds": float("nan"),
        "reward_mean": float(df["reward"].mean()),
        "reward_median": float(groups["mean"].median()),
        "batch_variance": float(full["var"].mean()) if full.height else float("nan"),
        "zero_variance_fraction": float(1.0 - full["informative"].cast(pl.Float64).mean())
        if full.height
        else float("nan"),
        "envs_touched": len({env_of[t] for t in groups["task_id"].to_list()}),
        "rollouts": len(out),
        "groups": groups.height,
        "missing_groups": len(set(env_of) - set(groups["task_id"])),
        "partial_groups": len(partial),
    }
    lake.write("train_metrics", [metrics], step=step)
    if rolled:
        metrics["rolled_back"] = rolled["moved"]
    return metrics


EVAL_NAME_MAX = 64


def record_evals(lake: Lake, step: int, scores, where: str = "scores") -> list[dict]:
    """An external trainer's evaluation after step ``step``'s update, into ``evals[step]``: ``scores``
    maps a benchmark name to a score, or to ``{"score": x, "se": s}`` (a standard error). Names
    ``heldout_seen`` and ``heldout_unseen`` fill the step table's held-out columns; any other name
    (``bfcl_v3``, ...) is charted in the report and sent to the trackers. A benchmark already
    recorded for the step is replaced, the others kept. Everything is checked before anything is
    written; a bad entry is named (``where`` says where the scores came from)."""
    external_run(lake, "recording scores (the internal trainer writes its own evaluations)")
    if not lake.has("train_metrics", step=step):
        raise StepError(
            f"step {step} has no ingested rollouts yet: record its evaluation after `step ingest`"
        )
    if not isinstance(scores, dict) or not scores:
        raise StepError(
            f"{where}: expected an object of benchmark name -> score, got {type(scores).__name__}"
        )
    rows = []
    for name, value in scores.items():
        if not isinstance(name, str) or not name.strip() or len(name) > EVAL_NAME_MAX or name != name.strip():
            raise StepError(
                f"{where}: benchmark name {name!r} must be a non-empty string of at most {EVAL_NAME_MAX} characters"
            )
        score, se = (value.get("score"), value.get("se")) if isinstance(value, dict) else (value, None)
        if isinstance(value, dict) and (extra := sorted(set(value) - {"score", "se"})):
            raise StepError(f"{where}: {name}: unknown field(s) {', '.join(extra)} (a score and its se)")
        if not _is_number(score):
            raise StepError(f"{where}: {name}: score {score!r} is not a finite number")
        if se is not None and (not _is_number(se) or se < 0):
            raise StepError(f"{where}: {name}: se {se!r} is not a finite number >= 0")
        rows.append(
            {
                "step": int(step),
                "benchmark": name,
                "score": float(score),
                "se": None if se is None else float(se),
            }
        )
    with step_lock(lake, f"ingest-step={step}") as lock, lake.fenced(lock.check):
        named = {r["benchmark"] for r in rows}
        kept = [r for r in lake.read("evals", step=step).to_pylist() if r["benchmark"] not in named]
        lake.write("evals", kept + rows, step=step)
    return rows
