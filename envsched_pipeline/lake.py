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

The root may be an object-store URL (``s3://bucket/prefix``; endpoint and credentials from the usual
``AWS_*`` variables, ``AWS_ENDPOINT_URL`` included). Object stores have no rename, but every partition
is one object and a PUT (or a completed multipart upload) becomes visible whole or not at all, so the
same guarantee holds: a killed writer leaves the old partition or none, never part of one. The run's
lease and step locks live in the lake itself (:meth:`Lake.create`). Files that only make sense on one
machine (rendered plots, the LLM answer cache, tracker logs, a resident worker's socket, LM
checkpoints) live under :attr:`Lake.local` (the root itself for a local lake; for a remote one
``$ENVSCHED_LOCAL_DIR/<bucket>/<prefix>``, default ``~/.cache/envsched/lakes``).

DuckDB connections are in-memory and open views over the Parquet globs, so any number of readers
(the CLI, the UI, a notebook) run while a step writes: nothing holds a database file lock.
This module imports no Dagster: the scheduler service and the trainer use it directly.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import fnmatch
import itertools
import json
import math
import os
import re
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
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
    "eval_rollouts": {
        "step": "int",
        "split": "str",
        "task_id": "str",
        "sample": "int",
        "env_id": "str",
        "reward": "float",
    },
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


SYNC_ENV = "ENVSCHED_LAKE_FSYNC"


def syncing() -> bool:
    """Whether a local lake's writes are fsynced before they are renamed into place (the default).
    ``$ENVSCHED_LAKE_FSYNC=0`` skips the fsyncs, for a throwaway lake (tests, a scratch run on
    tmpfs): every file still appears whole or not at all to a process that reads it, and a killed
    process loses nothing written before it died; only a machine that loses power can then lose
    the newest writes, a rename without its file's bytes included."""
    raw = os.environ.get(SYNC_ENV, "").strip() or "1"
    if raw not in ("0", "1"):
        raise LakeError(f"${SYNC_ENV}: expected 1 (fsync every write, the default) or 0, got {raw!r}")
    return raw == "1"


def _fsync(fd: int) -> None:
    if syncing():
        os.fsync(fd)


def _fsync_dir(path: Path) -> None:
    if not syncing():
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_replace(path: Path, fill, place=os.replace) -> None:
    """Create ``path`` whole or not at all: ``fill(tmp)`` writes a temp file beside it, which is
    fsynced and put in place by ``place(tmp, path)`` (a rename over ``path``; ``os.link`` for an
    exclusive create, which raises FileExistsError if ``path`` exists), then the folder is fsynced.
    The temp file never outlives the call."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        fill(tmp)
        with open(tmp, "rb+") as fh:
            _fsync(fh.fileno())
        place(tmp, path)
        _fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file + fsync + rename."""
    _atomic_replace(path, lambda tmp: tmp.write_bytes(data))


def json_safe(obj: Any) -> Any:
    """``obj`` with NaN and infinities as None (JSON null), so files people and tools read are valid
    JSON; tuples become lists."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


# per-step artifacts a run drops once newer ones exist (scheduler states, the simulated and neural
# learners' checkpoints) are kept for good at step 0 and every KEEP_EVERY-th step (19, 39, ...)
KEEP_EVERY = 20


def kept_for_good(step: int) -> bool:
    """Whether a per-step artifact of ``step`` stays once newer ones exist: step 0's and those of
    steps 19, 39, ... (a language model's default periodic checkpoints fall on the same steps)."""
    return step == 0 or (step + 1) % KEEP_EVERY == 0


def superseded(step: int, newest: int = 2) -> int | None:
    """The step whose per-step artifact writing ``step``'s makes unneeded: the one ``newest`` steps
    back unless kept for good (the newest two stay: a retried step needs its predecessor's; a run
    that selects ahead of its rollouts keeps more scheduler states)."""
    old = step - newest
    return old if old >= 0 and not kept_for_good(old) else None


# the best held-out policy of a language-model run (trainer.policy_step.PolicySession.keep_best):
# a folder under Lake.local with the policy and best.json (step, score, each split's score)
BEST_CHECKPOINT = "checkpoints/best"
# the run's latest report page (under Lake.local): the run_report asset's and the one `envsched train`
# writes at a run's end when the run names runs to compare with
LATEST_REPORT = "reports/latest"


def best_record(lake: Lake) -> dict | None:
    """The record of the best held-out policy (``best.json``: step, score, each split's score), or
    None when no step has saved one."""
    try:
        return json.loads((lake.local / BEST_CHECKPOINT / "best.json").read_text())
    except (OSError, ValueError):
        return None


def heldout_scores(lake: Lake) -> dict[int, dict[str, float]]:
    """The held-out scores the run recorded, by step (in order): ``{step: {"heldout_<split>": score}}``."""
    rows = lake.sql(
        "select step, benchmark, score from evals where benchmark like 'heldout_%' order by step, benchmark"
    ).to_pylist()
    by_step: dict[int, dict[str, float]] = {}
    for r in rows:
        by_step.setdefault(int(r["step"]), {})[r["benchmark"]] = float(r["score"])
    return by_step


def best_evaluated(lake: Lake, upto: int | None = None) -> dict | None:
    """The evaluated step with the best held-out score, the mean over its splits (the earlier step at
    a tie, as a language model's kept best): ``{"step", "score", "heldout_<split>": score}``, or
    None before the first evaluation. ``upto``: of the steps up to that one only."""
    return best_of(heldout_scores(lake), upto)


def split_mean(scores: Mapping[str, float]) -> float:
    """A step's held-out score: the mean of its splits' (what the best step is chosen by)."""
    return sum(scores.values()) / len(scores)


def best_of(by_step: Mapping[int, Mapping[str, float]], upto: int | None = None) -> dict | None:
    """:func:`best_evaluated` of scores already read (:func:`heldout_scores`)."""
    by_step = {t: v for t, v in by_step.items() if upto is None or t <= upto}
    if not by_step:
        return None
    mean = {t: split_mean(v) for t, v in by_step.items()}
    step = max(sorted(mean), key=lambda t: mean[t])  # the first of the best at a tie
    return {"step": step, "score": mean[step], **by_step[step]}


REMOTE_SCHEMES = ("s3://",)
# link(2) refused because the filesystem has no hard links (not because the name exists)
_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS}


class _Store:
    """What both stores share: reading a listing's Parquet objects through this process's cache."""

    def read_tables(self, listed: dict[str, tuple[str, int]]) -> dict[str, pa.Table | Exception]:
        """Each listed Parquet object (``{rel: (version, size)}`` from :meth:`objects`) as a table:
        from this process's cache when its version is the listed one, the others fetched together.
        An object gone since the listing is left out; one that is not Parquet maps to its error."""
        out: dict[str, pa.Table | Exception] = {}
        missing = []
        for rel, (version, _size) in listed.items():
            hit = _PARQUET_CACHE.get(self.full(rel), version)
            if hit is None:
                missing.append(rel)
            else:
                out[rel] = hit
        fetched = self.fetch(missing) if missing else {}
        for rel in missing:
            data = fetched.get(rel)
            if data is None or isinstance(data, (FileNotFoundError, NotADirectoryError)):
                continue  # replaced or archived between listing and reading
            if isinstance(data, Exception):
                raise data
            try:
                table = read_parquet_file(pa.BufferReader(data))
            except Exception as exc:  # pyarrow raises several types for corrupt files
                out[rel] = exc
                continue
            _PARQUET_CACHE.put(self.full(rel), listed[rel][0], table)
            out[rel] = table
        return {rel: out[rel] for rel in listed if rel in out}


class _LocalStore(_Store):
    """Files under a local folder: temp file + fsync + rename."""

    remote = False

    def __init__(self, root: Path):
        self.root = root

    def full(self, rel: str) -> str:
        return str(self.root / rel)

    def put(self, rel: str, data: bytes) -> None:
        atomic_write_bytes(self.root / rel, data)

    def get(self, rel: str) -> bytes | None:
        try:
            return (self.root / rel).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def exists(self, rel: str) -> bool:
        return (self.root / rel).exists()

    def swap(self, rel: str, seen: bytes, new: bytes | None) -> bool:
        """Replace ``rel`` with ``new`` (remove it if None) only if it still holds ``seen``. Swaps of
        one folder are serialized by an advisory lock, so of several callers judging the same record
        stale exactly one removes it, none removes the record a winner created after it, and a
        holder's heartbeat never overwrites a record that was taken over. True if this call swapped."""
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.parent / ".discard.guard", "a+b") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            try:
                if path.read_bytes() != seen:
                    return False
            except FileNotFoundError:
                return False
            if new is None:
                path.unlink()
            else:
                atomic_write_bytes(path, new)
        return True

    def create(self, rel: str, data: bytes) -> bool:
        """Write ``rel`` only if it does not exist (exclusive create); False if it does. The bytes
        are written to a temp file first and hard-linked into place, so the record appears whole:
        a reader never sees it empty or half-written (and never judges a half-written lease stale)."""
        path = self.root / rel
        try:
            _atomic_replace(path, lambda tmp: tmp.write_bytes(data), place=os.link)
        except FileExistsError:
            return False
        except OSError as exc:  # a filesystem without hard links (some network and FUSE mounts)
            if exc.errno not in _NO_HARD_LINKS or not path.parent.is_dir():
                raise  # not the link: e.g. a folder the machine refuses to make
            return self._create_in_place(path, data)
        return True

    @staticmethod
    def _create_in_place(path: Path, data: bytes) -> bool:
        """Exclusive create written in place (O_EXCL), for filesystems without hard links. There the
        race the hard link closes is open again: a reader can see the record before its bytes."""
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            _fsync(fh.fileno())
        return True

    def glob(self, pattern: str) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in self.root.glob(pattern))

    def objects(self, folder: str, name: str) -> dict[str, tuple[str, int]]:
        """``{rel: (version, size)}`` of the files called ``name`` anywhere under ``folder``; the
        version (inode, modification time, size) changes whenever a file is replaced."""
        out = {}
        for rel in self.glob(f"{folder}/**/{name}"):
            with suppress(FileNotFoundError):
                st = (self.root / rel).stat()
                out[rel] = (f"{st.st_ino}-{st.st_mtime_ns}-{st.st_size}", st.st_size)
        return out

    def fetch(self, rels: list[str]) -> dict[str, bytes | Exception]:
        """The files' bytes; an error per file."""
        out: dict[str, bytes | Exception] = {}
        for rel in rels:
            try:
                out[rel] = (self.root / rel).read_bytes()
            except OSError as exc:
                out[rel] = exc
        return out

    def delete(self, rel: str) -> None:
        path = self.root / rel
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    def move(self, src: str, dst: str) -> None:
        (self.root / dst).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(self.root / src), str(self.root / dst))

    def write_parquet(self, rel: str, data: pa.Table) -> None:
        _atomic_replace(self.root / rel, lambda tmp: pq.write_table(data, tmp, compression="zstd"))
        # a file's modification time ticks in milliseconds and a freed inode is reused: a rewrite of
        # the same size within one tick could carry the old version, so this process forgets it
        _PARQUET_CACHE.forget(self.full(rel))

    def read_parquet(self, rel: str, columns: list[str] | None = None) -> pa.Table:
        return read_parquet_file(self.root / rel, columns=columns)

    def read_partition(self, rel: str, columns: list[str] | None = None) -> pa.Table:
        """One partition's ``columns``, through this process's cache when the file is the version
        read before (its inode, modification time and size) and within the cache's size."""
        st = (self.root / rel).stat()
        version = f"{st.st_ino}-{st.st_mtime_ns}-{st.st_size}"
        hit = _PARQUET_CACHE.get(self.full(rel), version)
        if hit is not None:
            return _selected(hit, columns)
        if st.st_size > _PARQUET_CACHE.limit():
            return self.read_parquet(rel, columns=columns)
        table = read_parquet_file(self.root / rel)
        _PARQUET_CACHE.put(self.full(rel), version, table)
        return _selected(table, columns)

    def parquet_meta(self, rel: str) -> None:
        pq.ParquetFile(self.root / rel).metadata  # noqa: B018

    def attach(self, con: duckdb.DuckDBPyConnection) -> None:
        """Nothing to register: DuckDB reads local files itself."""


def _s3_error_code(exc: BaseException) -> str | None:
    """The S3 error code behind an s3fs error (it translates boto's ClientError, keeping it as the cause)."""
    cause = exc.__cause__
    response = getattr(cause, "response", None) or {}
    return response.get("Error", {}).get("Code")


class _ParquetCache:
    """Parquet files and objects already read by this process, keyed by path and version (a local
    file's inode, modification time and size; an object's ETag), so a replaced one is read again;
    least recently used dropped past ``$ENVSCHED_LAKE_CACHE_MB`` (default 256; 0 turns it off). A
    step's queries then cost one listing per table instead of reading every file of it again (on an
    object store, a request or two per object per query)."""

    def __init__(self) -> None:
        self._items: OrderedDict[str, tuple[str, pa.Table]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @staticmethod
    def limit() -> int:
        raw = os.environ.get("ENVSCHED_LAKE_CACHE_MB", "").strip() or "256"
        try:
            mb = float(raw)
        except ValueError:
            mb = -1.0
        if not (0 <= mb <= 1_000_000):
            raise LakeError(f"$ENVSCHED_LAKE_CACHE_MB: expected megabytes from 0 to 1000000, got {raw!r}")
        return int(mb * 2**20)

    def fits(self, listed: dict[str, tuple[str, int]]) -> bool:
        """Whether a table's listed files (``{rel: (version, size)}``) are read through the cache:
        some, and no larger together than it (a larger table is read by DuckDB file by file)."""
        return bool(listed) and sum(size for _, size in listed.values()) <= self.limit()

    def get(self, key: str, etag: str) -> pa.Table | None:
        with self._lock:
            item = self._items.get(key)
            if item is None or item[0] != etag or not etag:
                return None
            self._items.move_to_end(key)
            return item[1]

    def held(self, key: str) -> tuple[str, pa.Table] | None:
        """The version held for ``key`` and its table, whichever version that is (to ask the
        store whether it is still the current one); None with the cache turned off."""
        if not self.limit():
            return None
        with self._lock:
            item = self._items.get(key)
            if item is None or not item[0]:
                return None
            self._items.move_to_end(key)
            return item

    def forget(self, key: str) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1].nbytes

    def put(self, key: str, etag: str, table: pa.Table) -> None:
        limit = self.limit()
        self.forget(key)
        with self._lock:
            if not etag or table.nbytes > limit:
                return
            self._items[key] = (etag, table)
            self._bytes += table.nbytes
            while self._bytes > limit:
                _, (_, dropped) = self._items.popitem(last=False)
                self._bytes -= dropped.nbytes


_PARQUET_CACHE = _ParquetCache()
FETCH_AT_ONCE = 32  # concurrent GETs of one fetch from an object store
_WILDCARD = re.compile(r"[*?\[]")


def _glob_match(parts: list[str], pattern: list[str]) -> bool:
    """Whether a path's segments match a glob's: ``*``, ``?`` and ``[...]`` within a segment,
    ``**`` for any number of segments (fsspec's glob rules)."""
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_glob_match(parts[i:], pattern[1:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0]) and _glob_match(parts[1:], pattern[1:])


class _ObjectStore(_Store):
    """Objects under ``s3://bucket/prefix`` through s3fs: one PUT per object, atomic by the store."""

    remote = True

    def __init__(self, url: str):
        try:
            import s3fs  # the deploy extra; only for object-store lakes
        except ImportError as exc:
            raise LakeError(
                f"lake {url}: an object-store lake needs s3fs, which is not installed here "
                "(pip install -e '.[deploy]')"
            ) from exc
        self.url = url.rstrip("/")
        self.base = self.url.split("://", 1)[1]
        self.fs = s3fs.S3FileSystem()
        # compare-and-swap with If-Match; off once the store answers that it does not implement it
        self.conditional = True

    def full(self, rel: str) -> str:
        return f"{self.url}/{rel}"

    def _key(self, rel: str) -> str:
        return f"{self.base}/{rel}"

    def put(self, rel: str, data: bytes) -> None:
        self.fs.pipe_file(self._key(rel), data)

    def get(self, rel: str) -> bytes | None:
        """The object's bytes, from one GET."""
        got = self.fetch([rel])[rel]
        if isinstance(got, (FileNotFoundError, IsADirectoryError)):
            return None
        if isinstance(got, Exception):
            raise got
        return got

    def _object(self, rel: str) -> bytes:
        data = self.get(rel)
        if data is None:
            raise FileNotFoundError(self.full(rel))
        return data

    def exists(self, rel: str) -> bool:
        self.fs.invalidate_cache()
        return self.fs.exists(self._key(rel))

    async def _get_object(self, rel: str, unless: str | None = None) -> tuple[bytes, str] | None:
        """One GET: the object's bytes and the ETag of that same version (s3fs's cat_file asks
        for the size with a HEAD first); FileNotFoundError when it is not there. With ``unless``
        (an ETag) the GET is conditional (``If-None-Match``): None, and no bytes sent, when the
        object is still that version."""
        bucket, key, _ = self.fs.split_path(self._key(rel))
        condition = {"IfNoneMatch": unless} if unless else {}
        try:
            out = await self.fs._call_s3("get_object", Bucket=bucket, Key=key, **condition)
        except OSError as exc:
            if unless and _s3_error_code(exc) in ("304", "NotModified"):
                return None
            raise
        try:
            return await out["Body"].read(), out["ETag"]
        finally:
            out["Body"].close()

    def _read_tagged(self, rel: str) -> tuple[bytes, str] | None:
        """The object's bytes and the ETag of that same version, from one GET; None if absent."""
        from fsspec.asyn import sync  # s3fs's own event loop runs the async GET

        try:
            return sync(self.fs.loop, self._get_object, rel)
        except FileNotFoundError:
            return None

    def swap(self, rel: str, seen: bytes, new: bytes | None) -> bool:
        """Replace ``rel`` with ``new`` (remove it if None) only if it still holds ``seen``: the
        write is conditional on the ETag of the version read (``If-Match``), so a writer that
        changed the object in between makes this call lose instead of being overwritten. On a store
        that does not implement conditional writes the write is unconditional, right after that
        read (two writers within that gap is the residual risk there)."""
        got = self._read_tagged(rel)
        if got is None or got[0] != seen:
            return False
        bucket, key, _ = self.fs.split_path(self._key(rel))
        call = ("delete_object", {}) if new is None else ("put_object", {"Body": new})
        condition = {"IfMatch": got[1]} if self.conditional else {}
        try:
            self.fs.call_s3(call[0], Bucket=bucket, Key=key, **condition, **call[1])
        except FileNotFoundError:
            return False  # removed since it was read
        except OSError as exc:
            code = _s3_error_code(exc)
            if code in ("PreconditionFailed", "412"):
                # changed since it was read; unless what changed it was this very PUT, retried by
                # s3fs after a lost reply (the record would be our own bytes then)
                return new is not None and self.get(rel) == new
            if code not in ("NotImplemented", "501") or not self.conditional:
                raise
            self.conditional = False
            return self.swap(rel, seen, new)
        finally:
            self.fs.invalidate_cache(self._key(rel))
        return True

    def create(self, rel: str, data: bytes) -> bool:
        """Conditional PUT (If-None-Match: *): of two writers exactly one creates the object."""
        try:
            self.fs.pipe_file(self._key(rel), data, mode="create")
        except FileExistsError:
            return False
        return True

    def glob(self, pattern: str) -> list[str]:
        """The keys and folders (as ``fs.glob`` matches them) under the lake that match ``pattern``.
        A pattern whose wildcards follow a literal folder (``rollouts/step=*/part-0.parquet``) is
        matched against one recursive listing of that folder: fsspec's glob lists each folder a
        wildcard matches on its own, one request per step of the run."""
        self.fs.invalidate_cache()
        cut = len(self.base) + 1
        parts = pattern.split("/")
        literal = list(itertools.takewhile(lambda p: not _WILDCARD.search(p), parts))
        if not literal or len(literal) == len(parts):
            return sorted(p[cut:] for p in self.fs.glob(self._key(pattern)))
        found = set()
        for key in self.fs.find(self._key("/".join(literal))):
            rel = key[cut:].split("/")
            for depth in range(len(literal) + 1, len(rel) + 1):  # the key and the folders above it
                if _glob_match(rel[:depth], parts):
                    found.add("/".join(rel[:depth]))
        return sorted(found)

    def objects(self, folder: str, name: str) -> dict[str, tuple[str, int]]:
        """``{rel: (etag, size)}`` of the objects called ``name`` anywhere under ``folder``, from
        one recursive listing."""
        self.fs.invalidate_cache()
        cut = len(self.base) + 1
        listed = self.fs.find(self._key(folder), detail=True)
        return {
            key[cut:]: (str(info.get("ETag", "")), int(info.get("size") or 0))
            for key, info in sorted(listed.items())
            if key.rsplit("/", 1)[-1] == name and info.get("type") != "directory"
        }

    def fetch(self, rels: list[str]) -> dict[str, bytes | Exception]:
        """The objects' bytes, one GET each, fetched together (at most FETCH_AT_ONCE at a time);
        an error per object (FileNotFoundError for one that is not there)."""
        from fsspec.asyn import sync  # s3fs's own event loop runs the GETs

        gate = asyncio.Semaphore(FETCH_AT_ONCE)

        async def one(rel: str) -> bytes:
            async with gate:
                return (await self._get_object(rel))[0]

        async def every() -> list:
            return await asyncio.gather(*(one(r) for r in rels), return_exceptions=True)

        return dict(zip(rels, sync(self.fs.loop, every), strict=True))

    def _under(self, rel: str) -> list[str]:
        """The keys of the object ``rel`` or of every object under the folder ``rel``, from one
        listing (``step=1`` is not a prefix of ``step=10``)."""
        self.fs.invalidate_cache()
        base = self._key(rel)
        return [f for f in self.fs.find(base) if f == base or f.startswith(base + "/")]

    def delete(self, rel: str) -> None:
        """The object ``rel`` or every object under the folder ``rel``: one listing, one bulk delete
        (nothing when there is nothing)."""
        if found := self._under(rel):
            self.fs.rm(found)

    def move(self, src: str, dst: str) -> None:
        """Every object under ``src`` copied to the same place under ``dst``, then removed (s3fs's
        recursive ``mv`` also tries to copy the folder's own key, which an object store lacks)."""
        base = self._key(src)
        files = self._under(src)
        for f in files:
            self.fs.copy(f, self._key(dst) + f[len(base) :])
        if files:
            self.fs.rm(files)

    def write_parquet(self, rel: str, data: pa.Table) -> None:
        buf = pa.BufferOutputStream()
        pq.write_table(data, buf, compression="zstd")
        self.fs.pipe_file(self._key(rel), buf.getvalue().to_pybytes())

    def read_parquet(self, rel: str, columns: list[str] | None = None) -> pa.Table:
        return read_parquet_file(pa.BufferReader(self._object(rel)), columns=columns)

    def read_partition(self, rel: str, columns: list[str] | None = None) -> pa.Table:
        """One partition's ``columns`` from one GET, conditional on the ETag of the version this
        process read before: an unchanged partition (a pool's tasks and graph, read by several
        ops of every step) costs the request and none of its bytes."""
        from fsspec.asyn import sync  # s3fs's own event loop runs the async GET

        held = _PARQUET_CACHE.held(self.full(rel))
        got = sync(self.fs.loop, self._get_object, rel, held[0] if held else None)
        if got is None:
            return _selected(held[1], columns)
        table = read_parquet_file(pa.BufferReader(got[0]))
        _PARQUET_CACHE.put(self.full(rel), got[1], table)
        return _selected(table, columns)

    def parquet_meta(self, rel: str) -> None:
        pq.ParquetFile(pa.BufferReader(self._object(rel))).metadata  # noqa: B018

    def attach(self, con: duckdb.DuckDBPyConnection) -> None:
        con.register_filesystem(self.fs)  # DuckDB reads s3:// paths through s3fs (no httpfs needed)


class _Snapshot:
    """A store as one thread sees it inside :meth:`Lake.snapshot`: each object, listing and
    Parquet partition is read at most once, and every write through it (including the conditional
    writes of leases and locks) forgets what was read. Everything else is the store's own."""

    def __init__(self, store: _LocalStore | _ObjectStore):
        self._store = store
        self._seen: dict[tuple, Any] = {}

    def __getattr__(self, name: str) -> Any:
        if name == "_store":  # not set yet (a copy being made): never recurse
            raise AttributeError(name)
        return getattr(self._store, name)

    def _once(self, key: tuple, read: Callable[[], Any]) -> Any:
        if key not in self._seen:
            self._seen[key] = read()
        return self._seen[key]

    def get(self, rel: str) -> bytes | None:
        return self._once(("get", rel), lambda: self._store.get(rel))

    def exists(self, rel: str) -> bool:
        if ("get", rel) in self._seen:
            return self._seen[("get", rel)] is not None
        if ("partition", rel) in self._seen:
            return True
        return self._once(("exists", rel), lambda: self._store.exists(rel))

    def glob(self, pattern: str) -> list[str]:
        return list(self._once(("glob", pattern), lambda: tuple(self._store.glob(pattern))))

    def objects(self, folder: str, name: str) -> dict[str, tuple[str, int]]:
        return dict(self._once(("objects", folder, name), lambda: self._store.objects(folder, name)))

    def read_parquet(self, rel: str, columns: list[str] | None = None) -> pa.Table:
        if self._store.remote:  # one GET of the object, whichever columns each read wants
            data = self.get(rel)
            if data is None:
                raise FileNotFoundError(self._store.full(rel))
            return read_parquet_file(pa.BufferReader(data), columns=columns)
        key = ("parquet", rel, tuple(columns) if columns is not None else None)
        return self._once(key, lambda: self._store.read_parquet(rel, columns=columns))

    def read_partition(self, rel: str, columns: list[str] | None = None) -> pa.Table:
        """The whole partition read once, whichever columns each read wants."""
        return _selected(self._once(("partition", rel), lambda: self._store.read_partition(rel)), columns)

    def _write(self, name: str, *args: Any) -> Any:
        self._seen.clear()
        return getattr(self._store, name)(*args)

    def put(self, rel: str, data: bytes) -> None:
        self._write("put", rel, data)

    def swap(self, rel: str, seen: bytes, new: bytes | None) -> bool:
        return self._write("swap", rel, seen, new)

    def create(self, rel: str, data: bytes) -> bool:
        return self._write("create", rel, data)

    def delete(self, rel: str) -> None:
        self._write("delete", rel)

    def move(self, src: str, dst: str) -> None:
        self._write("move", src, dst)

    def write_parquet(self, rel: str, data: pa.Table) -> None:
        self._write("write_parquet", rel, data)


def store_endpoint() -> str:
    """The object store an ``s3://`` lake talks to, in words: ``$AWS_ENDPOINT_URL`` when set."""
    return os.environ.get("AWS_ENDPOINT_URL") or "AWS's endpoint"


def local_dir_for(url: str) -> Path:
    base = os.environ.get("ENVSCHED_LOCAL_DIR") or str(Path.home() / ".cache" / "envsched" / "lakes")
    return Path(base) / url.split("://", 1)[1].rstrip("/")


_ERROR_MARK = "lake error: "
PART = "part-0.parquet"  # the one file of a table partition
_SAFE_VALUE = re.compile(r"-?[A-Za-z0-9][A-Za-z0-9_\-]{0,63}")


class Lake:
    """Parquet tables + artifacts under one root, with DuckDB views for SQL."""

    def __init__(self, root: str | os.PathLike | None = None):
        raw = str(root or os.environ.get("ENVSCHED_LAKE") or DEFAULT_ROOT)
        syncing()  # a bad $ENVSCHED_LAKE_FSYNC is refused before anything is written
        scheme = re.match(r"([A-Za-z][A-Za-z0-9+.\-]*)://", raw)
        if scheme and not raw.startswith(REMOTE_SCHEMES):  # never a local folder named "gs:"
            raise LakeError(
                f"lake {raw!r}: {scheme.group(1)}:// is not supported; use a local path or "
                f"{' or '.join(s + 'bucket/prefix' for s in REMOTE_SCHEMES)}"
            )
        if scheme and not raw.split("://", 1)[1].strip("/"):
            raise LakeError(f"lake {raw!r}: the URL names no bucket ({scheme.group(1)}://bucket/prefix)")
        if raw.startswith(REMOTE_SCHEMES):
            from upath import UPath  # Dagster's own dependency; paths for messages and artifacts

            self._store: _LocalStore | _ObjectStore = _ObjectStore(raw)
            self.root = UPath(self._store.url)
            self.local = local_dir_for(self._store.url)
        else:
            self.root = Path(raw).resolve()
            self._store = _LocalStore(self.root)
            self.local = self.root
        self._fence: Callable[[], None] | None = None
        self._snapshots: dict[int, _Snapshot] = {}  # by thread

    @property
    def store(self) -> _LocalStore | _ObjectStore | _Snapshot:
        """Where the lake's bytes are; inside :meth:`snapshot`, as this thread's snapshot sees it."""
        return self._snapshots.get(threading.get_ident()) or self._store

    @contextmanager
    def snapshot(self):
        """For the block, this thread reads each object, listing and partition of the lake at most
        once (a planning pass or a step's bookkeeping asks the same questions several times; on an
        object store each is a request). A write through this object forgets what was read; writes
        by other processes or threads are not seen until the block ends, so a block must not wait
        for another process's writes. Other threads see the lake as always. Nested blocks share
        the outer one."""
        me = threading.get_ident()
        if me in self._snapshots:
            yield self
            return
        self._snapshots[me] = _Snapshot(self._store)
        try:
            yield self
        finally:
            del self._snapshots[me]

    @property
    def remote(self) -> bool:
        return self.store.remote

    def where(self, rel: str) -> str:
        """The full path or URL of ``rel`` (for messages)."""
        return self.store.full(rel)

    # ------------------------------------------------------------------ paths
    def _partition_rel(self, table: str, **partition: Any) -> str:
        if table not in ALL_TABLES:
            raise LakeError(f"unknown lake table {table!r}; known: {', '.join(sorted(ALL_TABLES))}")
        parts = [table]
        for k, v in partition.items():
            if not _SAFE_VALUE.fullmatch(str(v)):
                raise LakeError(
                    f"{table}: partition {k}={v!r} is not a valid name (letters, digits, '_' and '-')"
                )
            parts.append(f"{k}={v}")
        return "/".join(parts)

    def partition_dir(self, table: str, **partition: Any) -> Path:
        return self.root / self._partition_rel(table, **partition)

    def require(self) -> Lake:
        """This lake must exist (for commands that only read): a missing lake or a file in its
        place is an error that says how to start a run, never an empty answer."""
        if self.remote:
            if not self.store.glob("*"):
                bucket = self.store.base.split("/", 1)[0]
                if not self.store.fs.exists(bucket):
                    raise LakeError(
                        f"no lake at {self.root}: there is no bucket {bucket!r} at {store_endpoint()}"
                    )
                raise LakeError(
                    f"no lake at {self.root} (nothing under that prefix): start a run with `envsched train`"
                )
            return self
        if not self.root.exists():
            raise LakeError(
                f"no lake at {self.root}: start a run with `envsched train` (or `envsched --lake DIR ...` "
                "to point at another lake)"
            )
        if not self.root.is_dir():
            raise LakeError(f"{self.root} is not a lake (it is a file, not a folder)")
        return self

    @staticmethod
    def artifact_rel(kind: str, step: int | None, name: str) -> str:
        return f"{Lake.artifact_folder(kind, step)}/{name}" if step is not None else f"{kind}/{name}"

    @staticmethod
    def artifact_folder(kind: str, step: int) -> str:
        """The folder of one step's artifacts of a kind (``state/step=12``)."""
        return f"{kind}/step={int(step)}"

    def drop_superseded(self, kind: str, step: int, newest: int = 2, keep: Iterable[int] = ()) -> None:
        """After writing ``step``'s artifacts of ``kind``, drop the folder of the step they make
        unneeded (:func:`superseded`: step 0's, every ``KEEP_EVERY``-th, the ``newest`` and those of
        the steps in ``keep`` stay)."""
        if (old := superseded(step, newest)) is not None and old not in set(keep):
            self.delete(self.artifact_folder(kind, old))

    def drop_unkept(self, kind: str, old: int, step: int, newest: int = 2) -> None:
        """Drop ``old``'s folder of ``kind``, kept past its time by :meth:`drop_superseded`'s ``keep``
        (a best policy that ``step``'s has now beaten), unless :func:`superseded` would still keep it."""
        if old <= step - newest and not kept_for_good(old):
            self.delete(self.artifact_folder(kind, old))

    def artifact_path(self, kind: str, step: int | None, name: str) -> Path:
        return self.root / self.artifact_rel(kind, step, name)

    # ----------------------------------------------------------------- fence
    @contextmanager
    def fenced(self, check: Callable[[], None]):
        """For the block, every write, delete and archive through this object first calls
        ``check``, which raises when the caller no longer owns what it writes (its step lock was
        taken over while it was paused): such a writer stops at its next write instead of mixing
        its partitions into the new owner's. Leases and locks themselves (create, swap, discard)
        are not fenced."""
        before, self._fence = self._fence, check
        try:
            yield self
        finally:
            self._fence = before

    def guard(self) -> None:
        """Raise if this object is fenced and its holder no longer owns what it writes (for writes
        that bypass the lake, such as a model checkpoint saved to a local folder)."""
        if self._fence is not None:
            self._fence()

    # ----------------------------------------------------------------- bytes
    def write_bytes(self, rel: str, data: bytes) -> Path:
        """Write one artifact atomically (temp + rename locally, one PUT on an object store)."""
        self.guard()
        self.store.put(rel, data)
        return self.root / rel

    def read_bytes(self, rel: str, fresh: bool = False) -> bytes | None:
        """An artifact's bytes, or None; ``fresh``: from the store even inside a snapshot (what
        leases and locks read to decide who owns what)."""
        return (self._store if fresh else self.store).get(rel)

    def exists(self, rel: str) -> bool:
        return self.store.exists(rel)

    def create(self, rel: str, data: bytes) -> bool:
        """Exclusive create (a whole temp file hard-linked into place locally, a conditional PUT on
        an object store): True if this call created ``rel``, False if it already existed. Leases
        and locks are built on it."""
        return self.store.create(rel, data)

    def delete(self, rel: str) -> None:
        self.guard()
        self.store.delete(rel)

    def discard(self, rel: str, seen: bytes) -> bool:
        """Remove a stale record ``rel`` only if it still holds the bytes ``seen`` (what the caller
        judged stale): True if this call removed it. Leases and locks take over dead holders with it."""
        return self.store.swap(rel, seen, None)

    def swap(self, rel: str, seen: bytes, new: bytes) -> bool:
        """Overwrite ``rel`` with ``new`` only if it still holds ``seen`` (compare and swap): True
        if this call wrote it. A lease's heartbeat uses it, so it never overwrites a taker's lease."""
        return self.store.swap(rel, seen, new)

    # ----------------------------------------------------------------- writes
    def write(self, table: str, data: pa.Table | Iterable[Mapping[str, Any]], **partition: Any) -> Path:
        """Replace one partition of ``table`` atomically. Returns the file written."""
        if not isinstance(data, pa.Table):
            rows = list(data)
            # every key of any row is a column (a row without it holds null): pyarrow's from_pylist
            # would take the columns of the first row alone
            keys = list(dict.fromkeys(k for r in rows for k in r))
            data = pa.table({k: [r.get(k) for r in rows] for k in keys}) if rows else self._empty(table)
        self._validate(table, data)
        rel = f"{self._partition_rel(table, **partition)}/part-0.parquet"
        self.guard()
        self.store.write_parquet(rel, data)
        return self.root / rel

    def _empty(self, table: str) -> pa.Table:
        kinds = {"str": pa.string(), "int": pa.int64(), "float": pa.float64()}
        cols = ALL_TABLES[table]
        # from typed empty arrays: pa.array / pa.table on Python values would import pandas
        return pa.Table.from_arrays([pa.nulls(0, kinds[k]) for k in cols.values()], names=list(cols))

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
        self.guard()
        dest = f"archive/{label}-{int(time.time() * 1000)}"
        moved: dict[str, list[int]] = {}
        for kind in [*STEP_TABLES, "state", "plots", "checkpoints"]:
            for part in self.store.glob(f"{kind}/step=*"):
                try:
                    s = int(part.rsplit("=", 1)[1])
                except ValueError:
                    continue
                if select(kind, s):
                    self.store.move(part, f"{dest}/{part}")
                    moved.setdefault(kind, []).append(s)
        return {"archive": self.where(dest), "moved": {k: sorted(v) for k, v in moved.items()}}

    def artifact_steps(self, kind: str, name: str = "*") -> list[int]:
        """Steps with an artifact folder ``<kind>/step=<s>/`` that holds something (a file called
        ``name``), sorted; from one listing."""
        found = set()
        for rel in self.store.glob(f"{kind}/step=*/{name}"):
            with suppress(ValueError):
                found.add(int(rel.split("/")[-2].split("=", 1)[1]))
        return sorted(found)

    def delete_partition(self, table: str, **partition: Any) -> None:
        self.guard()
        self.store.delete(self._partition_rel(table, **partition))

    def write_json(self, relpath: str, obj: Any) -> Path:
        return self.write_bytes(relpath, json.dumps(obj, indent=2, sort_keys=True, default=str).encode())

    def read_json(self, relpath: str) -> Any | None:
        data = self.store.get(relpath)
        if data is None:
            return None
        try:
            return json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise LakeError(f"{self.where(relpath)}: not valid JSON ({exc})") from exc

    # ------------------------------------------------------------------ reads
    def has(self, table: str, **partition: Any) -> bool:
        return self.store.exists(f"{self._partition_rel(table, **partition)}/part-0.parquet")

    def _files(self, table: str) -> list[str]:
        return self.store.glob(f"{table}/**/{PART}")

    def read(self, table: str, columns: list[str] | None = None, **partition: Any) -> pa.Table:
        """Read one partition (through this process's cache, asking the store only whether it
        changed), or the whole table when no partition is given (from one listing and this
        process's cached reads when the table is within the cache's size)."""
        rel = self._partition_rel(table, **partition)
        empty = self._empty(table)
        if columns is not None:
            empty = empty.select([c for c in columns if c in ALL_TABLES[table]])
        listed = {} if partition else self.store.objects(table, PART)
        if _PARQUET_CACHE.fits(listed):
            read = self.store.read_tables(listed)
            loaders = {f: (lambda t=t: _selected(t, columns)) for f, t in read.items()}
        else:  # a missing partition is skipped below
            if partition:  # through this process's cache, asking the store only whether it changed
                loaders = {
                    f"{rel}/{PART}": lambda: self.store.read_partition(f"{rel}/{PART}", columns=columns)
                }
            else:
                loaders = {f: (lambda f=f: self.store.read_parquet(f, columns=columns)) for f in listed}
        parts = []
        for f, load in loaders.items():
            try:
                parts.append(load())
            except (FileNotFoundError, NotADirectoryError):
                continue  # not written yet, or replaced or archived between listing and reading
            except Exception as exc:  # pyarrow raises several types for corrupt files
                raise LakeError(
                    f"{self.where(f)}: cannot read Parquet file ({exc}); delete it and re-materialize that partition"
                ) from exc
        if not parts:
            return empty
        return pa.concat_tables(parts, promote_options="permissive") if len(parts) > 1 else parts[0]

    def steps(self, table: str) -> list[int]:
        """Steps that have a complete partition in ``table``, sorted."""
        out = []
        for f in self.store.glob(f"{table}/step=*/part-0.parquet"):
            try:
                out.append(int(f.split("/")[1].split("=", 1)[1]))
            except ValueError:
                continue
        return sorted(out)

    def pools(self) -> list[str]:
        return sorted(
            f.split("/")[1].split("=", 1)[1] for f in self.store.glob("tasks/pool=*/part-0.parquet")
        )

    # ------------------------------------------------------------------ SQL
    def connect(self, queries: Iterable[str] = ()) -> duckdb.DuckDBPyConnection:
        """In-memory DuckDB with a view per table (empty typed views for tables not written yet)
        and the documented views of ``views.sql``. Given ``queries`` that name any of them, only
        the views they name (and what those are built on) are made: a view reads the footer of
        every file of its table, which grows with the run's steps."""
        con = duckdb.connect(":memory:")
        self.store.attach(con)
        derived = [(stmt, _view_name(stmt)) for stmt in _split_sql(views_sql())]
        wanted = _views_needed(list(queries), derived)
        for table in ALL_TABLES:
            if wanted is not None and table not in wanted:
                continue
            if not self.remote and (self.root / table).exists() and not (self.root / table).is_dir():
                _error_view(con, table, f"{self.root / table} should be a folder of partitions, not a file")
                continue
            listed = self.store.objects(table, PART)
            if _PARQUET_CACHE.fits(listed):
                self._arrow_view(con, table, listed)  # this process's cached reads, one listing
                continue
            files = list(listed)
            if files:
                paths = ", ".join("'" + self.where(f).replace("'", "''") + "'" for f in files)
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
        for stmt, name in derived:
            if wanted is not None and name not in wanted:
                continue
            try:
                con.execute(stmt)
            except duckdb.Error as exc:
                # a derived view that cannot be built (e.g. a table lacks a column): it still exists,
                # and a query that touches it fails with the reason; other queries are unaffected
                if name:
                    _error_view(con, name, f"view {name} is unavailable: {str(exc).splitlines()[0]}")
        return con

    def _arrow_view(self, con: duckdb.DuckDBPyConnection, table: str, listed: dict) -> None:
        """View ``table`` over its files read into memory through this process's cache."""
        read = self.store.read_tables(listed)
        bad = next((f for f, t in read.items() if isinstance(t, Exception)), None)
        try:
            if bad is not None:
                raise read[bad]
            data = (
                pa.concat_tables(list(read.values()), promote_options="permissive")
                if read
                else self._empty(table)
            )
        except Exception as exc:  # pyarrow raises several types for corrupt or clashing files
            where = self.where(bad) if bad is not None else table
            _error_view(
                con,
                table,
                f"{where}: cannot read Parquet ({str(exc).splitlines()[0]}); delete it and "
                "re-materialize that partition",
            )
            return
        con.register(f"_{table}_data", data)
        con.execute(f"CREATE VIEW {table} AS SELECT * FROM _{table}_data")

    def _find_corrupt(self, files: list[str]) -> str | None:
        for f in files:
            try:
                self.store.parquet_meta(f)
            except Exception:
                return self.where(f)
        return None

    def sql(self, query: str) -> pa.Table:
        return self.sql_each([query])[0]

    def sql_each(self, queries: list[str]) -> list[pa.Table]:
        """Each query's result, all on one connection (its views are built once)."""
        with self._connection(queries) as con:
            return [self._run(con, query) for query in queries]

    def sql_batches(self, query: str, rows: int = 10_000) -> Iterator[pa.RecordBatch]:
        """``query``'s result in record batches of up to ``rows`` rows, each read as it is consumed,
        so a large result never sits in memory whole; errors as :meth:`sql`'s."""
        with self._connection([query]) as con:
            rel = con.sql(query)
            if rel is None:  # a statement without a result (e.g. SET)
                return
            to_reader = getattr(rel, "to_arrow_reader", None) or rel.fetch_record_batch  # duckdb 2.x / 1.x
            reader = to_reader(rows)
            empty = True
            for batch in reader:
                empty = False
                yield batch
            if empty:  # no rows: one empty batch still carries the columns
                yield pa.RecordBatch.from_pylist([], schema=reader.schema)

    @contextmanager
    def _connection(self, queries: list[str]) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection with the views ``queries`` name, closed after; a DuckDB error raised inside
        is named the lake's way: a view's own message, a corrupt Parquet file by its path."""
        con = self.connect(queries)
        try:
            yield con
        except duckdb.Error as exc:
            msg = str(exc)
            if _ERROR_MARK in msg:
                raise LakeError(msg.split(_ERROR_MARK, 1)[1].splitlines()[0]) from exc
            if "parquet" in msg.lower() or "magic" in msg.lower() or "Invalid Input Error" in msg:
                bad = self._find_corrupt([f for t in ALL_TABLES for f in self._files(t)])
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


def read_parquet_file(source, columns: list[str] | None = None) -> pa.Table:
    """One Parquet file (a path or a buffer) as a table: through ``ParquetFile``, not
    ``pq.read_table``, whose dataset layer costs a process its first read ~0.4 s (it imports
    pyarrow.dataset and, through it, pandas) and reads a single file the same way."""
    with pq.ParquetFile(source) as f:
        return f.read(columns=columns)


def _selected(table: pa.Table | Exception, columns: list[str] | None) -> pa.Table:
    """A cached table's ``columns`` (all with None); the error it was read with, raised."""
    if isinstance(table, Exception):
        raise table
    return table if columns is None else table.select(columns)


def _error_view(con: duckdb.DuckDBPyConnection, name: str, message: str) -> None:
    """A view that raises ``message`` when a query reads it."""
    text = f"{_ERROR_MARK}{message}".replace("'", "''")
    # the filter makes even count(*) evaluate error()
    con.execute(
        f"CREATE OR REPLACE VIEW {name} AS SELECT error('{text}') AS error FROM range(1) "
        f"WHERE error('{text}') IS NULL"
    )


def _names_in(text: str, names: Iterable[str]) -> set[str]:
    return {n for n in names if re.search(rf"(?<![A-Za-z0-9_]){n}(?![A-Za-z0-9_])", text, re.I)}


def _views_needed(queries: list[str], derived: list[tuple[str, str | None]]) -> set[str] | None:
    """The base and derived views ``queries`` read, with what the derived ones are built on; None
    (every view) when they name none of them (``show tables``, ``duckdb_views()``, ...)."""
    views = {name: stmt for stmt, name in derived if name}
    known = set(ALL_TABLES) | set(views)
    wanted = set().union(*(_names_in(q, known) for q in queries)) if queries else set()
    if not wanted:
        return None
    todo = [n for n in wanted if n in views]
    while todo:  # a derived view needs the views its statement names
        for dep in _names_in(views[todo.pop()], known) - wanted:
            wanted.add(dep)
            if dep in views:
                todo.append(dep)
    return wanted


def _view_name(stmt: str) -> str | None:
    m = re.match(r"\s*CREATE\s+(?:OR\s+REPLACE\s+)?VIEW\s+([A-Za-z_][A-Za-z0-9_]*)", stmt, re.I)
    return m.group(1) if m else None


def _split_sql(text: str) -> list[str]:
    """Statements of a .sql file (no semicolons inside string literals in ours)."""
    lines = [ln for ln in text.splitlines() if not ln.strip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]
