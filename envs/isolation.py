"""Process isolation for untrusted environment code: framed JSON pipes with deadlines, a supervisor
between the trainer and each worker, a scrubbed environment and a private working directory.

    trainer ──frames──▶ supervisor (our code, child subreaper) ──frames──▶ worker (untrusted code)

* **Frames**: a 4-byte length, then UTF-8 JSON (never pickle: a worker cannot make the trainer
  run code by what it sends). Every read and write has a deadline; a frame larger than
  ``MAX_FRAME`` or not JSON is a protocol violation (the worker is killed, the episode fails).
* **Supervisor**: relays each request to its worker and the reply back within the request's
  deadline; on a timeout or a crash it kills the worker's process group and starts a fresh worker.
  It is the worker's parent, so ``os.getppid()`` in environment code is the supervisor, never the
  trainer; it is a child subreaper, so a process the environment forks (even one that calls
  ``setsid``) is re-parented to it and killed when the episode ends.
* **Worker**: its own session (``setsid``), an allow-listed environment (no API keys, no lake
  path), ``HOME``/``TMPDIR``/cwd in a private temporary folder outside the lake, address-space
  and CPU limits, and ``PR_SET_PDEATHSIG`` so it dies with its supervisor.

What remains possible (there is no network namespace, no seccomp, no PID namespace): environment
code can open network connections, read files readable by the user, and signal other processes of
the same user if it finds their pids. Do not import pools from sources you would not run code from.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

MAX_FRAME = 256 * 1024 * 1024
ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "PYTHONHASHSEED", "TZ")
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36


class ProtocolError(Exception):
    """A peer sent something that is not a frame of JSON within limits."""


# ---------------------------------------------------------------------------- frames
def write_frame(fd: int, data: bytes, deadline: float | None = None) -> None:
    """Write one frame; raises TimeoutError if the reader does not take it before ``deadline``."""
    buf = memoryview(struct.pack(">I", len(data)) + data)
    while buf:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise TimeoutError("peer did not read in time")
        _, writable, _ = select.select([], [fd], [], left)
        if not writable:
            raise TimeoutError("peer did not read in time")
        n = os.write(fd, buf[: 1 << 20])
        buf = buf[n:]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, got = [], 0
    while got < n:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise TimeoutError("peer did not answer in time")
        readable, _, _ = select.select([fd], [], [], left)
        if not readable:
            raise TimeoutError("peer did not answer in time")
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError("peer closed the pipe")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, deadline: float | None = None, max_bytes: int = MAX_FRAME) -> bytes:
    (n,) = struct.unpack(">I", _read_exact(fd, 4, deadline))
    if n > max_bytes:
        raise ProtocolError(f"frame of {n} bytes exceeds the {max_bytes}-byte limit")
    return _read_exact(fd, n, deadline)


def dumps(obj) -> bytes:
    return json.dumps(obj, default=str).encode()


def loads(data: bytes):
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"not JSON ({exc})") from exc


# ---------------------------------------------------------------------------- process hygiene
def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the supervisor still kills the worker's process group


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent exits (Linux; elsewhere a
    no-op). For pool workers: a killed parent then leaves no orphan computing on. SIGKILL by
    default: a process inherits ignored and blocked signals from whoever started it (started from
    inside the full test suite, a child with SIGTERM as its death signal outlived its parent), and
    SIGKILL can be neither."""
    _prctl(_PR_SET_PDEATHSIG, sig)


def scrubbed_env(home: str) -> dict[str, str]:
    """The worker's whole environment: an allow-list, the import path, private HOME and TMPDIR."""
    env = {k: os.environ[k] for k in ENV_ALLOW if k in os.environ}
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in sys.path if p and os.path.isdir(p)),
        HOME=home,
        TMPDIR=home,
        PYTHONDONTWRITEBYTECODE="1",
        OPENBLAS_NUM_THREADS="1",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        ENVSCHED_SANDBOX="1",
    )
    return env


def descendants(root: int, *, zombies: bool = True) -> list[int]:
    """Pids of every process below ``root`` (from /proc); ``zombies=False`` leaves out processes
    that have exited and only wait to be reaped."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
            fields = stat.rsplit(")", 1)[1].split()
            ppid = int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
        if not zombies and fields[0] == "Z":
            continue  # a zombie has no children: they were re-parented when it exited
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_quietly(pid: int, group: bool = False) -> None:
    try:
        (os.killpg if group else os.kill)(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass


# ---------------------------------------------------------------------------- the supervisor
class _WorkerProcess:
    def __init__(self, limits_json: str, home: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "envs.sandbox", "work", limits_json],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=home,
            env=scrubbed_env(home),
            start_new_session=True,
            close_fds=True,
        )
        self.w, self.r = self.proc.stdin.fileno(), self.proc.stdout.fileno()

    def kill(self) -> None:
        kill_quietly(self.proc.pid, group=True)
        kill_quietly(self.proc.pid)
        try:
            self.proc.wait(2)
        except subprocess.TimeoutExpired:
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


def supervise(limits_json: str) -> None:
    """Supervisor main loop (``python -m envs.sandbox supervise LIMITS``): fd 0/1 talk to the
    trainer; each request is a control frame {"deadline", "ends_episode"} and a payload frame that
    is relayed to the worker verbatim; the answer is a control frame {"status": "ok" | "timeout" |
    "crash", "worker_pid", "detail"} followed, when ok, by the worker's reply frame."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    home = tempfile.mkdtemp(prefix="envsched-sandbox-")
    out = os.dup(1)
    os.dup2(2, 1)
    worker = _WorkerProcess(limits_json, home)

    def reap_strays() -> None:
        # A daemon may still be forking while we look, and a killed process lingers until reaped:
        # kill and reap until nothing but the worker is left alive below us (bounded).
        give_up = time.monotonic() + 2.0
        while True:
            strays = [p for p in descendants(os.getpid(), zombies=False) if p != worker.proc.pid]
            for pid in strays:
                kill_quietly(pid)
            try:
                while os.waitpid(-1, os.WNOHANG)[0] > 0:
                    pass
            except ChildProcessError:
                pass
            if not strays or time.monotonic() > give_up:
                return
            time.sleep(0.01)

    try:
        while True:
            try:
                ctrl = loads(read_frame(0))
                payload = read_frame(0)
            except (EOFError, ProtocolError, OSError):
                return  # the trainer went away
            if ctrl.get("quit"):
                return
            if worker.proc.poll() is not None:
                worker.kill()
                worker = _WorkerProcess(limits_json, home)
            deadline = time.monotonic() + float(ctrl.get("deadline", 60.0))
            status, reply, detail = "ok", b"", ""
            try:
                write_frame(worker.w, payload, deadline)
                reply = read_frame(worker.r, deadline)
                loads(reply)  # a reply must be JSON, or the worker broke the protocol
            except TimeoutError:
                status = "timeout"
            except (EOFError, ProtocolError, OSError, struct.error) as exc:
                status, detail = "crash", f"{type(exc).__name__}: {exc}"[:300]
            if status != "ok":
                worker.kill()
                reap_strays()
                worker = _WorkerProcess(limits_json, home)
            elif ctrl.get("ends_episode"):
                reap_strays()
            write_frame(out, dumps({"status": status, "worker_pid": worker.proc.pid, "detail": detail}))
            if status == "ok":
                write_frame(out, reply)
    finally:
        worker.kill()
        reap_strays()
        shutil.rmtree(home, ignore_errors=True)


def worker_setup(memory_mb: int, cpu_seconds: int) -> tuple[int, int]:
    """In the worker, before any untrusted code: die with the supervisor, resource limits, and the
    protocol moved off stdout (what environment code prints goes to stderr, i.e. nowhere).
    Returns (read fd, write fd) of the protocol."""
    import resource  # Unix only; the worker is the only place that sets limits

    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    try:
        mem = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
    except (ValueError, OSError):
        pass
    proto_out = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return 0, proto_out
