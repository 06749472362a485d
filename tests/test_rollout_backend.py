"""Distributed rollouts: the Ray backend (a real local Ray) keeps rewards, order and per-rollout
failure semantics of the local sandbox pool."""

import os
import subprocess
import sys

import pytest

from envs.rollout_backend import RayEpisodePool, backend_name, episode_pool
from envs.sandbox import Limits, SandboxPool
from envsched_pipeline.lake import Lake
from tests.test_pools import hostile_spec


@pytest.fixture(scope="module")
def ray_pool():
    limits = Limits(memory_mb=1024, episode_seconds=4.0, call_seconds=1.0)
    with RayEpisodePool(workers=2, limits=limits, chunk=2) as pool:
        yield pool


def _jobs():
    spec = hostile_spec()
    return [
        (spec, [{"name": "shout", "arguments": {}}]),
        (spec, [{"name": "sleep_forever", "arguments": {}}]),
        (spec, [{"name": "crash", "arguments": {}}]),
        (spec, [{"name": "shout", "arguments": {}}]),
        (spec, []),
    ]


def test_ray_actors_keep_sandbox_failures_per_rollout(ray_pool):
    seen = []
    res = ray_pool.map_episodes(_jobs(), progress=lambda d, n: seen.append((d, n)))
    assert [r["error_class"] for r in res] == ["none", "timeout", "env_crash", "none", "none"]
    assert res[0]["reward"] == 1.0 and res[3]["reward"] == 1.0
    assert seen[-1] == (5, 5)
    with SandboxPool(workers=2, limits=ray_pool.limits) as local:
        ref = local.map_episodes(_jobs())
    strip = lambda rs: [(r["reward"], r["error_class"]) for r in rs]  # noqa: E731
    assert strip(res) == strip(ref)


def test_a_lost_actor_costs_only_its_chunk(ray_pool):
    ray = ray_pool.ray
    victim = len(ray_pool._actors) - 1  # the slot the first chunk goes to
    ray.kill(ray_pool._actors[victim])
    spec = hostile_spec()
    jobs = [(spec, [{"name": "shout", "arguments": {}}])] * 6
    res = ray_pool.map_episodes(jobs)
    classes = [r["error_class"] for r in res]
    assert classes[:2] == ["infra", "infra"] and "rollout actor died" in res[0]["error"]
    assert classes[2:] == ["none"] * 4  # the actor was replaced; the rest ran
    assert ray_pool.stats["actor_failures"] == 1
    assert ray_pool.map_episodes(jobs[:2])[0]["reward"] == 1.0  # and the replacement works


def test_backend_is_chosen_by_env_and_refuses_unknown(monkeypatch):
    monkeypatch.setenv("ENVSCHED_ROLLOUT_BACKEND", "dask")
    with pytest.raises(ValueError, match="ENVSCHED_ROLLOUT_BACKEND='dask'"):
        backend_name()
    monkeypatch.setenv("ENVSCHED_ROLLOUT_BACKEND", "local")
    with episode_pool(workers=1) as pool:
        assert isinstance(pool, SandboxPool)


def test_train_run_on_ray_gives_the_local_rewards(tmp_path, dagster_home):
    cli = [sys.executable, "-m", "envsched_pipeline.cli"]
    totals = {}
    for backend in ("local", "ray"):
        lake = tmp_path / backend
        env = {**os.environ, "ENVSCHED_LAKE": str(lake), "ENVSCHED_ROLLOUT_BACKEND": backend}
        make = ["pool", "create", "synthetic", "--name", "mini", "--envs", "3", "--tasks-per-env", "4"]
        assert subprocess.run(cli + make, env=env, capture_output=True).returncode == 0
        train = ["train", "--pool", "mini", "--sim-mode", "real", "--steps", "1", "--batch-size", "6"]
        out = subprocess.run(
            cli + train + ["--group-size", "4"], env=env, capture_output=True, text=True, timeout=600
        )
        assert out.returncode == 0, out.stderr[-3000:]
        rows = Lake(lake).sql("select task_id, rollout, reward, error_class from rollouts order by 1, 2")
        totals[backend] = rows.to_pylist()
    assert len(totals["ray"]) == 24
    assert totals["ray"] == totals["local"]
