"""Edit-tolerant resume: re-importing a pool with tasks added, removed, renamed or edited keeps the
history of every unchanged task (by content hash); removed tasks' history is kept inactive."""

import json

import numpy as np
import pytest

from envs.registry import PoolData, load_synthetic
from envsched_pipeline.core.fold import load_state
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.core.select import select_manifest
from envsched_pipeline.core.statistics import statistics_step
from envsched_pipeline.run import RunSpec, start_run
from trainer.step import run_step


def run_steps(lake, steps):
    for t in steps:
        select_manifest(lake, t)
        run_step(lake, t, log=lambda *_: None)
        statistics_step(lake, t)


@pytest.fixture
def edited(lake):
    data = load_synthetic("synthetic", n_envs=4, tasks_per_env=10, seed=2)
    import_pool(lake, data)
    start_run(lake, RunSpec(pool="synthetic", scheduler="envsched", batch_size=16, group_size=4, max_steps=6))
    run_steps(lake, [0, 1, 2])
    return lake, data


def reimport(lake, data, tasks, latents=None):
    import_pool(
        lake,
        PoolData(
            name=data.name,
            environments=data.environments,
            tasks=tasks,
            latents=latents if latents is not None else data.latents,
        ),
        allow_edit=True,
    )


def observed(lake, spec_step=2):
    from envsched_pipeline.run import require_run

    st = load_state(lake, require_run(lake), spec_step)
    return st, {t: st.arrays["W"][i] for i, t in enumerate(st.task_ids.tolist())}


def test_renamed_task_keeps_its_history(edited):
    lake, data = edited
    _, before = observed(lake)
    victim = next(t for t, w in before.items() if w > 0)
    tasks = [dict(t, task_id=t["task_id"] + "-renamed") if t["task_id"] == victim else t for t in data.tasks]
    lat = [dict(r, task_id=r["task_id"] + "-renamed") if r["task_id"] == victim else r for r in data.latents]
    reimport(lake, data, tasks, lat)
    st, after = observed(lake)
    assert after[victim + "-renamed"] == pytest.approx(before[victim]) and victim not in after
    assert st.extra["last_alignment"]["kept"] == len(tasks)
    run_steps(lake, [3])  # the run goes on over the edited pool
    assert lake.has("statistics", step=3)


def test_added_and_edited_tasks_start_fresh_others_keep_history(edited):
    lake, data = edited
    _, before = observed(lake)
    seen = [t for t, w in before.items() if w > 0]
    edit = seen[0]
    tasks = []
    for t in data.tasks:
        if t["task_id"] == edit:
            t = dict(
                t,
                instruction=t["instruction"] + " Then double-check.",
                content_hash="edited-" + t["content_hash"],
            )
        tasks.append(t)
    extra = dict(data.tasks[0], task_id="library-new", content_hash="brand-new")
    tasks.append(extra)
    lat = data.latents + [dict(data.latents[0], task_id="library-new")]
    reimport(lake, data, tasks, lat)
    st, after = observed(lake)
    assert after[edit] == 0.0 and after["library-new"] == 0.0
    for t in seen[1:]:
        assert after[t] == pytest.approx(before[t])
    assert st.extra["last_alignment"]["new"] == 2
    run_steps(lake, [3])
    g = lake.read("edges", pool="synthetic")
    assert "library-new" in set(g.column("src").to_pylist())  # the graph was rebuilt for the edited pool


def test_removed_task_is_archived_and_restored(edited):
    lake, data = edited
    _, before = observed(lake)
    gone = next(t for t, w in before.items() if w > 0)
    reimport(
        lake,
        data,
        [t for t in data.tasks if t["task_id"] != gone],
        [r for r in data.latents if r["task_id"] != gone],
    )
    st, after = observed(lake)
    assert gone not in after and st.extra["last_alignment"]["archived"] == 1
    assert lake.sql(f"select count(*) as n from rollouts where task_id = '{gone}'").column("n")[0].as_py() > 0
    run_steps(lake, [3])
    reimport(lake, data, data.tasks, data.latents)  # it comes back
    from envsched_pipeline.run import require_run

    st4 = load_state(lake, require_run(lake), 3)
    i = st4.task_ids.tolist().index(gone)
    gamma = 2 ** (-1 / 8)
    assert st4.arrays["W"][i] == pytest.approx(before[gone]) or st4.arrays["W"][i] == pytest.approx(
        before[gone] * gamma
    )
    assert st4.extra["last_alignment"]["restored"] == 1
    assert json.dumps(st4.extra)  # still serializable
    assert np.isfinite(st4.arrays["W"]).all()
