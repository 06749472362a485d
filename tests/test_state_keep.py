"""The lake keeps the scheduler state of step 0, of every KEEP_EVERY-th step and of the newest two;
any other state is folded again from the kept one before it, checked against the digest its step's
statistics recorded, for selection, `envsched explain`, replay and rewinds alike."""

import math

import pyarrow as pa
import pytest

import envsched_pipeline.lake as lake_module
from envs.registry import load_synthetic
from envsched_pipeline.analysis.explain import explain_step
from envsched_pipeline.analysis.replay import replay
from envsched_pipeline.api import ExternalRun
from envsched_pipeline.core import state_store
from envsched_pipeline.core.fold import DIGEST, load_state, states_before
from envsched_pipeline.core.loop import consistency_problems, next_action
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.core.select import select_manifest
from envsched_pipeline.core.state_store import state_steps
from envsched_pipeline.core.statistics import statistics_step
from envsched_pipeline.errors import StepError
from envsched_pipeline.lake import Lake
from envsched_pipeline.run import RunSpec, load_run, start_run
from envsched_pipeline.scheduler.variants import RECOMMENDED, VARIANTS
from tests.test_external import rollouts_for
from trainer.step import run_step

STEPS = 11


def one_step(lake, t) -> str:
    """Select, train and fold step t; the digest of the state it made, read back while kept."""
    select_manifest(lake, t)
    run_step(lake, t, log=lambda *_: None)
    statistics_step(lake, t)
    return state_store.read_state(lake, t).digest()


@pytest.fixture
def kept_run(small_pool, monkeypatch):
    monkeypatch.setattr(lake_module, "KEEP_EVERY", 4)
    lake = small_pool
    spec = RunSpec(
        pool="synthetic",
        scheduler="envsched",
        scheduler_config=dict(VARIANTS[RECOMMENDED]),
        seed=5,
        batch_size=10,
        group_size=4,
        max_steps=STEPS,
    )
    start_run(lake, spec)
    digests = [one_step(lake, t) for t in range(STEPS)]
    return lake, load_run(lake), digests


def same(a, b) -> bool:
    """Equal structures whose floats agree to 1e-12 relative."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15) or (a != a and b != b)
    return a == b


def table(lake, name, step):
    return lake.read(name, step=step).to_pylist()


def test_a_run_keeps_few_states_and_folds_any_other_again_as_it_was(kept_run):
    lake, spec, digests = kept_run
    assert state_steps(lake) == {0, 3, 7, 9, 10}  # step 0's, every 4th, the newest two
    assert set(lake.artifact_steps("checkpoints")) == {0, 3, 7, 9, 10}  # the simulated policy's too
    assert sorted(p.name for p in (lake.root / "state").iterdir()) == [f"step={s}" for s in (0, 10, 3, 7, 9)]
    assert not consistency_problems(lake) and next_action(lake) is None
    assert {r[DIGEST] for r in table(lake, "statistics", 5)} == {digests[5]}
    assert [load_state(lake, spec, t).digest() for t in range(STEPS)] == digests
    assert [(t, s.digest()) for t, s in states_before(lake, spec, range(1, STEPS))] == [
        (t, digests[t - 1]) for t in range(1, STEPS)
    ]
    # a state handed out is the caller's own: changing it changes nothing folded after it
    them = states_before(lake, spec, [5, 6])
    next(them)[1].arrays["W"][:] = 99.0
    assert next(them)[1].digest() == digests[5]
    # explain and replay read states no longer kept
    assert explain_step(lake, 6)["reproduced"] and explain_step(lake, 2)["reproduced"]
    folded = replay(lake, ["random", "envsched"], log=lambda *_: None)
    for t in range(STEPS):  # every state back in the lake (each the one its step made: digests above)
        lake.write_bytes(state_store.state_rel(t), load_state(lake, spec, t).to_bytes())
    assert state_steps(lake) == set(range(STEPS))
    # the same estimates (to the last few bits: replay's float sums are not bit-reproducible
    # between two calls, whatever the states)
    assert same(replay(lake, ["random", "envsched"], log=lambda *_: None), folded)


@pytest.fixture
def external_run(tmp_path, monkeypatch):
    """An external trainer's run of STEPS steps: it keeps no policy, so it can go back to any step."""
    monkeypatch.setattr(lake_module, "KEEP_EVERY", 4)
    import_pool(Lake(tmp_path / "lake"), load_synthetic("mini", n_envs=5, tasks_per_env=8, seed=2))
    run = ExternalRun(pool="mini", lake=str(tmp_path / "lake"), seed=1, batch_size=6, group_size=4)
    picked = []
    for t in range(STEPS):
        picks = run.manifest(t)
        picked.append([p["task_id"] for p in picks])
        run.observe(t, rollouts_for(t, picks))
    return run, picked


def test_a_rewind_past_a_dropped_state_redoes_the_steps_as_they_were_done(external_run):
    run, first = external_run
    assert state_steps(run.lake) == {0, 3, 7, 9, 10}
    run.rewind(6)  # the state after step 5 was dropped: folded again
    for t in range(6, STEPS):
        picks = run.manifest(t)
        assert [p["task_id"] for p in picks] == first[t]
        run.observe(t, rollouts_for(t, picks))
    assert state_steps(run.lake) == {0, 3, 7, 9, 10}


def test_a_state_that_no_longer_folds_as_it_did_is_refused_and_a_rewind_to_it_moves_nothing(external_run):
    run, _ = external_run
    lake, spec = run.lake, load_run(run.lake)
    rows = table(lake, "rollouts", 5)
    for r in rows:  # step 5's rewards changed after the fact
        r["reward"] = 1.0 - r["reward"]
    lake.write("rollouts", pa.Table.from_pylist(rows), step=5)
    with pytest.raises(
        StepError, match=r"folding step 5's rollouts again does not give the state it made"
    ) as err:
        load_state(lake, spec, 6)
    assert "A step just after a kept state can be gone back to: 1, 4, 8, 10, 11" in str(err.value)
    assert load_state(lake, spec, 4).step == 4  # before the change: folds as it did
    held = lake.steps("manifests")
    with pytest.raises(StepError, match=r"folding step 5's rollouts again"):
        run.rewind(7)
    assert lake.steps("manifests") == held and state_steps(lake) == {0, 3, 7, 9, 10}
    # a state whose statistics record no digest (written before states were dropped) is missing
    stats = lake.read("statistics", step=1).drop_columns([DIGEST])
    lake.write("statistics", stats, step=1)
    with pytest.raises(StepError, match=r"state after step 1 is missing .* record no state digest"):
        load_state(lake, spec, 2)


def test_a_state_before_a_config_change_folds_with_the_config_of_its_time(small_pool, monkeypatch):
    monkeypatch.setattr(lake_module, "KEEP_EVERY", 4)
    lake = small_pool
    spec = RunSpec(pool="synthetic", scheduler="envsched", seed=5, batch_size=10, group_size=4, max_steps=8)
    start_run(lake, spec)
    digests = [one_step(lake, t) for t in range(4)]
    changed = RunSpec(**{**spec.to_dict(), "scheduler_config": {"h_long": 2.0}})
    start_run(lake, changed, allow_config_change=True)
    digests += [one_step(lake, t) for t in range(4, 8)]
    spec = load_run(lake)
    assert spec.scheduler_config == {"h_long": 2.0} and state_steps(lake) == {0, 3, 6, 7}
    assert [load_state(lake, spec, t).digest() for t in range(8)] == digests
