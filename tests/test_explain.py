"""`envsched explain --step T [--task ID]`: step T's selection recomputed from the state after
T-1 (nothing written), checked against its manifest, and a task's place in it explained with the
scheduler's own numbers."""

import json
from dataclasses import replace

import numpy as np
import pytest

from envsched_pipeline.analysis.explain import explain_lines, explain_step
from envsched_pipeline.cli import main
from envsched_pipeline.core.build import build_scheduler
from envsched_pipeline.core.fold import load_state
from envsched_pipeline.core.select import select_manifest
from envsched_pipeline.core.statistics import statistics_step
from envsched_pipeline.errors import StepError
from envsched_pipeline.orchestration.metadata import near_misses_table
from envsched_pipeline.run import RunSpec, load_run, start_run
from envsched_pipeline.scheduler.variants import RECOMMENDED, VARIANTS
from trainer.step import run_step

STEPS = 4


def run(lake, scheduler="envsched", config=None, batch_size=12) -> RunSpec:
    spec = RunSpec(
        pool="synthetic",
        scheduler=scheduler,
        scheduler_config=config or {},
        seed=2,
        batch_size=batch_size,
        group_size=4,
        max_steps=STEPS,
    )
    start_run(lake, spec)
    for t in range(STEPS):
        select_manifest(lake, t)
        run_step(lake, t, log=lambda *_: None)
        statistics_step(lake, t)
    return load_run(lake)


def manifest(lake, step):
    return lake.read("manifests", step=step).to_pylist()


def test_a_step_is_recomputed_as_stored_and_a_task_gets_the_schedulers_own_numbers(small_pool):
    lake = small_pool
    spec = run(lake, "envsched", dict(VARIANTS[RECOMMENDED]))
    before = sorted(str(p) for p in lake.local.rglob("*"))
    rows = manifest(lake, 3)
    out = explain_step(lake, 3)
    assert out["reproduced"] and not out["config_changed"]
    assert out["batch"]["picks"] == len(rows) == 12
    assert out["batch"]["halves"] == {h: sum(r["half"] == h for r in rows) for h in {r["half"] for r in rows}}
    # a pick: its stored reason, and the step's own group in its history
    pick = rows[-1]
    t = explain_step(lake, 3, pick["task_id"])["task"]
    assert t["picked"] and t["reason"] == json.loads(pick["reason"]) and t["slot"] == pick["slot"]
    assert t["history"][-1]["step"] == 3
    # a task left out: the score the scheduler's own formula gives it, its rank, and why
    picked = {r["task_id"] for r in rows}
    state = load_state(lake, spec, 2)
    sched = build_scheduler(lake, spec, state)
    score = sched.informativeness(state, sched.predict(state))["score"]
    ids = list(state.task_ids)
    left = [tid for tid in ids if tid not in picked]
    exploit = [r["score"] for r in rows if r["half"] == "exploit"]
    reasons, weighted = set(), 0
    for tid in left[:20]:
        t = explain_step(lake, 3, tid)["task"]
        i = ids.index(tid)
        assert not t["picked"] and t["score"] == pytest.approx(score[i])
        assert t["score_rank"] == int((score > score[i]).sum()) + 1
        assert t["reason"]["pred_var"] is not None and "n_within" in t["reason"]
        if not t["blocked_by"]:  # eligible: outscored by every exploit pick once penalties count
            assert t["value"] <= t["score"] and (t["value"] < min(exploit) or "tie" in t["why"])
            lam, pen = sched.config.lambda_sim, t["reason"]["similarity_penalty"]
            worked = f"{t['score']:.4g} - {lam:g} x {pen:.4g} = " if lam and pen else "("
            assert f"{worked}{t['value']:.4g})" in t["why"]
            weighted += worked != "("
        reasons.add(t["why"].split(" ")[0])
    assert reasons  # explanations came back for every task asked about
    assert weighted  # and the similarity penalty's arithmetic was shown where it counted
    assert sorted(str(p) for p in lake.local.rglob("*")) == before  # nothing written


def test_a_task_blocked_by_the_per_step_cap_is_told_so(small_pool):
    lake = small_pool
    run(lake, "envsched", {"cap_env_step": 1, "cap_env_window": 99}, batch_size=4)  # 6 environments
    rows = manifest(lake, 3)
    envs = {r["env_id"] for r in rows}
    state_ids = lake.read("tasks", pool="synthetic").to_pylist()
    other = next(
        t["task_id"]
        for t in state_ids
        if t["env_id"] in envs and t["task_id"] not in {r["task_id"] for r in rows}
    )
    t = explain_step(lake, 3, other)["task"]
    assert "C1 per-step cap" in t["blocked_by"] and "the C1 cap (1 picks" in t["why"]
    assert [p["task_id"] for p in t["env_picks"]] == [
        r["task_id"] for r in rows if r["env_id"] == t["env_id"]
    ]


def test_a_changed_config_is_said_and_a_baseline_is_explained_by_its_picks(small_pool, tmp_path):
    lake = small_pool
    spec = run(lake, "envsched")
    start_run(lake, replace(spec, scheduler_config={"rho": 0.0}, max_steps=STEPS), allow_config_change=True)
    out = explain_step(lake, 3)
    assert out["config_changed"] and not out["reproduced"]  # the exploit-only batch is another batch
    assert any("other picks than its manifest" in line for line in explain_lines(out))


def test_random_is_explained_by_its_picks(small_pool):
    lake = small_pool
    run(lake, "random")
    rows = manifest(lake, 2)
    tid = next(
        t
        for t in lake.read("tasks", pool="synthetic").column("task_id").to_pylist()
        if t not in {r["task_id"] for r in rows}
    )
    out = explain_step(lake, 2, tid)
    assert out["reproduced"] and "does not score the tasks it leaves out" in out["task"]["why"]


def test_the_command_prints_lines_or_json_and_refuses_what_is_not_there(small_pool, capsys):
    lake = small_pool
    run(lake)
    rows = manifest(lake, 1)
    assert main(["explain", "--step", "1", "--task", rows[0]["task_id"]]) == 0
    text = capsys.readouterr().out
    assert text.startswith("step 1: envsched") and f"task {rows[0]['task_id']}" in text and "picked" in text
    assert main(["explain", "--step", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["batch"]["picks"] == len(rows)
    with pytest.raises(StepError, match=r"step 9 has no manifest .*steps 0\.\.3"):
        explain_step(lake, 9)
    with pytest.raises(StepError, match="task 'nope' is not in pool 'synthetic'"):
        explain_step(lake, 1, "nope")
    assert main(["explain", "--step", "9"]) == 2
    assert "step 9 has no manifest" in capsys.readouterr().err
    assert np.isfinite(explain_step(lake, 0)["batch"]["picks"])


def test_each_manifest_names_its_near_misses_as_explain_does(small_pool):
    lake = small_pool
    start_run(lake, RunSpec(pool="synthetic", seed=2, batch_size=12, group_size=4, max_steps=STEPS))
    outs = []
    for t in range(STEPS):
        outs.append(select_manifest(lake, t))
        run_step(lake, t, log=lambda *_: None)
        statistics_step(lake, t)
    assert outs[0]["near_misses"] == []  # the cold start scores no task
    misses = outs[3]["near_misses"]
    picked = {r["task_id"] for r in outs[3]["rows"]}
    assert len(misses) == 10 and not picked & {m["task_id"] for m in misses}
    scores = [m["score"] for m in misses]
    assert scores == sorted(scores, reverse=True)
    for m in misses:
        t = explain_step(lake, 3, m["task_id"])["task"]
        assert (m["score"], m["score_rank"], m["why"], m["blocked_by"]) == (
            t["score"],
            t["score_rank"],
            t["why"],
            t["blocked_by"],
        )
    table = near_misses_table(misses).splitlines()  # what the manifest's partition shows in the UI
    assert len(table) == 2 + len(misses) and all(
        m["task_id"] in row for m, row in zip(misses, table[2:], strict=True)
    )
    # no task left out scores above the near misses
    left = [
        explain_step(lake, 3, tid)["task"]["score"]
        for tid in list(load_state(lake, load_run(lake), 2).task_ids)[:15]
        if tid not in picked
    ]
    assert max(left) <= scores[0]
