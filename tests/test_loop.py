"""The step loop over the lake, without Dagster: select -> train -> statistics."""

import numpy as np
import pytest

from envsched_pipeline.core.loop import next_action
from envsched_pipeline.core.select import select_manifest
from envsched_pipeline.core.statistics import statistics_step
from envsched_pipeline.errors import StepError
from envsched_pipeline.run import RunSpec, start_run
from trainer.step import run_step


def rows(table):
    """Rows with NaN made comparable."""
    return [
        {k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()} for r in table.to_pylist()
    ]


def one_step(lake, t):
    select_manifest(lake, t)
    run_step(lake, t, log=lambda *_: None)
    statistics_step(lake, t)


def test_three_steps_and_next_action(small_run):
    lake = small_run
    assert next_action(lake) == ("select", 0)
    for t in range(3):
        one_step(lake, t)
    assert next_action(lake) is None
    r = lake.read("rollouts")
    assert r.num_rows == 3 * 8 * 4
    keys = set(
        zip(
            r.column("step").to_pylist(),
            r.column("task_id").to_pylist(),
            r.column("rollout").to_pylist(),
            strict=True,
        )
    )
    assert len(keys) == r.num_rows


def test_statistics_record_prior_and_posterior_for_envsched(small_pool):
    lake = small_pool
    start_run(
        lake, RunSpec(pool="synthetic", scheduler="envsched", seed=1, batch_size=8, group_size=4, max_steps=2)
    )
    for t in range(2):
        one_step(lake, t)
    st = lake.read("statistics", step=1).to_pylist()
    assert st and all(np.isfinite(r["prior_var"]) and np.isfinite(r["posterior_var"]) for r in st)
    # the blend lies between the task's own history and its prior
    for r in st:
        lo, hi = sorted((r["own_var"], r["prior_var"]))
        assert lo - 1e-9 <= r["posterior_var"] <= hi + 1e-9


def test_rematerializing_a_step_gives_identical_rows(small_run):
    lake = small_run
    one_step(lake, 0)
    first = {
        t: lake.read(t, step=0).drop_columns(["seconds"] if t == "rollouts" else [])
        for t in ("manifests", "rollouts")
    }
    select_manifest(lake, 0)
    run_step(lake, 0, log=lambda *_: None)
    again = {
        t: lake.read(t, step=0).drop_columns(["seconds"] if t == "rollouts" else [])
        for t in ("manifests", "rollouts")
    }
    assert rows(first["manifests"]) == rows(again["manifests"])
    assert rows(first["rollouts"]) == rows(again["rollouts"])
    assert first["rollouts"].num_rows == 32


def test_select_refuses_when_previous_step_missing(small_run):
    with pytest.raises(StepError, match="cannot select step 1: rollouts of step 0 are missing"):
        select_manifest(small_run, 1)


def test_statistics_use_task_outcomes_only(small_run):
    lake = small_run
    select_manifest(lake, 0)
    run_step(lake, 0, log=lambda *_: None)
    r = lake.read("rollouts", step=0).to_pandas() if False else lake.read("rollouts", step=0).to_pylist()
    # an infrastructure failure must not look like a failed task: mark one group's rollouts as infra
    victim = r[0]["task_id"]
    for row in r:
        if row["task_id"] == victim:
            row["error_class"] = "infra"
            row["reward"] = 0.0
    lake.write("rollouts", r, step=0)
    statistics_step(lake, 0)
    stats = {s["task_id"]: s for s in lake.read("statistics", step=0).to_pylist()}
    assert stats[victim]["observations"] == 0  # no evidence about the task
    assert stats[victim]["exposure"] == 4  # but the rollouts were spent


def test_resumed_run_with_other_settings_is_refused(small_run):
    one_step(small_run, 0)
    with pytest.raises(StepError, match="already holds a run with other settings"):
        start_run(
            small_run, RunSpec(pool="synthetic", scheduler="random", seed=99, batch_size=8, group_size=4)
        )


def test_selection_is_seeded_and_distinct(small_run):
    out = select_manifest(small_run, 0)
    ids = [p.task_id for p in out["picks"]]
    assert len(ids) == len(set(ids)) == 8
    assert np.isclose(out["rows"][0]["propensity"], 8 / 60)
