"""Server processes the tests start (an S3 endpoint, Dagster's daemon and webserver, an
OpenAI-API server, PostgreSQL, torchrun's processes): a free loopback port, waiting until a port answers, and a stop that
still works on a loaded machine, where a process can take a while to be scheduled for its exit."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(n: int, args: list[str], env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run`` with ``n`` processes on a free rendezvous port, run to its
    end (its output captured)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={n}",
        f"--master_port={free_port()}",
    ]
    return subprocess.run(cmd + args, capture_output=True, text=True, timeout=timeout, env=env)


def wait_for_port(port: int, proc: subprocess.Popen | None = None, what: str = "server", timeout: float = 30):
    """Until ``127.0.0.1:port`` accepts a connection; raises if ``proc`` exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if time.monotonic() > deadline or (proc is not None and proc.poll() is not None):
                if proc is not None:
                    stop(proc, grace=5)
                raise RuntimeError(f"{what} did not listen on port {port} within {timeout:.0f} s") from None
            time.sleep(0.2)


def gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (no longer there, or a zombie nobody has reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].startswith("Z")
    except FileNotFoundError:
        return True


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, theirs, ...), read from /proc."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:  # gone meanwhile
                continue
            parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces
    out, todo = [], [pid]
    while todo:
        above = todo.pop()
        kids = [p for p, pp in parent.items() if pp == above]
        out += kids
        todo += kids
    return out


def stop(proc: subprocess.Popen, grace: float = 60.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds. A process started with
    ``start_new_session=True`` leads its own group: the signals go to the whole group (Dagster's
    daemon and webserver start children). Children that left the group (the daemon's code server
    starts in a session of its own and outlives it) are ended after it."""
    if proc.poll() is not None:
        return
    try:
        group = os.getpgid(proc.pid) == proc.pid
    except ProcessLookupError:  # exited between the poll and here
        return
    below = descendants(proc.pid)

    def send(sig: int) -> None:
        try:
            os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
        except ProcessLookupError:
            pass

    send(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        proc.wait()
    for pid in below:  # an escaped child is reparented, never reaped by us: signal it by pid
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
