"""Real pools with their real verifiers (gold scores 1, corrupted scores less), the EnvScaler
import, `envsched env run`, and the sandbox under hostile environment code."""

import json
import subprocess
import sys

import numpy as np
import pytest

from envs.envscaler import PoolFormatError, load_envscaler
from envs.registry import episode_spec, load_pool, load_synthetic
from envs.sandbox import Limits, SandboxPool
from envsched_pipeline.core.pools import derive_latents
from envsched_pipeline.lake import Lake
from trainer.realenv import corrupt, tool_names_of


@pytest.fixture(scope="module")
def sandbox():
    with SandboxPool(workers=2) as pool:
        yield pool


def gold_vs_corrupted(data, sandbox, n, seed=0):
    envs = {e["env_id"]: e for e in data.environments}
    rng = np.random.default_rng(seed)
    sample = [data.tasks[i] for i in rng.choice(len(data.tasks), size=min(n, len(data.tasks)), replace=False)]
    gold_jobs = [(episode_spec(envs[t["env_id"]], t), json.loads(t["gold"])) for t in sample]
    bad_jobs = [
        (
            episode_spec(envs[t["env_id"]], t),
            corrupt(json.loads(t["gold"]), 0.0, rng, tool_names_of(envs[t["env_id"]])),
        )
        for t in sample
    ]
    gold = sandbox.map_episodes(gold_jobs)
    bad = sandbox.map_episodes(bad_jobs)
    return [r["reward"] for r in gold], [r["reward"] for r in bad], gold


def test_synthetic_gold_scores_one_and_corrupted_less(sandbox):
    data = load_synthetic(n_envs=10, tasks_per_env=10, seed=4)
    gold, bad, _ = gold_vs_corrupted(data, sandbox, 40)
    assert gold == [1.0] * len(gold)
    assert np.mean(bad) < 0.9 and min(bad) < 1.0


def test_bfcl_official_checker(sandbox):
    data = load_pool("bfcl")
    assert len(data.tasks) == 800 and len({t["env_id"] for t in data.tasks}) >= 7
    gold, bad, _ = gold_vs_corrupted(data, sandbox, 12)
    assert gold == [1.0] * len(gold)
    assert np.mean(bad) < 0.5


def test_bfcl_checker_cache_is_cleared(sandbox):
    data = load_pool("bfcl")
    envs = {e["env_id"]: e for e in data.environments}
    t = data.tasks[0]
    spec = episode_spec(envs[t["env_id"]], t)
    # the same rollout twice gives the same answer (no instance leaking between rollouts)
    a = sandbox.run_episode(spec, json.loads(t["gold"]))
    b = sandbox.run_episode(spec, json.loads(t["gold"]))
    assert a["reward"] == b["reward"] == 1.0
    dense = sandbox.run_episode(dict(spec, dense=True), [json.loads(t["gold"])[0]])
    assert 0.0 < dense["reward"] < 1.0


def test_tau2_db_state_evaluator(sandbox):
    data = load_pool("tau2", domains=("airline", "retail"))
    assert {t["env_id"] for t in data.tasks} == {"airline", "retail"}
    with_actions = type(data)(
        name=data.name, environments=data.environments, tasks=[t for t in data.tasks if json.loads(t["gold"])]
    )
    gold, bad, _ = gold_vs_corrupted(with_actions, sandbox, 6)
    assert gold == [1.0] * len(gold)
    assert np.mean(bad) < 1.0


def test_reasoning_gym_right_and_wrong(sandbox):
    data = load_pool("reasoning_gym", datasets=("basic_arithmetic", "chain_sum"), per_dataset=5)
    envs = {e["env_id"]: e for e in data.environments}
    t = data.tasks[0]
    gold = json.loads(t["gold"])
    assert sandbox.run_episode(episode_spec(envs[t["env_id"]], t), gold)["reward"] == 1.0
    assert sandbox.run_episode(episode_spec(envs[t["env_id"]], t), [], "definitely wrong")["reward"] == 0.0
    latents = derive_latents(data)  # derived at import time (core.pools), for the simulated learner only
    assert len(latents) == 10 and all(json.loads(r["z"]) for r in latents)


# ---------------------------------------------------------------------------- EnvScaler import
ENV_CODE = """
class Shop:
    def __init__(self, config):
        self.items = config.get("items", {})
    def get_item(self, item_id):
        return self.items[item_id]
    def set_price(self, item_id, price):
        self.items[item_id]["price"] = price
        return {"ok": True}
"""


def write_pool(tmp_path, scenarios=None, meta=None):
    meta = (
        meta
        if meta is not None
        else {
            "shop": {
                "env_class_name": "Shop",
                "env_class_code": ENV_CODE,
                "env_summary": "a shop",
                "tools": json.dumps(
                    [{"name": "get_item", "parameters": {}}, {"name": "set_price", "parameters": {}}]
                ),
            },
            "broken": {"env_class_name": "Nope", "env_class_code": "class Other: pass", "tools": []},
        }
    )
    scenarios = (
        scenarios
        if scenarios is not None
        else [
            {
                "env_id": "shop",
                "task": "Set the price of A-1 to 5.",
                "init_config": {"items": {"A-1": {"price": 3}}},
                "checklist_with_func": [
                    {
                        "check_item": "price is 5",
                        "check_func": "def check_func(final_state):\n    return final_state['items']['A-1']['price'] == 5",
                    },
                    {
                        "check_item": "was 3",
                        "check_func": "def check_func(final_state):\n    return initial_state['items']['A-1']['price'] == 3",
                    },
                    {
                        "check_item": "returns a number",
                        "check_func": "def check_func(final_state):\n    return 1",
                    },
                    {
                        "check_item": "hangs",
                        "check_func": "def check_func(final_state):\n    while True: pass",
                    },
                ],
            },
            {"env_id": "shop", "task": "Nothing to check.", "init_config": {}, "checklist_with_func": []},
            {
                "env_id": "broken",
                "task": "Cannot build.",
                "init_config": {},
                "checklist_with_func": [
                    {"check_item": "x", "check_func": "def check_func(final_state):\n    return True"}
                ],
            },
        ]
    )
    s, m = tmp_path / "scenarios.json", tmp_path / "env_meta.json"
    s.write_text(json.dumps(scenarios))
    m.write_text(json.dumps(meta))
    return s, m


def envsched(*args, lake):
    return subprocess.run(
        [sys.executable, "-m", "envsched_pipeline.cli", "--lake", str(lake), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_envscaler_import_and_env_run_semantics(tmp_path):
    s, m = write_pool(tmp_path)
    lake = tmp_path / "lake"
    p = envsched(
        "pool",
        "import",
        "envscaler",
        "--scenarios",
        str(s),
        "--env-metadata",
        str(m),
        "--name",
        "shop",
        lake=lake,
    )
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["tasks"] == 3 and "broken" in rep["broken_environments"] and len(rep["empty_checklists"]) == 1
    actions = tmp_path / "a.json"
    actions.write_text(
        json.dumps(
            [
                {"name": "set_price", "arguments": {"item_id": "A-1", "price": 5}},
                {"name": "teleport", "arguments": {}},
            ]
        )
    )
    p = envsched("env", "run", "--pool", "shop", "--task", "shop-00000", "--actions", str(actions), lake=lake)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    # 2 of 4: the price check and initial_state pass; a non-bool result and a hang count 0
    assert out["reward"] == 0.5
    assert [c["passed"] for c in out["checks"]] == [True, True, False, False]
    assert "non-bool" in out["checks"][2]["error"] and "timeout" in out["checks"][3]["error"]
    p = envsched(
        "env", "run", "--pool", "shop", "--task", "broken-00002", "--actions", str(actions), lake=lake
    )
    assert p.returncode == 0 and json.loads(p.stdout)["reward"] == 0.0 and json.loads(p.stdout)["error"]
    p = envsched("env", "run", "--pool", "shop", "--task", "nope", "--actions", str(actions), lake=lake)
    assert p.returncode == 2 and "task 'nope' is not in pool 'shop'" in p.stderr
    p = envsched("env", "run", "--pool", "nopool", "--task", "x", "--actions", str(actions), lake=lake)
    assert p.returncode == 2 and "nopool" in p.stderr
    # an actions file that is not UTF-8 JSON, or a folder: one line naming the flag and the file
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes(b'[{"name": "set_price", "arguments": {"item_id": "\xe9"}}]')
    for path, says in (
        (latin1, f"--actions {latin1}: not UTF-8 text (byte 49 is 0xe9)"),
        (tmp_path, f"--actions {tmp_path}: a folder; name a file"),
        ("s3://bucket/a.json", "--actions: s3://bucket/a.json is a URL; name a file on this machine"),
    ):
        p = envsched(
            "env", "run", "--pool", "shop", "--task", "shop-00000", "--actions", str(path), lake=lake
        )
        assert p.returncode == 2 and says in p.stderr and "Traceback" not in p.stderr
    # the import's two files: a URL, a missing file or a folder is named by its flag, nothing written
    for scenarios, metadata, says in (
        ("s3://bucket/s.json", str(m), "--scenarios: s3://bucket/s.json is a URL"),
        (str(s), str(tmp_path / "none.json"), f"--env-metadata {tmp_path / 'none.json'}: no such file"),
        (str(s), str(tmp_path), f"--env-metadata {tmp_path}: a folder; name a file"),
    ):
        argv = ["pool", "import", "envscaler", "--scenarios", scenarios, "--env-metadata", metadata]
        p = envsched(*argv, "--name", "other", lake=tmp_path / "other")
        assert p.returncode == 2 and says in p.stderr and not (tmp_path / "other").exists(), p.stderr


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda s, m: (s.write_text(s.read_text()[:40]), None), "scenarios.json: invalid JSON"),
        (
            lambda s, m: (
                s.write_text(json.dumps([{"task": "x", "init_config": {}, "checklist_with_func": []}])),
                None,
            ),
            "scenarios.json: record 0: missing field 'env_id'",
        ),
        (
            lambda s, m: (
                s.write_text(
                    json.dumps(
                        [{"env_id": "shop", "task": "x", "init_config": [], "checklist_with_func": []}]
                    )
                ),
                None,
            ),
            "record 0: field 'init_config' must be an object",
        ),
        (
            lambda s, m: (m.write_text(json.dumps({"shop": {"env_class_name": "Shop"}})), None),
            "env_meta.json: environment 'shop': missing field 'env_class_code'",
        ),
        (
            lambda s, m: (
                m.write_text(
                    json.dumps({"shop": {"env_class_name": "Shop", "env_class_code": "x", "tools": "[oops"}})
                ),
                None,
            ),
            "field 'tools' is a string but not valid JSON",
        ),
        (
            lambda s, m: (
                s.write_text(
                    json.dumps(
                        [{"env_id": "shop", "task": ["x"], "init_config": {}, "checklist_with_func": []}]
                    )
                ),
                None,
            ),
            r"record 0: field 'task' \(the instruction text\) must be a non-empty string, got list",
        ),
        (
            lambda s, m: (
                m.write_text(json.dumps({"shop": {"env_class_name": 5, "env_class_code": "x"}})),
                None,
            ),
            "environment 'shop': field 'env_class_name' must be a non-empty string, got int",
        ),
    ],
)
def test_malformed_envscaler_files_are_refused_and_nothing_written(tmp_path, mutate, match):
    s, m = write_pool(tmp_path)
    mutate(s, m)
    with pytest.raises(PoolFormatError, match=match):
        load_envscaler(s, m, "shop")
    lake = tmp_path / "lake"
    p = envsched(
        "pool",
        "import",
        "envscaler",
        "--scenarios",
        str(s),
        "--env-metadata",
        str(m),
        "--name",
        "shop",
        lake=lake,
    )
    assert p.returncode == 2 and match.split(": ")[-1].split("'")[0] in p.stderr
    assert not (lake / "tasks").exists()


# ---------------------------------------------------------------------------- hostile code
HOSTILE = """
import os, time
class Evil:
    def __init__(self, config):
        self.n = 0
    def spin(self):
        while True:
            pass
    def sleep_forever(self):
        import signal
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        time.sleep(3600)
    def crash(self):
        os._exit(3)
    def eat(self):
        x = bytearray(8 * 1024 ** 3)
        return len(x)
    def shout(self):
        print("garbage on stdout that must not break the protocol")
        return "ok"
"""


def hostile_spec():
    tools = [
        {"type": "function", "function": {"name": n}}
        for n in ("spin", "sleep_forever", "crash", "eat", "shout")
    ]
    env = {
        "env_id": "evil",
        "class_name": "Evil",
        "code": HOSTILE,
        "tools": json.dumps(tools),
        "kind": "envscaler",
    }
    task = {
        "task_id": "evil-1",
        "env_id": "evil",
        "instruction": "x",
        "init_state": "{}",
        "checks": json.dumps(
            [{"check_item": "ok", "check_func": "def check_func(final_state):\n    return True"}]
        ),
    }
    return episode_spec(env, task)


def test_hostile_environments_cost_one_rollout_each():
    limits = Limits(memory_mb=1024, episode_seconds=4.0, call_seconds=1.0)
    with SandboxPool(workers=2, limits=limits) as pool:
        spec = hostile_spec()
        jobs = [
            (spec, [{"name": "shout", "arguments": {}}]),
            (spec, [{"name": "spin", "arguments": {}}]),
            (spec, [{"name": "sleep_forever", "arguments": {}}]),
            (spec, [{"name": "crash", "arguments": {}}]),
            (spec, [{"name": "eat", "arguments": {}}]),
            (spec, [{"name": "shout", "arguments": {}}]),
        ]
        res = pool.map_episodes(jobs)
        assert res[0]["reward"] == 1.0 and res[0]["tool_calls"][0]["output"] == "ok"
        assert res[1]["reward"] == 1.0 and "timed out" in res[1]["tool_calls"][0]["output"]  # per-call limit
        assert res[2]["error_class"] == "timeout" and res[2]["reward"] == 0.0  # ignores SIGALRM: killed
        assert res[3]["error_class"] == "env_crash" and res[3]["reward"] == 0.0
        # the address-space limit turns the 8 GB allocation into a MemoryError observation
        assert "MemoryError" in res[4]["tool_calls"][0]["output"] and res[4]["error_class"] == "none"
        assert res[5]["reward"] == 1.0  # the pool recovered
        assert pool.stats["timeouts"] == 1 and pool.stats["crashes"] == 1


def test_a_held_out_split_taken_out_of_any_pool():
    """Package pools and imports came without an evaluation split, so a language model trained on
    them had nothing held out to be measured on; ``hold_out`` takes one out, seeded."""
    from envs.registry import hold_out

    data = load_pool("reasoning_gym")
    envs = {e["env_id"] for e in data.environments}
    out = hold_out(data, tasks_per_env=3, envs=2, seed=5)
    unseen_envs = {e["env_id"] for e in out.eval_environments}
    assert len(unseen_envs) == 2 and unseen_envs <= envs
    assert {e["env_id"] for e in out.environments} == envs - unseen_envs
    seen = [r for r in out.heldout if r["split"] == "seen"]
    unseen = [r for r in out.heldout if r["split"] == "unseen"]
    assert len(seen) == 3 * (len(envs) - 2) and {r["env_id"] for r in unseen} == unseen_envs
    kept = {t["task_id"] for t in out.tasks}
    assert not kept & {r["task_id"] for r in out.heldout}  # the scheduler never sees a held-out task
    assert len(kept) + len(out.heldout) == len(data.tasks)
    again, other = hold_out(data, 3, 2, seed=5), hold_out(data, 3, 2, seed=6)
    assert again.heldout == out.heldout and other.heldout != out.heldout
    # an environment keeps a task to train on; every environment cannot go
    small = load_synthetic("t", n_envs=2, tasks_per_env=2, unseen_envs=0)
    tiny = hold_out(small, tasks_per_env=5)
    kept_per_env = {
        e["env_id"]: sum(t["env_id"] == e["env_id"] for t in tiny.tasks) for e in small.environments
    }
    assert kept_per_env == {e["env_id"]: 1 for e in small.environments}
    with pytest.raises(ValueError, match="at least one must stay"):
        hold_out(data, envs=len(envs))


def test_pool_create_and_import_take_a_held_out_split(tmp_path):
    lake = tmp_path / "lake"
    p = envsched(
        "pool",
        "create",
        "reasoning_gym",
        "--name",
        "rg",
        "--heldout-tasks",
        "4",
        "--heldout-envs",
        "1",
        lake=lake,
    )
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["heldout_environments"] == 1 and rep["heldout_seen_tasks"] == 4 * (rep["environments"])
    lk = Lake(lake)
    ev = lk.read("eval_tasks", pool="rg").to_pylist()
    assert {r["split"] for r in ev} == {"seen", "unseen"}
    assert not {r["task_id"] for r in ev} & set(lk.read("tasks", pool="rg").column("task_id").to_pylist())
    assert lk.read("eval_environments", pool="rg").num_rows == 1
    p = envsched("pool", "create", "tau2", "--name", "t2", "--envs", "2", lake=lake)
    assert p.returncode == 2 and "only the synthetic generator takes it" in p.stderr
    p = envsched("pool", "create", "reasoning_gym", "--name", "rg2", "--heldout-envs", "12", lake=lake)
    assert p.returncode == 2 and "at least one must stay" in p.stderr and not lk.has("tasks", pool="rg2")
    s, m = write_pool(tmp_path)
    p = envsched(
        "pool",
        "import",
        "envscaler",
        "--scenarios",
        str(s),
        "--env-metadata",
        str(m),
        "--name",
        "shop",
        "--heldout-envs",
        "1",
        lake=lake,
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["heldout_environments"] == 1 and lk.has("eval_tasks", pool="shop")
