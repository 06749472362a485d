"""Sandboxed execution of untrusted environment and verifier code.

Runtimes run in pooled worker processes (fresh interpreters: nothing inherited from the Dagster or
scheduler process), each with an address-space limit (RLIMIT_AS), a CPU-time limit, one BLAS thread, and a
per-check / per-call timeout inside the worker. The parent enforces a per-episode wall-clock limit:
a worker that hangs is killed and replaced, one that crashes or runs out of memory is replaced.
Either way the episode becomes reward 0 with an error class (``timeout``, ``env_crash``) — it costs
that rollout, never the step or the process. Inside a worker each environment's code runs in a
process of its own, forked for it and kept for its later episodes (``_Dispatcher``): what one
environment does to the interpreter never reaches another environment's rollouts or rewards. On
Linux the worker is also confined (``envs.isolation.confine``: namespaces, a private root).

    with SandboxPool(workers=2) as pool:
        results = pool.map_episodes([(spec, actions), ...])          # batch mode (one round trip)
        with pool.session(spec) as s:                                # interactive (agent loop)
            first = s.reset(); obs = s.step(call); nxt = s.end_turn(text); res = s.finish(text)
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

from envs.isolation import (
    MAX_FRAME,
    ProtocolError,
    confine,
    die_with_parent,
    dumps,
    end_children,
    kill_quietly,
    loads,
    read_frame,
    reaping,
    scrubbed_env,
    supervise,
    worker_setup,
    write_frame,
)
from envs.runtime import RUNTIMES, make_runtime, run_actions


@dataclass
class Limits:
    memory_mb: int = 2048  # address-space limit per worker
    cpu_seconds: int = 600  # CPU-time limit per worker lifetime (it is recycled before)
    episode_seconds: float = 60.0  # wall clock per episode (parent-enforced)
    check_seconds: float = 5.0  # per verifier check (worker-enforced)
    call_seconds: float = 5.0  # per tool call (worker-enforced)
    episodes_per_worker: int = 500  # recycle a worker after this many episodes
    network: bool = False  # let environment code reach the network (off: a namespace without any)
    disk_mb: int = 64  # confined: size of the worker's home and of its /tmp (each, in memory)
    file_mb: int = 256  # the largest file environment code may write (RLIMIT_FSIZE)
    env_processes: int = 64  # per worker: environments whose process is kept for their next episodes


def _failure(kind: str, message: str) -> dict:
    return {"reward": 0.0, "checks": [], "error": message, "error_class": kind, "tool_calls": []}


def _worker_main(limits: Limits) -> None:
    """Worker loop (``python -m envs.sandbox work LIMITS``, started by the supervisor): JSON frames
    on its protocol fds. The worker itself never runs environment code: each environment's
    episodes (batch, interactive, its share of a vector batch) run in a process forked for that
    environment (a unit, see ``_Dispatcher``), so what one environment's code does to the
    interpreter (patched builtins or modules, global state, leaked threads) never reaches another
    environment's rollouts or rewards."""
    confinement = confine(os.getcwd(), network=limits.network, disk_mb=limits.disk_mb)
    rfd, wfd = worker_setup(limits.memory_mb, limits.cpu_seconds, limits.file_mb)
    conn = _FrameConn(rfd, wfd)
    units = _Dispatcher(limits, (rfd, wfd), confinement["pid_namespace"])
    while True:
        try:
            with reaping(confinement["pid_namespace"]):
                msg = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if msg[0] == "quit":
            return
        if msg[0] == "confinement":
            conn.send(("ok", confinement))
            continue
        reply = units.handle(msg)
        conn.send(reply)
        units.housekeeping(lambda: bool(select.select([rfd], [], [], 0)[0]), msg[0] in END_OPS)


class _UnitDied(Exception):
    """An environment's process died, broke its pipe or answered beyond the protocol while a
    request was pending."""


class _UnitLate(_UnitDied):
    """An environment's process did not answer a vector request within its share's deadline."""


class _UnitState:
    """What one unit's process holds between requests: an interactive runtime, or vector episodes."""

    def __init__(self):
        self.rt = None
        self.many: dict[int, object] = {}  # vector mode: episode id -> runtime


def _handle(msg, state: _UnitState, limits: Limits) -> tuple:
    """One request, inside a unit's process: environment and verifier code run here and only here."""
    op = msg[0]
    try:
        if op.startswith("v"):
            return ("ok", _vector_op(op, msg, state.many, limits))
        if op == "episode":
            return ("ok", _classified(run_actions(_timed(msg[1], limits), msg[2], msg[3])))
        if op == "open":
            state.rt = make_runtime(_timed(msg[1], limits))
            return ("ok", state.rt.reset())
        if op == "step":
            return ("ok", state.rt.step(msg[1]))
        if op == "end_turn":
            return ("ok", state.rt.end_turn(msg[1]))
        if op == "finish":
            out = _classified(state.rt.finish(msg[1]))
            state.rt = None
            return ("ok", out)
        return ("error", "infra", f"unknown op {op!r}")
    except MemoryError:
        state.rt = None
        return ("error", "env_crash", "MemoryError: the environment exceeded its memory limit")
    except BaseException as exc:  # noqa: BLE001 - untrusted code may raise anything
        state.rt = None
        kind = "verifier_error" if op == "finish" else "env_crash"
        return ("error", kind, _short(exc))


class _Unit:
    """A forked process that runs one environment's code, request by request, over its own pipe
    pair; the worker's protocol and every other unit's pipes are closed in it, so environment code
    can write neither to the supervisor nor to another environment's process."""

    def __init__(self, limits: Limits, close_fds: tuple[int, ...]):
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        try:
            self.pid = os.fork()
        except OSError:
            for fd in (to_r, to_w, from_r, from_w):
                os.close(fd)
            raise
        if self.pid == 0:
            code = 0
            try:
                die_with_parent()
                for fd in (to_w, from_r, *close_fds):
                    os.close(fd)
                conn, state = _FrameConn(to_r, from_w), _UnitState()
                while True:
                    try:
                        msg = conn.recv()
                    except EOFError:
                        break
                    reply = _handle(msg, state, limits)
                    if msg[0] in END_OPS:
                        end_children()  # what its code forked dies with the episode
                    conn.send(reply)
            except BaseException:  # noqa: BLE001 - a unit that cannot answer dies; the worker reports it
                code = 1
            os._exit(code)
        os.close(to_r)
        os.close(from_w)
        self.conn = _FrameConn(from_r, to_w)
        self.ended: str | None = None  # how its process ended, once seen

    def send(self, msg, deadline: float | None = None) -> None:
        try:
            self.conn.send(msg, deadline)
        except TimeoutError as exc:  # it does not read its requests
            raise _UnitLate(str(exc)) from exc
        except OSError as exc:
            raise _UnitDied(str(exc)) from exc

    def recv(self, deadline: float | None = None):
        try:
            return self.conn.recv(max_bytes=UNIT_REPLY_BYTES, deadline=deadline)
        except TimeoutError as exc:
            raise _UnitLate(str(exc)) from exc
        except (EOFError, OSError) as exc:
            raise _UnitDied(str(exc)) from exc

    def recv_ok(self, deadline: float | None = None) -> list:
        """A vector reply's per-episode outcomes (a unit whose whole request failed has died)."""
        reply = self.recv(deadline)
        if reply[0] != "ok":
            raise _UnitDied(str(reply))
        return reply[1]

    def ask(self, msg, deadline: float | None = None):
        self.send(msg, deadline)
        return self.recv(deadline)

    def exited(self) -> str | None:
        """How this unit's process ended, or None while it runs (one waitpid, never blocking)."""
        if self.ended is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped already (the idle SIGCHLD handler of a PID 1)
                self.ended = "it exited"
            else:
                if pid:
                    self.ended = _exit_text(status)
        return self.ended

    def death(self) -> str:
        """Why a unit that broke off a request is gone: its exit, or (alive, it broke the protocol)
        that it stopped answering; waits a moment for an exit to be seen."""
        give_up = time.monotonic() + 0.2
        while self.exited() is None and time.monotonic() < give_up:
            time.sleep(0.01)
        return f"{ENV_PROCESS} died ({self.exited() or 'it broke the protocol'})"

    def close(self) -> None:
        for fd in (self.conn.r, self.conn.w):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.exited() is not None:
            return
        kill_quietly(self.pid)
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass  # reaped already (the idle SIGCHLD handler)


def _exit_text(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        return f"killed by {name}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"


# how an error reply says that the environment's process died or was ended under a request ...
ENV_PROCESS = "the environment's process"
# ... and how it marks it (the field after the message): the pool counts it as a crash or a timeout,
# and a vector episode so marked may have been innocent (the process held other episodes), so the
# trainer's side replays it alone, in a new one
LOST = "lost"

SPARE_UNITS = 4  # processes forked ahead, while the worker waits, for environments not seen yet
# the largest reply an environment's process may send (tool outputs are cut at 4,000 characters
# by the runtime; code that patches that away is stopped here, before the trainer reads it)
UNIT_REPLY_BYTES = 32 << 20


def _env_key(kind: str | None, env: dict) -> str:
    """One unit per environment: its identity is its kind, id, class and code, and its tools (two
    pools may share an id with different code)."""
    h = hashlib.sha256()
    for part in (kind, env.get("env_id"), env.get("class_name"), env.get("code"), env.get("tools")):
        h.update((part if isinstance(part, str) else json.dumps(part, default=str)).encode() + b"\0")
    return h.hexdigest()


class _Dispatcher:
    """The worker's side of the units: each environment's code runs in a unit of its own, kept
    for that environment's later episodes (up to ``Limits.env_processes`` units, the least recently
    used without an open episode ended first). Killing and forking happen off the request's path
    where they can: after the reply is sent, until the next request arrives. A unit that dies costs
    the episodes it held, never the worker or another environment's unit: a request to it is
    answered with an error, and a unit found dead before a new episode is replaced first."""

    def __init__(self, limits: Limits, protocol_fds: tuple[int, int], pid_one: bool):
        self.limits, self.protocol_fds, self.pid_one = limits, protocol_fds, pid_one
        self.units: OrderedDict[str, _Unit] = OrderedDict()  # environment key -> its unit (LRU)
        self.session: str | None = None  # the interactive episode's environment key
        self.session_ends = 0.0  # ... and when its time is up (monotonic clock)
        self.where: dict[int, str] = {}  # vector mode: open episode id -> environment key
        self.lost: dict[int, tuple[str, str]] = {}  # vector mode: open episode id -> (error class, why)
        self.spares: list[_Unit] = []  # forked, never given any work
        self.ended: list[_Unit] = []  # evicted; killed in the next housekeeping
        self.preloaded: set[str] = set()  # pool kinds whose runtime this process has imported

    def _all(self) -> list[_Unit]:
        return [*self.units.values(), *self.spares, *self.ended]

    def _fork(self, patience: float = 2.0) -> _Unit:
        """A new unit (it closes the worker's protocol and every other unit's pipes). A fork the
        process limit refuses (another environment's fork bomb, ended with its episode) is tried
        again for ``patience`` seconds, then fails the request that needed it."""
        others = [fd for u in self._all() for fd in (u.conn.r, u.conn.w)]
        give_up = time.monotonic() + patience
        while True:
            try:
                return _Unit(self.limits, (*self.protocol_fds, *others))
            except OSError as exc:
                if time.monotonic() > give_up:
                    raise _UnitDied(f"cannot start an environment's process: {exc}") from exc
                time.sleep(0.05)

    def _preload(self, kind: str | None) -> None:
        """Import a pool kind's runtime and the packages it names (``PRELOAD``: installed code,
        never an environment's) here, once, so every environment's process starts with them."""
        kind = kind or "envscaler"
        if kind in self.preloaded:
            return
        self.preloaded.add(kind)
        if kind in RUNTIMES:
            return  # imported with this module (the EnvScaler runtime) or before
        try:
            module = importlib.import_module(f"envs.pools.{kind}")
            for name in getattr(module, "PRELOAD", ()):
                importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the environment's process meets it again and reports it
            return
        self.ended.extend(self.spares)  # forked before the import: without it
        self.spares.clear()

    def _unit(self, key: str, fresh: bool = False) -> _Unit:
        """The environment's unit; for a new episode (``fresh``) one that has died since its last
        request (its own code's thread, the kernel's OOM killer) is replaced first."""
        if fresh and key in self.units and self.units[key].exited() is not None:
            self._lose(key, "env_crash", f"{ENV_PROCESS} died ({self.units[key].exited()})")
        if key not in self.units:
            self.units[key] = self.spares.pop() if self.spares else self._fork()
        self.units.move_to_end(key)
        return self.units[key]

    def _lose(self, key: str, kind: str = "env_crash", why: str | None = None) -> tuple[str, str]:
        """Drop an environment's unit that died, broke off a request or is ended for being late;
        the episodes it held are lost (told on their next request). Returns (error class, why)."""
        unit = self.units.pop(key, None)
        if unit is not None:
            why = why or unit.death()
            self.ended.append(unit)
        lost = (kind, why or f"{ENV_PROCESS} died")
        for eid in [eid for eid, k in self.where.items() if k == key]:
            del self.where[eid]
            self.lost[eid] = lost
        if self.session == key:
            self.session = None
        return lost

    def handle(self, msg) -> tuple:
        op = msg[0]
        try:
            if op in ("episode", "open"):
                self._preload(msg[1].get("kind"))
                key = _env_key(msg[1].get("kind"), msg[1].get("env"))
                ends = time.monotonic() + _under(self.limits.episode_seconds)
                if op == "episode":
                    return self._ask(key, msg, ends, fresh=True)
                self.session, self.session_ends = None, self._session_ends(msg, ends)
                reply = self._ask(key, msg[:2], self.session_ends, fresh=True)
                if reply[0] == "ok":
                    self.session = key
                return reply
            if op in ("step", "end_turn", "finish"):
                if self.session not in self.units:
                    kind = "verifier_error" if op == "finish" else "env_crash"
                    return ("error", kind, "no episode is open on this worker")
                self.session_ends = self._session_ends(msg, self.session_ends)
                try:
                    return self._ask(self.session, msg[:2], self.session_ends)
                finally:
                    if op == "finish":
                        self.session = None
            if op == "vopen":
                return self._vopen(msg)
            if op in ("vstep", "vfinish", "vdrop"):
                return self._vector(op, msg[1])
        except _UnitDied as exc:  # no process could be started for it
            return ("error", "env_crash", str(exc))
        return ("error", "infra", f"unknown op {op!r}")

    @staticmethod
    def _session_ends(msg, ends: float) -> float:
        """When the interactive episode's time is up here: a second under what the trainer has left
        of it (sent with each of its requests, so that time its agent spends between requests
        counts), never later than ``ends``. The worker then ends a late environment's process itself
        before the supervisor, held to the trainer's time, ends the worker."""
        if len(msg) > 2 and isinstance(msg[2], int | float) and msg[2] > 0:
            return min(ends, time.monotonic() + _under(float(msg[2])))
        return ends

    def _ask(self, key: str, msg, deadline: float, fresh: bool = False) -> tuple:
        """One request to an environment's unit, answered by the deadline; a unit that dies under
        it, or is late (it is ended), costs this episode only."""
        unit = self._unit(key, fresh)
        try:
            return unit.ask(msg, deadline)
        except _UnitLate:
            seconds = self.limits.episode_seconds
            why = f"{ENV_PROCESS} did not end its episode within {seconds:g}s"
            return ("error", *self._lose(key, "timeout", why), LOST)
        except _UnitDied:
            return ("error", *self._lose(key), LOST)

    def _ask_each(self, requests: list[tuple[str, tuple]]) -> list[list]:
        """Send each environment's unit (by key) its share of a vector request, then collect the
        per-episode outcomes in the same order (sent to all first, so the units work at once). A
        unit that dies under its share, or does not answer it within the share's deadline (code
        that ignores its per-call alarm: the unit is ended), costs this worker nothing more: its
        episodes come back marked ``LOST``."""
        fresh = requests[0][1][0] == "vopen" if requests else False
        lost: dict[str, tuple[str, str]] = {}
        deadline: dict[str, float] = {}

        def lose(key: str, exc: _UnitDied, seconds: float) -> None:
            if isinstance(exc, _UnitLate):
                lost[key] = self._lose(key, "timeout", f"{ENV_PROCESS} did not answer within {seconds:g}s")
            else:
                lost[key] = self._lose(key, why=None if key in self.units else str(exc))

        for key, request in requests:
            seconds = self._share_seconds(len(request[-1]))
            deadline[key] = time.monotonic() + seconds
            try:
                self._unit(key, fresh).send(request, deadline[key])
            except _UnitDied as exc:
                lose(key, exc, seconds)
        out = []
        for key, request in requests:
            if key not in lost:
                try:
                    out.append(self.units[key].recv_ok(deadline[key]))
                    continue
                except _UnitDied as exc:
                    lose(key, exc, self._share_seconds(len(request[-1])))
            out.append([(item[0], "error", *lost[key], LOST) for item in request[-1]])
        return out

    def _share_seconds(self, episodes: int) -> float:
        """How long one environment's share of a vector request may take: the trainer's bound for
        the whole request (``VectorBatch``) applied to the share, a second under it, so that a late
        environment is ended here before the supervisor ends the worker."""
        return _under(vector_seconds(self.limits, episodes))

    def _vopen(self, msg) -> tuple:
        envs, items = msg[1], msg[2]
        parts: dict[str, list] = {}
        for item in items:
            parts.setdefault(item[1], []).append(item)
            self.lost.pop(item[0], None)  # an episode id is used again by a later batch
            self.where.pop(item[0], None)
        requests = []
        for name, part in parts.items():
            kind = part[0][3].get("kind")
            self._preload(kind)
            requests.append((_env_key(kind, envs[name]), ("vopen", {name: envs[name]}, part)))
        results = {}
        for (key, _request), outcomes in zip(requests, self._ask_each(requests), strict=True):
            for res in outcomes:
                results[res[0]] = res
                if res[1] == "ok":
                    self.where[res[0]] = key
                else:
                    self.where.pop(res[0], None)
        return ("ok", [results[item[0]] for item in items])

    def _vector(self, op: str, pairs: list) -> tuple:
        parts: dict[str, list] = {}
        results = {}
        for eid, arg in pairs:
            if eid in self.lost:
                results[eid] = (eid, "error", *self.lost.pop(eid), LOST)
            elif self.where.get(eid) in self.units:
                parts.setdefault(self.where[eid], []).append((eid, arg))
        for outcomes in self._ask_each([(key, (op, part)) for key, part in parts.items()]):
            for res in outcomes:
                results[res[0]] = res
                if op != "vstep" or res[1] != "ok":
                    self.where.pop(res[0], None)
                    self.lost.pop(res[0], None)
        missing = ("error", "infra", "episode is not open on this worker")
        return ("ok", [results.get(eid) or (eid, *missing) for eid, _ in pairs])

    def housekeeping(self, request_waiting: Callable[[], bool], episode_ended: bool) -> None:
        """After a reply: end the least recently used units beyond the limit that hold no open
        episode, kill them (and, after an episode's end and as its namespace's PID 1, every
        orphan environment code left behind), then fork spares until there are enough or a
        request arrives."""
        busy = {*self.where.values(), self.session}
        for key in list(self.units):
            if len(self.units) <= self.limits.env_processes:
                break
            if key not in busy:
                self.ended.append(self.units.pop(key))
        for unit in self.ended:
            unit.close()
        self.ended.clear()
        if self.pid_one and episode_ended:
            end_children(keep={u.pid for u in self._all()})  # orphans its code left to PID 1
        while len(self.spares) < SPARE_UNITS and not request_waiting():
            try:
                self.spares.append(self._fork(patience=0.0))
            except _UnitDied:
                break  # the process limit is reached for now: no spares until it is not


def _vector_op(op: str, msg: tuple, many: dict, limits: Limits) -> list[tuple]:
    """Many episodes on one worker, one message per operation: ``vopen`` (envs, [(eid, env_key,
    task, extra)]), ``vstep`` [(eid, call)], ``vfinish`` [(eid, answer)], ``vdrop`` [(eid, None)]
    (an episode given up: ended unverified). Each episode's outcome is ("ok", value) or ("error",
    error_class, message): one episode's failure never affects another."""

    out = []
    if op == "vopen":
        envs, items = msg[1], msg[2]
        first_of: dict[str, int] = {}  # tool schemas travel once per environment and message
        for eid, env_key, task, extra in items:
            try:
                rt = make_runtime(_timed({**extra, "env": envs[env_key], "task": task}, limits))
                first = rt.reset()
                many[eid] = rt
                if env_key in first_of and isinstance(first, dict):
                    first = dict(first, tools=None, same_tools_as=first_of[env_key])
                else:
                    first_of[env_key] = eid
                out.append((eid, "ok", first))
            except BaseException as exc:  # noqa: BLE001 - untrusted code may raise anything
                many.pop(eid, None)
                out.append((eid, "error", "env_crash", _short(exc)))
        return out
    for eid, arg in msg[1]:
        rt = many.pop(eid, None) if op == "vdrop" else many.get(eid)
        if op == "vdrop":
            out.append((eid, "ok", rt is not None))
            continue
        if rt is None:
            out.append((eid, "error", "infra", "episode is not open on this worker"))
            continue
        try:
            if op == "vstep":
                out.append((eid, "ok", rt.step(arg)))
            elif op == "vfinish":
                res = _classified(rt.finish(arg))
                many.pop(eid, None)
                out.append((eid, "ok", res))
            else:
                out.append((eid, "error", "infra", f"unknown op {op!r}"))
        except BaseException as exc:  # noqa: BLE001
            many.pop(eid, None)
            out.append((eid, "error", "verifier_error" if op == "vfinish" else "env_crash", _short(exc)))
    return out


def _under(seconds: float) -> float:
    """A wall-clock limit the worker enforces on an environment's process: a second under the
    trainer's own (never under half of it), so the worker answers before the supervisor ends it."""
    return max(seconds / 2, seconds - 1.0)


def vector_seconds(limits: Limits, episodes: int) -> float:
    """The wall-clock bound on one vector operation over ``episodes`` episodes: each may use a
    tool call's and a check's limit, and never less than one episode's."""
    return max(limits.episode_seconds, episodes * (limits.call_seconds + limits.check_seconds) + 5.0)


def _short(exc: BaseException) -> str:
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


def _timed(spec: dict, limits: Limits) -> dict:
    """An episode's spec with the per-check and per-call time limits the runtime enforces."""
    return dict(spec, check_timeout=limits.check_seconds, call_timeout=limits.call_seconds)


def _classified(out: dict) -> dict:
    """A verified episode's result with its error class (``none`` or, if it says why not, ``task``)."""
    out.setdefault("error_class", "none" if not out.get("error") else "task")
    return out


class _FrameConn:
    """One side of a framed JSON pipe (see :mod:`envs.isolation`)."""

    def __init__(self, read_fd: int, write_fd: int):
        self.r, self.w = read_fd, write_fd

    def send(self, obj, deadline: float | None = None) -> None:
        write_frame(self.w, dumps(obj), deadline)

    def recv(self, max_bytes: int = MAX_FRAME, deadline: float | None = None):
        try:
            return loads(read_frame(self.r, deadline, max_bytes=max_bytes))
        except ProtocolError as exc:
            raise EOFError(str(exc)) from exc


# after these, what environment code forked is killed: by its environment's process, by the worker
# (a namespace's PID 1 inherits the orphans) and, for an unconfined worker, by the supervisor
END_OPS = ("episode", "finish", "vfinish", "vdrop")


class _Worker:
    """The trainer's handle on one sandbox: a supervisor process and, behind it, a worker."""

    def __init__(self, limits: Limits):
        home = tempfile.mkdtemp(prefix="envsched-supervisor-")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "envs.sandbox", "supervise", json.dumps(asdict(limits))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=home,
            env=scrubbed_env(home),
            start_new_session=True,
            close_fds=True,
        )
        self.home = home
        self.w, self.r = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        self.worker_pid: int | None = None
        self.episodes = 0

    def call(self, msg, timeout: float):
        """(status, payload...) of the worker's reply; raises TimeoutError (the worker hung: the
        supervisor already replaced it) or EOFError (it crashed or broke the protocol)."""
        deadline = time.monotonic() + timeout + 5.0  # the supervisor enforces ``timeout`` on the worker
        try:
            write_frame(self.w, dumps({"deadline": timeout, "ends_episode": msg[0] in END_OPS}), deadline)
            write_frame(self.w, dumps(msg), deadline)
            ctrl = loads(read_frame(self.r, deadline))
        except ProtocolError as exc:
            raise EOFError(str(exc)) from exc
        except (BrokenPipeError, OSError) as exc:
            raise EOFError(str(exc)) from exc
        self.worker_pid = ctrl.get("worker_pid")
        if ctrl.get("status") == "timeout":
            raise TimeoutError
        if ctrl.get("status") != "ok":
            raise EOFError(ctrl.get("detail") or "the environment worker crashed")
        try:
            return loads(read_frame(self.r, deadline))
        except ProtocolError as exc:
            raise EOFError(str(exc)) from exc

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.worker_pid:
            kill_quietly(self.worker_pid, group=True)
        kill_quietly(self.proc.pid, group=True)
        try:
            self.proc.kill()
            self.proc.wait(2)
        except Exception:
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        shutil.rmtree(self.home, ignore_errors=True)


class SandboxPool:
    def __init__(self, workers: int = 2, limits: Limits | None = None):
        self.limits = limits or Limits()
        self.size = max(1, int(workers))
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._lock = threading.Lock()
        self._all: list[_Worker] = []
        self.stats = {"episodes": 0, "timeouts": 0, "crashes": 0, "respawns": 0}
        for _ in range(self.size):
            self._idle.put(self._spawn())
        if not SandboxPool._confinement_told:
            SandboxPool._confinement_told = True
            self._tell_missing_confinement()

    def _spawn(self) -> _Worker:
        w = _Worker(self.limits)
        with self._lock:
            self._all.append(w)
        return w

    def _replace(self, w: _Worker) -> _Worker:
        w.kill()
        with self._lock:
            if w in self._all:
                self._all.remove(w)
            self.stats["respawns"] += 1
        return self._spawn()

    def _checkout(self) -> _Worker:
        w = self._idle.get()
        if not w.alive() or w.episodes >= self.limits.episodes_per_worker:
            w = self._replace(w)
        return w

    def _checkin(self, w: _Worker) -> None:
        self._idle.put(w)

    _confinement_told = False  # a missing layer is told once per process, not once per pool

    def _tell_missing_confinement(self) -> None:
        try:
            report = self.confinement()
        except RuntimeError:
            return  # a worker that cannot answer fails the episodes it is given, and says so there
        if report["notes"]:
            warnings.warn(
                "environment code runs less confined on this host: "
                + "; ".join(report["notes"])
                + " (envsched env sandbox shows every layer)",
                RuntimeWarning,
                stacklevel=3,
            )

    def confinement(self) -> dict:
        """What confines environment code in this pool's workers (``isolation.confine``'s report:
        PID namespace, network, filesystem, uid, and notes on any layer the host refused)."""
        w = self._checkout()
        try:
            status, *payload = w.call(("confinement",), self.limits.episode_seconds)
        except (TimeoutError, EOFError, OSError) as exc:
            w = self._replace(w)
            raise RuntimeError(
                f"the sandbox worker did not report its confinement ({type(exc).__name__})"
            ) from exc
        finally:
            self._checkin(w)
        if status != "ok":
            raise RuntimeError(f"the sandbox worker did not report its confinement: {payload}")
        return payload[0]

    # ------------------------------------------------------------------ batch mode
    def run_episode(self, spec: dict, actions: list, answer: str | None = None) -> dict:
        w = self._checkout()
        t0 = time.perf_counter()
        try:
            status, *payload = w.call(("episode", spec, actions, answer), self.limits.episode_seconds)
        except TimeoutError:
            self.stats["timeouts"] += 1
            w = self._replace(w)
            return _failure("timeout", f"episode exceeded {self.limits.episode_seconds:g}s")
        except (EOFError, OSError, BrokenPipeError) as exc:
            self.stats["crashes"] += 1
            w = self._replace(w)
            return _failure("env_crash", f"environment worker died ({type(exc).__name__})")
        finally:
            w.episodes += 1
            self.stats["episodes"] += 1
            self._checkin(w)
        if status == "ok":
            out = payload[0]
        else:
            out = self._failed(*payload)
        out["seconds"] = time.perf_counter() - t0
        return out

    def _failed(self, kind: str, message: str, lost: str | None = None) -> dict:
        """An episode's error reply as its result; one whose environment's process died or was
        ended under it (marked ``LOST``) counts as a crash or a timeout, as a dead or hung worker does."""
        if lost == LOST:
            self.stats["timeouts" if kind == "timeout" else "crashes"] += 1
        return _failure(kind, message)

    def map_episodes(
        self, jobs: Iterable[tuple], progress: Callable[[int, int], None] | None = None
    ) -> list[dict]:
        """Run (spec, actions[, answer]) jobs over the workers; results in job order."""
        jobs = list(jobs)
        out: list[dict | None] = [None] * len(jobs)
        done = 0
        lock = threading.Lock()

        def one(j):
            nonlocal done
            job = jobs[j]
            out[j] = self.run_episode(job[0], job[1], job[2] if len(job) > 2 else None)
            with lock:
                done += 1
                if progress:
                    progress(done, len(jobs))

        with ThreadPoolExecutor(max_workers=self.size) as ex:
            list(ex.map(one, range(len(jobs))))
        return out  # type: ignore[return-value]

    # ------------------------------------------------------------------ interactive
    def session(self, spec: dict) -> Session:
        return Session(self, spec)

    def batch(
        self, envs: dict[str, dict], episodes: list[tuple[str, dict]], kind: str = "envscaler"
    ) -> VectorBatch:
        """Many interactive episodes in lock-step over all workers (see :class:`VectorBatch`)."""
        return VectorBatch(self, envs, episodes, kind)

    def close(self) -> None:
        with self._lock:
            workers = list(self._all)
            self._all.clear()
        for w in workers:
            w.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Session:
    """One interactive episode on one worker; every call is bounded by the episode deadline."""

    def __init__(self, pool: SandboxPool, spec: dict):
        self.pool, self.spec = pool, spec
        self.worker = pool._checkout()
        self.deadline = time.perf_counter() + pool.limits.episode_seconds
        self.failed: dict | None = None

    def _call(self, msg):
        if self.failed is not None:
            return None
        left = self.deadline - time.perf_counter()
        try:
            if left <= 0:
                raise TimeoutError
            status, *payload = self.worker.call((*msg, left), left)  # the worker holds its end to it
        except TimeoutError:
            self.pool.stats["timeouts"] += 1
            self.worker = self.pool._replace(self.worker)
            self.failed = _failure("timeout", f"episode exceeded {self.pool.limits.episode_seconds:g}s")
            return None
        except (EOFError, OSError, BrokenPipeError) as exc:
            self.pool.stats["crashes"] += 1
            self.worker = self.pool._replace(self.worker)
            self.failed = _failure("env_crash", f"environment worker died ({type(exc).__name__})")
            return None
        if status != "ok":
            self.failed = self.pool._failed(*payload)
            return None
        return payload[0]

    def reset(self):
        return self._call(("open", self.spec))

    def step(self, call: dict):
        out = self._call(("step", call))
        return out if out is not None else f"Error: {self.failed['error'] if self.failed else 'no result'}"

    def end_turn(self, answer: str | None):
        return self._call(("end_turn", answer))

    def finish(self, answer: str | None = None) -> dict:
        out = self._call(("finish", answer))
        return self.failed if out is None else out

    def close(self):
        if self.worker is not None:
            self.worker.episodes += 1
            self.pool.stats["episodes"] += 1
            self.pool._checkin(self.worker)
            self.worker = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class VectorBatch:
    """Many interactive episodes at once, spread over the pool's workers, one message per worker
    per operation (the neural learner steps hundreds of episodes in lock-step).

        b = pool.batch(envs, [(env_key, task_row), ...])
        firsts = b.reset()                        # per episode: {"observation", "tools"} or None (failed)
        obs = b.step({j: call, ...})              # tool results for the episodes given
        res = b.finish({j: answer, ...})          # verifier results; the episode is closed

    An environment's process that dies or hangs under an operation is ended by the worker, which
    marks its episodes ``LOST``; a worker that hangs or dies is replaced. Either way the episodes
    are replayed one by one (reset + the calls they made so far) so that only the episode that
    hangs or crashes fails (``timeout`` / ``env_crash``): one episode's failure costs that rollout only.
    """

    def __init__(self, pool: SandboxPool, envs: dict[str, dict], episodes: list[tuple[str, dict]], kind: str):
        self.pool, self.envs, self.kind = pool, envs, kind
        self.episodes = episodes
        self.history: list[list[dict]] = [[] for _ in episodes]
        self.failed: dict[int, dict] = {}
        self.closed: set[int] = set()
        self.workers = [pool._checkout() for _ in range(min(pool.size, max(1, len(episodes))))]
        self.owner = [j % len(self.workers) for j in range(len(episodes))]
        # a worker's generation counts its replacements; an episode is open on its worker only if
        # it was opened in that worker's current generation (else it is replayed at its next call)
        self.generation = [0] * len(self.workers)
        self.opened_in = [0] * len(episodes)

    def _replace(self, w: int) -> None:
        self.workers[w] = self.pool._replace(self.workers[w])
        self.generation[w] += 1

    def _deadline(self, n: int) -> float:
        return vector_seconds(self.pool.limits, n)

    def _open_items(self, js: list[int]) -> list[tuple]:
        return [(j, self.episodes[j][0], self.episodes[j][1], {"kind": self.kind}) for j in js]

    def _send(self, w: int, op: str, payload: list[tuple], envs: dict | None = None) -> list[tuple] | None:
        msg = (op, envs, payload) if op == "vopen" else (op, payload)
        try:
            status, *out = self.workers[w].call(msg, self._deadline(len(payload)))
        except (TimeoutError, EOFError, OSError, BrokenPipeError):
            return None
        return out[0] if status == "ok" else None

    def _run(self, op: str, items: dict[int, object]) -> dict[int, tuple]:
        by_worker: dict[int, list[int]] = {}
        for j in items:
            if j not in self.failed:
                by_worker.setdefault(self.owner[j], []).append(j)
        results: dict[int, tuple] = {}

        def one(w: int) -> None:
            js = by_worker[w]
            for j in [j for j in js if op != "vopen" and self.opened_in[j] != self.generation[w]]:
                results[j] = self._solo(w, j, op, items[j])  # its worker was replaced since it opened
                js.remove(j)
            if not js:
                return
            if op == "vopen":
                for j in js:
                    self.opened_in[j] = self.generation[w]
                envs = {self.episodes[j][0]: self.envs[self.episodes[j][0]] for j in js}
                out = self._send(w, op, self._open_items(js), envs)
            else:
                out = self._send(w, op, [(j, items[j]) for j in js])
            if out is None:  # the worker hung or died: isolate the episode that did it
                results.update(self._isolate(w, op, js, items))
                return
            for eid, *res in out:
                # an environment's process died under its episodes: replay each alone in a new one
                lost = res[0] == "error" and len(res) == 4 and res[3] == LOST
                results[eid] = self._solo(w, eid, op, items[eid]) if lost else tuple(res)

        with ThreadPoolExecutor(max_workers=max(1, len(by_worker))) as ex:
            list(ex.map(one, list(by_worker)))
        return results

    def _isolate(self, w: int, op: str, js: list[int], items: dict[int, object]) -> dict[int, tuple]:
        """Replace worker ``w`` and replay the operation's episodes one at a time: only an episode
        that fails on its own is failed; the others get their result as if nothing had happened
        (the worker's other open episodes are replayed at their next operation)."""
        self._replace(w)
        return {j: self._solo(w, j, op, items[j]) for j in js}

    def _solo(self, w: int, j: int, op: str, arg) -> tuple:
        """Re-open episode ``j`` on worker ``w``, replay its calls, then run ``op``; the last outcome."""
        seconds = self._deadline(1)
        ops = [("vopen", None)] + [("vstep", c) for c in self.history[j]]
        if op != "vopen":
            ops.append((op, arg))
        last: tuple = ("error", "infra", "nothing ran")
        for o, a in ops:
            if o == "vopen":
                msg = (o, {self.episodes[j][0]: self.envs[self.episodes[j][0]]}, self._open_items([j]))
                self.opened_in[j] = self.generation[w]
            else:
                msg = (o, [(j, a)])
            try:
                status, *got = self.workers[w].call(msg, seconds)
            except TimeoutError:
                self.pool.stats["timeouts"] += 1
                self._replace(w)
                return ("error", "timeout", f"episode exceeded {seconds:g}s")
            except (EOFError, OSError, BrokenPipeError) as exc:
                self.pool.stats["crashes"] += 1
                self._replace(w)
                return ("error", "env_crash", f"environment worker died ({type(exc).__name__})")
            if status != "ok":
                return ("error", "infra", str(got))
            last = tuple(got[0][0][1:])
            if last[0] != "ok":
                return last
        return last

    def _fail(self, j: int, res: tuple) -> None:
        self.failed[j] = self.pool._failed(*res[1:])

    def reset(self) -> list[dict | None]:
        got = self._run("vopen", {j: None for j in range(len(self.episodes))})
        out: list[dict | None] = []
        for j in range(len(self.episodes)):
            r = got.get(j)
            if r is None or r[0] != "ok":
                self._fail(j, r or ("error", "infra", "no result"))
                out.append(None)
            else:
                first = r[1]
                if isinstance(first, dict) and "same_tools_as" in first:
                    src = got[first.pop("same_tools_as")][1]
                    first["tools"] = src.get("tools")
                out.append(first)
        return out

    def step(self, calls: dict[int, dict]) -> dict[int, str]:
        got = self._run("vstep", calls)
        out = {}
        for j, call in calls.items():
            r = got.get(j)
            if j in self.failed:
                out[j] = f"Error: {self.failed[j]['error']}"
            elif r is None or r[0] != "ok":
                self._fail(j, r or ("error", "infra", "no result"))
                out[j] = f"Error: {self.failed[j]['error']}"
            else:
                self.history[j].append(call)
                out[j] = r[1]
        return out

    def finish(self, answers: dict[int, str | None]) -> dict[int, dict]:
        got = self._run("vfinish", answers)
        out = {}
        for j in answers:
            r = got.get(j)
            if j in self.failed:
                out[j] = self.failed[j]
            elif r is None or r[0] != "ok":
                self._fail(j, r or ("error", "infra", "no result"))
                out[j] = self.failed[j]
            else:
                out[j] = r[1]
            self.closed.add(j)
        return out

    def close(self) -> None:
        """Give the workers back; episodes never finished (an exception in the caller, an agent
        loop cut short) are ended first, unverified, with whatever their code forked, so that they
        hold no memory or process in the pool's workers."""
        for w in range(len(self.workers)):
            js = [
                j
                for j in range(len(self.episodes))
                if self.owner[j] == w and j not in self.closed and self.opened_in[j] == self.generation[w]
            ]
            if js and self._send(w, "vdrop", [(j, None) for j in js]) is None:
                self._replace(w)
        for w in self.workers:
            w.episodes += 1
            self.pool._checkin(w)
        self.pool.stats["episodes"] += len(self.episodes)
        self.workers = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _serve() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "work"
    limits_json = sys.argv[2] if len(sys.argv) > 2 else json.dumps(asdict(Limits()))
    if mode == "supervise":
        supervise(limits_json)
    else:
        _worker_main(Limits(**json.loads(limits_json)))


if __name__ == "__main__":
    _serve()
