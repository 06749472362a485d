"""One driver per run, and one writer per step: leases and locks in the lake.

* :class:`Lease` (``lease.json``): whoever drives the run (``envsched train``) holds it, with its
  owner (pid, host, command) and a heartbeat refreshed every few seconds. A second driver is refused
  with the holder named; the loop sensor skips while a live lease is held, and the step assets
  refuse runs that another driver did not request. A lease whose heartbeat is older than
  ``STALE_SECONDS`` (or whose process is gone, on the same host) is stale and can be taken over.
* :func:`step_lock` (``locks/<name>.lock``): exclusive creation, so of two ingests of one step
  running at once one wins and the other gets a clear error.
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
from pathlib import Path

from envsched_pipeline.errors import StepError
from envsched_pipeline.lake import Lake, atomic_write_bytes

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


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, OSError):
        return {"id": "unreadable", "heartbeat": 0}


def describe(record: dict) -> str:
    age = time.time() - float(record.get("heartbeat", 0))
    return (
        f"{record.get('kind', '?')} (pid {record.get('pid')} on {record.get('host')}, "
        f"`{record.get('command', '')}`), heartbeat {age:.0f}s ago"
    )


def current(lake: Lake) -> dict | None:
    """The live lease of the lake's run, or None (no lease, or a stale one)."""
    record = _read(lake.root / LEASE_FILE)
    return None if record is None or _stale(record) else record


class Lease:
    def __init__(self, lake: Lake, kind: str = "envsched train"):
        self.lake, self.kind = lake, kind
        self.path = lake.root / LEASE_FILE
        self.id = uuid.uuid4().hex[:12]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.took_over: dict | None = None

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
        self.lake.root.mkdir(parents=True, exist_ok=True)
        for _ in range(5):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                held = _read(self.path)
                if held is None:
                    continue
                if not _stale(held):
                    raise StepError(
                        f"{self.lake.root}: the run is being driven by {describe(held)}; one driver per "
                        "run (wait for it, stop it, or use another lake)"
                    ) from None
                # stale: move it aside (only one contender's rename succeeds), then retry creating
                try:
                    os.rename(self.path, self.path.with_name(f".{LEASE_FILE}.stale.{uuid.uuid4().hex[:8]}"))
                    self.took_over = held
                except FileNotFoundError:
                    pass
                continue
            with os.fdopen(fd, "w") as fh:
                json.dump(self._record(), fh)
            self._thread = threading.Thread(target=self._beat, daemon=True, name="envsched-lease")
            self._thread.start()
            return self
        raise StepError(f"{self.lake.root}: could not take the run's lease (contended)")

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            held = _read(self.path)
            if held is None or held.get("id") != self.id:
                return  # taken over (we were stale): stop claiming
            atomic_write_bytes(self.path, json.dumps({**held, "heartbeat": time.time()}).encode())

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        held = _read(self.path)
        if held is not None and held.get("id") == self.id:
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


@contextmanager
def step_lock(lake: Lake, name: str):
    """Exclusive lock ``locks/<name>.lock`` for the duration of the block (a dead holder's lock is
    broken; a live one's is an error naming it)."""
    path = lake.root / "locks" / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            break
        except FileExistsError:
            held = _read(path) or {}
            if held and not _stale({**held, "heartbeat": time.time()}):
                raise StepError(
                    f"{name} is already running ({describe({**held, 'kind': name})}); wait for it to finish"
                ) from None
            path.unlink(missing_ok=True)
    else:
        raise StepError(f"could not lock {name}")
    with os.fdopen(fd, "w") as fh:
        json.dump(
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "command": " ".join(sys.argv[:6]),
                "heartbeat": time.time(),
            },
            fh,
        )
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
