"""Failure-aware statistics: infrastructure failures are not evidence that a task is hard, and a
flaky environment is quarantined (skipped with a reason) instead of being picked again and again."""

import json

import numpy as np

from envs.registry import load_synthetic
from envsched_pipeline.core.fold import load_state, observations_from_rollouts
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.core.select import select_manifest
from envsched_pipeline.core.statistics import statistics_step
from envsched_pipeline.run import RunSpec, start_run
from trainer.step import run_step


def test_flaky_environment_is_not_hard_and_is_quarantined(lake):
    import_pool(lake, load_synthetic("synthetic", n_envs=6, tasks_per_env=10, seed=3))
    spec = start_run(
        lake, RunSpec(pool="synthetic", scheduler="envsched", batch_size=12, group_size=4, max_steps=8)
    )
    flaky = None
    for t in range(6):
        out = select_manifest(lake, t)
        envs_now = {p.env_id for p in out["picks"]}
        if t == 0:
            flaky = sorted(envs_now)[0]
        run_step(lake, t, log=lambda *_: None)
        rows = lake.read("rollouts", step=t).to_pylist()
        for r in rows:  # the flaky environment's workers crash: reward 0, infra error
            if r["env_id"] == flaky:
                r.update(reward=0.0, error_class="env_crash", error_message="worker died")
        lake.write("rollouts", rows, step=t)
        statistics_step(lake, t)
        audit = lake.read("audits", step=t).to_pylist()[0]
        q = {x["env_id"] for x in json.loads(audit["quarantined"])}
        if t >= 1 and flaky in q:
            assert flaky not in envs_now  # skipped, with a reason
            assert "infrastructure error rate" in json.loads(audit["quarantined"])[0]["reason"]
    state = load_state(lake, spec, 5)
    e = state.env_ids.index(flaky)
    in_env = state.env == e
    # its crashed rollouts never entered the task statistics: not "hard", just unobserved
    assert state.arrays["W"][in_env].sum() == 0 and state.arrays["exposure"][in_env].sum() > 0
    picks_flaky = lake.sql(
        f"select count(*) as n from manifests where env_id = '{flaky}' and step between 1 and 3"
    )
    assert picks_flaky.column("n")[0].as_py() == 0  # quarantined for quarantine_steps after the spike
    audits = lake.sql("select step, quarantined from audits order by step").to_pylist()
    assert any(flaky in a["quarantined"] for a in audits)


def test_infra_errors_excluded_from_group_statistics(small_run):
    lake = small_run
    select_manifest(lake, 0)
    run_step(lake, 0, log=lambda *_: None)
    rows = lake.read("rollouts", step=0).to_pylist()
    task = rows[0]["task_id"]
    for r in rows:
        if r["task_id"] == task and r["rollout"] < 2:
            r.update(reward=0.0, error_class="timeout")
    from envsched_pipeline.lake import Lake  # noqa: F401

    state = load_state(lake, __import__("envsched_pipeline.run", fromlist=["x"]).require_run(lake), -1)
    import pyarrow as pa

    obs = observations_from_rollouts(state, 0, pa.Table.from_pylist(rows))
    j = list(state.task_ids[obs.task_idx]).index(task)
    kept = [r["reward"] for r in rows if r["task_id"] == task and r["rollout"] >= 2]
    assert obs.rollouts[j] == 2 and obs.spent[j] == 4
    assert np.isclose(obs.mean[j], np.mean(kept))
