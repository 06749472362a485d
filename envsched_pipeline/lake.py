"""The rollout lake: Parquet files are the source of truth, DuckDB is views + SQL over them.

Layout under the root (``$ENVSCHED_LAKE``, default ``warehouse/lake``)::

    environments/pool=synthetic/part-0.parquet      pool-level tables, one partition per pool
    tasks/pool=synthetic/part-0.parquet
    manifests/step=12/part-0.parquet                per-step tables, one partition per step
    rollouts/step=12/part-0.parquet
    state/step=12/scheduler.npz                      artifacts (scheduler state, policy checkpoints)
    run.json                                         the training run this lake holds

Partition columns are stored inside the files too (``step``, ``pool``), so a file read on its own
is complete; the directory names only organise. Every write goes to a temporary file in the
partition folder, is fsynced and renamed over ``part-0.parquet``: a reader sees the old partition or
the new one, never half of one, and re-writing a partition replaces it (idempotent per step).

DuckDB connections are in-memory and open views over the Parquet globs, so any number of readers
(the CLI, the UI, a notebook) run while a step writes: nothing holds a database file lock.
This module imports no Dagster: the scheduler service and the trainer use it directly.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from envsched_pipeline.errors import LakeError
from warehouse import views_sql

DEFAULT_ROOT = "warehouse/lake"

# Required columns per table (more columns are allowed). Types are checked loosely by kind.
POOL_TABLES: dict[str, dict[str, str]] = {
    "environments": {"pool": "str", "env_id": "str", "summary": "str", "tools": "str", "class_name": "str"},
    "tasks": {"pool": "str", "task_id": "str", "env_id": "str", "content_hash": "str", "instruction": "str"},
    "task_latents": {"pool": "str", "task_id": "str", "split": "str"},
    "eval_tasks": {"pool": "str", "task_id": "str", "env_id": "str", "split": "str", "instruction": "str"},
    "eval_environments": {"pool": "str", "env_id": "str", "tools": "str", "class_name": "str"},
    "topologies": {"pool": "str", "task_id": "str", "topology": "str"},
    "features": {"pool": "str", "task_id": "str", "view": "str"},
    "edges": {"pool": "str", "src": "str", "dst": "str", "kind": "str", "similarity": "float"},
}
STEP_TABLES: dict[str, dict[str, str]] = {
    "manifests": {
        "step": "int",
        "slot": "int",
        "task_id": "str",
        "env_id": "str",
        "half": "str",
        "score": "float",
    },
    "rollouts": {"step": "int", "task_id": "str", "rollout": "int", "env_id": "str", "reward": "float"},
    "statistics": {"step": "int", "task_id": "str"},
    "train_metrics": {"step": "int", "seconds": "float"},
    "evals": {"step": "int", "benchmark": "str", "score": "float"},
    "audits": {"step": "int"},
    "yields": {"step": "int", "predicted_yield": "float", "realized_yield": "float"},
}
ALL_TABLES = {**POOL_TABLES, **STEP_TABLES}


def _kind_ok(arrow_type: pa.DataType, kind: str) -> bool:
    if kind == "str":
        return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
    if kind == "int":
        return pa.types.is_integer(arrow_type)
    if kind == "float":
        return pa.types.is_floating(arrow_type) or pa.types.is_integer(arrow_type)
    return True


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file + fsync + rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


_ERROR_MARK = "lake error: "
_SAFE_VALUE = re.compile(r"-?[A-Za-z0-9][A-Za-z0-9_\-]{0,63}")


class Lake:
    """Parquet tables + artifacts under one root, with DuckDB views for SQL."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root or os.environ.get("ENVSCHED_LAKE") or DEFAULT_ROOT).resolve()

    # ------------------------------------------------------------------ paths
    def partition_dir(self, table: str, **partition: Any) -> Path:
        if table not in ALL_TABLES:
            raise LakeError(f"unknown lake table {table!r}; known: {', '.join(sorted(ALL_TABLES))}")
        d = self.root / table
        for k, v in partition.items():
            if not _SAFE_VALUE.fullmatch(str(v)):
                raise LakeError(
                    f"{table}: partition {k}={v!r} is not a valid name (letters, digits, '_' and '-')"
                )
            d = d / f"{k}={v}"
        return d

    def require(self) -> Lake:
        """This lake must exist (for commands that only read): a missing lake or a file in its
        place is an error that says how to start a run, never an empty answer."""
        if not self.root.exists():
            raise LakeError(
                f"no lake at {self.root}: start a run with `envsched train` (or `envsched --lake DIR ...` "
                "to point at another lake)"
            )
        if not self.root.is_dir():
            raise LakeError(f"{self.root} is not a lake (it is a file, not a folder)")
        return self

    def artifact_path(self, kind: str, step: int | None, name: str) -> Path:
        d = self.root / kind
        if step is not None:
            d = d / f"step={int(step)}"
        return d / name

    # ----------------------------------------------------------------- writes
    def write(self, table: str, data: pa.Table | Iterable[Mapping[str, Any]], **partition: Any) -> Path:
        """Replace one partition of ``table`` atomically. Returns the file written."""
        if not isinstance(data, pa.Table):
            rows = list(data)
            data = pa.Table.from_pylist(rows) if rows else self._empty(table)
        self._validate(table, data)
        d = self.partition_dir(table, **partition)
        d.mkdir(parents=True, exist_ok=True)
        target = d / "part-0.parquet"
        tmp = d / f".part-0.{uuid.uuid4().hex}.tmp"
        try:
            pq.write_table(data, tmp, compression="zstd")
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, target)
            _fsync_dir(d)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return target

    def _empty(self, table: str) -> pa.Table:
        kinds = {"str": pa.string(), "int": pa.int64(), "float": pa.float64()}
        cols = ALL_TABLES[table]
        return pa.table({c: pa.array([], type=kinds[k]) for c, k in cols.items()})

    def _validate(self, table: str, data: pa.Table) -> None:
        for col, kind in ALL_TABLES[table].items():
            if col not in data.column_names:
                raise LakeError(f"{table}: missing required column {col!r}")
            if not _kind_ok(data.schema.field(col).type, kind):
                raise LakeError(f"{table}.{col}: expected {kind}, got {data.schema.field(col).type}")

    def archive(self, label: str, select) -> dict:
        """Move every per-step partition or artifact folder ``<kind>/step=<s>`` for which
        ``select(kind, s)`` is true into ``archive/<label>-<ms>/`` (kept, never mixed with the live
        run). Returns {"archive": folder, "moved": {kind: [steps]}}."""
        dest = self.root / "archive" / f"{label}-{int(time.time() * 1000)}"
        moved: dict[str, list[int]] = {}
        kinds = [*STEP_TABLES, "state", "plots"]
        for kind in kinds:
            folder = self.root / kind
            if not folder.is_dir():
                continue
            for part in sorted(folder.glob("step=*")):
                try:
                    s = int(part.name.split("=", 1)[1])
                except ValueError:
                    continue
                if select(kind, s):
                    (dest / kind).mkdir(parents=True, exist_ok=True)
                    shutil.move(str(part), str(dest / kind / part.name))
                    moved.setdefault(kind, []).append(s)
        return {"archive": str(dest), "moved": {k: sorted(v) for k, v in moved.items()}}

    def delete_partition(self, table: str, **partition: Any) -> None:
        shutil.rmtree(self.partition_dir(table, **partition), ignore_errors=True)

    def write_json(self, relpath: str, obj: Any) -> Path:
        path = self.root / relpath
        atomic_write_bytes(path, json.dumps(obj, indent=2, sort_keys=True, default=str).encode())
        return path

    def read_json(self, relpath: str) -> Any | None:
        path = self.root / relpath
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise LakeError(f"{path}: not valid JSON ({exc})") from exc

    # ------------------------------------------------------------------ reads
    def has(self, table: str, **partition: Any) -> bool:
        return (self.partition_dir(table, **partition) / "part-0.parquet").exists()

    def read(self, table: str, columns: list[str] | None = None, **partition: Any) -> pa.Table:
        """Read one partition, or the whole table when no partition is given."""
        if partition:
            files = [self.partition_dir(table, **partition) / "part-0.parquet"]
            files = [f for f in files if f.exists()]
        else:
            files = sorted(self.partition_dir(table).rglob("part-0.parquet"))
        if not files:
            return (
                self._empty(table)
                if columns is None
                else self._empty(table).select([c for c in columns if c in ALL_TABLES[table]])
            )
        parts = []
        for f in files:
            try:
                parts.append(pq.read_table(f, columns=columns))
            except Exception as exc:  # pyarrow raises several types for corrupt files
                raise LakeError(
                    f"{f}: cannot read Parquet file ({exc}); delete it and re-materialize that partition"
                ) from exc
        return pa.concat_tables(parts, promote_options="permissive") if len(parts) > 1 else parts[0]

    def steps(self, table: str) -> list[int]:
        """Steps that have a complete partition in ``table``, sorted."""
        d = self.root / table
        if not d.exists():
            return []
        out = []
        for p in d.glob("step=*/part-0.parquet"):
            try:
                out.append(int(p.parent.name.split("=", 1)[1]))
            except ValueError:
                continue
        return sorted(out)

    def pools(self) -> list[str]:
        d = self.root / "tasks"
        return (
            sorted(p.parent.name.split("=", 1)[1] for p in d.glob("pool=*/part-0.parquet"))
            if d.exists()
            else []
        )

    # ------------------------------------------------------------------ SQL
    def connect(self) -> duckdb.DuckDBPyConnection:
        """In-memory DuckDB with a view per table (empty typed views for tables not written yet)
        and the documented views of ``views.sql``."""
        con = duckdb.connect(":memory:")
        for table in ALL_TABLES:
            folder = self.root / table
            if folder.exists() and not folder.is_dir():
                _error_view(con, table, f"{folder} should be a folder of partitions, not a file")
                continue
            files = sorted(folder.rglob("part-0.parquet")) if folder.exists() else []
            if files:
                paths = ", ".join("'" + str(f).replace("'", "''") + "'" for f in files)
                try:
                    con.execute(
                        f"CREATE VIEW {table} AS SELECT * FROM read_parquet([{paths}], union_by_name=true, hive_partitioning=false)"
                    )
                except duckdb.Error as exc:
                    # only queries that touch this table fail, and they name the file
                    bad = self._find_corrupt(files)
                    _error_view(
                        con,
                        table,
                        f"{bad or table}: cannot read Parquet ({str(exc).splitlines()[0]}); "
                        "delete it and re-materialize that partition",
                    )
            else:
                con.register(f"_{table}_empty", self._empty(table))
                con.execute(f"CREATE VIEW {table} AS SELECT * FROM _{table}_empty")
        for stmt in _split_sql(views_sql()):
            try:
                con.execute(stmt)
            except duckdb.Error as exc:
                # a derived view that cannot be built (e.g. a table lacks a column): it still exists,
                # and a query that touches it fails with the reason; other queries are unaffected
                name = _view_name(stmt)
                if name:
                    _error_view(con, name, f"view {name} is unavailable: {str(exc).splitlines()[0]}")
        return con

    def _find_corrupt(self, files: list[Path]) -> Path | None:
        for f in files:
            try:
                pq.ParquetFile(f).metadata  # noqa: B018
            except Exception:
                return f
        return None

    def sql(self, query: str) -> pa.Table:
        con = self.connect()
        try:
            return self._run(con, query)
        except duckdb.Error as exc:
            msg = str(exc)
            if _ERROR_MARK in msg:
                raise LakeError(msg.split(_ERROR_MARK, 1)[1].splitlines()[0]) from exc
            if "parquet" in msg.lower() or "magic" in msg.lower() or "Invalid Input Error" in msg:
                bad = self._find_corrupt(sorted(self.root.rglob("part-0.parquet")))
                if bad is not None:
                    raise LakeError(
                        f"{bad}: cannot read Parquet ({msg.splitlines()[0]}); delete it and "
                        "re-materialize that partition"
                    ) from exc
            raise
        finally:
            con.close()

    @staticmethod
    def _run(con, query: str) -> pa.Table:
        rel = con.sql(query)
        if rel is None:  # a statement without a result (e.g. SET)
            return pa.table({})
        fetch = getattr(rel, "to_arrow_table", None) or rel.arrow  # duckdb 2.x / 1.x
        return fetch()


def _error_view(con: duckdb.DuckDBPyConnection, name: str, message: str) -> None:
    """A view that raises ``message`` when a query reads it."""
    text = f"{_ERROR_MARK}{message}".replace("'", "''")
    # the filter makes even count(*) evaluate error()
    con.execute(
        f"CREATE OR REPLACE VIEW {name} AS SELECT error('{text}') AS error FROM range(1) "
        f"WHERE error('{text}') IS NULL"
    )


def _view_name(stmt: str) -> str | None:
    m = re.match(r"\s*CREATE\s+(?:OR\s+REPLACE\s+)?VIEW\s+([A-Za-z_][A-Za-z0-9_]*)", stmt, re.I)
    return m.group(1) if m else None


def _split_sql(text: str) -> list[str]:
    """Statements of a .sql file (no semicolons inside string literals in ours)."""
    lines = [ln for ln in text.splitlines() if not ln.strip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]
