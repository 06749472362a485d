"""A run that selects ahead of its rollouts (``RunSpec.select_lag``): manifest t is chosen from the
rollouts up to t-1-select_lag, the picks in between counted as spent, for a trainer that asks for
the next batch while one trains."""

import zlib

import pytest

from envs.registry import load_synthetic
from envsched_pipeline.analysis.compare import against_runs
from envsched_pipeline.analysis.explain import explain_step
from envsched_pipeline.api import ExternalRun
from envsched_pipeline.cli import main
from envsched_pipeline.core.build import new_run
from envsched_pipeline.core.gates import check_manifest, rewind
from envsched_pipeline.core.loop import consistency_problems, next_action
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.core.state_store import state_steps
from envsched_pipeline.errors import ConfigError, StepError
from envsched_pipeline.lake import Lake
from envsched_pipeline.run import load_run, start_run
from tests.conftest import SMALL, run_steps
from trainer.remake import remake


def _reward(step, task_id, rollout, salt=""):
    return [0.0, 0.5, 1.0][zlib.crc32(f"{task_id}|{rollout}|{step}|{salt}".encode()) % 3]


def _rollouts(step, picks, g=4, salt=""):
    return [
        {"task_id": p["task_id"], "rollout": r, "reward": _reward(step, p["task_id"], r, salt)}
        for p in picks
        for r in range(g)
    ]


def _ids(picks):
    return [p["task_id"] for p in picks]


def _api(lake, lag):
    return ExternalRun(pool="synthetic", lake=lake, seed=3, batch_size=8, group_size=4, select_lag=lag)


@pytest.mark.parametrize("lag", [0, 1])
def test_a_manifest_is_chosen_from_the_rollouts_lag_steps_back_and_no_later(small_pool, tmp_path, lag):
    # two runs alike up to step 2, whose step-3 rewards differ: with a lag of 1 the manifest of step 4
    # cannot know step 3's rewards (it is the same in both); without one it follows them
    other = Lake(tmp_path / "other")
    import_pool(other, load_synthetic("synthetic", **SMALL))
    runs = [_api(small_pool, lag), _api(other, lag)]
    for salt, run in zip(("", "x"), runs, strict=True):
        for t in range(4):
            batch = run.manifest(t)
            if lag:  # the next one is chosen before this one's rewards come back
                run.manifest(t + 1)
            run.observe(t, _rollouts(t, batch, salt=salt if t == 3 else ""))
    fourth = [_ids(run.manifest(4)) for run in runs]
    if lag:
        assert fourth[0] == fourth[1]  # chosen from the rollouts up to step 2, the same in both
        for run in runs:
            run.observe(4, _rollouts(4, run.manifest(4)))
        fifth = [_ids(run.manifest(5)) for run in runs]
        assert fifth[0] != fifth[1]  # step 3's rewards reach the manifest after
    else:
        assert fourth[0] != fourth[1]
    audit = small_pool.read("audits", step=4).to_pylist()[0]
    assert audit["selected_ahead"] == lag and audit["history_steps"] == 4 - lag


def test_the_picks_a_selection_runs_ahead_of_count_as_spent(small_pool):
    # before any rollouts, step 1 is chosen with step 0's picks spent: none is picked again
    run = _api(small_pool, 1)
    first, second = set(_ids(run.manifest(0))), set(_ids(run.manifest(1)))
    assert len(first) == len(second) == 8
    assert not first & second
    run.observe(0, _rollouts(0, run.manifest(0)))
    third = set(_ids(run.manifest(2)))  # from step 0's rollouts, step 1's picks spent
    assert len(third & second) <= 1


def test_an_ahead_trainer_ingests_after_the_next_manifest_and_the_lake_stays_consistent(small_pool):
    run = _api(small_pool, 1)
    run.manifest(0)
    run.manifest(1)  # ahead of step 0's rollouts
    assert consistency_problems(small_pool) == [] and next_action(small_pool) == ("wait", 0)
    with pytest.raises(
        StepError, match=r"cannot select step 2: rollouts of step 0 are missing \(the run selects 1"
    ):
        run.manifest(2)
    run.observe(0, _rollouts(0, run.manifest(0)))  # not refused as "already used" by manifest 1
    run.manifest(2)
    run.observe(1, _rollouts(1, run.manifest(1)))
    assert consistency_problems(small_pool) == [] and next_action(small_pool) == ("wait", 2)
    # step 1's rollouts are used once manifest 3 is chosen from them
    run.observe(2, _rollouts(2, run.manifest(2)))
    run.manifest(3)
    with pytest.raises(StepError, match="step 1 was already used"):
        run.observe(1, _rollouts(1, run.manifest(1), salt="again"))
    # a step whose rollouts a manifest was chosen from, missing, is an inconsistency
    small_pool.delete("rollouts/step=1")
    assert any(p.startswith("step 1: rollouts") for p in consistency_problems(small_pool))


def test_the_lag_is_checked_and_fixed_for_the_run(small_pool):
    with pytest.raises(ConfigError, match=r"select_lag must be in \[0, 4\], got 5"):
        _api(small_pool, 5)
    with pytest.raises(ConfigError, match="select_lag"):
        _api(small_pool, True)
    run = _api(small_pool, 1)
    run.manifest(0)
    with pytest.raises(StepError, match="select_lag: lake has 1, asked 0"):
        _api(small_pool, 0)
    assert ExternalRun(lake=small_pool).spec.select_lag == 1  # the lake alone resumes it


def _lagged_run(lake, lag, steps):
    spec = new_run(pool="synthetic", seed=2, batch_size=8, group_size=4, max_steps=steps, select_lag=lag)
    start_run(lake, spec)
    return run_steps(lake, steps)


def test_a_lagged_internal_run_is_explained_rewound_and_redone_alike(small_pool):
    lake = _lagged_run(small_pool, 2, 9)
    first = {t: _ids(lake.read("manifests", step=t).to_pylist()) for t in range(9)}
    # the scheduler states a selection two steps ahead reads stay kept: the newest four
    assert {5, 6, 7, 8} <= state_steps(lake) and 4 not in state_steps(lake)
    assert all(explain_step(lake, t)["reproduced"] for t in (0, 1, 2, 5, 8))
    # the batch constraints saw the two manifests before each, pending or not: the gate passes
    assert all(check_manifest(lake, t)["passed"] for t in range(9))
    rewind(lake, 5, remake=lambda k: remake(lake, k, log=lambda *_: None))  # the policy after 4 made again
    assert consistency_problems(lake) == []
    run_steps(lake, range(5, 9))
    assert {t: _ids(lake.read("manifests", step=t).to_pylist()) for t in range(9)} == first


def test_step_select_takes_the_lag_and_status_says_it(tmp_path, capsys):
    lake = tmp_path / "lake"
    code = main(
        ["--lake", str(lake), *"pool create synthetic --name mini --envs 4 --tasks-per-env 6".split()]
    )
    assert code == 0
    args = ["--lake", str(lake), "step", "select", "--pool", "mini", "--batch-size", "4", "--group-size", "2"]
    assert main([*args, "--step", "0", "--select-lag", "1"]) == 0
    assert main([*args, "--step", "1"]) == 0  # the run's own lag: ahead of step 0's rollouts
    assert main([*args, "--step", "2"]) == 2
    capsys.readouterr()
    assert main(["--lake", str(lake), "status"]) == 0
    assert "selects 1 step(s) ahead of its rollouts" in capsys.readouterr().out
    assert load_run(Lake(lake)).select_lag == 1


def test_a_report_against_a_run_of_another_lag_says_so(small_pool, tmp_path):
    other = Lake(tmp_path / "other")
    import_pool(other, load_synthetic("synthetic", **SMALL))
    mine, theirs = _api(small_pool, 0), _api(other, 1)
    (got,) = against_runs(small_pool, mine.spec, [other])
    assert got["notes"] == ["selects 1 step(s) ahead of its rollouts (this run: 0)"]
    assert against_runs(other, theirs.spec, [small_pool])[0]["notes"] == [
        "selects 0 step(s) ahead of its rollouts (this run: 1)"
    ]
