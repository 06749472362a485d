"""Cost-aware scheduling (opt-in) and cross-run priors."""

import numpy as np
import pytest

from envs.registry import load_synthetic
from envsched_pipeline.core.fold import load_state
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.core.select import select_manifest
from envsched_pipeline.core.statistics import statistics_step
from envsched_pipeline.run import RunSpec, start_run
from envsched_pipeline.scheduler.config import SchedulerConfig
from envsched_pipeline.scheduler.envsched import EnvSched
from envsched_pipeline.scheduler.state import Observations, SchedulerState, prior_from
from envsched_pipeline.scheduler.update import update_state
from trainer.step import run_step


def test_cost_aware_prefers_cheap_informative_tasks_with_a_floor():
    st = SchedulerState.new([f"t{i}" for i in range(4)], ["a", "a", "b", "b"])
    obs = Observations.from_groups(0, [0, 1, 2, 3], [np.array([0.0, 1.0] * 4)] * 4)
    obs.cost = np.array([1.0, 8.0, 1.0, 100.0])
    cfg = SchedulerConfig(cost_aware=True, cost_floor=0.25)
    update_state(st, obs, cfg)
    sched = EnvSched(cfg)
    inf = sched.informativeness(st, sched.predict(st))
    assert inf["score"][0] > inf["score"][1] > 0
    assert inf["score"][3] >= 0.25 * inf["score"][2] - 1e-12  # never starved below the floor share
    plain = EnvSched(SchedulerConfig())
    p = plain.informativeness(st, plain.predict(st))
    assert p["score"][0] == pytest.approx(p["score"][1])  # off by default


def test_prior_from_previous_run_by_content_hash():
    prev = SchedulerState.new(["a1", "a2"], ["e", "e"], ["h1", "h2"])
    update_state(
        prev,
        Observations.from_groups(0, [0, 1], [np.array([0.0, 1.0]), np.array([1.0, 1.0])]),
        SchedulerConfig(),
    )
    new = prior_from(prev, ["x1", "x2", "x3"], ["e", "e", "f"], ["h2", "h1", "h9"], discount=0.5)
    assert new.arrays["W"].tolist() == [0.5, 0.5, 0.0]
    assert new.arrays["Xs2"][1] == pytest.approx(0.5 * 0.25)  # h1 had variance 0.25
    assert new.arrays["exposure"].sum() == 0 and new.step == -1
    with pytest.raises(ValueError):
        prior_from(prev, ["x1"], ["e"], ["h1"], discount=2.0)


def test_run_started_from_a_previous_lake(tmp_path):
    from envsched_pipeline.lake import Lake

    data = load_synthetic("synthetic", n_envs=5, tasks_per_env=10, seed=4)
    a, b = Lake(tmp_path / "a"), Lake(tmp_path / "b")
    for lk in (a, b):
        import_pool(lk, data)
    start_run(a, RunSpec(pool="synthetic", batch_size=10, group_size=4, max_steps=3))
    for t in range(3):
        select_manifest(a, t)
        run_step(a, t, log=lambda *_: None)
        statistics_step(a, t)
    spec = start_run(
        b,
        RunSpec(
            pool="synthetic",
            batch_size=10,
            group_size=4,
            max_steps=2,
            prior_lake=str(a.root),
            prior_discount=0.5,
        ),
    )
    st0 = load_state(b, spec, -1)
    assert st0.arrays["W"].sum() > 0 and st0.extra["prior"]["discount"] == 0.5
    out = select_manifest(b, 0)
    assert {p.half for p in out["picks"]} <= {"coverage", "exploit"}  # no cold start: it has estimates


def test_a_prior_lake_that_cannot_serve_is_refused_before_anything_is_written(tmp_path):
    """A missing directory, a lake without scheduler state, or the run's own lake as its prior:
    refused by the API (and `envsched train --prior-lake`, which shares the check) naming the prior
    lake, with the new lake left unwritten."""
    from envsched_pipeline.api import ExternalRun  # only this test opens runs through the API
    from envsched_pipeline.errors import StepError

    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        (tmp_path / "nowhere", "nowhere: no such directory"),
        (empty, "has no scheduler state to start from"),
        (tmp_path / "new", "is this run's own lake"),
    ]
    for prior, match in cases:
        with pytest.raises(StepError, match=match):
            ExternalRun(lake=tmp_path / "new", prior_lake=str(prior), batch_size=8, group_size=2)
        assert not (tmp_path / "new").exists()
