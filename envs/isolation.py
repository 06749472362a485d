"""Process isolation for untrusted environment code: framed JSON pipes with deadlines, a supervisor
between the trainer and each worker, a scrubbed environment and a private working directory.

    trainer ──frames──▶ supervisor (our code, child subreaper) ──frames──▶ worker (untrusted code)

* **Frames**: a 4-byte length, then UTF-8 JSON (never pickle: a worker cannot make the trainer
  run code by what it sends). Every read and write has a deadline; a frame larger than
  ``MAX_FRAME`` or not JSON is a protocol violation (the worker is killed, the episode fails).
* **Supervisor**: relays each request to its worker and the reply back within the request's
  deadline; on a timeout or a crash it kills the worker's process group and starts a fresh worker.
  It is the worker's parent, so ``os.getppid()`` in environment code is the supervisor (confined:
  0, a process outside its namespace), never the trainer. What environment code forks dies at
  its episode's end: its environment's process kills its children, and a daemon that escaped them
  (even after ``setsid``) is an orphan of the worker (confined: the PID 1 of its namespace) or of
  the supervisor, a child subreaper, which kills it.
* **Worker**: its own session (``setsid``), an allow-listed environment (no API keys, no lake
  path), ``HOME``/``TMPDIR``/cwd in a private temporary folder outside the lake, address-space
  and CPU limits, and ``PR_SET_PDEATHSIG`` so it dies with its supervisor.
* **Confinement** (:func:`confine`, Linux): before any untrusted code the worker enters its own
  PID, mount, IPC, UTS and network namespaces and a private root: it is PID 1 of a namespace with
  a fresh /proc (no other process to see, signal or read), has no network interface, sees only the
  system folders and the Python paths (read-only) besides its home, and drops to a user of its
  own when the trainer is root; a seccomp filter (also where namespaces are refused) refuses the syscalls
  environments never need. A layer the host refuses (a container without namespaces, another OS)
  is left out and named in the worker's report (``SandboxPool.confinement()``).

What remains possible even confined: reading the system folders and the Python installation
(world-readable files a user can read anyway), using its CPU and memory up to the limits, and the
syscalls the seccomp denylist leaves.
Without namespaces (see the report) it can also open network connections, read files readable by
the user and signal the user's other processes. Do not import pools from sources you would not run
code from.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

MAX_FRAME = 256 * 1024 * 1024
ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "PYTHONHASHSEED", "TZ", "ENVSCHED_SANDBOX_CONFINE")
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
        LOGNAME="envsched-sandbox",  # its user may have no passwd entry (getpass reads these first)
        USER="envsched-sandbox",
    )
    return env


def process_tree(*, zombies: bool = True) -> dict[int, int]:
    """Every process's parent, from one pass over /proc (pid -> parent pid); ``zombies=False``
    leaves out processes that have exited and only wait to be reaped."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                record = fh.read().decode(errors="replace")
            fields = record.rsplit(")", 1)[1].split()
            ppid = int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
        if not zombies and fields[0] == "Z":
            continue  # a zombie has no children: they were re-parented when it exited
        parents[int(entry)] = ppid
    return parents


def descendants(root: int, *, zombies: bool = True) -> list[int]:
    """Pids of every process below ``root`` (one look at /proc)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in process_tree(zombies=zombies).items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def children_of(pid: int) -> set[int]:
    """The children of ``pid`` (of every thread of it): from /proc/PID/task/*/children, a few
    reads, where the kernel keeps that file; else from one pass over /proc."""
    try:
        out: set[int] = set()
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out.update(int(x) for x in fh.read().split())
        return out
    except (OSError, ValueError):
        return {p for p, parent in process_tree().items() if parent == pid}


def end_children(keep: set[int] | frozenset = frozenset(), rounds: int = 50) -> None:
    """Kill every child of this process but ``keep``, and the children their deaths hand to it
    (the PID 1 of a namespace inherits its orphans), until none is left (bounded)."""
    for _ in range(rounds):
        extra = children_of(os.getpid()) - set(keep)
        if not extra:
            return
        for pid in extra:
            kill_quietly(pid)
        for pid in extra:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def reap_orphans(*_signal) -> None:
    """Collect every child that has exited, without blocking (also a SIGCHLD handler)."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


@contextmanager
def reaping(enabled: bool):
    """For the PID 1 of a namespace, the parent of every orphan in it: while it waits for its next
    request (no environment code runs) exited processes are reaped as they go; during a request
    they are left alone, so environment code can wait for its own children."""
    if not enabled:
        yield
        return
    reap_orphans()
    previous = signal.signal(signal.SIGCHLD, reap_orphans)
    try:
        yield
    finally:
        signal.signal(signal.SIGCHLD, previous)


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
        # Environment code runs in the worker's per-environment processes, which kill their own
        # children when an episode ends; what escaped them (a daemon that forked twice) was handed
        # to us, the child subreaper (confined workers keep theirs in their namespace's PID 1).
        end_children(keep={worker.proc.pid})

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


def worker_setup(memory_mb: int, cpu_seconds: int, file_mb: int = 256) -> tuple[int, int]:
    """In the worker, before any untrusted code: die with the supervisor, resource limits, and the
    protocol moved off stdout (what environment code prints goes to stderr, i.e. nowhere).
    Returns (read fd, write fd) of the protocol."""
    import resource  # Unix only; the worker is the only place that sets limits

    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    try:
        mem = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb << 20, file_mb << 20))
    except (ValueError, OSError):
        pass
    proto_out = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return 0, proto_out


# ---------------------------------------------------------------------------- confinement (Linux)
# Namespaces and a private root, entered by the worker before any untrusted code runs. Each layer is
# best effort: what the kernel or the container refuses is left out and named in the report.
_NEWNS, _NEWUTS, _NEWIPC, _NEWUSER, _NEWPID, _NEWNET = (
    0x00020000,
    0x04000000,
    0x08000000,
    0x10000000,
    0x20000000,
    0x40000000,
)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = (
    1,
    2,
    4,
    8,
    32,
    4096,
    16384,
    1 << 18,
)
_MNT_DETACH, _PR_SET_NO_NEW_PRIVS, _PR_SET_DUMPABLE = 2, 38, 4
# as root, each worker drops to a user of its own: SANDBOX_UID_BASE + the pid of the worker (unique
# while it lives), so its process limit, signals and files are its alone, never another worker's
SANDBOX_UID_BASE = 1_000_000
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc")
DEVICES = ("null", "zero", "random", "urandom")
PROCESS_LIMIT = 512  # processes of a worker's own user (fork bombs stop there, in that worker)


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
    libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
    libc.unshare.argtypes = (ctypes.c_int,)
    return libc


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_libc().mount(enc(src), enc(dst), enc(fstype), flags, enc(data)), f"mount {dst}")


def _bind(src: str, dst: str, *, writable: bool = False) -> None:
    """Bind ``src`` at ``dst``, read-only unless ``writable`` (a writable bind leaves out the mounts
    below ``src``); keeps the flags the source's mount has locked (nosuid, nodev, noexec), which a
    remount inside a user namespace may not drop."""
    _mount(src, dst, None, _MS_BIND | (0 if writable else _MS_REC))
    st = os.statvfs(src)
    keep = st.f_flag & (_MS_NOSUID | _MS_NODEV | _MS_NOEXEC | (0 if writable else _MS_RDONLY))
    ro = 0 if writable else _MS_RDONLY
    _mount(None, dst, None, _MS_BIND | _MS_REMOUNT | _MS_NOSUID | ro | keep)


IMPORTABLE = (".py", ".pyc", ".so", ".pth", ".zip", ".egg")


def _importable(folder: str) -> list[str]:
    """What the import system can load from a folder on ``sys.path``: its packages (folders with
    ``__init__.py``), modules and extension files. A site-packages folder counts whole (metadata,
    namespace packages); any other folder (a project, a script's folder, /tmp) gives only these,
    so a project's lake, its git history and its dotfiles stay outside."""
    if os.path.basename(folder.rstrip("/")) in ("site-packages", "dist-packages"):
        return [folder]
    out = []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    for name in names:
        full = os.path.join(folder, name)
        if os.path.isdir(full) and os.path.isfile(os.path.join(full, "__init__.py")):
            out.append(full)
        elif os.path.isfile(full) and name.endswith(IMPORTABLE):
            out.append(full)
    return out


def _python_paths() -> tuple[list[str], list[str]]:
    """What the worker's interpreter reads, as (needed, optional). Needed: its installation, the
    folders of the packages it has imported and those an editable install maps. Optional: what it
    can import from each other ``sys.path`` folder. The sandbox's own private folders (the
    supervisor's, on the import path as the worker's working directory, and the worker's home) are
    never among them."""
    prefixes = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        os.path.dirname(os.path.dirname(sys.executable)),
    }
    needed, optional = set(prefixes), set()
    real_prefixes = tuple(os.path.realpath(p).rstrip("/") + "/" for p in prefixes)
    for entry in sys.path:
        if entry and os.path.isdir(entry) and not os.path.realpath(entry).startswith(real_prefixes):
            optional.update(_importable(os.path.abspath(entry)))
    for name, module in list(sys.modules.items()):
        mapping = getattr(module, "MAPPING", None) if name.startswith("__editable__") else None
        if isinstance(mapping, dict):
            needed.update(p for p in mapping.values() if isinstance(p, str) and os.path.isdir(p))
        where = getattr(module, "__file__", None)
        if "." not in name and isinstance(where, str) and where.endswith("__init__.py"):
            needed.add(os.path.dirname(where))
    private = ("envsched-supervisor-", "envsched-sandbox-")

    def spelled(paths: set[str]) -> list[str]:
        out = {q for p in paths for q in (os.path.realpath(p), os.path.abspath(p))}
        return sorted(
            p for p in out if p != "/" and not any(part.startswith(private) for part in p.split("/"))
        )

    needed_out = spelled(needed)
    return needed_out, [p for p in spelled(optional) if p not in needed_out]


def _build_root(new: str, home: str, paths: list[str], disk_mb: int, owner: int | None) -> None:
    """A root for the worker on a tmpfs at ``new``: system directories and ``paths`` bound
    read-only; ``home`` and /tmp writable, each a tmpfs of ``disk_mb`` (in memory: nothing it
    writes reaches the host's disk, and it cannot fill it), ``home`` owned by ``owner``; four
    devices and a fresh /proc (of the worker's own PID namespace)."""
    _mount("tmpfs", new, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=1m")
    bound: list[str] = []

    def inside(p: str) -> str:
        return os.path.join(new, p.lstrip("/"))

    def under_bound(p: str) -> bool:
        return any(p == b or p.startswith(b.rstrip("/") + "/") for b in bound)

    for p in SYSTEM_PATHS:
        if os.path.islink(p):
            os.symlink(os.readlink(p), inside(p))
        elif os.path.isdir(p):
            os.makedirs(inside(p), mode=0o755)
            _bind(p, inside(p))
            bound.append(p)
    os.makedirs(inside("/tmp"), mode=0o755)
    _mount("tmpfs", inside("/tmp"), "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=1777,size={disk_mb}m")
    for p in paths:
        if under_bound(p) or os.path.islink(p) and under_bound(os.path.realpath(p)):
            continue
        if os.path.isdir(p):
            os.makedirs(inside(p), mode=0o755, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(inside(p)), mode=0o755, exist_ok=True)
            open(inside(p), "a").close()
        _bind(p, inside(p))
        bound.append(p)
    os.makedirs(inside(home), mode=0o755, exist_ok=True)
    ids = "" if owner is None else f",uid={owner},gid={owner}"
    _mount("tmpfs", inside(home), "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=0700,size={disk_mb}m{ids}")
    os.makedirs(inside("/dev"), mode=0o755)
    for d in DEVICES:
        if os.path.exists(f"/dev/{d}"):
            open(inside(f"/dev/{d}"), "w").close()
            _bind(f"/dev/{d}", inside(f"/dev/{d}"), writable=True)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, inside(f"/dev/{name}"))
    os.makedirs(inside("/proc"), mode=0o555)
    _mount("proc", inside("/proc"), "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)


def _pivot(new: str) -> None:
    """Make ``new`` the root and detach the old one (no way back to it, unlike chroot)."""
    import platform  # only the private root needs the machine's syscall number

    numbers = dict(zip(SECCOMP_MACHINES, _DENIED_SYSCALLS["pivot_root"], strict=True))
    number = numbers.get(platform.machine())
    if number is None:
        raise OSError(0, f"pivot_root: no syscall number known for {platform.machine()}")
    os.chdir(new)
    os.mkdir(".old-root", 0o700)
    _check(_libc().syscall(number, b".", b".old-root"), "pivot_root")
    os.chdir("/")
    _check(_libc().umount2(b"/.old-root", _MNT_DETACH), "umount old root")
    os.rmdir("/.old-root")
    _mount(None, "/", None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)


def _uid_mapped(uid: int) -> bool:
    """Whether this process's user namespace has ``uid`` (a rootless container maps only a few)."""
    try:
        with open("/proc/self/uid_map") as fh:
            ranges = [tuple(int(x) for x in line.split()) for line in fh if line.strip()]
    except (OSError, ValueError):
        return True  # no user namespaces here: every uid exists
    return any(inside <= uid < inside + count for inside, _outside, count in ranges)


def _readable_by_others(path: str) -> bool:
    """Whether an unprivileged user can read ``path`` (a folder: and what lies directly in it).
    Its parents in the private root are our own 0755 folders, so only its own modes count."""
    try:
        mode = os.stat(path).st_mode
        if mode & 0o004 == 0 or stat.S_ISDIR(mode) and mode & 0o001 == 0:
            return False
        if stat.S_ISDIR(mode):
            for entry in os.scandir(path):
                mode = entry.stat(follow_symlinks=True).st_mode
                if mode & 0o004 == 0 or stat.S_ISDIR(mode) and mode & 0o001 == 0:
                    return False
    except OSError:
        return False
    return True


# Syscalls environment code never needs and that widen what it can reach of the kernel: tracing and
# reading other processes, modules, kexec, BPF, perf, keyrings, namespaces and mounts, swap, reboot,
# accounting, userfaultfd, file handles, port I/O (x86 only), io_uring. Numbers per machine (x86_64:
# asm/unistd_64.h; aarch64: asm-generic/unistd.h). clone3 answers ENOSYS (its flags sit behind a
# pointer; C libraries fall back to clone, whose namespace flags are refused).
_DENIED_SYSCALLS = {  # name: (x86_64, aarch64)
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "init_module": (175, 105),
    "finit_module": (313, 273), "delete_module": (176, 106), "bpf": (321, 280),
    "perf_event_open": (298, 241), "keyctl": (250, 219), "add_key": (248, 217),
    "request_key": (249, 218), "unshare": (272, 97), "setns": (308, 268), "mount": (165, 40),
    "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51), "swapon": (167, 224),
    "swapoff": (168, 225), "reboot": (169, 142), "acct": (163, 89), "userfaultfd": (323, 282),
    "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264), "iopl": (172, None),
    "ioperm": (173, None), "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432),
    "move_mount": (429, 429), "open_tree": (428, 428), "mount_setattr": (442, 442),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
}  # fmt: skip
# per machine: its AUDIT_ARCH (the filter refuses any other ABI: i386 and x32 on x86_64), clone, clone3
SECCOMP_MACHINES = {"x86_64": (0xC000003E, 56, 435), "aarch64": (0xC00000B7, 220, 435)}
_NAMESPACE_FLAGS = _NEWNS | _NEWUTS | _NEWIPC | _NEWUSER | _NEWPID | _NEWNET | 0x02000000  # + cgroup
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2


def _seccomp_program(machine: str = "x86_64") -> list[tuple[int, int, int, int]]:
    """A classic-BPF seccomp filter (code, jt, jf, k) for ``machine``: the denied syscalls answer
    EPERM, clone3 ENOSYS, clone with a namespace flag EPERM, any other ABI (i386, x32) ENOSYS; the
    rest runs."""
    column = list(SECCOMP_MACHINES).index(machine)
    audit_arch, clone, clone3 = SECCOMP_MACHINES[machine]
    denied = [nrs[column] for nrs in _DENIED_SYSCALLS.values() if nrs[column] is not None]
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, errno = 0x7FFF0000, 0x00050000
    body: list = [(ld, 0, 0, 4), (jeq, 1, 0, audit_arch), (ret, 0, 0, errno | 38)]
    body += [(ld, 0, 0, 0), (jge, "eperm", 0, 0x40000000)]
    body += [(jeq, "eperm", 0, nr) for nr in denied]
    body += [(jeq, "enosys", 0, clone3), (jeq, "clone", 0, clone), (ret, 0, 0, allow)]
    labels = {"clone": len(body)}
    body += [(ld, 0, 0, 16), (jset, "eperm", 0, _NAMESPACE_FLAGS), (ret, 0, 0, allow)]
    labels["eperm"] = len(body)
    body.append((ret, 0, 0, errno | 1))
    labels["enosys"] = len(body)
    body.append((ret, 0, 0, errno | 38))
    return [(c, labels[t] - i - 1 if isinstance(t, str) else t, f, k) for i, (c, t, f, k) in enumerate(body)]


def _install_seccomp() -> None:
    """Install the filter on this process (inherited by every process it forks; needs
    ``no_new_privs``). Raises OSError where the kernel refuses or the machine has no syscall table
    here (``SECCOMP_MACHINES``: x86_64, aarch64)."""
    import platform  # only the filter needs the machine's syscall numbers

    machine = platform.machine()
    if machine not in SECCOMP_MACHINES:
        raise OSError(0, f"no syscall table here for {machine}")

    class Instruction(ctypes.Structure):
        _fields_ = [
            ("code", ctypes.c_ushort),
            ("jt", ctypes.c_ubyte),
            ("jf", ctypes.c_ubyte),
            ("k", ctypes.c_uint),
        ]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Instruction))]

    program = _seccomp_program(machine)
    instructions = (Instruction * len(program))(*[Instruction(*ins) for ins in program])
    prog = Program(len(program), instructions)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong)
    _check(libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0), "seccomp")


def _harden(report: dict) -> dict:
    """What holds with or without namespaces: no new privileges, not dumpable (no process of the
    same user may ptrace this one or its forks, nor read their memory; a drop of user does it
    too, a user namespace not), and the seccomp filter."""
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    _prctl(_PR_SET_DUMPABLE, 0)
    try:
        _install_seccomp()
        report["seccomp"] = True
    except OSError as exc:
        report["notes"].append(f"seccomp filter refused ({exc.strerror or exc}); all syscalls allowed")
    return report


def confine(home: str, *, network: bool = False, disk_mb: int = 64) -> dict:
    """Enter the worker's confinement before any untrusted code runs; returns what holds.

    * PID, mount, IPC and UTS namespaces (and a user namespace when not root): the worker is
      PID 1 of its own namespace, sees only its own processes in a fresh /proc, cannot name, signal
      or read the trainer or any other process; whatever it forks dies with it;
    * a network namespace with no interfaces up, unless ``network`` (no connections out, none in);
    * a private root (pivot_root): the system directories and the Python installation and import
      paths read-only, ``home`` and a private /tmp writable; nothing else of the host's files;
    * when the trainer runs as root: the worker drops to a user of its own (``SANDBOX_UID_BASE`` +
      its pid: no access to root's files, no capabilities, a process limit that is this worker's
      alone), with ``no_new_privs`` so no setuid binary can raise it again.

    The process that calls it forks: the parent stays behind as the child's keeper (it only waits,
    then leaves with the child's exit code); the child returns and serves. Without Linux namespaces
    (another OS, a container that forbids them, ``ENVSCHED_SANDBOX_CONFINE=0``) it returns at
    once and the report says so."""
    report: dict = {
        "pid_namespace": False,
        "network": "host",
        "filesystem": "host",
        "uid": os.geteuid(),
        "seccomp": False,
        "notes": [],
    }
    if os.environ.get("ENVSCHED_SANDBOX_CONFINE", "1") == "0":
        report["notes"].append("confinement turned off (ENVSCHED_SANDBOX_CONFINE=0)")
        return report
    if not sys.platform.startswith("linux"):
        report["notes"].append(f"no Linux namespaces or seccomp on {sys.platform}")
        return report
    die_with_parent()  # the keeper below dies with the supervisor, and the worker with the keeper
    root = os.geteuid() == 0
    uid, gid = os.geteuid(), os.getegid()
    flags = _NEWPID | _NEWNS | _NEWIPC | _NEWUTS | (0 if network else _NEWNET) | (0 if root else _NEWUSER)
    try:
        _check(_libc().unshare(flags), "unshare")
    except OSError as exc:
        report["notes"].append(f"namespaces refused ({exc.strerror or exc}); running without them")
        return _harden(report)
    if not root:
        with open("/proc/self/setgroups", "w") as fh:
            fh.write("deny")
        with open("/proc/self/uid_map", "w") as fh:
            fh.write(f"0 {uid} 1")
        with open("/proc/self/gid_map", "w") as fh:
            fh.write(f"0 {gid} 1")
    own = SANDBOX_UID_BASE + os.getpid()  # the worker's user, as root (its pid, as the host knows it)
    child = os.fork()
    if child:  # the keeper: our code only, never the environment's
        _, status = os.waitpid(child, 0)  # retried by Python when a signal interrupts it
        os._exit(max(0, os.waitstatus_to_exitcode(status)))
    die_with_parent()
    report["pid_namespace"] = os.getpid() == 1
    report["network"] = "host" if network else "none"
    needed, optional = _python_paths()
    unreadable = next((p for p in needed if not _readable_by_others(p)), None) if root else None
    mapped = _uid_mapped(own)
    drop = root and unreadable is None and mapped
    try:
        _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
        new = os.path.join(home, ".root")
        os.makedirs(new, exist_ok=True)
        # after the drop an unreadable optional path could not be imported anyway
        paths = needed + [p for p in optional if not drop or _readable_by_others(p)]
        _build_root(new, home, paths, disk_mb, own if drop else None)
        _pivot(new)
        report["filesystem"] = "private root"
    except OSError as exc:
        drop = False  # the host's files: the Python installation may be readable by root alone
        report["notes"].append(f"private root refused ({exc}); the host's files stay visible")
        try:
            _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        except OSError as exc2:
            report["notes"].append(f"fresh /proc refused ({exc2}); the host's processes stay listed")
    os.chdir(home)
    if drop:
        import resource  # Unix only, like the rest of the worker's limits

        resource.setrlimit(resource.RLIMIT_NPROC, (PROCESS_LIMIT, PROCESS_LIMIT))
        os.setgroups([])
        os.setgid(own)
        os.setuid(own)
    elif root:
        why = (
            f"{unreadable} is not readable by other users"
            if unreadable
            else f"this user namespace maps no uid {own}"
            if not mapped
            else "no private root"
        )
        report["notes"].append(f"stays root: {why}")
    report["uid"] = os.geteuid() if root else uid  # as the host sees it (a user namespace maps it to 0)
    return _harden(report)
