"""The neural learner (trainer/neural): small, deterministic, blind to the answer key, learns from
GRPO on the real verifiers' rewards, and runs inside the loop (`--policy neural`) with held-out on
seen and unseen environments and a rollout viewer that shows what it did."""

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from envs.registry import load_synthetic
from envsched_pipeline.analysis.bench import (
    _cache_file,
    _canonical_eval,
    blas_kernel,
    run_benchmark,
    run_environment,
)
from envsched_pipeline.analysis.patterns import pattern_effects, pattern_shares, residual_share_correlation
from envsched_pipeline.analysis.spread import (
    every_seed_chance,
    every_seed_needs,
    paired_components,
    predicted_sd,
    several_draws,
    two_draws,
    within_run,
)
from envsched_pipeline.cli import main
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.core.select import select_manifest
from envsched_pipeline.core.statistics import statistics_step
from envsched_pipeline.lake import Lake
from envsched_pipeline.run import RunSpec, start_run
from tests.gradients import GradientTaker, assert_scaled
from trainer.neural import UPDATE_DIAGNOSTICS
from trainer.neural.learner import NeuralConfig, NeuralLearner
from trainer.step import run_step


@pytest.fixture(scope="module")
def pool():
    return load_synthetic("nn", n_envs=3, tasks_per_env=4, heldout_per_env=1, seed=5)


def learner(pool, seed=0, **kw):
    return NeuralLearner({e["env_id"]: e for e in pool.environments}, NeuralConfig(**kw), seed=seed)


def test_small_and_deterministic_given_the_seed(pool):
    a, b = learner(pool), learner(pool)
    try:
        assert sum(p.numel() for p in a.model.parameters()) < 5_000_000
        ra = a.rollout(pool.tasks[:6], 4, seed=11)
        rb = b.rollout(pool.tasks[:6], 4, seed=11)
        assert np.array_equal(ra["reward"], rb["reward"])
        assert ra["trajectory"].tolist() == rb["trajectory"].tolist()
    finally:
        a.close()
        b.close()


def test_results_do_not_depend_on_the_callers_torch_threads(pool):
    """The bench's parallel workers run one torch thread and its serial path the caller's setting:
    both must give the same run (they once differed after a few updates)."""
    before, weights = torch.get_num_threads(), []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            lrn = learner(pool, warm_start_steps=0, lr=3e-3)
            try:
                for step in range(3):
                    lrn.rollout(pool.tasks, 8, seed=step)
                    lrn.learn()
                weights.append([p.detach().clone() for p in lrn.model.parameters()])
            finally:
                lrn.close()
            assert torch.get_num_threads() == threads  # the caller's setting is restored
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(*weights, strict=True))


def test_a_checkpoint_loads_with_the_learners_own_learning_rate(pool):
    """The optimizer's saved state carries the learning rate and weight decay it ran with; a run
    resumed with other ones (`--allow-config-change`) trains with those it asked for."""
    old = learner(pool, warm_start_steps=0, lr=1e-3, weight_decay=0.0)
    new = learner(pool, warm_start_steps=0, lr=5e-3, weight_decay=0.01)
    new.load_bytes(old.state_bytes())
    assert [(g["lr"], g["weight_decay"]) for g in new.optimizer.param_groups] == [(5e-3, 0.01)]
    assert new.digest() != old.digest()  # what its steps record: the settings it trained with


def test_it_acts_without_the_answer_key(pool):
    """Gold actions (the generator's answer key) are never read at rollout time: garbling them
    changes nothing the policy does."""
    garbled = [dict(t, gold=json.dumps([{"name": "nothing", "arguments": {}}])) for t in pool.tasks[:6]]
    a, b = learner(pool), learner(pool)
    try:
        ra = a.rollout(pool.tasks[:6], 4, seed=3)
        rb = b.rollout(garbled, 4, seed=3)
        assert ra["trajectory"].tolist() == rb["trajectory"].tolist()
        assert np.array_equal(ra["reward"], rb["reward"])
    finally:
        a.close()
        b.close()


def test_grpo_on_real_verifier_rewards_improves_the_trained_tasks(pool):
    lrn = learner(pool, warm_start_steps=0, lr=3e-3)
    try:
        tasks = pool.tasks  # no warm start: few groups have spread at first, so give it 20 steps
        before = lrn.evaluate(tasks, 8, seed=99)["mean"]
        trained = 0
        for step in range(20):
            lrn.rollout(tasks, 8, seed=step)
            trained += lrn.learn()["trained_groups"]
        after = lrn.evaluate(tasks, 8, seed=99)["mean"]
        assert trained > 0 and after > before + 0.04, (before, after)  # measured: 0.281 -> 0.354
    finally:
        lrn.close()


def test_the_loss_can_average_over_the_whole_batch(pool):
    """loss_denominator "batch": the step is the informative-only step times the share of the batch's
    decisions that carry an advantage, so a batch of mostly zero-variance groups moves the policy less."""
    with pytest.raises(ValueError, match="loss_denominator"):
        NeuralConfig(loss_denominator="everything")
    grads, infos = {}, {}
    for denominator in ("informative", "batch"):
        lrn = learner(pool, minibatches=1, grad_clip=1e9, loss_denominator=denominator)
        try:
            lrn.optimizer = GradientTaker(lrn.model.parameters())
            out = lrn.rollout(pool.tasks, 4, seed=7)
            infos[denominator] = lrn.learn()
            grads[denominator] = lrn.optimizer.grads
        finally:
            lrn.close()
    spread = np.ptp(out["reward"].reshape(len(pool.tasks), 4), axis=1) > 1e-6
    assert spread.any() and not spread.all()  # some groups informative, some not
    share = infos["batch"]["informative_decision_share"]
    assert (
        0 < share < 1 and infos["batch"]["loss_scale"] == share and infos["informative"]["loss_scale"] == 1.0
    )
    assert_scaled(grads["informative"], grads["batch"], share)


def test_a_non_finite_gradient_skips_the_update_instead_of_poisoning_the_weights(pool):
    """A decision whose probability grew by more than e^88 since it was sampled overflows the ratio;
    with a negative advantage the loss and the gradient are infinite. The optimizer step is skipped
    (and counted): before, one such step turned every weight into NaN and the policy into a constant
    that still scored 0.36 on held-out, which read as a late learning collapse."""
    lrn = learner(pool, warm_start_steps=0)
    try:
        out = lrn.rollout(pool.tasks, 4, seed=7)
        assert (np.ptp(out["reward"].reshape(len(pool.tasks), 4), axis=1) > 1e-6).any()
        for t in lrn.last["traces"]:  # as if every decision had been sampled at probability e^-200
            t.logp = [[-200.0 for _ in step] for step in t.logp]
        before = [p.detach().clone() for p in lrn.model.parameters()]
        info = lrn.learn()
        assert info["skipped_updates"] == lrn.config.minibatches
        for a, b in zip(before, lrn.model.parameters(), strict=True):
            assert torch.isfinite(b).all() and torch.equal(a, b)
        lrn.rollout(pool.tasks, 4, seed=8)  # the policy still acts and learns
        assert lrn.learn()["skipped_updates"] == 0
        with torch.no_grad():  # and a policy with NaN weights fails loudly instead of picking option 0
            next(lrn.model.parameters()).fill_(float("nan"))
        with pytest.raises(FloatingPointError, match="NaN"):
            lrn.rollout(pool.tasks[:3], 4, seed=9)
    finally:
        lrn.close()


def test_dual_clip_and_untrained_forced_stops_keep_an_overflowing_update_finite(pool):
    """With dual_clip set, the decisions whose ratio overflowed are held (no gradient) instead of
    skipping the whole update; with train_forced_stop off, the stop that the max_actions cap forced
    carries no gradient at all (it was not sampled from the policy)."""
    with pytest.raises(ValueError, match="dual_clip"):
        NeuralConfig(dual_clip=0.5)
    lrn = learner(pool, warm_start_steps=0, dual_clip=3.0, minibatches=1)
    try:
        lrn.rollout(pool.tasks, 4, seed=7)
        for t in lrn.last["traces"][::2]:  # half the episodes overflow, the other half still teach
            t.logp = [[-200.0 for _ in step] for step in t.logp]
        before = [p.detach().clone() for p in lrn.model.parameters()]
        info = lrn.learn()
        assert info["skipped_updates"] == 0 and np.isfinite(info["grad_norm"])
        # the update's diagnostics see the overflow: the ratio's log passed 100, and decisions with
        # a negative advantage sit past the dual clip's bound
        assert info["log_ratio_max"] > 100 and 0 < info["negative_ratio_over3"] < 1
        assert all(torch.isfinite(p).all() for p in lrn.model.parameters())
        assert any(not torch.equal(a, b) for a, b in zip(before, lrn.model.parameters(), strict=True))
    finally:
        lrn.close()
    # without a warm start most episodes run into the max_actions cap
    grads = {}
    for train_forced_stop in (True, False):
        lrn = learner(
            pool, warm_start_steps=0, minibatches=1, grad_clip=1e9, train_forced_stop=train_forced_stop
        )
        try:
            lrn.optimizer = GradientTaker(lrn.model.parameters())
            lrn.rollout(pool.tasks, 4, seed=7)
            traces = lrn.last["traces"]
            info = lrn.learn()
            grads[train_forced_stop] = lrn.optimizer.grads
        finally:
            lrn.close()
        capped = np.mean([len(t.tool_choice) > lrn.config.max_actions for t in traces])
        assert 0 < capped and info["forced_stop_share"] == pytest.approx(capped)
        assert info["trained_episodes"] > 0
        # one minibatch: the policy the loss sees is the one that sampled (ratio 1)
        assert abs(info["log_ratio_max"]) < 1e-4 and info["negative_ratio_over3"] == 0
        # the log-probability the cap's stops had, reported only where they are trained
        assert (info["forced_stop_logp"] < 0) if train_forced_stop else np.isnan(info["forced_stop_logp"])
    # the forced stop's tool logits are the only difference: the two gradients differ
    assert any(not torch.allclose(a, b) for a, b in zip(grads[True], grads[False], strict=True))


def test_overrun_penalty_charges_only_the_episodes_the_cap_stopped(pool):
    """The penalty comes off the reward GRPO trains on for capped episodes only; the verifiers'
    reward, the trajectory record and held-out evaluation are untouched by it."""
    for bad in (-0.1, 1.5, float("nan"), True, "0.1"):
        with pytest.raises(ValueError, match="overrun_penalty"):
            NeuralConfig(overrun_penalty=bad)
    outs = {}
    for penalty in (0.0, 0.25):
        # without a warm start many episodes run into the max_actions cap
        lrn = learner(pool, warm_start_steps=0, overrun_penalty=penalty)
        try:
            ev = lrn.evaluate(pool.tasks, samples=4, seed=3)  # same weights in both settings
            out = lrn.rollout(pool.tasks, 4, seed=7)
            assert np.array_equal(lrn.last["rewards"], out["reward"])
            info = lrn.learn()
            assert info["forced_stop_share"] == pytest.approx(out["capped"].mean())
        finally:
            lrn.close()
        outs[penalty] = (out, ev)
    (plain, ev0), (charged, ev1) = outs[0.0], outs[0.25]
    capped = charged["capped"]
    assert 0 < capped.mean() < 1  # both kinds of episode occur, so both sides of the rule are tested
    # same seed, same weights: the same episodes; only the capped ones lose 0.25
    assert np.array_equal(plain["verifier_reward"], charged["verifier_reward"])
    assert np.allclose(charged["reward"], np.maximum(charged["verifier_reward"] - 0.25 * capped, 0))
    assert (charged["reward"] < charged["verifier_reward"]).any()  # some capped episodes scored
    assert np.array_equal(plain["reward"], plain["verifier_reward"])
    assert ev0 == ev1  # held-out reports the verifiers' reward (its episodes hit the cap as often)
    stops = [json.loads(t)["stopped_by_cap"] for t in charged["trajectory"].reshape(-1)]
    assert stops == capped.reshape(-1).tolist()


def test_train_takes_the_overrun_penalty_and_forced_stop_setting_only_for_policies_that_use_them(
    tmp_path, capsys
):
    base = ["train", "--pool", "synthetic", "--steps", "1"]
    for policy, flags, says in (
        ("simulated", ["--overrun-penalty", "0.1"], "policy 'simulated' does not use overrun_penalty"),
        ("simulated", ["--no-train-forced-stop"], "policy 'simulated' does not use train_forced_stop"),
        ("neural", ["--overrun-penalty", "1.5"], "policy_config.overrun_penalty must be in [0, 1], got 1.5"),
    ):
        lake = tmp_path / policy
        assert main(["--lake", str(lake), *base, *flags, "--policy", policy]) == 2
        assert says in capsys.readouterr().err
        assert not (lake / "run.json").exists()  # refused before anything is written


def test_a_run_keeps_the_learner_it_started_with_when_a_default_changes(tmp_path):
    """A neural run states the changed defaults in its spec from the start; a spec written before
    runs did is read with the former default, so resuming it cannot silently switch learners."""
    from dataclasses import replace

    from envsched_pipeline.errors import StepError
    from envsched_pipeline.run import load_run

    lake = Lake(tmp_path / "lake")
    spec = start_run(lake, RunSpec(pool="synthetic", policy="neural", max_steps=2))
    assert spec.policy_config == {"train_forced_stop": False} == load_run(lake).policy_config
    assert NeuralConfig.from_dict(spec.policy_config) == NeuralConfig()
    # other policies and outside trainers are left as given
    other = Lake(tmp_path / "sim")
    assert start_run(other, RunSpec(pool="synthetic", policy="simulated")).policy_config == {}
    ext = Lake(tmp_path / "ext")
    assert start_run(ext, RunSpec(pool="synthetic", policy="neural", trainer="external")).policy_config == {}
    # a lake started before runs stated it (its run.json says nothing) trained the forced stop
    old = Lake(tmp_path / "old")
    import_pool(old, load_synthetic("synthetic", n_envs=2, tasks_per_env=3, heldout_per_env=1, seed=5))
    small = {"batch_size": 2, "group_size": 2, "run_id": "r0", "policy_config": {"lr": 1e-3}}
    old.write_json("run.json", {**spec.to_dict(), **small})
    assert load_run(old).policy_config == {"lr": 1e-3, "train_forced_stop": True}
    select_manifest(old, 0)  # the old run has taken a step
    asked = RunSpec(
        pool="synthetic", policy="neural", batch_size=2, group_size=2, max_steps=4, policy_config={"lr": 1e-3}
    )
    with pytest.raises(StepError, match="train_forced_stop"):
        start_run(old, asked)  # today's default would change its learner: refused, says which setting
    resumed = start_run(old, replace(asked, policy_config={"lr": 1e-3, "train_forced_stop": True}))
    assert resumed.policy_config["train_forced_stop"] is True and resumed.max_steps == 4


def test_neural_policy_in_the_loop_with_held_out_and_rollout_viewer(tmp_path, capsys):
    lake = Lake(tmp_path / "lake")
    import_pool(lake, load_synthetic("synthetic", n_envs=3, tasks_per_env=4, heldout_per_env=1, seed=5))
    start_run(
        lake,
        RunSpec(
            pool="synthetic",
            policy="neural",
            batch_size=4,
            group_size=4,
            max_steps=2,
            policy_config={
                "warm_start_steps": 5,
                "loss_denominator": "batch",
                "dual_clip": 3.0,
                "train_forced_stop": False,
                "overrun_penalty": 0.1,
            },
        ),
    )
    for t in range(2):
        select_manifest(lake, t)
        run_step(lake, t, log=lambda *_: None)
        statistics_step(lake, t)
    assert lake.read("rollouts").num_rows == 2 * 4 * 4
    tm = lake.read("train_metrics", step=1).to_pylist()[0]
    assert tm["policy"] == "neural" and tm["skipped_updates"] == 0 and 0 <= tm["forced_stop_share"] <= 1
    # the update's diagnostics reach the lake; no forced stop is trained here, so it has no log-prob
    assert "log_ratio_max" in tm and "negative_ratio_over3" in tm and not tm["forced_stop_logp"] < 0
    for t in range(2):  # the whole-batch denominator: the step shrinks with the informative share
        m = lake.read("train_metrics", step=t).to_pylist()[0]
        assert 0 <= m["loss_scale"] < 1 and (m["loss_scale"] > 0) == (m["trained_groups"] > 0)
    benches = set(lake.read("evals").column("benchmark").to_pylist())
    assert any("seen" in b for b in benches) and any("unseen" in b for b in benches), benches
    assert lake.read_bytes("checkpoints/step=1/neural.pt") is not None
    capsys.readouterr()
    assert main(["--lake", str(lake.root), "rollouts", "show", "--step", "1", "--limit", "1"]) == 0
    out = capsys.readouterr().out
    assert "instruction:" in out and "checks:" in out
    # the held-out episodes behind the scores: every evaluation task, 8 samples each, per split
    held = lake.sql(
        "select step, split, count(*) as n, avg(reward) as mean from eval_rollouts group by all order by all"
    )
    splits = {r["split"] for r in held.to_pylist()}
    ev = {(e["step"], e["benchmark"]): e["score"] for e in lake.read("evals").to_pylist()}
    n_eval = {
        s: sum(r["split"] == s for r in lake.read("eval_tasks", pool="synthetic").to_pylist()) for s in splits
    }
    for r in held.to_pylist():  # step 0 and the last step (1) evaluate
        assert r["n"] == 8 * n_eval[r["split"]] and r["mean"] == pytest.approx(
            ev[(r["step"], f"heldout_{r['split']}")]
        )
    assert {r["step"] for r in held.to_pylist()} == {0, 1} and splits == {"seen", "unseen"}
    assert (
        main(["--lake", str(lake.root), "rollouts", "show", "--step", "1", "--heldout", "--limit", "1"]) == 0
    )
    out = capsys.readouterr().out
    assert "held-out (seen environments)" in out and "checks:" in out


NEURAL_FIELDS = (
    "heldout_seen_initial",
    "heldout_seen_final",
    "heldout_unseen_initial",
    "heldout_unseen_final",
    "heldout_seen_initial_se",
    "heldout_seen_final_se",
    "heldout_unseen_initial_se",
    "heldout_unseen_final_se",
    "informative_envs",
    "effective_envs",
    "distinct_tasks",
    "max_task_picks",
)


def test_bench_json_on_the_neural_learner(tmp_path, capsys):
    """`envsched bench scheduler --learner neural ... --json` carries the held-out and useful-breadth
    fields per scheduler, and the paired difference against random; between the held-out
    evaluations the run says how far it is."""
    out = tmp_path / "bench.json"
    args = ["bench", "scheduler", "--learner", "neural", "--envs", "4", "--tasks", "6", "--steps", "2"]
    args += [
        "--batch-size",
        "4",
        "--group-size",
        "4",
        "--schedulers",
        "random,envsched",
        "--eval-every",
        "2",
        "--series",
    ]
    assert main([*args, "--json", str(out)]) == 0
    said = capsys.readouterr().out
    assert re.search(r"envsched seed 0 step 1/2: zero-variance \d\.\d\d, .* s/step, ~\d+ min left", said)
    assert "step 2/2" not in said  # the last step's line is the held-out evaluation
    doc = json.loads(out.read_text())
    assert doc["setup"]["learner"] == "neural" and not doc["setup"]["simulated"]
    for name in ("random", "envsched"):
        m = doc["schedulers"][name]
        assert all(k in m for k in NEURAL_FIELDS), sorted(set(NEURAL_FIELDS) - set(m))
        assert m["seeds"] == 1 and 0.0 <= m["heldout_unseen_final"] <= 1.0 and m["heldout_seen_final_se"] > 0
        assert 1 <= m["distinct_tasks"] <= 24 and m["max_task_picks"] >= 1
    # the coverage half's picks per step: none at the cold start, then round(rho B) = 2
    assert doc["series"]["envsched"]["coverage_picks"] == [0, 2]
    # every step's update statistics are in the record
    for k in UPDATE_DIAGNOSTICS:
        assert len(doc["series"]["random"][f"update_{k}"]) == 2
    assert all(np.isfinite(doc["series"]["random"]["update_grad_norm"]))
    paired = doc["paired_vs_random"]["envsched"]["heldout_unseen_final"]
    m, r = doc["schedulers"]["envsched"], doc["schedulers"]["random"]
    assert paired["n"] == 1 and paired["per_seed"] == [m["heldout_unseen_final"] - r["heldout_unseen_final"]]
    # held-out over repeated attempts at the last evaluation, from its episodes (analysis.passk)
    last = doc["series"]["random"]["evals"][-1]
    for kind in ("seen", "unseen"):
        assert r[f"heldout_{kind}_final_pass_all"] <= r[f"heldout_{kind}_final_solved"]
        assert r[f"heldout_{kind}_final_solved"] <= r[f"heldout_{kind}_final_pass_any"]
        assert r[f"heldout_{kind}_final_solved_se"] > 0
        assert f"{kind}_pass_at" not in last  # by k: in each run's record, not averaged in the series
        d = doc["paired_vs_random"]["envsched"][f"heldout_{kind}_final_pass_all"]
        assert d["per_seed"] == [m[f"heldout_{kind}_final_pass_all"] - r[f"heldout_{kind}_final_pass_all"]]


def test_a_larger_unseen_split_adds_environments_and_leaves_the_run_as_it_was(tmp_path, capsys):
    """`--unseen-envs N` holds out N environments of the unseen family, the default 12 first: the
    training run is the same step for step, its record is keyed apart, and every evaluation keeps
    the held-out per environment (the mean of those is the held-out: every environment has as many
    tasks)."""
    base = ["bench", "scheduler", "--learner", "neural", "--envs", "4", "--tasks", "6", "--steps", "2"]
    base += ["--batch-size", "4", "--group-size", "4", "--schedulers", "random", "--eval-every", "2"]
    base += ["--cache", str(tmp_path / "runs")]
    assert main(base) == 0
    assert main([*base, "--unseen-envs", "14", "--json", str(tmp_path / "large.json")]) == 0
    assert json.loads((tmp_path / "large.json").read_text())["setup"]["unseen_envs"] == 14
    capsys.readouterr()
    small, large = (
        json.loads(f.read_text())
        for f in sorted((tmp_path / "runs").glob("random-s0-*.json"), key=lambda f: len(f.read_text()))
    )
    assert small["mean_reward"] == large["mean_reward"] and small["batch_variance"] == large["batch_variance"]
    for rec, n in ((small, 12), (large, 14)):
        for ev in rec["evals"]:
            assert len(ev["unseen_by_env"]) == n and len(ev["seen_by_env"]) == 4
            assert ev["unseen_mean"] == pytest.approx(np.mean(list(ev["unseen_by_env"].values())))
            # per task too (what a task asks is in the pool's latents, so held-out can be grouped by it)
            assert len(ev["unseen_by_task"]) == 10 * n and len(ev["seen_by_task"]) == 4 * 4
            assert ev["seen_mean"] == pytest.approx(np.mean(list(ev["seen_by_task"].values())))
            by_env = {}
            for task, m in ev["unseen_by_task"].items():
                by_env.setdefault(task.rsplit("-", 1)[0], []).append(m)
            assert {e: np.mean(v) for e, v in by_env.items()} == pytest.approx(ev["unseen_by_env"])
    assert set(small["evals"][0]["unseen_by_env"]) < set(large["evals"][0]["unseen_by_env"])
    with pytest.raises(ValueError, match="unseen_envs must be >= 1"):  # the CLI's parser refuses it first
        run_benchmark(["random"], 1, 0, learner="neural", unseen_envs=0)


def test_runs_recorded_before_a_new_field_still_aggregate():
    """A run recorded by an older version lacks fields added since (here the neural runs' total of
    skipped updates): the table averages the per-step series every run has instead of failing."""
    from envsched_pipeline.analysis.bench import aggregate, prepare_pool, run_one, summarize

    pool = prepare_pool(4, 6, 0)
    new = {s: run_one("random", pool, steps=3, seed=s, batch_size=4) for s in (0, 1)}
    new[0]["skipped_updates"] = 0  # recorded by this version; seed 1 by an older one
    new[0]["forced_stop_share"] = [0.2, 0.4, 1.0]
    doc = aggregate(["random"], [0, 1], {("random", s): r for s, r in new.items()}, {})
    assert doc["schedulers"]["random"]["seeds"] == 2
    # capped-episode shares of the first and last quarter of the steps, where the run recorded them
    first = doc["per_seed"]["random"][0]
    assert (first["capped_first_quarter"], first["capped_last_quarter"]) == (0.2, 1.0)
    assert "capped_last_quarter" not in doc["per_seed"]["random"][1]
    assert "skipped_updates" not in doc["series"]["random"]
    assert len(doc["series"]["random"]["batch_variance"]) == 3
    # a late decline: the last evaluation against the best earlier one (0 when the last is the best)
    run = dict(new[0], evals=[dict(new[0]["evals"][0], seen_mean=x) for x in (0.5, 0.9, 0.8)])
    assert summarize(run, None)["heldout_seen_drop"] == pytest.approx(0.1)
    run["evals"][-1]["seen_mean"] = 0.95
    assert summarize(run, None)["heldout_seen_drop"] == 0.0


def test_steps_to_random_final_held_out_interpolates_between_evaluations():
    """Each run's per-seed summary says at which step it first reached random's final held-out in the
    same seed (both kinds), interpolated between evaluations; None where it never did; a target the
    start already met is reached at the first evaluation."""
    from envsched_pipeline.analysis.bench import aggregate, prepare_pool, run_one, steps_to_reach

    evals = [{"step": t, "a": a} for t, a in ((0, 0.6), (50, 0.8), (100, 0.85), (150, 0.9), (200, 0.91))]
    assert steps_to_reach(evals, "a", 0.875) == pytest.approx(125.0)
    assert steps_to_reach(evals, "a", 0.91) == 200.0 and steps_to_reach(evals, "a", 0.95) is None
    assert steps_to_reach(evals, "a", 0.5) == 50.0
    pool = prepare_pool(4, 6, 0)
    runs = {n: run_one("random", pool, steps=4, seed=0, batch_size=4) for n in ("random", "other")}
    curve = lambda seen, unseen: [  # noqa: E731
        {"step": t, "seen_mean": a, "seen_se": 0.0, "unseen_mean": b, "unseen_se": 0.0}
        for t, a, b in zip((0, 2, 4), seen, unseen, strict=True)
    ]
    runs["random"]["evals"] = curve((0.5, 0.6, 0.7), (0.4, 0.5, 0.6))
    runs["other"]["evals"] = curve((0.5, 0.8, 0.9), (0.4, 0.45, 0.5))
    doc = aggregate(["random", "other"], [0], {(n, 0): r for n, r in runs.items()}, {})
    mine, rnd = doc["per_seed"]["other"][0], doc["per_seed"]["random"][0]
    assert mine["steps_to_random_seen_final"] == pytest.approx(2 * (0.7 - 0.5) / (0.8 - 0.5))
    assert mine["steps_to_random_unseen_final"] is None
    assert rnd["steps_to_random_seen_final"] == 4.0 == rnd["steps_to_random_unseen_final"]


def test_a_table_from_recorded_runs_leaves_out_what_is_not_on_record(tmp_path, capsys):
    """--recorded-only runs nothing: a scheduler is averaged over the seeds it has, and compared with
    random over the seeds both have."""
    runs, out = tmp_path / "runs", tmp_path / "bench.json"
    args = ["bench", "scheduler", "--envs", "4", "--tasks", "6", "--steps", "3", "--batch-size", "4"]
    args += ["--schedulers", "random,envsched", "--seeds", "3", "--cache", str(runs), "--json", str(out)]
    assert main(args) == 0
    full = json.loads(out.read_text())
    (gone,) = runs.glob("envsched-s1-*.json")
    gone.unlink()
    capsys.readouterr()
    assert main([*args, "--recorded-only"]) == 0
    assert "not on record (left out): envsched seed 1" in capsys.readouterr().out
    part = json.loads(out.read_text())
    assert part["schedulers"]["random"]["seeds"] == 3 and part["schedulers"]["envsched"]["seeds"] == 2
    d_full = full["paired_vs_random"]["envsched"]["batch_variance"]["per_seed"]
    d_part = part["paired_vs_random"]["envsched"]["batch_variance"]
    assert d_part["n"] == 2 and d_part["per_seed"] == [d_full[0], d_full[2]]
    assert part["schedulers"]["random"] == full["schedulers"]["random"]
    assert not list(runs.glob("envsched-s1-*.json"))  # nothing was run to fill the gap
    none = tmp_path / "none.json"
    assert (
        main(
            [*args[:-4], "--schedulers", "dps", "--cache", str(runs), "--recorded-only", "--json", str(none)]
        )
        == 2
    )
    assert not none.exists()  # refused: nothing written
    # every record says which package versions it ran under; a table built from a record made under
    # others says so, as does one built from records that predate the field
    (rec_file,) = runs.glob("random-s0-*.json")
    rec = json.loads(rec_file.read_text())
    assert rec["environment"] == run_environment() and rec["environment"]["numpy"] == np.__version__
    rec["environment"]["numpy"] = "1.0.0"
    rec_file.write_text(json.dumps(rec))
    (old_file,) = runs.glob("random-s2-*.json")
    old_file.write_text(
        json.dumps({k: v for k, v in json.loads(old_file.read_text()).items() if k != "environment"})
    )
    # a record from before the CPU (or the BLAS kernels) was kept is not a mismatch but is counted
    # apart; the same versions on another CPU or other BLAS kernels are a mismatch (a re-run there
    # can depart)
    here = run_environment()
    assert here["blas"] == blas_kernel() and here["blas"] != "unknown"  # numpy's OpenBLAS is loaded
    older = {k: v for k, v in here.items() if k not in ("cpu", "blas")}
    for name, s, env in (("envsched", "0", older), ("envsched", "2", None), ("random", "1", None)):
        (f,) = runs.glob(f"{name}-s{s}-*.json")
        r = json.loads(f.read_text())
        changed = {"cpu": "Other CPU (AVX2)"} if name == "envsched" else {"blas": "OtherKernel"}
        r["environment"] = env or {**r["environment"], **changed}
        f.write_text(json.dumps(r))
    capsys.readouterr()
    assert main([*args, "--recorded-only"]) == 0
    said = capsys.readouterr().out
    assert f"recorded under numpy 1.0.0 (now {np.__version__}): a re-run may differ" in said
    assert f"recorded under cpu Other CPU (AVX2) (now {here['cpu']})" in said
    assert f"recorded under blas OtherKernel (now {here['blas']}): a re-run may differ)" in said
    assert "1 cached run(s) predate recorded package versions" in said
    prov = json.loads(out.read_text())["provenance"]
    counts = ("runs", "current", "complete", "unversioned", "no_cpu", "no_blas")
    assert tuple(prov[k] for k in counts) == (5, 1, 0, 1, 1, 1)
    assert prov["other"] == {
        f"numpy 1.0.0 (now {np.__version__})": 1,
        f"cpu Other CPU (AVX2) (now {here['cpu']})": 1,
        f"blas OtherKernel (now {here['blas']})": 1,
    }
    assert (
        f"Runs behind this table: 5; 0 under this environment's (Python {platform.python_version()}, "
        f"blas {here['blas']}, numpy {np.__version__}"
        in said
        and "; 1 under its package versions, the CPU or BLAS kernels not recorded; " in said
        and "1 recorded before runs kept their package versions; 1 under other versions (numpy 1.0.0" in said
        and "Of the versioned runs, 1 were recorded before runs kept their CPU" in said
        and f"1 versioned run(s) predate the BLAS kernels in the record (this process: {here['blas']})."
        in said
    )
    assert json.loads(out.read_text())["schedulers"]["random"] == full["schedulers"]["random"]
    # learner settings are part of a run's key: runs of other settings are never taken for these
    other = [*args[:-2], "--learner-config", '{"forget": 0.01}', "--recorded-only", "--json", str(none)]
    assert main(other) == 2 and not none.exists()


def test_another_draw_is_another_run_from_the_same_seed_and_leaves_the_records_keyed_as_they_were(
    tmp_path, capsys
):
    """`--draw K`: the same seed's pool, split and warm start, other sampling and selection streams.
    Draw 0 is the recorded run (same key, same numbers); draw K > 0 is a record of its own, differs
    from draw 0 and repeats itself."""
    base = ["bench", "scheduler", "--envs", "4", "--tasks", "6", "--steps", "6", "--batch-size", "6"]
    base += [
        "--group-size",
        "4",
        "--schedulers",
        "random,envsched",
        "--cache",
        str(tmp_path / "runs"),
        "--series",
    ]
    docs, headers = {}, {}
    for label, extra in (
        ("plain", []),
        ("zero", ["--draw", "0"]),
        ("one", ["--draw", "1"]),
        ("again", ["--draw", "1"]),
    ):
        out = tmp_path / f"{label}.json"
        assert main([*base, *extra, "--json", str(out)]) == 0
        docs[label] = json.loads(out.read_text())
        headers[label] = capsys.readouterr().out.splitlines()[0]
    # the command's first line says which draw it runs (nothing for the recorded one)
    assert headers["one"].endswith(", draw 1") and "draw" not in headers["plain"] + headers["zero"]
    assert len(list((tmp_path / "runs").glob("*.json"))) == 4  # two schedulers x two draws
    for name in ("random", "envsched"):
        plain, one = docs["plain"]["series"][name], docs["one"]["series"][name]
        assert docs["zero"]["series"][name]["mean_reward"] == plain["mean_reward"]
        assert docs["again"]["series"][name]["mean_reward"] == one["mean_reward"]
        assert one["mean_reward"] != plain["mean_reward"]
    assert docs["one"]["setup"]["draw"] == 1 and docs["plain"]["setup"]["draw"] == 0
    # a traced draw is a file of its own beside the recorded run's trace
    traced = tmp_path / "traced.json"
    assert main([*base, "--draw", "1", "--trace", str(tmp_path / "t"), "--json", str(traced)]) == 0
    assert sorted(Path(p).name for p in json.loads(traced.read_text())["traces"]) == [
        "envsched-s0-d1.parquet",
        "random-s0-d1.parquet",
    ]
    with pytest.raises(ValueError, match="draw must be >= 0"):  # the CLI's parser refuses it first
        run_benchmark(["random"], 1, 0, learner="neural", draw=-1)


def test_a_whole_number_for_a_float_setting_finds_the_same_recorded_runs():
    from envsched_pipeline.analysis.bench import check_learner_config

    given = {"dual_clip": 3, "train_forced_stop": False, "loss_denominator": "batch", "max_actions": 8}
    c = check_learner_config("neural", given)
    assert json.dumps(c, sort_keys=True) == json.dumps(
        {"dual_clip": 3.0, "train_forced_stop": False, "loss_denominator": "batch", "max_actions": 8},
        sort_keys=True,
    )
    assert type(c["max_actions"]) is int and c["train_forced_stop"] is False


def test_recorded_runs_keep_their_meaning_when_a_default_changes(tmp_path):
    """Runs are keyed by their settings that differ from the defaults of when recording began, so
    the committed records of the learner that trains the forced stop (the default until 2026-12)
    are found under that setting named explicitly, and never taken for today's default learner."""
    from trainer.neural.learner import record_settings

    assert NeuralConfig().train_forced_stop is False
    assert record_settings({}) == {"train_forced_stop": False}
    assert record_settings({"train_forced_stop": True}) == {}
    # a default given explicitly, a whole number for a float, a model size: keyed as what they change
    given = {
        "loss_denominator": "informative",
        "train_forced_stop": True,
        "dual_clip": 3,
        "policy": {"dim": 32},
    }
    assert json.dumps(record_settings(given)) == json.dumps({"dual_clip": 3.0, "policy": {"dim": 32}})
    assert record_settings({"policy": {"dim": 64}, "overrun_penalty": 0.1}) == {
        "overrun_penalty": 0.1,
        "train_forced_stop": False,
    }
    runs = Path(__file__).resolve().parents[1] / "bench" / "runs"
    kw = dict(
        steps=200, seed=0, seeds=1, learner="neural", eval_every=50, recorded_only=True, log=lambda _m: None
    )
    forced = run_benchmark(
        ["random"], cache_dir=runs / "neural", learner_config={"train_forced_stop": True}, **kw
    )
    assert forced["per_seed"]["random"][0]["heldout_seen_final"] > 0
    assert "random" not in run_benchmark(["random"], cache_dir=runs / "neural", **kw)["schedulers"]
    # today's default finds the runs recorded with the forced stop left out, whichever way it is said
    plain = run_benchmark(["random"], cache_dir=runs / "neural-noforced", **kw)
    said = run_benchmark(
        ["random"], cache_dir=runs / "neural-noforced", learner_config={"train_forced_stop": False}, **kw
    )
    assert plain["per_seed"]["random"] == said["per_seed"]["random"] != forced["per_seed"]["random"]
    # the held-out schedule is keyed as run: --eval-every left out and given as its default
    # (steps // 4) are one run, and a record keyed the first way before that is still found
    unsaid = run_benchmark(["random"], cache_dir=runs / "neural-noforced", **{**kw, "eval_every": None})
    assert unsaid["per_seed"]["random"] == plain["per_seed"]["random"]
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    keyed = {
        "envs": 51,
        "tasks_per_env": 50,
        "steps": 200,
        "batch_size": 64,
        "group_size": 8,
        "overrides": None,
        "learner": "neural",
        "eval_every": None,
        "learner_config": {"train_forced_stop": False},
    }
    canonical = _cache_file(runs / "neural-noforced", "random", 0, _canonical_eval(keyed))
    shutil.copy(canonical, _cache_file(legacy, "random", 0, keyed))
    for every in (None, 50):
        found = run_benchmark(["random"], cache_dir=legacy, **{**kw, "eval_every": every})
        assert found["per_seed"]["random"] == plain["per_seed"]["random"]


def test_learner_settings_are_checked_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "bench.json"
    base = ["bench", "scheduler", "--learner", "neural", "--steps", "1", "--json", str(out)]
    for bad, says in (
        ('{"loss_denominator": "all"}', "loss_denominator: 'all' is not one of informative, batch"),
        ('{"lr": 1e-3, "momentum": 0.9}', "unknown neural learner setting(s): momentum"),
        ("[1]", "a JSON object of settings"),
        ("{lr: 1}", "--learner-config: not JSON"),
    ):
        assert main([*base, "--learner-config", bad]) == 2
        assert says in capsys.readouterr().err
    # from a file, each error names it
    bad_file = tmp_path / "learner.json"
    bad_file.write_text('{"momentum": 0.9}')
    for given in (f"@{bad_file}", str(bad_file)):
        assert main([*base, "--learner-config", given]) == 2
        assert (
            f"--learner-config {bad_file}: unknown neural learner setting(s): momentum"
            in capsys.readouterr().err
        )
    assert main([*base, "--learner-config", "@nowhere.json"]) == 2
    assert "--learner-config nowhere.json: no such file" in capsys.readouterr().err
    assert not out.exists()


def test_grpo_only_settings_share_the_warm_start():
    from trainer.neural.testbed import TestbedConfig, warm_start_key

    tb = TestbedConfig()
    default = warm_start_key(0, tb, NeuralConfig())
    steady = NeuralConfig(
        dual_clip=3.0, train_forced_stop=False, loss_denominator="batch", overrun_penalty=0.1
    )
    assert warm_start_key(0, tb, steady) == default
    assert warm_start_key(0, tb, NeuralConfig(warm_start_steps=10)) != default
    assert warm_start_key(1, tb, NeuralConfig()) != default


def test_a_runs_warm_start_is_made_once_per_seed_and_settings_then_loaded(tmp_path, monkeypatch):
    """Step 0 of a neural run behaviour-clones the warm start, or loads the weights the same warm
    start gave before (the bench's cache): the same weights either way, a damaged cache file made
    again, and another seed or warm-start setting a warm start of its own."""
    from dataclasses import replace

    from trainer.neural.runner import load_learner, new_learner

    monkeypatch.setenv("ENVSCHED_CACHE", str(tmp_path / "cache"))
    lake = Lake(tmp_path / "lake")
    import_pool(lake, load_synthetic("synthetic", n_envs=2, tasks_per_env=3, heldout_per_env=1, seed=5))
    spec = RunSpec(pool="synthetic", policy="neural", seed=3, policy_config={"warm_start_steps": 3})

    def weights(learner) -> list:
        try:
            return [v.clone() for v in learner.model.state_dict().values()]
        finally:
            learner.close()

    def start(run: RunSpec) -> tuple[list, str]:
        lines: list[str] = []
        return weights(load_learner(lake, run, 0, log=lines.append)), "\n".join(lines)

    made, said = start(spec)
    assert "3 behaviour-cloning steps" in said and "kept in" in said
    (cached,) = (tmp_path / "cache" / "neural-warmstart").glob("*.pt")
    loaded, said = start(spec)
    assert f"gave before ({cached}" in said and "behaviour-cloning" not in said
    assert all(torch.equal(a, b) for a, b in zip(made, loaded, strict=True))
    # a GRPO-only setting shares it; the untrained policy does not look like it
    steady, said = start(replace(spec, policy_config={"warm_start_steps": 3, "dual_clip": 3.0}))
    assert "gave before" in said and all(torch.equal(a, b) for a, b in zip(made, steady, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(made, weights(new_learner(lake, spec)), strict=True))
    cached.write_bytes(b"not a checkpoint")
    again, said = start(spec)
    assert "cannot be read" in said and "3 behaviour-cloning steps" in said
    assert all(torch.equal(a, b) for a, b in zip(made, again, strict=True))
    # another seed, another number of warm-start steps: warm starts of their own
    for other in (replace(spec, seed=4), replace(spec, policy_config={"warm_start_steps": 2})):
        _, said = start(other)
        assert "behaviour-cloning steps" in said
    assert len(list((tmp_path / "cache" / "neural-warmstart").glob("*.pt"))) == 3
    # a cache that cannot be made (a file where its folder would be): made and not kept
    (tmp_path / "blocked").write_text("")
    monkeypatch.setenv("ENVSCHED_CACHE", str(tmp_path / "blocked"))
    unkept, said = start(spec)
    assert "no cache to keep it in" in said and "3 behaviour-cloning steps" in said and "kept in" not in said
    assert all(torch.equal(a, b) for a, b in zip(made, unkept, strict=True))


def test_a_run_refuses_a_bad_loss_denominator():
    from envsched_pipeline.errors import ConfigError
    from trainer.update import GRPOConfig

    with pytest.raises(
        ConfigError, match="policy_config.loss_denominator: 'all' is not one of informative, batch"
    ):
        RunSpec(pool="synthetic", policy="neural", policy_config={"loss_denominator": "all"}).validate()
    with pytest.raises(ConfigError, match="policy_config.mode: 'gold' is not one of latent, real"):
        RunSpec(pool="synthetic", policy="simulated", policy_config={"mode": "gold"}).validate()
    with pytest.raises(ConfigError, match="does not use loss_denominator"):
        RunSpec(pool="synthetic", policy="simulated", policy_config={"loss_denominator": "batch"}).validate()
    RunSpec(pool="synthetic", policy="hf-tiny", policy_config={"loss_denominator": "batch"}).validate()
    with pytest.raises(ValueError, match="loss_denominator: 'all'"):
        GRPOConfig(loss_denominator="all")
    with pytest.raises(ConfigError, match="policy_config.dual_clip must be > 1"):
        RunSpec(pool="synthetic", policy="hf-tiny", policy_config={"dual_clip": 0.9}).validate()
    with pytest.raises(ConfigError, match="does not use train_forced_stop"):
        RunSpec(pool="synthetic", policy="hf-tiny", policy_config={"train_forced_stop": False}).validate()
    with pytest.raises(ConfigError, match="does not use overrun_penalty"):
        RunSpec(pool="synthetic", policy="simulated", policy_config={"overrun_penalty": 0.1}).validate()
    with pytest.raises(ConfigError, match=r"policy_config.overrun_penalty must be in \[0, 1\], got 2"):
        RunSpec(pool="synthetic", policy="neural", policy_config={"overrun_penalty": 2}).validate()
    with pytest.raises(ValueError, match="dual_clip: must be > 1"):
        GRPOConfig(dual_clip=1.0)


def test_a_probe_leaves_the_learner_as_it_was(pool):
    """`probe` draws the rewards GRPO would train on without keeping anything for `learn`: a probe
    between a rollout and its update changes neither the update nor the next rollout."""
    a, b = learner(pool, warm_start_steps=0), learner(pool, warm_start_steps=0)
    try:
        tasks = pool.tasks[:6]
        ra = a.rollout(tasks, 4, seed=3)
        b.rollout(tasks, 4, seed=3)
        assert np.array_equal(b.probe(tasks, 4, seed=3), ra["reward"])  # the same seed: the same episodes
        assert b.probe(pool.tasks, 4, seed=5).shape == (len(pool.tasks), 4)
        a.learn(), b.learn()
        for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True):
            assert torch.equal(p, q)
        assert np.array_equal(a.rollout(tasks, 4, seed=4)["reward"], b.rollout(tasks, 4, seed=4)["reward"])
    finally:
        a.close()
        b.close()


def test_bench_probes_the_pools_headroom_without_changing_the_run(tmp_path):
    """`--probe-every N`: every N steps the whole pool is probed (two fresh groups per task): the
    share with spread in the pool, in the scheduler's batch and in an oracle's batch (the tasks with
    the most reward variance in the first draw, scored on the second); the run's own numbers are
    those of the same run without probes."""
    base = ["bench", "scheduler", "--learner", "neural", "--envs", "4", "--tasks", "6", "--steps", "4"]
    base += ["--batch-size", "6", "--group-size", "4", "--schedulers", "random,envsched", "--eval-every", "4"]
    plain, probed = tmp_path / "plain.json", tmp_path / "probed.json"
    assert main([*base, "--json", str(plain)]) == 0
    assert main([*base, "--probe-every", "2", "--json", str(probed), "--series"]) == 0
    a, b = json.loads(plain.read_text()), json.loads(probed.read_text())
    timing = ("select_seconds_median", "step_seconds", "informative_groups_per_second")
    assert "probes" not in a
    for name, m in a["schedulers"].items():
        assert {k: v for k, v in m.items() if k not in timing} == {
            k: v for k, v in b["schedulers"][name].items() if k not in timing
        }
    for name in ("random", "envsched"):
        (row,) = b["probes"][name]  # steps 2 only (probes at N, 2N, ... before the last step)
        assert row["step"] == 2 and 0 <= row["pool_tasks_with_spread"] <= 24
        assert row["pool_spread"] == pytest.approx(row["pool_tasks_with_spread"] / 24)
        for k in ("batch_spread", "oracle_spread", "history_spread"):
            assert 0.0 <= row[k] <= 1.0 and (row[k] * 6) == pytest.approx(round(row[k] * 6))
        assert np.isnan(row["history_auc"]) or 0.0 <= row["history_auc"] <= 1.0
        # the scheduler's own chance of spread (envsched has one, random none) and the batch per half
        assert ("model_spread" in row) == (name == "envsched")
        assert sum(row["half_spread"].values()) > 0 or row["batch_spread"] == 0
        if name == "random":
            assert (
                set(row["half_spread"]) == {"random"} and row["half_spread"]["random"] == row["batch_spread"]
            )
        # episodes the sandbox ended (time limit, crash) are counted per step: none in a healthy run
        assert b["series"][name]["sandbox_failures"] == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="probe_every must be >= 1"):  # the CLI's parser refuses it first
        run_benchmark(["random"], 1, 0, learner="neural", probe_every=0)


def test_the_history_ceiling_ranks_by_what_the_history_says_and_never_by_a_tasks_own_probe():
    """The history ceiling is cross-fitted: a column that tells draw A's spread ranks the spread
    tasks first; with no such column it finds the base rate, even though a model could memorize
    each task's own draw A (which would copy the oracle). Its features: one row per pool task, 26
    columns, no NaN, from any scheduler's state."""
    from envsched_pipeline.analysis.bench import prepare_pool, run_one
    from envsched_pipeline.analysis.headroom import history_ceiling, history_features

    rng = np.random.default_rng(0)
    n, k = 2000, 64
    spread = rng.random(n) < 0.15  # the same chance in draws A and B
    a = spread ^ (rng.random(n) < 0.05)  # draw A: mostly the same tasks, a few flipped
    told = np.column_stack([spread + rng.normal(0, 0.1, n), rng.normal(size=(n, 3))])
    hit = history_ceiling(told, a, spread, k, seed=0)
    assert hit["history_spread"] >= 0.9 and hit["history_auc"] > 0.9
    ids = np.column_stack([np.arange(n), rng.normal(size=(n, 3))])  # unique rows, nothing else
    blind = history_ceiling(ids, a, spread, k, seed=0)
    assert blind["history_spread"] < 0.35 and 0.4 < blind["history_auc"] < 0.6
    with pytest.raises(ValueError, match="feature rows"):
        history_ceiling(told[:10], a, spread, k, seed=0)

    pool = prepare_pool(4, 6, 0)
    for name in ("random", "envsched"):
        state = run_one(name, pool, steps=3, seed=0, batch_size=6, return_state=True)["_state"]
        X = history_features(state, pool["graph"], 3)
        assert X.shape == (24, 26) and np.isfinite(X).all()
        assert (X[:, 0] == (state.arrays["n_groups"] <= 0)).all()  # first column: never picked


def test_zero_variance_groups_are_split_by_kind():
    """A group without spread is solved (all 1), failed (all 0) or stuck at one partial credit; the
    three shares of a run's steps add up to its zero-variance fraction."""
    from envsched_pipeline.analysis.bench import prepare_pool, run_one, summarize, zero_variance_kinds
    from envsched_pipeline.rollouts import informative

    r = np.array([[1.0, 1.0], [0.0, 0.0], [0.5, 0.5], [0.0, 1.0], [0.9, 0.9]])
    assert zero_variance_kinds(r, informative(r)) == {"solved": 0.2, "failed": 0.2, "partial": 0.4}
    run = run_one("envsched", prepare_pool(4, 6, 0), steps=4, seed=0, batch_size=6)
    for t, z in enumerate(run["zero_variance_fraction"]):
        parts = [run[f"zero_variance_{k}"][t] for k in ("solved", "failed", "partial")]
        assert sum(parts) == pytest.approx(z)
    m = summarize(run, None)
    assert m["zero_variance_partial"] == pytest.approx(np.mean(run["zero_variance_partial"]))


def test_bench_traces_every_pick_and_checks_a_recorded_run_repeats(tmp_path, capsys):
    """`--trace DIR`: one Parquet file per run, one row per pick with the scheduler's predictions
    beside the group's outcome; `bench trace` summarizes it by the task's previous group and by
    half. A run already on record is run again for its trace: its record stays, and the log says
    whether the re-run repeated it."""
    import duckdb

    from envsched_pipeline.analysis.trace import COLUMNS, known_informative

    # the simulated learner: the trace is the bench loop's, whichever learner rolls out
    base = ["bench", "scheduler", "--envs", "4", "--tasks", "6", "--steps", "4", "--batch-size", "6"]
    base += ["--group-size", "4", "--schedulers", "random,envsched@success+adaptive+covscore"]
    base += ["--cache", str(tmp_path / "runs"), "--series"]
    first, again = tmp_path / "first.json", tmp_path / "again.json"
    assert main([*base, "--trace", str(tmp_path / "t1"), "--json", str(first)]) == 0
    doc = json.loads(first.read_text())
    assert sorted(doc["traces"]) == sorted(
        str(tmp_path / "t1" / f"{n}-s0.parquet") for n in doc["schedulers"]
    )
    con = duckdb.connect()
    for name in doc["schedulers"]:
        rel = con.sql(
            f"SELECT * FROM read_parquet('{tmp_path / 't1' / name}-s0.parquet') ORDER BY step, slot"
        )
        assert rel.columns == list(COLUMNS)
        rows = [dict(zip(rel.columns, r, strict=True)) for r in rel.fetchall()]
        assert len(rows) == 4 * 6 and {r["scheduler"] for r in rows} == {name}
        # the trace's groups are the run's: its zero-variance share per step, split by kind
        for t in range(4):
            step = [r for r in rows if r["step"] == t]
            assert 1 - np.mean([r["informative"] for r in step]) == pytest.approx(
                doc["series"][name]["zero_variance_fraction"][t]
            )
            assert np.mean([r["flat_kind"] == "partial" for r in step]) == pytest.approx(
                doc["series"][name]["zero_variance_partial"][t]
            )
        assert all((r["group_var"] > 0) == r["informative"] for r in rows)
        assert all(r["flat_kind"] == "" for r in rows if r["informative"])
        has_success = [r["pred_success"] is not None for r in rows if r["step"] > 0]
        assert all(has_success) if name.startswith("envsched") else not any(has_success)
    capsys.readouterr()
    assert main(["bench", "trace", *doc["traces"], "--json", str(tmp_path / "summary.json")]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    for name in doc["schedulers"]:
        mine = [r for r in summary["by_previous"] if r["scheduler"] == name]
        assert sum(r["picks"] for r in mine) == 24 and {r["quarter"] for r in mine} <= {0, 1, 2, 3}
        assert {r["what"] for r in mine} <= {
            "first look",
            "spread",
            "flat, solved",
            "flat, failed",
            "flat, partial",
        }
        assert sum(r["picks"] for r in summary["by_half"] if r["scheduler"] == name) == 24
    assert "| previous group of the task |" in capsys.readouterr().out
    query = (
        "SELECT scheduler, count(*) AS n, sum(informative::INT) AS spread FROM picks GROUP BY 1 ORDER BY 1"
    )
    assert main(["bench", "trace", *doc["traces"], "--sql", query, "--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "scheduler,n,spread" and len(lines) == 3
    for line in lines[1:]:
        name, n, spread = line.split(",")
        assert int(n) == 24 and int(spread) == round(
            24 * (1 - np.mean(doc["series"][name]["zero_variance_fraction"]))
        )
    assert main(["bench", "trace", *doc["traces"], "--sql", "SELECT nope FROM picks"]) == 2
    assert "SQL error" in capsys.readouterr().err
    # tasks known to be informative at a step: latest group before it, within the window, had spread
    known = {
        (r["scheduler"], r["step"]): r["tasks"] for r in known_informative(doc["traces"], [2, 4], window=2)
    }
    for name in doc["schedulers"]:
        rows = con.sql(
            f"SELECT step, task_id, informative FROM read_parquet('{tmp_path / 't1' / name}-s0.parquet')"
        ).fetchall()
        for t in (2, 4):
            latest = {}
            for step, task, spread in sorted(rows):
                if step < t:
                    latest[task] = (step, spread)
            assert known[(name, t)] == sum(1 for s, sp in latest.values() if sp and s >= t - 2)
    # on record now: traced again, the record is kept and the re-run repeats it
    assert main([*base, "--trace", str(tmp_path / "t2"), "--json", str(again)]) == 0
    log = capsys.readouterr().out
    assert log.count("the re-run repeats its record step for step") == 2, log
    assert json.loads(again.read_text())["schedulers"] == doc["schedulers"]
    t1 = con.sql(f"SELECT * FROM read_parquet('{tmp_path}/t1/*.parquet') ORDER BY ALL").fetchall()
    t2 = con.sql(f"SELECT * FROM read_parquet('{tmp_path}/t2/*.parquet') ORDER BY ALL").fetchall()
    assert t1 == t2
    assert main([*base, "--trace", str(tmp_path / "t3"), "--recorded-only"]) == 2
    assert main(["bench", "trace", str(tmp_path / "missing.parquet")]) == 2
    assert "missing.parquet" in capsys.readouterr().err


def test_the_neural_learners_oracle_looks_at_fresh_groups_and_keys_its_runs_by_how_many(tmp_path):
    """`--schedulers oracle` on the neural learner: each step a fresh group of --oracle-candidates
    tasks at the learner's weights, the batch the most varied of them (a bench ceiling). Its runs
    are recorded per candidate count; a bad count is refused before anything runs."""
    cache = tmp_path / "runs"
    base = ["bench", "scheduler", "--learner", "neural", "--envs", "4", "--tasks", "6", "--steps", "2"]
    base += ["--batch-size", "4", "--group-size", "4", "--schedulers", "oracle", "--eval-every", "2"]
    base += ["--cache", str(cache)]
    for n in ("8", "24"):
        out = tmp_path / f"oracle{n}.json"
        assert main([*base, "--oracle-candidates", n, "--json", str(out), "--series"]) == 0
        doc = json.loads(out.read_text())
        m = doc["schedulers"]["oracle"]
        assert all(k in m for k in NEURAL_FIELDS) and m["seeds"] == 1
        assert 1 <= m["distinct_tasks"] <= 8 and len(doc["series"]["oracle"]["zero_variance_fraction"]) == 2
        # its chance of spread is whether the look had spread: a number in [0, 1] every step
        assert all(0.0 <= p <= 1.0 for p in doc["series"]["oracle"]["predicted_nonzero"])
    recorded = sorted(p.name for p in cache.glob("oracle-s0-*.json"))
    assert len(recorded) == 2
    assert main([*base, "--oracle-candidates", "8", "--json", str(tmp_path / "again.json")]) == 0
    assert sorted(p.name for p in cache.glob("oracle-s0-*.json")) == recorded  # read back, not re-run
    again = json.loads((tmp_path / "again.json").read_text())["schedulers"]["oracle"]
    assert again == json.loads((tmp_path / "oracle8.json").read_text())["schedulers"]["oracle"]
    with pytest.raises(
        ValueError, match="oracle_candidates must be >= 1"
    ):  # the CLI's parser refuses it first
        run_benchmark(["oracle"], 1, 0, learner="neural", oracle_candidates=0)


def test_the_spread_of_a_paired_difference_splits_into_seed_domain_and_environment_shares():
    """Known components are recovered from simulated paired differences (seeds x 12 domains x 4
    environments each), the environments' own effects are not counted as noise, and the predicted
    sd of the mean matches the observed one."""
    rng = np.random.default_rng(0)
    seeds, doms, per = 600, 12, 4
    domains = [f"d{k}" for k in range(doms) for _ in range(per)]
    var = {"var_seed": 1e-4, "var_seed_domain": 4e-4, "var_within_domain": 16e-4}
    d = (
        0.01
        + rng.normal(0, 0.05, doms * per)[None, :]  # each environment's own effect: not noise
        + rng.normal(0, var["var_seed"] ** 0.5, (seeds, 1))
        + np.repeat(rng.normal(0, var["var_seed_domain"] ** 0.5, (seeds, doms)), per, axis=1)
        + rng.normal(0, var["var_within_domain"] ** 0.5, (seeds, doms * per))
    )
    c = paired_components(d, domains)
    for k, v in var.items():
        assert c[k] == pytest.approx(v, rel=0.3), k
    assert (c["domains"], c["per_domain"], c["seeds"]) == (doms, per, seeds)
    assert predicted_sd(c, doms, per) == pytest.approx(c["observed_sd"], rel=0.1)
    assert predicted_sd(c, doms, 1) > predicted_sd(c, doms, per) > var["var_seed"] ** 0.5
    one = paired_components(d[:, ::per], domains[::per])  # one environment per domain
    assert one["var_within_domain"] == 0.0
    assert one["var_seed_domain"] == pytest.approx(var["var_seed_domain"] + var["var_within_domain"], rel=0.3)
    with pytest.raises(ValueError, match="as many environments"):
        paired_components(d[:, :-1], domains[:-1])
    with pytest.raises(ValueError, match="at least 2 seeds"):
        paired_components(d[:1], domains)


def test_two_draws_of_one_scheduler_split_the_spread_into_the_seed_and_the_run():
    """Two runs per seed that share the seed's part and differ in their own: the run's and the
    seed's variances are recovered, and inputs that cannot carry them are refused."""
    rng = np.random.default_rng(1)
    seeds, seed_sd, run_sd = 4000, 0.02, 0.01
    g = rng.normal(0.015, seed_sd, seeds)
    a, b = g + rng.normal(0, run_sd, seeds), g + rng.normal(0, run_sd, seeds)
    c = two_draws(a, b)
    assert c["run_sd"] == pytest.approx(run_sd, rel=0.05) and c["seed_sd"] == pytest.approx(seed_sd, rel=0.05)
    assert c["run_share"] == pytest.approx(run_sd**2 / (run_sd**2 + seed_sd**2), abs=0.02)
    assert c["correlation"] == pytest.approx(0.8, abs=0.03) and c["seeds"] == seeds
    assert c["both_positive"] <= min(c["positive"])
    same = two_draws(a[:10], a[:10])  # one draw twice: nothing is the run's
    assert same["run_sd"] == 0.0 and same["run_share"] == 0.0
    with pytest.raises(ValueError, match="one difference per seed"):
        two_draws(a[:5], b[:4])
    with pytest.raises(ValueError, match="at least 3 seeds"):
        two_draws(a[:2], b[:2])


def test_several_draws_split_the_spread_like_two_draws_and_count_seed_means():
    """Three runs per seed: the run's and the seed's variances are recovered, two runs agree with
    :func:`two_draws`, the seed means and their signs are counted, and too few runs or seeds are
    refused."""
    rng = np.random.default_rng(2)
    seeds, seed_sd, run_sd = 4000, 0.01, 0.02
    g = rng.normal(0.012, seed_sd, seeds)
    d = g[:, None] + rng.normal(0, run_sd, (seeds, 3))
    c = several_draws(d)
    assert c["run_sd"] == pytest.approx(run_sd, rel=0.05) and c["seed_sd"] == pytest.approx(seed_sd, rel=0.1)
    assert c["runs"] == 3 and c["seeds"] == seeds and c["mean"] == pytest.approx(0.012, abs=0.001)
    assert c["positive_seed_means"] == sum(m > 0 for m in c["seed_means"]) > c["positive_runs"] / 3
    # two runs: two_draws' estimate, up to the mean difference between the draws it takes out
    pair = two_draws(d[:50, 0], d[:50, 1])
    both = several_draws(d[:50, :2])
    assert both["run_sd"] == pytest.approx(pair["run_sd"], rel=0.02)
    small = [[0.01, 0.03], [-0.02, 0.0], [0.02, 0.02]]
    assert several_draws(small)["seed_means"] == pytest.approx([0.02, -0.01, 0.02])
    assert several_draws(small)["positive_seed_means"] == 2 and several_draws(small)["positive_runs"] == 4
    with pytest.raises(ValueError, match="two runs or more"):
        several_draws(d[:, :1])
    with pytest.raises(ValueError, match="at least 3 seeds"):
        several_draws(d[:2])


def test_within_run_splits_a_series_into_its_fast_part_and_its_slow_swings():
    """Independent noise is all fast part (its sd recovered); a slow swing has almost none, however
    far it moves; the late mean and the share above 0 read the series as given; bad input refused."""
    rng = np.random.default_rng(2)
    long = np.arange(0, 4001, 5)
    noise = within_run(long, rng.normal(0, 0.01, len(long)))
    assert noise["jitter_sd"] == pytest.approx(0.01, rel=0.1)
    assert noise["swing_sd"] == pytest.approx(0.01, rel=0.1)
    st = np.arange(0, 201, 5)
    slow = 0.02 * np.sin(2 * np.pi * st / 80)
    w = within_run(st, slow)
    assert w["jitter_sd"] < 0.001 < 0.01 < w["swing_sd"]
    assert w["points"] == 21 and w["positive"] == int((slow[st >= 100] > 0).sum())
    assert w["late_mean"] == pytest.approx(slow[st >= 150].mean())
    assert w["low"] == pytest.approx(-0.02) and w["high"] == pytest.approx(0.02)
    with pytest.raises(ValueError, match="one series each"):
        within_run(st, slow[:-1])
    with pytest.raises(ValueError, match="at least 8 points"):
        within_run(st[::5], slow[::5])
    with pytest.raises(ValueError, match="too few points within 20 steps"):
        within_run(np.arange(0, 401, 25), np.zeros(17))


def test_every_seed_needs_and_chance_are_each_others_inverse():
    """The effect at which all n seeds come out above the baseline with a chance of 0.9, and the
    chance at a given effect: inverse to each other, larger with more seeds, a step at sd 0."""
    need = every_seed_needs(0.02, 10)
    assert every_seed_chance(need, 0.02, 10) == pytest.approx(0.9)
    assert every_seed_needs(0.02, 5) < need < every_seed_needs(0.02, 15)
    assert every_seed_chance(0.0, 0.02, 1) == pytest.approx(0.5)
    assert every_seed_chance(0.01, 0.0) == 1.0 and every_seed_chance(-0.01, 0.0) == 0.0


def test_the_draws_plot_shows_every_seed_and_draw(tmp_path):
    """One panel per held-out kind, one marker per (seed, draw): a PNG of the size asked for."""
    from PIL import Image

    from envsched_pipeline.analysis.plots import draws_plot

    diffs = {"unseen": {0: [0.01, -0.02], 1: [0.03, 0.02]}, "seen": {0: [0.02, 0.01], 1: [0.01, 0.02]}}
    path = draws_plot(diffs, tmp_path / "draws.png")
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size == (900, 342)
    # a third run of each seed (another CPU's), named in the legend; too few names is refused
    three = {k: {s: [*ds, ds[0] / 2] for s, ds in by_seed.items()} for k, by_seed in diffs.items()}
    named = draws_plot(three, tmp_path / "three.png", labels=("records", "draw 1", "AVX2"))
    with Image.open(named) as im:
        assert im.size == (900, 342)
    with pytest.raises(ValueError, match="2 labels for seeds with 3 draws"):
        draws_plot(three, tmp_path / "short.png", labels=("records", "draw 1"))
    assert not (tmp_path / "short.png").exists()


def test_window_concentration_counts_the_most_served_environment_per_window(tmp_path):
    """Informative groups per 3-step window: the most-served environment's count window by window,
    their mean, and the share above twice the fair share; its plot is a PNG; a short trace is named."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    from envsched_pipeline.analysis.plots import breadth_window_plot
    from envsched_pipeline.analysis.trace import window_concentration

    # 4 steps over environments a, b (and c, never informative): a has spread 2, 2, 0, 2 times, b 0, 1, 1, 0
    rows = [(0, "a", True), (0, "a", True), (0, "b", False), (1, "a", True), (1, "a", True), (1, "b", True)]
    rows += [(2, "a", False), (2, "b", True), (2, "c", False), (3, "a", True), (3, "a", True)]
    step, env, inf = zip(*rows, strict=True)
    path = tmp_path / "run.parquet"
    pq.write_table(pa.table({"step": list(step), "env_id": list(env), "informative": list(inf)}), path)
    w = window_concentration(path, n_envs=3)
    # windows 0-2 and 1-3: a holds 4 of 6 and 4 of 6; the fair share is 2, so 4 - 2 x 2 = 0 above it
    assert list(w["by_window"]) == [4.0, 4.0] and w["most_served"] == 4.0 and w["above_twice_fair"] == 0.0
    w1 = window_concentration(path, n_envs=6)  # a fair share of 1: a's 4 are 2 above twice it
    assert w1["above_twice_fair"] == pytest.approx(4 / 12)
    with pytest.raises(ValueError, match="run.parquet: 4 step"):
        window_concentration(path, n_envs=3, window=5)
    png = breadth_window_plot(
        {"form": [8.0, 7.5], "quota": [5.0, 4.5]}, {"seen": {0: 0.01}}, tmp_path / "w.png"
    )
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size[0] > im.size[1]


def test_held_out_moves_by_pattern_residuals_and_training_shares():
    """Per pattern: the paired difference over the tasks that contain it, its residual from the run's
    common shift and the scheduler's training share of it over the baseline's; a difference put on
    one pattern's tasks shows as that pattern's residual, and bad inputs are named."""
    patterns = {"t0": ["lookup"], "t1": ["lookup", "transfer"], "t2": ["transfer"], "t3": ["create"]}
    base = {"t0": 0.5, "t1": 0.6, "t2": 0.7, "t3": 0.8}
    sched = {"t0": 0.55, "t1": 0.65, "t2": 0.95, "t3": 0.85}  # +0.05 everywhere, +0.25 on t2
    e = pattern_effects(base, sched, patterns, ["t0", "t3", "t2", "t2"], ["t2", "t2", "t1", "t3"])
    assert e["diff"] == pytest.approx(0.1) and e["tasks"] == 4
    rows = e["patterns"]
    assert rows["transfer"]["diff"] == pytest.approx(0.15)
    assert rows["transfer"]["residual"] == pytest.approx(0.05)
    assert rows["create"]["residual"] == pytest.approx(-0.05) and rows["lookup"]["tasks"] == 2
    assert rows["lookup"]["baseline"] == pytest.approx(0.55) and np.isnan(rows["create"]["se"])
    # pattern occurrences picked: baseline lookup 1, create 1, transfer 2; scheduler 1, 1, 3
    assert pattern_shares(["t2", "t2", "t1", "t3"], patterns)["transfer"] == pytest.approx(0.6)
    assert rows["create"]["share_ratio"] == pytest.approx(0.8)
    assert rows["transfer"]["share_ratio"] == pytest.approx(1.2)
    assert residual_share_correlation([e]) == pytest.approx(1.0)  # the more-trained pattern gained more
    # the baseline never picked transfer
    never = pattern_effects(base, sched, patterns, ["t0"], ["t2"])["patterns"]
    assert np.isnan(never["transfer"]["share_ratio"]) and never["lookup"]["share_ratio"] == 0.0
    with pytest.raises(ValueError, match="at least 3 patterns"):
        residual_share_correlation([{"patterns": never}])
    assert "share_ratio" not in pattern_effects(base, sched, patterns)["patterns"]["lookup"]
    with pytest.raises(ValueError, match="task sets differ"):
        pattern_effects(base, {**sched, "t9": 0.1}, patterns)
    with pytest.raises(ValueError, match="no patterns for held-out task"):
        pattern_effects({**base, "t9": 0.1}, {**sched, "t9": 0.1}, patterns)


@pytest.mark.skipif(
    platform.machine() != "x86_64" or "avx2" not in Path("/proc/cpuinfo").read_text(),
    reason="OpenBLAS's Haswell kernels need an x86-64 CPU with AVX2",
)
def test_a_run_records_the_blas_kernels_it_ran_and_openblas_coretype_chooses_them():
    """The kernels OpenBLAS runs are part of a run's environment (float products round by them; the
    task graph once did), and OPENBLAS_CORETYPE, which `make bench` sets, decides them in a fresh
    process."""
    code = "from envsched_pipeline.analysis.bench import run_environment; print(run_environment()['blas'])"
    said = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "OPENBLAS_CORETYPE": "Haswell"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert said.stdout.strip() == "Haswell"


def test_a_validation_slice_steers_the_coverage_share_and_leaves_held_out_alone():
    """scheduler_config.validation_every (bench, neural learner): every N steps the policy is scored
    on a slice of unseen-family environments the pool and the held-out split never contain; the
    score goes to the scheduler, whose adaptive share falls back to rho while the slice stalls; the
    slice's episodes are counted; the pipeline and the simulated learner refuse the setting."""
    from envs.registry import unseen_validation  # only this test needs these
    from envsched_pipeline.analysis.bench import aggregate, prepare_pool, run_one
    from envsched_pipeline.core.build import scheduler_config
    from envsched_pipeline.errors import ConfigError
    from envsched_pipeline.run import RunSpec
    from envsched_pipeline.scheduler.config import SchedulerConfig
    from envsched_pipeline.scheduler.envsched import EnvSched, validation_stalled

    pool = prepare_pool(4, 6, 0)
    envs, tasks = unseen_validation("synthetic", 0, after=len(pool["eval_environments"]))
    held = {e["env_id"] for e in pool["eval_environments"]} | {t["env_id"] for t in pool["tasks"]}
    assert len(envs) == 12 and len(tasks) == 48 and not held & {e["env_id"] for e in envs}
    over = {"target": "success", "adaptive_rho": True, "validation_every": 2, "validation_window": 1}
    kw = {"steps": 5, "seed": 0, "batch_size": 6, "group_size": 4, "learner": "neural", "eval_every": 5}
    run = run_one("envsched", pool, overrides=over, return_state=True, **kw)
    looks = run["validation"]
    assert [v["step"] for v in looks] == [0, 2, 4] and all(0 <= v["mean"] <= 1 for v in looks)
    assert run["_state"].extra["validation"] == [[v["step"], v["mean"]] for v in looks]
    assert run["validation_episodes"] == 3 * 48 * 8
    doc = aggregate(["envsched"], [0], {("envsched", 0): run}, {})  # what `bench scheduler` prints
    assert doc["per_seed"]["envsched"][0]["validation_episodes"] == 3 * 48 * 8
    assert doc["series"]["envsched"]["validation_stalled"] == [float(x) for x in run["validation_stalled"]]
    # the share of steps at rho: stalled from the second look on whenever it is not above the first
    stalls = [looks[1]["mean"] <= looks[0]["mean"]] * 2 + [looks[2]["mean"] <= looks[1]["mean"]]
    assert run["validation_stalled"] == [False, False, *stalls]
    plain = run_one("envsched", pool, overrides={**over, "validation_every": 0}, **kw)
    assert "validation" not in plain
    # scoring the slice alone leaves the run as it was (a window the run never fills: no stall)
    looking = run_one("envsched", pool, overrides={**over, "validation_window": 10}, **kw)
    assert [v["step"] for v in looking["validation"]] == [0, 2, 4] and not any(looking["validation_stalled"])
    assert looking["evals"] == plain["evals"] and looking["batch_variance"] == plain["batch_variance"]
    # the rule itself: rho while the last window's mean is not above the one before, else the yield's
    sched = EnvSched(SchedulerConfig(batch_size=6, **over, rho_min=0.1))
    state = run["_state"]
    state.extra["half_yield"] = {"coverage": [8.0, 1.0], "exploit": [8.0, 8.0]}
    for scores, stalled in (([0.5, 0.6], False), ([0.6, 0.6], True), ([0.6, 0.5], True), ([0.5], False)):
        state.extra["validation"] = [[2 * i, s] for i, s in enumerate(scores)]
        assert validation_stalled(state, 1) is stalled
        assert sched.coverage_share(state) == (0.5 if stalled else 0.1)
    with pytest.raises(ValueError, match="validation_every needs the neural learner"):
        run_one("envsched", pool, steps=1, seed=0, batch_size=6, overrides=over)  # simulated
    with pytest.raises(ConfigError, match="scheduler_config.validation_every: a validation slice"):
        scheduler_config(RunSpec(scheduler_config={"validation_every": 10}))


def test_the_neural_checkpoints_kept_are_the_ones_rewind_can_start_from():
    """Every step writes its checkpoint and drops the one two steps back, except step 0's and steps
    19, 39, ... (a language model's default periodic ones), so `envsched rewind --to 1` and `--to
    20k` find their policy (any other is made again from them: tests/test_remake.py)."""
    from envsched_pipeline.lake import superseded  # this test's subject

    kept = set(range(46)) - {superseded(s) for s in range(46)}
    assert kept == {0, 19, 39, 44, 45}
