"""One driver per run, and one writer per step: leases and locks in the lake.

* :class:`Lease` (``lease.json``): whoever drives the run (``envsched train``) holds it, with its
  owner (pid, host, command) and a heartbeat refreshed every few seconds. A second driver is refused
  with the holder named; the loop sensor skips while a live lease is held, and the step assets
  refuse runs that another driver did not request. A lease whose heartbeat is older than
  ``STALE_SECONDS`` (or whose process is gone, on the same host) is stale and can be taken over; a
  driver whose lease was taken over (it was paused past that) finds out before its next step
  (:meth:`Lease.check`) and stops.
* :func:`step_lock` (``locks/<name>.lock``): one writer per step. Of two ingests of one step
  running at once one wins and the other gets a clear error; a training step (``train-step=<n>``)
  waits for a holder to finish or go stale. The lock has a heartbeat too, so a holder that died on
  another machine (a crashed pod) leaves a lock that goes stale after ``STALE_SECONDS`` rather than
  one that blocks the step's retries for good. Its holder writes through a fenced lake
  (:meth:`Lake.fenced`): before every write it checks that the lock is still its own, so a writer
  paused past ``STALE_SECONDS`` whose step was taken over stops at its next write instead of
  writing partitions into the taker's step.

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


def _read_raw(lake: Lake, rel: str, fresh: bool = True) -> tuple[dict | None, bytes | None]:
    """The record at ``rel`` (None if there is none) and its bytes; an unreadable record counts as
    stale. Read from the store even inside a ``Lake.snapshot`` unless ``fresh`` is False (a look
    that decides nothing about owning the record)."""
    try:
        data = lake.read_bytes(rel, fresh=fresh)
    except OSError:
        return {"id": "unreadable", "heartbeat": 0}, None
    if data is None:
        return None, None
    try:
        return json.loads(data), data
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {"id": "unreadable", "heartbeat": 0}, data


def _read(lake: Lake, rel: str) -> dict | None:
    """Who holds the record at ``rel``, as the caller's snapshot of the lake sees it."""
    return _read_raw(lake, rel, fresh=False)[0]


def describe(record: dict) -> str:
    age = time.time() - float(record.get("heartbeat", 0))
    return (
        f"{record.get('kind', '?')} (pid {record.get('pid')} on {record.get('host')}, "
        f"`{record.get('command', '')}`), heartbeat {age:.0f}s ago"
    )


def holders(lake: Lake) -> dict:
    """Who drives the run and who writes which step right now, for ``envsched status``: the lease's
    holder and every step lock's (a stale one is marked: the next writer of that step takes it)."""

    def view(record: dict) -> dict:
        return {
            **{k: record.get(k) for k in ("kind", "pid", "host", "command")},
            "heartbeat_age_s": round(time.time() - float(record.get("heartbeat", 0)), 1),
            "stale": _stale(record),
        }

    lease = _read(lake, LEASE_FILE)
    locks = {}
    for rel in sorted(lake.store.glob("locks/*.lock")):
        record = _read(lake, rel)
        if record is not None:
            locks[rel.rsplit("/", 1)[-1].removesuffix(".lock")] = view(record)
    return {"driver": view(lease) if lease else None, "step_locks": locks}


def current(lake: Lake) -> dict | None:
    """The live lease of the lake's run, or None (no lease, or a stale one)."""
    record = _read(lake, LEASE_FILE)
    return None if record is None or _stale(record) else record


class _Claim:
    """A record at ``rel`` that one holder owns (its id, pid, host, command and a heartbeat the
    holder's thread refreshes every ``HEARTBEAT_SECONDS``): taken with :meth:`Lake.create`, a stale
    one (no heartbeat for ``STALE_SECONDS``, or a dead process on this host) taken over with
    :meth:`Lake.discard`, refreshed with :meth:`Lake.swap`, and released only while it is ours."""

    def __init__(self, lake: Lake, rel: str, kind: str):
        self.lake, self.rel, self.kind = lake, rel, kind
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

    def _busy(self, held: dict) -> StepError:
        return StepError(f"{self.lake.where(self.rel)} is held by {describe(held)}")

    def acquire(self, wait: float = 0.0, log=None):
        """Take the record; a live holder's is an error naming it, unless it goes stale or is
        released within ``wait`` seconds (``log`` is told once that this waits, and for whom)."""
        deadline, told = time.monotonic() + wait, False
        for _ in range(5 + int(wait / HEARTBEAT_SECONDS) * 2):
            if self.lake.create(self.rel, json.dumps(self._record()).encode()):
                self._thread = threading.Thread(target=self._beat, daemon=True, name=f"envsched-{self.kind}")
                self._thread.start()
                return self
            held, raw = _read_raw(self.lake, self.rel)
            if held is None:
                continue  # released between our create and our read
            if not _stale(held):
                if time.monotonic() >= deadline:
                    raise self._busy(held)
                if log is not None and not told:
                    told = True
                    log(f"waiting up to {wait:.0f}s for {self.kind}, held by {describe(held)}")
                time.sleep(min(HEARTBEAT_SECONDS, max(deadline - time.monotonic(), 0.01)))
                continue
            # stale: remove that very record (Lake.discard: one contender wins), then retry ours
            if raw is not None and self.lake.discard(self.rel, raw):
                self.took_over = held
        raise StepError(f"{self.lake.where(self.rel)}: could not take it (contended)")

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            held, raw = _read_raw(self.lake, self.rel)
            if held is not None and raw is None:
                continue  # the read failed (e.g. the object store did not answer): try next beat
            if held is None or held.get("id") != self.id:
                self.lost = held or {"id": None}
                return  # taken over (we were stale) or removed: stop claiming
            # compare and swap: a taker who judged us stale since the read keeps its record
            self.lake.swap(self.rel, raw, json.dumps({**held, "heartbeat": time.time()}).encode())

    def _lost(self, by: str) -> StepError:
        return StepError(f"{self.lake.where(self.rel)} was {by}")

    def check(self) -> None:
        """Raise if the record is no longer ours: taken over by another holder (ours went without a
        heartbeat for ``STALE_SECONDS``, e.g. a paused process) or removed. Passes while it is ours,
        or unreadable this once (the heartbeat tells)."""
        held, raw = _read_raw(self.lake, self.rel) if self.lost is None else (self.lost, b"")
        if held is not None and (held.get("id") == self.id or raw is None):
            return
        raise self._lost(f"taken over by {describe(held)}" if held and held.get("id") else "removed")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        held, raw = _read_raw(self.lake, self.rel)
        if held is not None and held.get("id") == self.id and raw is not None:
            self.lake.discard(self.rel, raw)  # only our own record: never a taker's written since

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class Lease(_Claim):
    """The run's driver: ``lease.json``."""

    def __init__(self, lake: Lake, kind: str = "envsched train"):
        super().__init__(lake, LEASE_FILE, kind)

    def _busy(self, held: dict) -> StepError:
        return StepError(
            f"{self.lake.root}: the run is being driven by {describe(held)}; one driver per "
            "run (wait for it, stop it, or use another lake)"
        )

    def _lost(self, by: str) -> StepError:
        # a driver calls check() before each step it starts (a paused process, a suspended laptop)
        return StepError(
            f"{self.lake.root}: this driver's lease of the run was {by}; stopping so that the run "
            "has one driver (its heartbeat may have stopped for over "
            f"{STALE_SECONDS:.0f}s, e.g. a paused process)"
        )


class StepLock(_Claim):
    """One writer of one step's work: ``locks/<name>.lock``, with a heartbeat, so a holder that died
    on another machine (a crashed pod) leaves a lock that goes stale instead of one that blocks the
    step for good."""

    def __init__(self, lake: Lake, name: str):
        super().__init__(lake, f"locks/{name}.lock", name)
        self.name = name

    def _busy(self, held: dict) -> StepError:
        return StepError(
            f"{self.name} is already running ({describe({**held, 'kind': self.name})}); wait for it to finish"
        )

    def _lost(self, by: str) -> StepError:
        # a fenced lake calls check() before every write (Lake.fenced): a writer that lost its step
        # never writes into it
        return StepError(
            f"{self.lake.where(self.rel)}: the lock of {self.name} held by this process was {by} "
            f"(no heartbeat for over {STALE_SECONDS:.0f}s, e.g. a paused process); nothing more of "
            "this step is written by it"
        )


def holder_check(lake: Lake, name: str, claim_id: str):
    """A check for a process that writes for the holder of ``locks/<name>.lock`` without holding it
    itself (a resident worker serving a step whose client holds the lock): raises unless the lock
    still carries ``claim_id``."""
    lock = StepLock(lake, name)
    lock.id = claim_id
    return lock.check


@contextmanager
def step_lock(lake: Lake, name: str, wait: float = 0.0, log=None):
    """Exclusive lock ``locks/<name>.lock`` for the duration of the block, heartbeat included: a
    stale or dead holder's lock is taken over; a live one's is an error naming it, after waiting up
    to ``wait`` seconds for it to finish or go stale. Yields the :class:`StepLock` (its ``check``
    is the fence for the block's writes)."""
    lock = StepLock(lake, name).acquire(wait=wait, log=log)
    try:
        yield lock
    finally:
        lock.release()
