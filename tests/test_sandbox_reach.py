"""Environment code cannot reach out: it cannot kill or hang the trainer, leave processes behind,
read the trainer's secrets, or write into the lake's folder (issue: a loop you can trust, class 7)."""

import json
import os
import time

import pytest

from envs.isolation import descendants
from envs.registry import episode_spec
from envs.sandbox import Limits, SandboxPool

REACH = """
import json, os, time
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
        pid = os.fork()
        if pid == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(120)
            os._exit(0)
        os.waitpid(pid, 0)
        return "spawned"
    def env(self):
        return json.dumps(dict(os.environ))
    def where(self):
        return os.getcwd() + "|" + os.environ.get("HOME", "")
"""


def reach_spec():
    tools = [
        {"type": "function", "function": {"name": n}}
        for n in ("kill_parent", "parent_pid", "scribble", "spawn_daemon", "env", "where")
    ]
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


def call(pool, name):
    return pool.run_episode(reach_spec(), [{"name": name, "arguments": {}}])


@pytest.fixture
def pool():
    with SandboxPool(workers=1, limits=Limits(episode_seconds=5.0, call_seconds=2.0)) as p:
        yield p


def test_environment_code_never_sees_the_trainer_as_its_parent(pool):
    out = call(pool, "parent_pid")["tool_calls"][0]["output"]
    assert out != str(os.getpid())


def test_killing_its_parent_costs_one_rollout_not_the_trainer(pool):
    res = call(pool, "kill_parent")
    assert res["reward"] == 0.0 and res["error_class"] in ("env_crash", "timeout")
    assert call(pool, "parent_pid")["reward"] == 1.0  # the trainer (this process) and the pool go on


def test_writing_to_inherited_descriptors_never_blocks_the_trainer(pool):
    t0 = time.monotonic()
    res = call(pool, "scribble")
    assert time.monotonic() - t0 < 10
    assert res["reward"] in (0.0, 1.0)  # either the protocol survived or the rollout failed cleanly
    assert call(pool, "parent_pid")["reward"] == 1.0


def test_no_descendant_survives_the_episode(pool):
    assert call(pool, "spawn_daemon")["reward"] == 1.0  # forks, setsid()s, forks again, sleeps
    time.sleep(0.5)
    w = pool._idle.queue[0]
    below = descendants(w.proc.pid)
    # below the supervisor only its worker remains: the daemon was re-parented to it and killed
    assert below == [w.worker_pid], below
    assert set(descendants(os.getpid())) == {w.proc.pid, w.worker_pid}


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
