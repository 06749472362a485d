"""Held-out evaluation of the language-model policies during a run, and the seeded sampling that
makes their steps repeat: the same run twice gives the same episodes, and evaluating changes no
training step."""

import json
import sys
import types
from pathlib import Path

import dagster as dg
import duckdb
import numpy as np
import pytest

from envsched_pipeline.cli import main
from envsched_pipeline.core.ingest import record_evals
from envsched_pipeline.core.loop import status, step_summary
from envsched_pipeline.errors import StepError
from envsched_pipeline.lake import Lake
from trainer.heldout import due, heldout_tasks, summarize

TRAIN = [
    "train",
    "--pool",
    "mini",
    "--policy",
    "hf-tiny",
    "--batch-size",
    "2",
    "--group-size",
    "2",
    "--max-new-tokens",
    "8",
]


def test_evaluation_is_due_every_n_steps_and_at_the_last():
    assert [s for s in range(25) if due(s, 25, 10)] == [0, 10, 20, 24]
    assert [s for s in range(5) if due(s, 5, 1)] == [0, 1, 2, 3, 4]
    assert not any(due(s, 25, 0) for s in range(25))  # 0 turns it off, the last step included


def test_the_held_out_subset_is_fixed_by_the_seed_and_keeps_the_lake_order():
    rows = [{"task_id": f"s{j}", "split": "seen"} for j in range(30)] + [
        {"task_id": f"u{j}", "split": "unseen"} for j in range(5)
    ]
    every = heldout_tasks(rows, seed=0)
    assert [len(every["seen"]), len(every["unseen"])] == [30, 5] and every["seen"] == rows[:30]
    a, b, c = (heldout_tasks(rows, seed=s, per_split=4) for s in (3, 3, 4))
    assert a == b and a["seen"] != c["seen"]  # the same tasks at every evaluation of a run
    assert len(a["seen"]) == 4 and len(a["unseen"]) == 4
    order = [int(r["task_id"][1:]) for r in a["seen"]]
    assert order == sorted(order)
    assert heldout_tasks(rows, seed=0, per_split=99)["seen"] == rows[:30]
    assert heldout_tasks([r for r in rows if r["split"] == "seen"], seed=0).keys() == {"seen"}


def test_the_summary_is_the_mean_of_task_means_with_the_sampling_error():
    r = np.array([[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.5, 0.5]])
    out = summarize(r)
    assert out["mean"] == pytest.approx((0.5 + 1.0 + 0.25) / 3)
    within = [np.var(row, ddof=1) for row in r]
    assert out["se"] == pytest.approx(np.sqrt(sum(within) / 4) / 3)
    assert (out["tasks"], out["samples"]) == (3, 4)
    assert summarize(np.array([[0.5], [1.0]]))["se"] == 0.0  # one sample: no within-task spread


def test_rows_with_a_column_the_first_row_lacks_keep_it(tmp_path):
    """The LM step's evals start with a row without a standard error; pyarrow's from_pylist took
    the first row's columns, so the held-out rows' ``se`` was dropped."""
    lake = Lake(tmp_path / "lake")
    lake.write(
        "evals",
        [{"step": 0, "benchmark": "a", "score": 0.5}, {"step": 0, "benchmark": "b", "score": 0.4, "se": 0.1}],
        step=0,
    )
    assert lake.read("evals", step=0).to_pylist()[1]["se"] == 0.1


def test_vllm_requests_are_seeded_after_a_reseed(monkeypatch):
    """vLLM seeds a request, not the engine: after ``reseed`` every prompt gets its own seed, and
    the same calls after the same reseed get the same seeds (no GPU: the engine's LLM and vLLM's
    two classes are stand-ins; what is checked is what envsched hands them)."""
    from trainer.engines import VLLMEngine

    class Params:
        def __init__(self, **kw):
            self.kw = kw

    class Out:
        def __init__(self):
            self.outputs = [types.SimpleNamespace(token_ids=[1, 2])]

    class LLM:
        def __init__(self):
            self.seen = []

        def generate(self, prompts, params, use_tqdm=False):
            self.seen.append(params)
            return [Out() for _ in prompts]

    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = Params
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: prompt_token_ids
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    llm = LLM()
    engine = VLLMEngine("unused", llm=llm, sleep_mode=False)
    engine.generate([[1], [2]])
    assert "seed" not in llm.seen[-1].kw  # never reseeded: vLLM's own sampling, as before
    seeds = []
    for _ in range(2):
        engine.reseed(7)
        engine.generate([[1], [2]])
        engine.generate([[3]])
        seeds.append([p.kw["seed"] for call in llm.seen[-2:] for p in call])
    assert seeds[0] == seeds[1] and len(set(seeds[0])) == 3
    engine.reseed(8)
    engine.generate([[1], [2]])
    assert [p.kw["seed"] for p in llm.seen[-1]] != seeds[0][:2]
    # what the agent loop samples asks for the drawn token's log-probability (the update's sampler
    # correction), and gets the same seeds; plain generation (`trainer.serve`) asks for none
    assert "logprobs" not in llm.seen[0].kw and all("logprobs" not in p.kw for p in llm.seen[-1])
    engine.reseed(7)
    assert [tokens for tokens, _ in engine.sample([[1], [2]])] == [[1, 2], [1, 2]]
    assert all(p.kw["logprobs"] == 0 for p in llm.seen[-1])
    assert [p.kw["seed"] for p in llm.seen[-1]] == seeds[0][:2]


@pytest.fixture
def mini(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))

    def make(name: str) -> Lake:
        root = tmp_path / name
        args = ["pool", "create", "synthetic", "--name", "mini", "--envs", "2", "--tasks-per-env", "3"]
        assert main(["--lake", str(root), *args]) == 0
        return Lake(root)

    return make


def _episodes(lake: Lake, table: str) -> list[tuple]:
    key = "rollout" if table == "rollouts" else "sample"
    rows = lake.sql(f"select * from {table} order by step, task_id, {key}").to_pylist()
    return [(r["step"], r["task_id"], r[key], r["reward"], r["trajectory"]) for r in rows]


def test_a_language_model_run_evaluates_held_out_repeats_and_is_not_changed_by_it(mini, capsys):
    """hf-tiny, 2 steps, evaluated at every step on 1 task per split x 2 samples: held-out rows with
    standard errors in ``evals``, their episodes in ``eval_rollouts`` (the same tasks each time),
    the step table's held-out columns filled. The same run again repeats every episode (steps after
    the first used to sample from an unseeded generator in each step's fresh process): a resident
    worker, which runs both steps in one process, samples exactly the run's episodes, which a step
    drawn from an unseeded generator would not; and a run without evaluation trains on exactly the
    same episodes."""
    runs = {}
    for name, every, more in (
        ("a", "1", []),
        ("off", "0", []),
        ("resident", "1", ["--resident"]),
    ):
        lake = mini(name)
        flags = ["--eval-every", every, "--eval-tasks", "1", "--eval-samples", "2", "--steps", "2", *more]
        assert main(["--lake", str(lake.root), *TRAIN, *flags]) == 0
        runs[name] = lake
    out = capsys.readouterr()
    a = runs["a"]
    evals = a.sql("select * from evals where benchmark like 'heldout_%' order by step, benchmark").to_pylist()
    assert [(e["step"], e["benchmark"]) for e in evals] == [
        (s, f"heldout_{k}") for s in range(2) for k in ("seen", "unseen")
    ]
    assert all(0 <= e["score"] <= 1 and e["se"] is not None and e["se"] >= 0 for e in evals)
    held = a.sql("select step, split, task_id, sample from eval_rollouts order by all").to_pylist()
    assert len(held) == 2 * 2 * 1 * 2
    tasks = {s: {(r["split"], r["task_id"]) for r in held if r["step"] == s} for s in range(2)}
    assert tasks[0] == tasks[1] and {k for k, _ in tasks[0]} == {"seen", "unseen"}
    pool_tasks = {r["task_id"] for r in a.read("tasks", pool="mini").to_pylist()}
    assert not {t for _, t in tasks[0]} & pool_tasks  # evaluation tasks are never training tasks
    summary = step_summary(a)  # what the step table prints
    assert all(r["heldout_seen"] is not None and r["heldout_unseen"] is not None for r in summary)
    tm = a.read("train_metrics", step=1).to_pylist()[0]
    assert tm["eval_episodes"] == 4 and tm["eval_seconds"] > 0
    assert "ho_seen" in out.out
    # the best held-out policy so far is kept (ties: the earlier step), and status names it
    means = {s: np.mean([e["score"] for e in evals if e["step"] == s]) for s in range(2)}
    first_best = min(s for s in means if means[s] == max(means.values()))
    best = status(a)["best_heldout"]
    assert best["step"] == first_best and best["score"] == pytest.approx(means[first_best])
    assert json.loads(Path(best["policy"], "trainer.json").read_text())["step"] == first_best
    flags = [a.read("train_metrics", step=s).to_pylist()[0]["heldout_best"] for s in range(2)]
    assert flags == [True, bool(means[1] > means[0])]
    # `envsched evaluate`: the newest checkpoint (the last step's) and the best one, sampled as the
    # run sampled them, repeat the recorded episodes and scores; nothing is written in the lake
    held_before = sorted(a.root.rglob("*"))
    for extra, step in (([], 1), (["--best"], first_best)):
        capsys.readouterr()
        out = a.root.parent / f"episodes-{step}.parquet"
        assert main(["--lake", str(a.root), "evaluate", *extra, "--episodes", str(out), "--json"]) == 0
        got = json.loads(capsys.readouterr().out)
        key = "split, task_id, sample, reward, trajectory"  # episode for episode, token for token
        kept = a.sql(f"select {key} from eval_rollouts where step = {step} order by all").to_pylist()
        assert duckdb.sql(f"select {key} from '{out}' order by all").fetchall() == [
            tuple(r.values()) for r in kept
        ]
        assert got["step"] == step and got["policy"] == "hf-tiny"
        recorded = {
            (e["benchmark"][8:], k): e[k] for e in evals if e["step"] == step for k in ("score", "se")
        }
        scores = {(r["split"], k): r[m] for r in got["splits"] for k, m in (("score", "mean"), ("se", "se"))}
        assert scores == pytest.approx(recorded)
        assert [(r["tasks"], r["samples"]) for r in got["splits"]] == [(1, 2), (1, 2)]
    assert main(["--lake", str(a.root), "evaluate", "--step", "0"]) == 2
    assert "--step 0: the language model's checkpoint after that step is not kept; these are: 1" in (
        capsys.readouterr().err
    )
    assert sorted(a.root.rglob("*")) == held_before
    # on another pool's held-out split (a transfer evaluation): that pool's tasks, every one of them,
    # sampled as asked; nothing recorded beside it
    other = ["pool", "create", "synthetic", "--name", "mini2", "--envs", "3", "--tasks-per-env", "3"]
    other += ["--seed", "5", "--heldout-tasks", "1", "--heldout-envs", "1"]
    assert main(["--lake", str(a.root), *other]) == 0
    capsys.readouterr()
    out = a.root.parent / "episodes-mini2.parquet"
    flags = ["--pool", "mini2", "--tasks", "2", "--samples", "1", "--episodes", str(out), "--json"]
    assert main(["--lake", str(a.root), "evaluate", *flags]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["pool"], got["own_pool"], got["recorded"], got["policy"]) == ("mini2", False, {}, "hf-tiny")
    assert all(r["tasks"] == 2 and r["samples"] == 1 and 0 <= r["mean"] <= 1 for r in got["splits"])
    # the tasks are drawn from that pool's split as a run on it would draw them, not from the run's
    theirs, ours = (
        {
            split: sorted(r["task_id"] for r in rows)
            for split, rows in heldout_tasks(
                a.read("eval_tasks", pool=name).to_pylist(), status(a)["run"]["seed"], 2
            ).items()
        }
        for name in ("mini2", "mini")
    )
    assert theirs != ours
    scored = duckdb.sql(
        f"select split, list(task_id order by task_id) from '{out}' group by split"
    ).fetchall()
    assert dict(scored) == theirs
    # the same run again, by a resident worker (one process keeps the model across steps): every
    # training and held-out episode repeats, token for token
    assert _episodes(runs["resident"], "rollouts") == _episodes(a, "rollouts")
    assert _episodes(runs["resident"], "eval_rollouts") == _episodes(a, "eval_rollouts")
    # evaluating is not training: without it, the same training episodes
    off = runs["off"]
    assert _episodes(off, "rollouts") == _episodes(a, "rollouts")
    assert (
        off.sql("select count(*) as n from evals where benchmark like 'heldout_%'").to_pylist()[0]["n"] == 0
    )
    assert not off.steps("eval_rollouts") and status(off)["best_heldout"] is None


def test_held_out_episodes_in_the_rollout_viewer_and_their_setting_on_resume(mini, capsys):
    lake = mini("lake")
    flags = ["--eval-every", "2", "--eval-tasks", "1", "--eval-samples", "2", "--eval-temperature", "0"]
    assert main(["--lake", str(lake.root), *TRAIN, *flags, "--steps", "2"]) == 0
    assert lake.steps("eval_rollouts") == [0, 1]  # step 0, and the run's last step
    assert lake.read("eval_rollouts", step=0).num_rows == 2  # greedy: one episode per task and split
    capsys.readouterr()
    assert (
        main(["--lake", str(lake.root), "rollouts", "show", "--step", "1", "--heldout", "--limit", "1"]) == 0
    )
    shown = capsys.readouterr().out
    assert "held-out (seen environments)" in shown and "sample 0" in shown and "instruction:" in shown
    # the report: held-out per environment at the last evaluation
    assert main(["--lake", str(lake.root), "report", "--out", str(lake.root.parent / "report")]) == 0
    summary = json.loads((lake.root.parent / "report" / "summary.json").read_text())
    by_env = summary["heldout_by_env"]
    assert {r["split"] for r in by_env} == {"seen", "unseen"} and sum(r["episodes"] for r in by_env) == 2
    assert "Held-out by environment" in (lake.root.parent / "report" / "index.html").read_text()
    # the training step's materialization carries the scores (the UI charts numbers over partitions)
    with dg.DagsterInstance.get() as instance:
        event = instance.get_latest_materialization_event(dg.AssetKey("training_step"))
        meta = event.asset_materialization.metadata
    assert {"heldout_seen", "heldout_seen_se", "heldout_unseen", "heldout_unseen_se"} <= set(meta)
    # and the best held-out policy so far, the one `envsched status` names
    best = status(lake)["best_heldout"]
    assert (meta["heldout_best_step"].value, meta["heldout_best_score"].value) == (
        best["step"],
        best["score"],
    )
    # and each split's share solved, in any and in all of its attempts (one greedy episode a task)
    view = lake.sql("select * from heldout_pass_at_k where step = 1").to_pylist()
    assert {r["split"]: r["k"] for r in view} == {"seen": 1, "unseen": 1}
    for r in view:
        for key in ("solved", "pass_at_1", "pass_hat_1"):
            assert meta[f"heldout_{r['split']}_{key}"].value == pytest.approx(r["pass_at_k"])
    # the non-blocking check ran with the step (a warning, never a halt)
    check = dg.AssetCheckKey(dg.AssetKey("training_step"), "heldout_holds")
    with dg.DagsterInstance.get() as instance:
        records = instance.event_log_storage.get_asset_check_execution_history(check, limit=10)
    assert len(records) == 2 and all(r.status.value in ("SUCCEEDED", "FAILED") for r in records)
    check = dg.AssetCheckKey(dg.AssetKey("training_step"), "sampler_matches_trainer")
    with dg.DagsterInstance.get() as instance:
        records = instance.event_log_storage.get_asset_check_execution_history(check, limit=10)
    assert len(records) == 2 and all(r.status.value == "SUCCEEDED" for r in records)  # nothing drifted
    failures = meta["heldout_failures"].value  # the worst held-out episode of each split, rendered
    assert (
        "worst held-out episode, seen environments" in failures
        and "held-out (unseen environments)" in failures
    )
    # evaluation settings, and how a step runs, are not training settings: a resumed run may change
    # them, recorded
    resumed = ["--eval-every", "0", "--activation-checkpointing", "--checkpoint-every", "5", "--steps", "3"]
    assert main(["--lake", str(lake.root), *TRAIN, *resumed]) == 0
    assert lake.steps("eval_rollouts") == [0, 1]
    run = json.loads((lake.root / "run.json").read_text())
    assert {k: run["policy_config"][k] for k in ("eval_every", "activation_checkpointing")} == {
        "eval_every": 0,
        "activation_checkpointing": True,
    }
    assert run["config_changes"][-1]["from_step"] == 2
    assert main(["--lake", str(lake.root), "rollouts", "show", "--step", "2", "--heldout"]) == 2
    assert "step 2 has no held-out rollouts" in capsys.readouterr().err
    # envsched's own trainer writes its evaluations; scores from outside are for external runs
    with pytest.raises(StepError, match="writes its own evaluations"):
        record_evals(lake, 0, {"heldout_seen": 0.5})
    # a training setting still is
    assert main(["--lake", str(lake.root), *TRAIN, "--lr", "0.5", "--steps", "4"]) != 0
    assert "--allow-config-change" in capsys.readouterr().err
    # going back before the best policy's step archives it with the steps it came from
    best = status(lake)["best_heldout"]
    assert best is not None and best["step"] in (0, 1)
    assert main(["--lake", str(lake.root), "rewind", "--to", "0"]) == 0
    assert status(lake)["best_heldout"] is None
    archived = list((lake.root / "archive").glob("rewind-to-step0-*/checkpoints/best/best.json"))
    assert len(archived) == 1 and json.loads(archived[0].read_text())["step"] == best["step"]


def test_a_pool_without_a_held_out_split_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    lake = Lake(tmp_path / "lake")
    assert main(["--lake", str(lake.root), "pool", "create", "reasoning_gym", "--name", "rg"]) == 0
    train = ["train", "--pool", "rg", "--policy", "hf-tiny", "--batch-size", "2", "--group-size", "2"]
    assert main(["--lake", str(lake.root), *train, "--max-new-tokens", "4", "--steps", "1"]) == 0
    assert "pool rg has no held-out split, so nothing is evaluated" in capsys.readouterr().out
    assert not lake.steps("eval_rollouts")


def test_the_best_held_out_policy_is_kept_and_a_rewound_record_does_not_count(tmp_path):
    """``keep_best`` on a stand-in session (no model: its trainer writes what a save writes)."""
    from trainer.policy_step import PolicySession, best_checkpoint  # the trainer side, torch and all

    class Trainer:
        def save(self, path, step, tokenizer=None):
            path.mkdir(parents=True, exist_ok=True)
            (path / "trainer.json").write_text(json.dumps({"step": step}))

    lake = Lake(tmp_path / "lake")
    sess = types.SimpleNamespace(
        trainer=Trainer(), ranks=types.SimpleNamespace(main=True), lake=lake, tok=None
    )

    def keep(step, seen, unseen):
        evals = [
            {"benchmark": "batch_mean_reward", "score": 0.99},  # not a held-out score
            {"benchmark": "heldout_seen", "score": seen},
            {"benchmark": "heldout_unseen", "score": unseen},
        ]
        return PolicySession.keep_best(sess, step, evals, log=lambda *_: None)

    assert [keep(0, 0.5, 0.5), keep(1, 0.4, 0.5), keep(2, 0.6, 0.6), keep(3, 0.6, 0.6)] == [
        True,
        False,
        True,
        False,
    ]
    path, record = best_checkpoint(lake)
    assert (record["step"], record["score"], record["heldout_unseen"]) == (2, 0.6, 0.6)
    assert json.loads((path / "policy" / "trainer.json").read_text())["step"] == 2
    # the run went back to step 1 (`envsched rewind`): step 2's record is of an undone future
    assert keep(1, 0.3, 0.3) and best_checkpoint(lake)[1]["step"] == 1
    assert status(lake)["best_heldout"]["policy"] == str(path / "policy")


def test_a_held_out_score_below_its_best_is_flagged_past_its_error(tmp_path):
    from envsched_pipeline.core.loop import heldout_drops  # the check's logic, on a bare lake

    lake = Lake(tmp_path / "lake")

    def evals(step, seen, unseen, se=0.01):
        lake.write(
            "evals",
            [
                {"step": step, "benchmark": "batch_mean_reward", "score": 0.1},
                {"step": step, "benchmark": "heldout_seen", "score": seen, "se": se},
                {"step": step, "benchmark": "heldout_unseen", "score": unseen, "se": se},
            ],
            step=step,
        )

    evals(0, 0.50, 0.40)
    evals(10, 0.60, 0.45)
    evals(20, 0.58, 0.40)  # seen: -0.02 within 2 x 0.0141; unseen: -0.05 past it
    first = heldout_drops(lake, 0)
    assert first["evaluated"] and not first["splits"]  # nothing earlier to compare with
    out = heldout_drops(lake, 20)
    assert [d["split"] for d in out["drops"]] == ["unseen"]
    unseen = out["drops"][0]
    assert unseen["best_step"] == 10 and unseen["drop"] == pytest.approx(0.05)
    assert unseen["threshold"] == pytest.approx(2 * (2 * 0.01**2) ** 0.5)
    assert not heldout_drops(lake, 15)["evaluated"]  # a step that did not evaluate
    evals(30, 0.595, 0.4495, se=0.0)  # no error (the simulated learner): the floor of 0.01 holds
    assert not heldout_drops(lake, 30)["drops"]


def test_a_language_model_run_keeps_its_newest_checkpoints_and_rewinds_to_them(mini, capsys):
    """`--keep-checkpoints N`: after each periodic checkpoint the older ones past the newest N are
    deleted (a real model's are GBs each); a rewind then goes back only to a step just after a kept
    one, and names them. How many to keep changes no weight, so a resumed run may change it."""
    lake = mini("keep")
    flags = ["--resident", "--eval-every", "0", "--checkpoint-every", "1", "--keep-checkpoints", "2"]
    assert main(["--lake", str(lake.root), *TRAIN, *flags, "--steps", "4", "--max-steps", "5"]) == 0
    folders = lambda: sorted(p.parent.name for p in (lake.root / "checkpoints").glob("step=*/policy"))  # noqa: E731
    assert folders() == ["step=2", "step=3"]
    capsys.readouterr()
    assert main(["--lake", str(lake.root), "rewind", "--to", "2"]) == 2
    err = capsys.readouterr().err
    assert "the policy after step 1 is not on disk" in err and err.rstrip().endswith(
        "after one that is: 0, 3"
    ), err
    again = ["--resident", "--eval-every", "0", "--checkpoint-every", "1", "--keep-checkpoints", "1"]
    assert main(["--lake", str(lake.root), *TRAIN, *again, "--steps", "5"]) == 0  # no --allow-config-change
    assert folders() == ["step=4"]
    assert json.loads((lake.root / "run.json").read_text())["policy_config"]["keep_checkpoints"] == 1
