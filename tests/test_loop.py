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


def test_rewind_redoes_the_run_from_a_step_as_it_was_done(small_run, dagster_home, capsys):
    """`envsched rewind --to K` takes the run back to step K (later steps archived, not deleted) and
    the loop redoes it from the policy and scheduler state after K-1: the same manifests and
    rollouts as the first time. A halt at or after K is cleared. It refuses a step whose
    predecessor's policy is gone and cannot be made again, naming the steps it can go back to, and a step past the run; the
    missing-checkpoint error of a training step points at it."""
    from envsched_pipeline.cli import main  # the command under test
    from envsched_pipeline.core.gates import halt, halted

    lake = small_run
    for t in range(3):
        one_step(lake, t)
    by_step = [("step", "ascending"), ("task_id", "ascending"), ("rollout", "ascending")]
    first = rows(lake.read("rollouts").sort_by(by_step))
    halt(lake, 2, "rollouts_are_complete", ["a problem found late"])
    assert main(["rewind", "--to", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("rewound to step 2: steps 2..2 moved to ") and "the halt is cleared" in out
    assert "Next: select step 2" in out and halted(lake) is None and next_action(lake) == ("select", 2)
    one_step(lake, 2)
    assert rows(lake.read("rollouts").sort_by(by_step)) == first

    lake.delete("checkpoints/step=0")
    assert main(["rewind", "--to", "1"]) == 2
    assert (
        "the policy after step 0 is not on disk and cannot be made again (no simulated checkpoint "
        "before step 0 is in the lake to make it again from); rewind to a step after one that is: 0, 2"
    ) in capsys.readouterr().err
    assert main(["rewind", "--to", "3"]) == 2 and "holds steps 0..2" in capsys.readouterr().err
    lake.delete("checkpoints/step=1")
    with pytest.raises(StepError, match=r"`envsched rewind --to 2` makes it again from a kept one"):
        run_step(lake, 2, log=lambda *_: None)  # the step after a lost checkpoint says how to go on

    assert main(["rewind", "--to", "0"]) == 0
    assert capsys.readouterr().out.startswith("rewound to step 0: steps 0..2 moved to ")
    assert next_action(lake) == ("select", 0) and lake.steps("rollouts") == []
    archived = sorted(p.name for p in (lake.root / "archive").iterdir())
    assert sorted(a.split("-")[2] for a in archived) == ["step0", "step2"]  # two rewinds, both kept
    for t in range(3):
        one_step(lake, t)
    assert rows(lake.read("rollouts").sort_by(by_step)) == first
