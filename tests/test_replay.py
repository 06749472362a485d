"""Offline scheduler evaluation on a logged run."""

import json
from dataclasses import replace

import pytest

from envs.registry import load_synthetic
from envsched_pipeline.analysis.replay import replay
from envsched_pipeline.cli import main
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.core.select import select_manifest
from envsched_pipeline.core.statistics import statistics_step
from envsched_pipeline.run import RunSpec, start_run
from envsched_pipeline.scheduler.variants import RECOMMENDED
from trainer.step import run_step


def test_replay_estimates_with_standard_errors(lake, capsys):
    import_pool(lake, load_synthetic("synthetic", n_envs=8, tasks_per_env=15, seed=2))
    # the logged run's own overrides (rho = 1: all coverage) never reach the schedulers replayed
    spec = RunSpec(pool="synthetic", scheduler="random", batch_size=24, group_size=8, max_steps=10)
    start_run(lake, replace(spec, scheduler_config={"rho": 1.0}))
    for t in range(10):
        select_manifest(lake, t)
        run_step(lake, t, log=lambda *_: None)
        statistics_step(lake, t)
    out = replay(
        lake, ["random", "envsched", "coverage-only", RECOMMENDED, "variance-greedy"], log=lambda *_: None
    )
    assert out["logged"]["steps"] == 10 and out["logged"]["scheduler"] == "random + rho=1.0"
    est = {n: e["batch_variance_estimate"] for n, e in out["schedulers"].items()}
    # envsched is the paper's half-coverage scheduler, not the run's all-coverage one; a named variant
    # replays as its own form (same logged states and seeds, other picks)
    assert est["envsched"] != est["coverage-only"] and est[RECOMMENDED] != est["envsched"]
    r = out["schedulers"]["random"]
    # replaying the logging scheduler itself (same seeds differ only by salt) is close to the log
    assert abs(r["batch_variance_estimate"] - out["logged"]["batch_variance"]) < 3 * r["stderr"] + 0.01
    for name in ("envsched", RECOMMENDED, "variance-greedy"):
        e = out["schedulers"][name]
        assert e["stderr"] > 0 and 0 <= e["overlap_with_log"] <= 1
    # a variance-seeking scheduler is estimated above random on the same logged states
    assert out["schedulers"]["variance-greedy"]["batch_variance_estimate"] > r["batch_variance_estimate"]
    with pytest.raises(ValueError, match="valslice: a validation-slice variant runs only in"):
        replay(lake, [RECOMMENDED + "+valslice"], log=lambda *_: None)
    assert main(["--lake", str(lake.root), "bench", "replay", "--schedulers", "random,dps"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["schedulers"]) == {"random", "dps"}
