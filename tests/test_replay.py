"""Offline scheduler evaluation on a logged run."""

import json

from envs.registry import load_synthetic
from envsched_pipeline.analysis.replay import replay
from envsched_pipeline.cli import main
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.core.select import select_manifest
from envsched_pipeline.core.statistics import statistics_step
from envsched_pipeline.run import RunSpec, start_run
from trainer.step import run_step


def test_replay_estimates_with_standard_errors(lake, capsys):
    import_pool(lake, load_synthetic("synthetic", n_envs=8, tasks_per_env=15, seed=2))
    start_run(lake, RunSpec(pool="synthetic", scheduler="random", batch_size=24, group_size=8, max_steps=10))
    for t in range(10):
        select_manifest(lake, t)
        run_step(lake, t, log=lambda *_: None)
        statistics_step(lake, t)
    out = replay(lake, ["random", "envsched", "variance-greedy"], log=lambda *_: None)
    assert out["logged"]["steps"] == 10
    r = out["schedulers"]["random"]
    # replaying the logging scheduler itself (same seeds differ only by salt) is close to the log
    assert abs(r["batch_variance_estimate"] - out["logged"]["batch_variance"]) < 3 * r["stderr"] + 0.01
    for name in ("envsched", "variance-greedy"):
        e = out["schedulers"][name]
        assert e["stderr"] > 0 and 0 <= e["overlap_with_log"] <= 1
    # a variance-seeking scheduler is estimated above random on the same logged states
    assert out["schedulers"]["variance-greedy"]["batch_variance_estimate"] > r["batch_variance_estimate"]
    assert main(["--lake", str(lake.root), "bench", "replay", "--schedulers", "random,dps"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["schedulers"]) == {"random", "dps"}
