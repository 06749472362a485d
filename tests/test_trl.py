"""envsched as TRL's GRPO data source: a real ``trl.GRPOTrainer`` (a random-init tiny Qwen3 on CPU)
trained on envsched's batches, its rewards handed back to the run, and the pool's own verifiers as
the reward."""

import json
import os
import textwrap

import pytest
import trl

from envs.registry import load_synthetic
from envsched_pipeline.api import ExternalRun
from envsched_pipeline.core.loop import consistency_problems
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.errors import ConfigError, StepError
from envsched_pipeline.integrations.trl import (
    EnvSchedReward,
    EnvSchedSampler,
    VerifierScore,
    grpo_trainer,
    heldout_prompts,
    task_prompts,
)
from envsched_pipeline.lake import Lake
from tests.procs import torchrun
from trainer import chat
from trainer.heldout import heldout_tasks


@pytest.fixture(scope="module")
def pool_lake(tmp_path_factory):
    lake = Lake(tmp_path_factory.mktemp("trl") / "pool")
    import_pool(lake, load_synthetic("synthetic", n_envs=3, tasks_per_env=4, heldout_per_env=1, seed=3))
    return lake


def _run(tmp_path, pool_lake, lag=1):
    lake = Lake(tmp_path / "lake")
    for f in pool_lake.root.rglob("*"):  # the pool, imported once for the module
        if f.is_file():
            dst = lake.root / f.relative_to(pool_lake.root)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(f.read_bytes())
    return ExternalRun(pool="synthetic", lake=lake, batch_size=4, group_size=2, select_lag=lag, seed=0)


def _args(tmp_path, **kw):
    return trl.GRPOConfig(
        **{
            "output_dir": str(tmp_path / "out"),
            "num_generations": 2,
            "per_device_train_batch_size": 8,
            "steps_per_generation": 1,
            "gradient_accumulation_steps": 1,
            "max_completion_length": 8,
            "max_steps": 3,
            "learning_rate": 1e-4,
            "use_cpu": True,
            "report_to": "none",
            "save_strategy": "no",
            "logging_steps": 1,
            "disable_tqdm": True,
            "seed": 0,
            **kw,
        }
    )


def test_grpo_trainer_trains_on_envsched_batches_and_hands_the_rewards_back(tmp_path, pool_lake):
    from trainer.model import qwen3_tokenizer, tiny_qwen3  # torch and transformers: only these tests

    run = _run(tmp_path, pool_lake)
    scored = []

    def score(task_ids, texts):  # a scorer of the completions TRL generated: their length's parity
        scored.append(list(task_ids))
        return [float(len(t) % 2) for t in texts]

    # without the tool schemas a prompt is ~80 tokens, not ~1,200: TRL's CPU path scores every
    # prompt position over the 151k vocabulary, so this keeps the three steps to seconds
    trainer = grpo_trainer(
        run, tiny_qwen3(seed=0), qwen3_tokenizer(), _args(tmp_path), score=score, tools_in_prompt=False
    )
    trainer.train()
    lake = run.lake
    assert lake.steps("rollouts") == [0, 1, 2]
    # TRL's loader asked for step 3's batch before step 2 was scored: chosen from the rollouts up to 1
    assert lake.steps("manifests") == [0, 1, 2, 3]
    assert lake.read("audits", step=3).to_pylist()[0]["selected_ahead"] == 1
    for t in range(3):  # TRL generated for step t's manifest, each task G times, in order
        picks = [r["task_id"] for r in lake.read("manifests", step=t).sort_by("slot").to_pylist()]
        assert scored[t] == [p for p in picks for _ in range(2)]
        got = lake.read("rollouts", step=t).sort_by([("task_id", "ascending"), ("rollout", "ascending")])
        assert len(got) == 8 and set(got.column("rollout").to_pylist()) == {0, 1}
    assert consistency_problems(lake) == []
    logged = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    means = [sum(r["reward"] for r in lake.read("rollouts", step=t).to_pylist()) / 8 for t in range(3)]
    assert logged == pytest.approx(means)  # TRL trained on the rewards the run recorded


TWO_PROCESSES = textwrap.dedent(
    """
    import atexit, json, sys
    import torch.distributed as dist
    import trl
    from accelerate import PartialState
    from envsched_pipeline.api import ExternalRun
    from envsched_pipeline.integrations.trl import grpo_trainer
    from trainer.model import qwen3_tokenizer, tiny_qwen3

    lake, out = sys.argv[1], sys.argv[2]
    state = PartialState(cpu=True)  # on CPU only: as GRPOConfig(use_cpu=True) sees the processes
    with state.main_process_first():  # process 0 starts the run, the other resumes it
        run = ExternalRun(pool="synthetic", lake=lake, batch_size=4, group_size=2, select_lag=0, seed=0)
    seen = []

    def at_exit():  # registered before the trainer's own exit handler, so it runs after it
        with open(f"{out}/exit-{state.process_index}.json", "w") as f:
            json.dump({"in_group": dist.is_initialized()}, f)

    atexit.register(at_exit)

    def score(task_ids, texts):  # a task's two samples (side by side in a slice) always differ
        rewards = [float(j % 2) for j in range(len(texts))]
        seen.append(list(zip(task_ids, rewards)))
        return rewards

    # each process's generation is 2 optimizer steps of 2 samples, each used twice: 4 optimizer
    # steps per envsched step, and no select_lag needed (the next batch is asked for after scoring)
    args = trl.GRPOConfig(
        output_dir=out, num_generations=2, per_device_train_batch_size=2, steps_per_generation=2,
        num_iterations=2, max_completion_length=8, max_steps=8, learning_rate=1e-4, use_cpu=True,
        report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0,
        eval_strategy="steps", eval_steps=4, per_device_eval_batch_size=2,
    )
    trainer = grpo_trainer(
        run, tiny_qwen3(seed=0), qwen3_tokenizer(), args, score=score, tools_in_prompt=False, heldout=1
    )
    trainer.train()
    assert (state.num_processes, args.world_size) == (2, 2)
    with open(f"{out}/scored-{state.process_index}.json", "w") as f:
        json.dump({"scored": seen, "logged": trainer.state.log_history, "steps": trainer.state.global_step}, f)
    """
)


def test_two_processes_each_generate_their_share_and_the_run_gets_whole_steps(tmp_path, pool_lake):
    """``torchrun`` with two processes (gloo on CPU): each generates its half of each step and of
    each evaluation, once per step although each generation serves four optimizer steps (two per
    generation, each twice); the run gets every step whole, from process 0, and one record per
    evaluation; each process leaves its gloo group before the interpreter exits (one still in it
    can abort at exit after a good run)."""
    run = _run(tmp_path, pool_lake, lag=0)  # the pool in the run's lake; the processes resume this run
    script = tmp_path / "two.py"
    script.write_text(TWO_PROCESSES)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    p = torchrun(2, [str(script), str(run.lake.root), str(tmp_path)], env)
    assert p.returncode == 0, p.stderr[-4000:]
    lake = run.lake
    assert lake.steps("rollouts") == [0, 1] and consistency_problems(lake) == []
    out = [json.loads((tmp_path / f"scored-{k}.json").read_text()) for k in (0, 1)]
    assert [json.loads((tmp_path / f"exit-{k}.json").read_text()) for k in (0, 1)] == [
        {"in_group": False}
    ] * 2
    scored = [o["scored"] for o in out]
    train = [[c for c in calls if len(c) == 4] for calls in scored]  # a training slice: B x G / 2
    held = [[c for c in calls if len(c) == 2] for calls in scored]  # an evaluation slice: 2 x G / 2
    assert [o["steps"] for o in out] == [8, 8]  # TRL's optimizer steps: four per envsched step
    assert [len(t) for t in train] == [2, 2] and [len(h) for h in held] == [2, 2]
    for t in range(2):
        picks = [r["task_id"] for r in lake.read("manifests", step=t).sort_by("slot").to_pylist()]
        whole = [x for x in picks for _ in range(2)]
        # process k generated the k-th half of step t's batch, and the run holds both halves' rewards
        assert [tid for tid, _ in train[0][t]] == whole[:4] and [tid for tid, _ in train[1][t]] == whole[4:]
        got = lake.read("rollouts", step=t).to_pylist()
        assert sorted((r["task_id"], r["reward"]) for r in got) == sorted(
            (tid, r) for k in (0, 1) for tid, r in train[k][t]
        )
        assert sorted((r["task_id"], r["rollout"]) for r in got) == sorted(
            (x, j % 2) for j, x in enumerate(whole)
        )
    evals = lake.sql("select * from evals order by step, benchmark").to_pylist()
    assert [(e["step"], e["benchmark"]) for e in evals] == [
        (s, f"heldout_{k}") for s in (0, 1) for k in ("seen", "unseen")
    ]
    split_of = {r["task_id"]: r["split"] for r in heldout_prompts(lake, "synthetic", seed=0, per_split=1)}
    for e in evals:  # both processes' halves of the evaluation after step t, never a step's rows
        got = [r for k in (0, 1) for tid, r in held[k][e["step"]] if split_of[tid] == e["benchmark"][8:]]
        assert len(got) == 2 and e["score"] == pytest.approx(sum(got) / 2)
        assert e["se"] == pytest.approx(abs(got[0] - got[1]) / 2)  # one task, two samples
    assert {r["task_id"] for r in lake.sql("select task_id from rollouts").to_pylist()}.isdisjoint(split_of)
    logged = [h["eval_heldout_seen"] for h in out[0]["logged"] if "eval_heldout_seen" in h]
    assert logged == [e["score"] for e in evals if e["benchmark"] == "heldout_seen"]  # in TRL's logs too


def test_the_trainer_refuses_settings_that_break_one_step_per_generation_batch(tmp_path, pool_lake):
    from trainer.model import qwen3_tokenizer, tiny_qwen3  # torch and transformers: only these tests

    run = _run(tmp_path, pool_lake)
    model, tok = tiny_qwen3(seed=0), qwen3_tokenizer()
    with pytest.raises(ConfigError, match="num_generations is 4; the run's group size G is 2"):
        grpo_trainer(run, model, tok, _args(tmp_path, num_generations=4), score=lambda a, b: [0.0] * len(a))
    with pytest.raises(
        ConfigError, match="process\\(es\\) is 4; one generation batch must be one envsched step, B x G = 8"
    ):
        grpo_trainer(
            run, model, tok, _args(tmp_path, per_device_train_batch_size=4), score=lambda a, b: [0.0] * len(a)
        )
    with pytest.raises(
        ConfigError, match="eval_dataset: .* evaluate on the pool's held-out split with heldout=N"
    ):
        grpo_trainer(run, model, tok, _args(tmp_path), score=lambda a, b: [0.0] * len(a), eval_dataset=[{}])
    unlagged = _run(tmp_path / "b", pool_lake, lag=0)
    with pytest.raises(ConfigError, match="start the run with select_lag=1"):
        grpo_trainer(unlagged, model, tok, _args(tmp_path), score=lambda a, b: [0.0] * len(a))
    # a held-out evaluation with no evaluation to run, or one with no step to be recorded after
    with pytest.raises(ConfigError, match="eval_strategy is 'no'; set eval_strategy='steps'"):
        grpo_trainer(run, model, tok, _args(tmp_path), score=lambda a, b: [0.0] * len(a), heldout=1)
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="heldout must be a whole number of tasks per split"):
            grpo_trainer(run, model, tok, _args(tmp_path), score=lambda a, b: [0.0] * len(a), heldout=bad)
    early = _args(tmp_path, eval_strategy="steps", eval_steps=1, eval_on_start=True)
    with pytest.raises(ConfigError, match="eval_on_start: an evaluation before the run's first step"):
        grpo_trainer(run, model, tok, early, score=lambda a, b: [0.0] * len(a), heldout=1)


def test_the_held_out_prompts_are_the_tasks_the_internal_trainer_evaluates(pool_lake):
    held = heldout_prompts(pool_lake, "synthetic", seed=0, per_split=1)
    chosen = heldout_tasks(pool_lake.read("eval_tasks", pool="synthetic").to_pylist(), 0, 1)
    assert [(r["split"], r["task_id"]) for r in held] == [(k, v[0]["task_id"]) for k, v in chosen.items()]
    assert {r["split"] for r in held} == {"seen", "unseen"}
    instructions = {t["task_id"]: t["instruction"] for v in chosen.values() for t in v}
    assert all(instructions[r["task_id"]] in r["prompt"] for r in held)


def test_the_sampler_repeats_a_step_for_each_use_of_its_generation_batch(tmp_path, pool_lake):
    run = _run(tmp_path, pool_lake, lag=0)
    ids = [r["task_id"] for r in task_prompts(run.lake, "synthetic")]
    it = iter(EnvSchedSampler(run, ids, repeat=2))
    first = [next(it) for _ in range(16)]
    picks = [ids.index(p["task_id"]) for p in run.manifest(0)]
    assert first == [i for i in picks for _ in range(2)] * 2
    with pytest.raises(StepError, match="start the run with select_lag=1"):
        next(it)  # step 1 asked for before step 0 was scored


def test_verifier_score_runs_a_completions_tool_calls_through_the_pools_verifier(pool_lake):
    tasks = pool_lake.read("tasks", pool="synthetic").to_pylist()[:4]
    gold = [chat.render_assistant("Done.", json.loads(t["gold"])) for t in tasks]
    scorer = VerifierScore(pool_lake, "synthetic", workers=1)
    try:
        ids = [t["task_id"] for t in tasks]
        right = scorer(ids, gold)
        wrong = scorer(ids, ['<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>'] * 4)
        broken = scorer(ids, ["<tool_call>{not json</tool_call>"] * 4)
    finally:
        scorer.close()
    assert right == [1.0] * 4
    assert all(w < 1.0 for w in wrong) and all(b < 1.0 for b in broken)
    # the held-out scorer: evaluation tasks of both splits, each in its own environment (the unseen
    # split's are environments the pool does not train in)
    held = [
        r
        for split in ("seen", "unseen")
        for r in heldout_prompts(pool_lake, "synthetic", 0, 2)
        if r["split"] == split
    ]
    rows = {t["task_id"]: t for t in pool_lake.read("eval_tasks", pool="synthetic").to_pylist()}
    scorer = VerifierScore(pool_lake, "synthetic", workers=1, heldout=True)
    try:
        ids = [r["task_id"] for r in held]
        gold_held = scorer(ids, [chat.render_assistant("Done.", json.loads(rows[t]["gold"])) for t in ids])
        wrong_held = scorer(ids, ["no tool calls"] * len(ids))
    finally:
        scorer.close()
    assert len(ids) == 4 and gold_held == [1.0] * 4 and all(w < 1.0 for w in wrong_held)
    prompt = next(p for p in task_prompts(pool_lake, "synthetic") if p["task_id"] == tasks[0]["task_id"])
    assert tasks[0]["instruction"] in prompt["prompt"] and prompt["prompt"].endswith(chat.assistant_header())
    assert '"name": "' + json.loads(tasks[0]["gold"])[0]["name"] + '"' in prompt["prompt"]  # its tool schema


def test_an_episode_the_sandbox_ended_counts_as_spent_not_as_the_tasks_outcome(tmp_path, pool_lake):
    run = _run(tmp_path, pool_lake, lag=0)
    picks = [p["task_id"] for p in run.manifest(0) for _ in range(2)]

    class Scorer:  # as VerifierScore: rewards, and the episodes behind them in ``last``
        def __call__(self, task_ids, texts):
            self.last = [{"reward": 0.0, "error_class": "timeout"}] + [{"reward": 1.0}] * (len(task_ids) - 1)
            return [e["reward"] for e in self.last]

    assert EnvSchedReward(run, Scorer())(picks, ["x"] * len(picks), task_id=picks)[:2] == [0.0, 1.0]
    got = run.lake.read("rollouts", step=0).to_pylist()
    assert sorted(r["error_class"] for r in got).count("timeout") == 1
    first = next(r for r in got if r["error_class"] == "timeout")
    assert (first["task_id"], first["rollout"]) == (picks[0], 0)


def test_an_error_on_process_0_is_raised_on_every_process(monkeypatch):
    """Process 0's failure (observing a step, recording an evaluation) reaches the other processes
    through the same gather that hands them its result, so none waits for it in a later
    collective. The gather is stood in for here (the two-process run above uses the real one)."""
    from envsched_pipeline.integrations import trl as integration

    sent = []

    def gathered(items, world):  # every process gets process 0's item first
        sent.append(items[0])
        return [sent[0], *items]

    monkeypatch.setattr(integration, "_gathered", gathered)

    def fail():
        raise StepError("rollouts of step 3: reward 'x' is not a number")

    with pytest.raises(StepError, match="reward 'x' is not a number") as on_0:
        integration._on_process_0(fail, rank=0, world=2)
    assert not on_0.value.args[0].startswith("process 0 failed")
    with pytest.raises(StepError, match="process 0 failed: StepError: rollouts of step 3: reward 'x'"):
        integration._on_process_0(lambda: pytest.fail("only process 0 does the work"), rank=1, world=2)
    sent.clear()
    assert integration._on_process_0(lambda: {"rows": 8}, rank=0, world=2) == {"rows": 8}
    assert integration._on_process_0(lambda: pytest.fail("not here"), rank=1, world=2) == {"rows": 8}
