"""One driver per run, and one writer per step: leases and locks in the lake.

* :class:`Lease` (``lease.json``): whoever drives the run (``envsched train``) holds it, with its
  owner (pid, host, command) and a heartbeat refreshed every few seconds. A second driver is refused
  with the holder named; the loop sensor skips while a live lease is held, and the step assets
  refuse runs that another driver did not request. A lease whose heartbeat is older than
  ``STALE_SECONDS`` (or whose process is gone, on the same host) is stale and can be taken over; a
  driver whose lease was taken over (it was paused past that) finds out before its next step
  (:meth:`Lease.check`) and stops.
* :func:`step_lock` (``locks/<name>.lock``): exclusive creation, so of two ingests of one step
  running at once one wins and the other gets a clear error.

Both live in the lake itself and rest on :meth:`Lake.create`: an exclusive hard link of a whole temp
file on a local lake (the record appears whole or not at all, so a racing taker never reads a new
lease half-written and judges it stale), a conditional PUT (``If-None-Match: *``) on an object-store
lake, so drivers on different machines sharing one ``s3://`` lake exclude each other too. A stale
lease or a dead holder's lock is removed with :meth:`Lake.discard`, and a heartbeat rewrites the
lease with :meth:`Lake.swap`, each only if the record still holds the bytes read: under an advisory
folder lock on a local lake (one contender wins; a late heartbeat never overwrites a taker's lease);
on an object store the write or delete is conditional on the ETag of the version read (``If-Match``),
so there too a record rewritten after the read is never overwritten or deleted. (A store without
conditional writes gets a re-read just before an unconditional write: two writers within that gap
is the residual risk there.)
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from contextlib import contextmanager

from envsched_pipeline.errors import StepError
from envsched_pipeline.lake import Lake

LEASE_FILE = "lease.json"
STALE_SECONDS = 60.0
HEARTBEAT_SECONDS = 5.0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stale(record: dict, now: float | None = None) -> bool:
    now = time.time() if now is None else now
    if now - float(record.get("heartbeat", 0)) > STALE_SECONDS:
        return True
    return record.get("host") == socket.gethostname() and not _pid_alive(int(record.get("pid", -1)))


def _read_raw(lake: Lake, rel: str) -> tuple[dict | None, bytes | None]:
    """The record at ``rel`` (None if there is none) and its bytes; an unreadable record counts as
    stale."""
    try:
        data = lake.read_bytes(rel)
    except OSError:
        return {"id": "unreadable", "heartbeat": 0}, None
    if data is None:
        return None, None
    try:
        return json.loads(data), data
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {"id": "unreadable", "heartbeat": 0}, data


def _read(lake: Lake, rel: str) -> dict | None:
    return _read_raw(lake, rel)[0]


def describe(record: dict) -> str:
    age = time.time() - float(record.get("heartbeat", 0))
    return (
        f"{record.get('kind', '?')} (pid {record.get('pid')} on {record.get('host')}, "
        f"`{record.get('command', '')}`), heartbeat {age:.0f}s ago"
    )


def current(lake: Lake) -> dict | None:
    """The live lease of the lake's run, or None (no lease, or a stale one)."""
    record = _read(lake, LEASE_FILE)
    return None if record is None or _stale(record) else record


class Lease:
    def __init__(self, lake: Lake, kind: str = "envsched train"):
        self.lake, self.kind = lake, kind
        self.id = uuid.uuid4().hex[:12]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.took_over: dict | None = None
        self.lost: dict | None = None  # the record found in our place once the heartbeat saw it

    def _record(self) -> dict:
        return {
            "id": self.id,
            "kind": self.kind,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": " ".join(sys.argv[:6]),
            "started": time.time(),
            "heartbeat": time.time(),
        }

    def acquire(self) -> Lease:
        for _ in range(5):
            if self.lake.create(LEASE_FILE, json.dumps(self._record()).encode()):
                self._thread = threading.Thread(target=self._beat, daemon=True, name="envsched-lease")
                self._thread.start()
                return self
            held, raw = _read_raw(self.lake, LEASE_FILE)
            if held is None:
                continue  # released between our create and our read
            if not _stale(held):
                raise StepError(
                    f"{self.lake.root}: the run is being driven by {describe(held)}; one driver per "
                    "run (wait for it, stop it, or use another lake)"
                )
            # stale: remove that very record (Lake.discard: one contender wins), then retry ours
            if raw is not None and self.lake.discard(LEASE_FILE, raw):
                self.took_over = held
        raise StepError(f"{self.lake.root}: could not take the run's lease (contended)")

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            held, raw = _read_raw(self.lake, LEASE_FILE)
            if held is not None and raw is None:
                continue  # the read failed (e.g. the object store did not answer): try next beat
            if held is None or held.get("id") != self.id:
                self.lost = held or {"id": None}
                return  # taken over (we were stale) or removed: stop claiming
            # compare and swap: a taker who judged us stale since the read keeps its lease
            self.lake.swap(LEASE_FILE, raw, json.dumps({**held, "heartbeat": time.time()}).encode())

    def check(self) -> None:
        """Raise if this lease is no longer held: its holder went without a heartbeat for
        ``STALE_SECONDS`` (a paused process, a suspended laptop) and another driver took the run
        over, or someone removed the lease. A driver calls it before each step it starts."""
        held, raw = _read_raw(self.lake, LEASE_FILE) if self.lost is None else (self.lost, b"")
        if held is not None and (held.get("id") == self.id or raw is None):
            return  # still ours (or unreadable this once: the heartbeat tells)
        by = f"taken over by {describe(held)}" if held and held.get("id") else "removed"
        raise StepError(
            f"{self.lake.root}: this driver's lease of the run was {by}; stopping so that the run "
            "has one driver (its heartbeat may have stopped for over "
            f"{STALE_SECONDS:.0f}s, e.g. a paused process)"
        )

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        held, raw = _read_raw(self.lake, LEASE_FILE)
        if held is not None and held.get("id") == self.id and raw is not None:
            self.lake.discard(LEASE_FILE, raw)  # only our own record: never a taker's written since

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


@contextmanager
def step_lock(lake: Lake, name: str):
    """Exclusive lock ``locks/<name>.lock`` for the duration of the block (a dead holder's lock is
    broken; a live one's is an error naming it)."""
    rel = f"locks/{name}.lock"
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": " ".join(sys.argv[:6]),
        "heartbeat": time.time(),
    }
    for _ in range(3):
        if lake.create(rel, json.dumps(record).encode()):
            break
        held, raw = _read_raw(lake, rel)
        if held and not _stale({**held, "heartbeat": time.time()}):
            raise StepError(
                f"{name} is already running ({describe({**held, 'kind': name})}); wait for it to finish"
            )
        if raw is not None:
            lake.discard(rel, raw)  # a dead holder's lock
    else:
        raise StepError(f"could not lock {name}")
    try:
        yield
    finally:
        lake.delete(rel)
