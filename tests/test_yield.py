"""Yield prediction: each manifest states its predicted share of informative groups, the realized
share is recorded after the rollouts, and a DAPO-style trainer can ask for the over-sampling factor."""

import numpy as np

from envs.registry import load_synthetic
from envsched_pipeline.api import ExternalRun
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.core.select import select_manifest
from envsched_pipeline.core.statistics import statistics_step
from envsched_pipeline.run import RunSpec, start_run
from trainer.step import run_step


def test_predicted_vs_realized_yield_and_oversampling(lake):
    import_pool(lake, load_synthetic("synthetic", n_envs=10, tasks_per_env=20, seed=1))
    start_run(
        lake, RunSpec(pool="synthetic", scheduler="envsched", batch_size=32, group_size=8, max_steps=12)
    )
    for t in range(12):
        select_manifest(lake, t)
        run_step(lake, t, log=lambda *_: None)
        out = statistics_step(lake, t)
        assert 0.0 <= out["predicted_yield"] <= 1.0 and 0.0 <= out["realized_yield"] <= 1.0
    y = lake.read("yields").to_pylist()
    assert [r["step"] for r in sorted(y, key=lambda r: r["step"])] == list(range(12))
    late = [r for r in y if r["step"] >= 4]
    gap = abs(np.mean([r["predicted_yield"] for r in late]) - np.mean([r["realized_yield"] for r in late]))
    assert gap < 0.2, gap  # calibrated to within 20 points after a few steps
    audit = lake.read("audits", step=11).to_pylist()[0]
    assert 1.0 <= audit["oversampling_factor"] <= 8.0
    assert audit["oversampling_factor"] >= 0.99 / max(audit["predicted_yield"], 1e-9) * 0.5


def test_api_exposes_yield_and_oversampling(tmp_path):
    from envsched_pipeline.core.pools import import_pool as imp

    lake_dir = tmp_path / "l"
    from envsched_pipeline.lake import Lake

    imp(Lake(lake_dir), load_synthetic("mini", n_envs=4, tasks_per_env=8, seed=2))
    s = ExternalRun(pool="mini", lake=str(lake_dir), batch_size=8, group_size=4)
    f = s.oversampling_factor(0)
    y = s.predicted_yield(0)
    assert 0 < y <= 1 and f == min(8.0, 1.0 / y)
