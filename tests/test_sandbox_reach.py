"""Environment code cannot reach out: it cannot kill or hang the trainer, leave processes behind,
read the trainer's secrets, or write into the lake's folder (issue: a loop you can trust, class 7).
Where the host allows Linux namespaces (``envs.isolation.confine``): it cannot see, signal or read
any process but its own, has no network, sees no file but the system's and the Python paths', and
runs as a user of its own when the trainer is root. Those tests skip, naming why, on a host that refuses."""

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from envs.isolation import _DENIED_SYSCALLS, SANDBOX_UID_BASE, SECCOMP_MACHINES, _seccomp_program, descendants
from envs.registry import episode_spec
from envs.sandbox import SPARE_UNITS, Limits, SandboxPool

REACH = """
import json, os, socket, time
class Reach:
    def __init__(self, config):
        pass
    def kill_parent(self):
        os.kill(os.getppid(), 9)
        return "still here"
    def parent_pid(self):
        return str(os.getppid())
    def scribble(self):
        for fd in range(3, 64):
            try:
                os.write(fd, b"\\x00\\x00\\x00\\x10garbage-garbage!" * 4)
            except OSError:
                pass
        return "scribbled"
    def spawn_daemon(self):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.setsid()
            daemon = os.fork()
            if daemon == 0:
                time.sleep(120)
                os._exit(0)
            os.write(w, str(daemon).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        return os.read(r, 32).decode()
    def env(self):
        return json.dumps(dict(os.environ))
    def where(self):
        return os.getcwd() + "|" + os.environ.get("HOME", "")
    def processes(self):
        return json.dumps(sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
    def kill_everyone(self):
        os.kill(-1, 9)
        return "sent"
    def hunt(self, secret):
        for p in os.listdir("/proc"):
            for name in ("environ", "cmdline"):
                try:
                    with open(f"/proc/{p}/{name}", "rb") as fh:
                        if secret.encode() in fh.read():
                            return "found in " + p
                except OSError:
                    pass
        return "not found"
    def connect(self, port):
        s = socket.socket()
        s.settimeout(2)
        try:
            s.connect(("127.0.0.1", int(port)))
            return "connected"
        except OSError as exc:
            return "refused: " + str(exc)
    def exists(self, path):
        return json.dumps(os.path.exists(path))
    def read(self, path):
        try:
            with open(path) as fh:
                return "read: " + fh.read(10)
        except OSError as exc:
            return "refused: " + type(exc).__name__
    def write(self, path):
        try:
            with open(path, "w") as fh:
                fh.write("x")
            return "wrote"
        except OSError as exc:
            return "refused: " + type(exc).__name__
    def pry(self):
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        opened = []
        for p in (int(x) for x in os.listdir("/proc") if x.isdigit()):
            if p == os.getpid():
                continue
            try:
                with open(f"/proc/{p}/mem", "rb"):
                    opened.append(p)
            except OSError:
                pass
            if libc.ptrace(16, p, 0, 0) == 0:  # PTRACE_ATTACH
                opened.append(p)
                libc.ptrace(17, p, 0, 0)  # PTRACE_DETACH
        return json.dumps(opened)
    def flood(self):
        import envs.runtime
        envs.runtime.to_text = lambda value, limit=0: "x" * (64 << 20)  # past the runtime's cut
        return "anything"
    def syscalls(self):
        import ctypes, subprocess
        libc = ctypes.CDLL(None, use_errno=True)
        out = {}
        for name, call in (
            ("unshare", lambda: libc.unshare(0x10000000)),                   # a user namespace
            ("mount", lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)),
            ("bpf", lambda: libc.syscall(321, 0, 0, 0)),
            ("keyctl", lambda: libc.syscall(250, 0, 0, 0, 0, 0)),
            ("clone_newuser", lambda: libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)),
        ):
            ctypes.set_errno(0)
            out[name] = [call(), ctypes.get_errno()]
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        out["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        out["subprocess"] = subprocess.run(["true"]).returncode
        return json.dumps(out)
    def fill(self, path):
        written = 0
        try:
            with open(path, "wb") as fh:
                while written < 4096:
                    fh.write(b"x" * (1 << 20))
                    fh.flush()
                    written += 1
        except OSError:
            pass
        return str(written)
    def crash(self, code):
        os._exit(int(code))
    def kill_self(self):
        os.kill(os.getpid(), 9)
    def sleep_forever(self):
        import signal
        signal.signal(signal.SIGALRM, signal.SIG_IGN)  # past its per-call limit
        time.sleep(3600)
    def die_later(self):
        import threading
        threading.Thread(target=lambda: (time.sleep(0.3), os._exit(0)), daemon=True).start()
        return "armed"
    def fork_bomb(self):
        n = 0
        try:
            while n < 2000:
                if os.fork() == 0:
                    time.sleep(30)
                    os._exit(0)
                n += 1
        except OSError:
            pass
        return str(n)
"""
TOOLS = (
    "kill_parent",
    "parent_pid",
    "scribble",
    "spawn_daemon",
    "env",
    "where",
    "processes",
    "kill_everyone",
    "hunt",
    "connect",
    "exists",
    "read",
    "write",
    "fill",
    "syscalls",
    "flood",
    "pry",
    "fork_bomb",
    "crash",
    "kill_self",
    "die_later",
    "sleep_forever",
)


def reach_spec():
    tools = [{"type": "function", "function": {"name": n}} for n in TOOLS]
    env = {
        "env_id": "reach",
        "class_name": "Reach",
        "code": REACH,
        "tools": json.dumps(tools),
        "kind": "envscaler",
    }
    task = {
        "task_id": "reach-1",
        "env_id": "reach",
        "instruction": "x",
        "init_state": "{}",
        "checks": json.dumps(
            [{"check_item": "ok", "check_func": "def check_func(final_state):\n    return True"}]
        ),
    }
    return episode_spec(env, task)


def call(pool, name, **arguments):
    return pool.run_episode(reach_spec(), [{"name": name, "arguments": arguments}])


def output(pool, name, **arguments):
    return call(pool, name, **arguments)["tool_calls"][0]["output"]


@pytest.fixture
def pool():
    with SandboxPool(workers=1, limits=Limits(episode_seconds=5.0, call_seconds=2.0)) as p:
        yield p


def test_environment_code_never_sees_the_trainer_as_its_parent(pool):
    out = call(pool, "parent_pid")["tool_calls"][0]["output"]
    assert out != str(os.getpid())


def test_killing_its_parent_costs_one_rollout_not_the_trainer(pool):
    res = call(pool, "kill_parent")
    # unconfined, the parent is the supervisor and the rollout fails; confined, the parent lies
    # outside the worker's PID namespace (pid 0: the signal goes to its own group) and it goes on
    assert res["reward"] == 1.0 or res["error_class"] in ("env_crash", "timeout")
    assert call(pool, "parent_pid")["reward"] == 1.0  # the trainer (this process) and the pool go on


def test_writing_to_inherited_descriptors_never_blocks_the_trainer(pool):
    t0 = time.monotonic()
    res = call(pool, "scribble")
    assert time.monotonic() - t0 < 10
    assert res["reward"] in (0.0, 1.0)  # either the protocol survived or the rollout failed cleanly
    assert call(pool, "parent_pid")["reward"] == 1.0


def namespace_pids(pid: int) -> list[int]:
    """A process's pid in each PID namespace it is in, outermost first (/proc/PID/status NSpid)."""
    with open(f"/proc/{pid}/status") as fh:
        line = next(x for x in fh if x.startswith("NSpid:"))
    return [int(x) for x in line.split()[1:]]


def test_no_descendant_survives_the_episode(pool):
    res = call(pool, "spawn_daemon")  # forks, setsid()s, forks a daemon, returns the daemon's pid
    assert res["reward"] == 1.0
    daemon = int(res["tool_calls"][0]["output"])  # as environment code sees it (its namespace's)
    time.sleep(0.5)
    w = pool._idle.queue[0]
    below = descendants(w.proc.pid, zombies=False)
    assert below and all(namespace_pids(p)[-1] != daemon for p in below if os.path.exists(f"/proc/{p}"))
    assert set(descendants(os.getpid(), zombies=False)) == {w.proc.pid, *below}


def test_no_descendant_survives_the_episode_unconfined_either(monkeypatch):
    """Without namespaces the daemon is handed to the supervisor (a child subreaper), which ends it."""
    monkeypatch.setenv("ENVSCHED_SANDBOX_CONFINE", "0")
    with SandboxPool(workers=1, limits=Limits(episode_seconds=5.0, call_seconds=2.0)) as p:
        assert not p.confinement()["pid_namespace"]
        res = call(p, "spawn_daemon")
        daemon = int(res["tool_calls"][0]["output"])  # a host pid here
        time.sleep(0.5)
        assert not os.path.exists(f"/proc/{daemon}")
        w = p._idle.queue[0]
        assert daemon not in descendants(w.proc.pid, zombies=False)
        assert daemon not in descendants(os.getpid(), zombies=False)


def test_a_flood_of_output_costs_one_rollout_not_the_trainers_memory(pool):
    t0 = time.monotonic()
    res = call(pool, "flood")  # patches the runtime's 4,000-character cut, answers 64 MB
    assert res["reward"] == 0.0 and res["error_class"] == "env_crash"
    assert time.monotonic() - t0 < 10
    assert call(pool, "parent_pid")["reward"] == 1.0


def test_workers_see_no_secrets_and_work_outside_the_lake(pool, tmp_path, monkeypatch):
    monkeypatch.setenv("ENVSCHED_LLM_API_KEY", "sk-secret-value")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-value")
    monkeypatch.setenv("ENVSCHED_LAKE", str(tmp_path / "lake"))
    with SandboxPool(workers=1) as fresh:  # spawned with the secrets in the trainer's environment
        env = json.loads(call(fresh, "env")["tool_calls"][0]["output"])
        cwd, home = call(fresh, "where")["tool_calls"][0]["output"].split("|")
    assert "sk-secret-value" not in json.dumps(env) and "aws-secret-value" not in json.dumps(env)
    assert "ENVSCHED_LAKE" not in env and "ENVSCHED_LLM_API_KEY" not in env
    assert cwd == home and "envsched-sandbox-" in cwd and str(tmp_path) not in cwd


# ---------------------------------------------------------------------------- confinement
@pytest.fixture
def confined(pool):
    report = pool.confinement()
    if not report["pid_namespace"]:
        pytest.skip(f"this host refuses Linux namespaces: {report['notes']}")
    return report


def test_the_confinement_report_names_every_layer(pool):
    report = pool.confinement()
    assert set(report) == {"pid_namespace", "network", "filesystem", "uid", "seccomp", "notes"}
    assert report["network"] in ("none", "host") and report["filesystem"] in ("private root", "host")
    assert report["pid_namespace"] or report["notes"]  # a missing layer always says why


def test_confined_code_sees_and_signals_no_other_process(pool, confined):
    # a fresh /proc of its own PID namespace: the worker (pid 1) and the unit running this code
    seen = json.loads(output(pool, "processes"))
    assert seen[0] == 1 and len(seen) <= 2, seen
    call(pool, "kill_everyone")  # kill(-1, SIGKILL): every process it may signal
    assert call(pool, "parent_pid")["reward"] == 1.0  # the trainer (this process) and the pool go on


def test_confined_code_cannot_read_the_trainers_environment(tmp_path):
    # a trainer started with a secret in its environment (what /proc/PID/environ shows)
    script = (
        "import json\n"
        "from tests.test_sandbox_reach import reach_spec\n"
        "from envs.sandbox import Limits, SandboxPool\n"
        "with SandboxPool(workers=1, limits=Limits(episode_seconds=10.0)) as p:\n"
        "    report = p.confinement()\n"
        "    res = p.run_episode(reach_spec(), [{'name': 'hunt', 'arguments': {'secret': 'sk-hunted-42'}}])\n"
        "    print(json.dumps([report, res['tool_calls'][0]['output']]))\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, ENVSCHED_LLM_API_KEY="sk-hunted-42")
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report, found = json.loads(out.stdout.strip().splitlines()[-1])
    if not report["pid_namespace"]:
        pytest.skip(f"this host refuses Linux namespaces: {report['notes']}")
    assert found == "not found"


def test_confined_code_has_no_network(pool, confined):
    if confined["network"] != "none":
        pytest.skip("the pool was given the network")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    threading.Thread(target=server.accept, daemon=True).start()
    try:
        assert output(pool, "connect", port=server.getsockname()[1]).startswith("refused")
    finally:
        server.close()
    with SandboxPool(workers=1, limits=Limits(episode_seconds=5.0, network=True)) as open_pool:
        assert open_pool.confinement()["network"] == "host"


def test_confined_code_sees_only_system_and_python_files(pool, confined, tmp_path):
    if confined["filesystem"] != "private root":
        pytest.skip(f"the host refused a private root: {confined['notes']}")
    lake = tmp_path / "lake"
    lake.mkdir()
    (lake / "rollouts.parquet").write_text("rewards")
    os.chmod(tmp_path, 0o755)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert output(pool, "exists", path=str(lake / "rollouts.parquet")) == "false"
    assert output(pool, "exists", path=os.path.join(repo, ".git")) == "false"  # only its packages
    assert output(pool, "exists", path=os.path.join(repo, "envs", "sandbox.py")) == "true"
    assert output(pool, "write", path=os.path.join(repo, "envs", "planted.py")) != "wrote"
    assert output(pool, "write", path="/etc/planted") != "wrote"
    assert output(pool, "write", path="scratch.txt") == "wrote"  # its own working folder
    assert not os.path.exists(os.path.join(repo, "envs", "planted.py"))


def test_confined_code_cannot_read_or_trace_the_worker_or_other_environments(pool, confined):
    envs = {"reach": json.loads(json.dumps(reach_spec()["env"])), "honest": rows("honest", HONEST)[0]}
    episodes = [("honest", rows("honest", HONEST)[1]), ("reach", reach_spec()["task"])]
    with pool.batch(envs, episodes) as b:  # another environment's process is alive meanwhile
        b.reset()
        pried = json.loads(b.step({1: {"name": "pry", "arguments": {}}})[1])
        b.finish({0: None, 1: None})
    assert pried == []  # /proc/PID/mem and ptrace refused for the worker and every other process


def test_the_kernel_refuses_environment_code_what_it_never_needs(pool):
    report = pool.confinement()
    if not report["seccomp"]:
        pytest.skip(f"no seccomp filter on this host: {report['notes']}")
    out = json.loads(output(pool, "syscalls"))
    for name in ("unshare", "mount", "bpf", "keyctl", "clone_newuser"):
        assert out[name] == [-1, 1], (name, out[name])  # EPERM
    assert out["fork"] == 7 and out["subprocess"] == 0  # what environments do use still works


def _filter_answer(program: list, nr: int, arch: int, flags: int = 0) -> tuple[str, int]:
    """What a classic-BPF seccomp program answers for a syscall (``nr``, ``arch``, first argument
    ``flags``): ("allow", 0) or ("errno", N). Runs the program's five instruction kinds as the
    kernel does over struct seccomp_data (nr at 0, arch at 4, args[0]'s low word at 16)."""
    words = {0: nr, 4: arch, 16: flags & 0xFFFFFFFF}
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = program[pc]
        if code == 0x20:  # ld [k]
            acc = words[k]
        elif code == 0x06:  # ret k
            return ("allow", 0) if k == 0x7FFF0000 else ("errno", k & 0xFFFF)
        else:
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if taken else jf
        pc += 1


@pytest.mark.parametrize("machine", sorted(SECCOMP_MACHINES))
def test_the_seccomp_filter_of_every_machine_refuses_what_it_names(machine):
    """The filter for each machine with a syscall table (x86_64, aarch64: a Grace GPU node), run
    here through a BPF interpreter: what is denied answers EPERM, another ABI ENOSYS, clone only
    with a namespace flag EPERM, and the syscalls environments use run."""
    program = _seccomp_program(machine)
    arch, clone, clone3 = SECCOMP_MACHINES[machine]
    column = list(SECCOMP_MACHINES).index(machine)
    for name, numbers in _DENIED_SYSCALLS.items():
        if numbers[column] is not None:
            assert _filter_answer(program, numbers[column], arch) == ("errno", 1), name
    assert _filter_answer(program, clone3, arch) == ("errno", 38)
    assert _filter_answer(program, clone, arch, flags=0x10000000) == ("errno", 1)  # CLONE_NEWUSER
    assert _filter_answer(program, clone, arch, flags=0x01200011) == ("allow", 0)  # fork's flags
    other = next(a for a, *_ in SECCOMP_MACHINES.values() if a != arch)
    assert _filter_answer(program, 0, other) == ("errno", 38)  # another machine's ABI
    assert _filter_answer(program, 0x40000000 + 1, arch) == ("errno", 1)  # x32
    read, write, getpid = {"x86_64": (0, 1, 39), "aarch64": (63, 64, 172)}[machine]
    for nr in (read, write, getpid):
        assert _filter_answer(program, nr, arch) == ("allow", 0), nr


@pytest.mark.parametrize(
    "machine,header",
    [
        ("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
        ("aarch64", "/usr/include/asm-generic/unistd.h"),
    ],
)
def test_the_denied_syscalls_numbers_are_the_kernel_headers(machine, header):
    """Each machine's numbers in the filter's table are the ones its kernel headers define (skips
    where the headers are not installed)."""
    if not os.path.exists(header):
        pytest.skip(f"{header} is not installed here")
    text = open(header).read()
    defined = {m[0]: int(m[1]) for m in re.findall(r"#define __NR(?:3264)?_(\w+)\s+(\d+)", text)}
    column = list(SECCOMP_MACHINES).index(machine)
    for name, numbers in _DENIED_SYSCALLS.items():
        assert numbers[column] == defined.get(name), (machine, name)
    arch, clone, clone3 = SECCOMP_MACHINES[machine]
    assert (clone, clone3) == (defined["clone"], defined["clone3"])


def test_confined_code_cannot_fill_the_hosts_disk(pool, confined):
    if confined["filesystem"] != "private root":
        pytest.skip(f"the host refused a private root: {confined['notes']}")
    # its home and /tmp are tmpfs of Limits.disk_mb (64 MB): a full disk there, never the host's
    assert int(output(pool, "fill", path="big.bin")) <= pool.limits.disk_mb
    assert int(output(pool, "fill", path="/tmp/big.bin")) <= pool.limits.disk_mb
    w = pool._idle.queue[0]
    on_host = [f for _, _, files in os.walk(f"/proc/{w.proc.pid}/cwd") for f in files]
    assert "big.bin" not in on_host


def test_as_root_each_worker_runs_as_a_user_of_its_own(confined):  # skips where unconfined
    # its own pool: forking to the process limit takes seconds on a loaded machine
    with SandboxPool(workers=1, limits=Limits(episode_seconds=60.0, call_seconds=30.0)) as pool:
        report = pool.confinement()
        if os.geteuid() != 0 or report["uid"] == 0:
            pytest.skip(f"trainer uid {os.geteuid()}, worker uid {report['uid']}: {report['notes']}")
        assert report["uid"] >= SANDBOX_UID_BASE
        assert output(pool, "read", path="/etc/shadow").startswith("refused")
        with SandboxPool(workers=1, limits=Limits(episode_seconds=60.0)) as other:
            assert other.confinement()["uid"] not in (report["uid"], 0)
            with pool.session(reach_spec()) as bomb:
                bomb.reset()
                # the bomb's processes live until its episode ends; they stop at this worker's limit
                assert int(bomb.step({"name": "fork_bomb", "arguments": {}})) < 2000
                # meanwhile the other worker, a user of its own, starts processes for new environments
                env, task = rows("honest", HONEST)
                jobs = [
                    (episode_spec(dict(env, env_id=f"honest{i}"), dict(task, env_id=f"honest{i}")), [])
                    for i in range(2 * SPARE_UNITS)
                ]
                assert all(r["error_class"] == "none" for r in other.map_episodes(jobs))
                bomb.finish()
        time.sleep(0.5)
        w = pool._idle.queue[0]
        # the worker, its namespace's PID 1, this environment's process and the spares: no bomb left
        assert len(descendants(w.proc.pid, zombies=False)) <= 3 + SPARE_UNITS
        assert call(pool, "parent_pid")["reward"] == 1.0


# ---------------------------------------------------------------------------- one environment, one process
POISON = """
import builtins, math
class Poison:
    def __init__(self, config):
        builtins.any = lambda xs: True          # every later any() says yes
        math.isclose = lambda *a, **k: True
    def noop(self):
        return "ok"
"""
HONEST = """
class Honest:
    def __init__(self, config):
        self.state = config
    def noop(self):
        return "ok"
"""


def rows(name: str, code: str) -> tuple[dict, dict]:
    env = {
        "env_id": name,
        "class_name": name.title(),
        "code": code,
        "tools": json.dumps([{"type": "function", "function": {"name": "noop"}}]),
        "kind": "envscaler",
    }
    check = "def check_func(final_state):\n    return any([False])"  # honest: False
    task = {
        "task_id": f"{name}-1",
        "env_id": name,
        "instruction": "x",
        "init_state": "{}",
        "checks": json.dumps([{"check_item": "any", "check_func": check}]),
    }
    return env, task


@pytest.mark.parametrize("confine", ["1", "0"])
def test_one_environments_code_never_changes_anothers_rewards(confine, monkeypatch):
    """Code that patches the interpreter (builtins, a module) reaches only its own rollouts: each
    batch episode, interactive episode and environment of a vector batch runs in its own process."""
    monkeypatch.setenv("ENVSCHED_SANDBOX_CONFINE", confine)  # namespaces or not: the same
    (poison_env, poison_task), (honest_env, honest_task) = rows("poison", POISON), rows("honest", HONEST)
    poison, honest = episode_spec(poison_env, poison_task), episode_spec(honest_env, honest_task)
    with SandboxPool(workers=1, limits=Limits(episode_seconds=10.0)) as p:
        assert p.run_episode(poison, [])["reward"] == 1.0  # its own check believes the patch
        assert p.run_episode(honest, [])["reward"] == 0.0
        with p.session(poison) as s:
            s.reset()
            assert s.finish()["reward"] == 1.0
        with p.session(honest) as s:
            s.reset()
            assert s.finish()["reward"] == 0.0
        envs = {"poison": poison_env, "honest": honest_env}
        with p.batch(envs, [("poison", poison_task), ("honest", honest_task), ("poison", poison_task)]) as b:
            assert all(first is not None for first in b.reset())
            res = b.finish({0: None, 1: None, 2: None})
        assert [res[j]["reward"] for j in range(3)] == [1.0, 0.0, 1.0]
        assert p.run_episode(honest, [])["reward"] == 0.0


def test_an_environments_process_dying_between_episodes_costs_no_rollout(pool):
    """Code that outlives its episode (a thread) and ends its environment's process: the next
    episode of that environment gets a new process, with no failure and no worker replaced."""
    assert output(pool, "die_later") == "armed"
    time.sleep(1.0)  # the environment's process has exited by now
    res = call(pool, "parent_pid")
    assert res["error_class"] == "none" and res["reward"] == 1.0
    assert pool.stats["crashes"] == 0 and pool.stats["respawns"] == 0


def test_an_environments_process_dying_under_a_vector_step_costs_that_rollout_only(pool):
    """One episode ends its environment's process while three others of that environment are open
    in it: those three are replayed in a new process and finish as if nothing had happened; the
    worker (and every other environment's process) stays."""
    spec = reach_spec()
    envs = {"reach": json.loads(json.dumps(spec["env"]))}
    with pool.batch(envs, [("reach", spec["task"])] * 4) as b:
        assert all(first is not None for first in b.reset())
        out = b.step(
            {
                0: {"name": "parent_pid", "arguments": {}},
                1: {"name": "crash", "arguments": {"code": 3}},
                2: {"name": "where", "arguments": {}},
                3: {"name": "parent_pid", "arguments": {}},
            }
        )
        res = b.finish({j: None for j in range(4)})
    assert out[0].isdigit() and out[3].isdigit() and "|" in out[2]
    assert [res[j]["reward"] for j in range(4)] == [1.0, 0.0, 1.0, 1.0]
    assert res[1]["error_class"] == "env_crash" and "exit code 3" in res[1]["error"], res[1]
    assert pool.stats["crashes"] == 1 and pool.stats["respawns"] == 0


def test_an_environment_that_hangs_a_vector_step_costs_that_rollout_only():
    """Code that ignores its per-call alarm and sleeps: its environment's process is ended at
    its share's deadline (not the whole request's), the others open in it are replayed, and the
    worker stays."""
    spec = reach_spec()
    envs = {"reach": json.loads(json.dumps(spec["env"]))}
    limits = Limits(episode_seconds=2.0, call_seconds=0.5, check_seconds=0.5)
    with SandboxPool(workers=1, limits=limits) as p:
        with p.batch(envs, [("reach", spec["task"])] * 4) as b:
            b.reset()
            t0 = time.monotonic()
            calls = {j: {"name": "parent_pid", "arguments": {}} for j in range(4)}
            out = b.step({**calls, 1: {"name": "sleep_forever", "arguments": {}}})
            took = time.monotonic() - t0
            res = b.finish({j: None for j in range(4)})
        assert all(out[j].isdigit() for j in (0, 2, 3)) and out[1].startswith("Error")
        assert [res[j]["reward"] for j in range(4)] == [1.0, 0.0, 1.0, 1.0], res
        assert res[1]["error_class"] == "timeout" and "did not answer within" in res[1]["error"], res[1]
        assert p.stats["timeouts"] == 1 and p.stats["respawns"] == 0
        assert took < 2 * 9.0  # the share's deadline, then the hanging episode alone once more


def test_a_vector_episode_that_kills_its_worker_costs_that_rollout_only(monkeypatch):
    """Unconfined, an environment's process can kill the worker (its parent): the worker is
    replaced and the batch's episodes are replayed on the new one as they are needed, each once."""
    monkeypatch.setenv("ENVSCHED_SANDBOX_CONFINE", "0")
    spec = reach_spec()
    envs = {"reach": json.loads(json.dumps(spec["env"]))}
    with SandboxPool(workers=1, limits=Limits(episode_seconds=5.0, call_seconds=2.0)) as p:
        with p.batch(envs, [("reach", spec["task"])] * 4) as b:
            b.reset()
            calls = {j: {"name": "where", "arguments": {}} for j in range(4)}
            out = b.step({**calls, 1: {"name": "kill_parent", "arguments": {}}})
            again = b.step({0: {"name": "parent_pid", "arguments": {}}})
            res = b.finish({j: None for j in range(4)})
        assert all("|" in out[j] for j in (0, 2, 3)) and out[1].startswith("Error") and again[0].isdigit()
        assert [res[j]["reward"] for j in range(4)] == [1.0, 0.0, 1.0, 1.0], res
        assert res[1]["error_class"] == "env_crash" and p.stats["respawns"] == 2  # at its step and its replay


def test_an_episode_that_hangs_its_environments_process_costs_no_worker():
    """Batch and interactive episodes alike: code that ignores its per-call alarm is ended with its
    environment's process when the episode's time is up; the worker (and its other environments'
    processes) stays."""
    with SandboxPool(workers=1, limits=Limits(episode_seconds=2.0, call_seconds=0.5)) as p:
        res = call(p, "sleep_forever")
        assert res["error_class"] == "timeout" and "did not end its episode within 2s" in res["error"], res
        with p.session(reach_spec()) as s:
            s.reset()
            s.step({"name": "sleep_forever", "arguments": {}})
            assert s.finish()["error_class"] == "timeout"
        assert call(p, "parent_pid")["reward"] == 1.0
        assert p.stats["timeouts"] == 2 and p.stats["respawns"] == 0


def test_an_interactive_episode_late_by_the_trainers_clock_costs_no_worker():
    """The interactive episode's clock runs from the trainer's start of it (the session), not
    from its ``open`` reaching the worker: a step that hangs after the trainer spent time before
    the open (resetting the other episodes of its wave, generating) is ended by the worker within
    what the trainer has left, not by the supervisor ending the worker."""
    with SandboxPool(workers=1, limits=Limits(episode_seconds=8.0, call_seconds=0.5)) as p:
        with p.session(reach_spec()) as s:
            time.sleep(4.0)  # the rest of its wave being reset first
            s.reset()
            time.sleep(0.5)  # the agent generating its first call
            t0 = time.monotonic()
            s.step({"name": "sleep_forever", "arguments": {}})
            took = time.monotonic() - t0
            res = s.finish()
        assert res["error_class"] == "timeout" and "did not end its episode" in res["error"], res
        assert took < 3.5  # the trainer's time left: ended a second under it, by the worker
        assert call(p, "parent_pid")["reward"] == 1.0
        assert p.stats["timeouts"] == 1 and p.stats["respawns"] == 0


def test_an_interactive_episode_whose_process_dies_says_how(pool):
    with pool.session(reach_spec()) as s:
        s.reset()
        s.step({"name": "kill_self", "arguments": {}})
        res = s.finish()
    assert res["error_class"] == "env_crash" and "killed by SIGKILL" in res["error"], res
    with pool.session(reach_spec()) as s:  # the same environment, a new process, the same worker
        s.reset()
        assert s.step({"name": "parent_pid", "arguments": {}}).isdigit()
        assert s.finish()["reward"] == 1.0
    assert pool.stats["crashes"] == 1 and pool.stats["respawns"] == 0


@pytest.mark.parametrize("confine", ["1", "0"])
def test_a_batch_given_up_unfinished_leaves_nothing_running(confine, monkeypatch):
    """A vector batch closed before its episodes finish (the caller raised, an agent loop was cut
    short) ends them: what their code forked dies then, not at some later episode's end."""
    monkeypatch.setenv("ENVSCHED_SANDBOX_CONFINE", confine)
    spec = reach_spec()
    envs = {"reach": json.loads(json.dumps(spec["env"]))}
    with SandboxPool(workers=1, limits=Limits(episode_seconds=5.0, call_seconds=2.0)) as p:
        w = p._idle.queue[0]
        with p.batch(envs, [("reach", spec["task"])] * 2) as b:
            b.reset()
            b.step({0: {"name": "spawn_daemon", "arguments": {}}})
            time.sleep(0.3)
            while_open = set(descendants(w.proc.pid, zombies=False))
        time.sleep(0.5)
        after = set(descendants(w.proc.pid, zombies=False))
        assert len(while_open - after) == 1, (while_open, after)  # the daemon, and nothing else
        with p.batch(envs, [("reach", spec["task"])] * 2) as b:  # the same episode ids, a new batch
            assert all(first is not None for first in b.reset())
            assert [r["reward"] for r in b.finish({0: None, 1: None}).values()] == [1.0, 1.0]
        assert p.stats["respawns"] == 0
