"""`envsched evaluate`: a trained policy's held-out scores from its checkpoint, outside training (the
neural learner here; the language models' in tests/test_heldout.py): the run's own settings repeat
the scores it recorded, more samples or another seed look again, and nothing is written."""

import json
from collections import Counter

import dagster as dg
import duckdb
import pytest

from envsched_pipeline.cli import main
from envsched_pipeline.lake import Lake


@pytest.fixture
def neural_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    lake = Lake(tmp_path / "lake")
    pool = ["pool", "create", "synthetic", "--name", "mini", "--envs", "2", "--tasks-per-env", "3"]
    assert main(["--lake", str(lake.root), *pool]) == 0
    train = ["train", "--pool", "mini", "--policy", "neural", "--batch-size", "4", "--group-size", "2"]
    train += ["--steps", "4", "--eval-every", "1", "--eval-tasks", "2", "--eval-samples", "2"]
    assert main(["--lake", str(lake.root), *train]) == 0
    capsys.readouterr()
    return lake


def evaluated(lake: Lake, capsys, *flags: str) -> dict:
    assert main(["--lake", str(lake.root), "evaluate", *flags, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_a_neural_checkpoint_repeats_its_recorded_scores_and_looks_again_when_asked(neural_run, capsys):
    lake = neural_run
    before = sorted(lake.root.rglob("*"))
    evals = lake.sql("select * from evals where benchmark like 'heldout_%'").to_pylist()
    recorded = {(e["step"], e["benchmark"][8:], k): e[k] for e in evals for k in ("score", "se")}
    # the lake keeps steps 0, 2 and 3's checkpoints (step 0's and the newest two): step 1's is made
    # again from step 0's, in memory, and scores as the run recorded, episode for episode
    assert sorted(lake.artifact_steps("checkpoints")) == [0, 2, 3]
    for flags, step in (((), 3), (("--step", "0"), 0), (("--step", "1"), 1)):  # the newest kept by default
        out = lake.root.parent / f"episodes-{step}.parquet"
        got = evaluated(lake, capsys, *flags, "--episodes", str(out))
        if step == 1:
            made = dict(got["made_again"])
            assert made.pop("seconds") > 0 and made == {
                "after": 1,
                "from": 0,
                "from_kept": True,
                "remade": [1],
            }
            assert got["checkpoint"].startswith("not kept: made again from step 0's checkpoint, 1 step(s)")
        else:
            assert got["made_again"] is None
            assert got["checkpoint"].endswith(f"checkpoints/step={step}/neural.pt")
        assert got["step"] == step
        scores = {
            (step, r["split"], k): r[m] for r in got["splits"] for k, m in (("score", "mean"), ("se", "se"))
        }
        assert scores == pytest.approx({k: v for k, v in recorded.items() if k[0] == step})
        assert got["recorded"] == {k[1]: v for k, v in recorded.items() if k[0] == step and k[2] == "score"}
        assert [(r["split"], r["tasks"], r["samples"]) for r in got["splits"]] == [
            ("seen", 2, 2),
            ("unseen", 2, 2),
        ]
        # episode for episode the ones the run recorded: the same tasks, samples and trajectories
        key = "split, task_id, sample, reward, trajectory"
        mine = duckdb.sql(f"select {key} from '{out}' order by all").fetchall()
        kept = lake.sql(f"select {key} from eval_rollouts where step = {step} order by all").to_pylist()
        assert len(mine) == 8 and mine == [tuple(r.values()) for r in kept]
        # solved in one attempt, in either of two and in both: the lake's view of the same episodes
        view = lake.sql(f"select * from heldout_pass_at_k where step = {step} order by split, k").to_pylist()
        got_rel = [(split, r) for split, rows in got["reliability"].items() for r in rows]
        assert [(split, r["k"], r["tasks"]) for split, r in got_rel] == [
            (r["split"], r["k"], r["tasks"]) for r in view
        ]
        estimates = [r[m] for r in view for m in ("pass_at_k", "pass_hat_k")]
        assert [r[m] for _, r in got_rel for m in ("pass_at_k", "pass_hat_k")] == pytest.approx(estimates)
        # by environment: each one's tasks, weakest first, adding up to the split's score
        for r in got["splits"]:
            envs = [e for e in got["by_env"] if e["split"] == r["split"]]
            assert [e["mean"] for e in envs] == sorted(e["mean"] for e in envs)
            assert sum(e["tasks"] for e in envs) == r["tasks"] and {e["episodes"] for e in envs} <= {2, 4}
            assert sum(e["tasks"] * e["mean"] for e in envs) / r["tasks"] == pytest.approx(r["mean"])
    # the best held-out policy: the evaluated step with the best mean over the splits, the earlier
    # at a tie, read or made again as any other step's
    means = {}
    for e in evals:
        means.setdefault(e["step"], []).append(e["score"])
    top = max(sum(v) / len(v) for v in means.values())
    best = min(t for t, v in means.items() if sum(v) / len(v) == top)
    with dg.DagsterInstance.get() as instance:  # the last step's materialization names it in the UI
        meta = instance.get_latest_materialization_event(
            dg.AssetKey("training_step")
        ).asset_materialization.metadata
    assert (meta["heldout_best_step"].value, meta["heldout_best_score"].value) == (best, pytest.approx(top))
    got = evaluated(lake, capsys, "--best")
    assert got["step"] == best and (got["made_again"] is None) == (best != 1)
    assert got["recorded"] == {k[1]: v for k, v in recorded.items() if k[0] == best and k[2] == "score"}
    assert {r["split"]: r["mean"] for r in got["splits"]} == pytest.approx(
        {k[1]: v for k, v in recorded.items() if k[0] == best and k[2] == "score"}
    )
    # several steps' policies, one after the other: the run's curve scored again (steps 0 and 3 read,
    # 1 made again), each as its own evaluation gives it; `evaluated` names every step the run evaluated
    out = lake.root.parent / "episodes-curve.parquet"
    curve = evaluated(lake, capsys, "--steps", "3,0,1", "--episodes", str(out))
    assert [c["step"] for c in curve] == [3, 0, 1]
    assert [c["made_again"] is not None for c in curve] == [False, False, True]
    for c in curve:
        assert {r["split"]: r["mean"] for r in c["splits"]} == pytest.approx(
            {k[1]: v for k, v in recorded.items() if k[0] == c["step"] and k[2] == "score"}
        )
    assert duckdb.sql(f"select step, count(*) from '{out}' group by step order by step").fetchall() == [
        (0, 8),
        (1, 8),
        (3, 8),
    ]
    assert [c["step"] for c in evaluated(lake, capsys, "--steps", "evaluated")] == [0, 1, 2, 3]
    assert main(["--lake", str(lake.root), "evaluate", "--steps", "0,2"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[-4].startswith("held-out over the steps") and text[-3].split() == [
        "step",
        "seen",
        "±",
        "se",
        "recorded",
        "unseen",
        "±",
        "se",
        "recorded",
    ]
    shown = [line.split() for line in text[-2:]]
    assert [int(c[0]) for c in shown] == [0, 2]
    for cells in shown:
        want = {k[1:]: v for k, v in recorded.items() if k[0] == int(cells[0])}
        assert [float(cells[j]) for j in (1, 3, 4, 5, 7, 8)] == pytest.approx(
            [want[("seen", m)] for m in ("score", "se", "score")]
            + [want[("unseen", m)] for m in ("score", "se", "score")],
            abs=5e-5,
        )
    # a step that cannot be scored is named before any is scored
    assert main(["--lake", str(lake.root), "evaluate", "--steps", "1,7,9"]) == 2
    err = capsys.readouterr().err
    assert "--steps: the policy after step(s) 7, 9 cannot be scored; these can: 0..3" in err
    assert "evaluating" not in err
    # more samples from another seed: the same tasks, another look
    again = evaluated(lake, capsys, "--step", "1", "--samples", "12", "--seed", "7")
    assert [(r["tasks"], r["samples"]) for r in again["splits"]] == [(2, 12), (2, 12)]
    assert all(0 <= r["mean"] <= 1 and r["se"] >= 0 for r in again["splits"])
    assert sorted(lake.root.rglob("*")) == before  # nothing written in the lake
    # the table a person reads
    assert main(["--lake", str(lake.root), "evaluate", "--step", "0", "--by-env"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "by environment, weakest first:" in out and len(out) == 4 + 1 + 1 + len(got["by_env"])
    assert out[0].startswith("neural policy after step 0 (") and out[1].split() == [
        "split",
        "tasks",
        "samples",
        "held-out",
        "±",
        "se",
        "recorded",
        "solved",
        "pass@2",
        "pass^2",
    ]
    rel = {split: {r["k"]: r for r in rows} for split, rows in got["reliability"].items()}  # step 0's
    for line in out[2:4]:
        split, *_, solved, any2, all2 = line.split()
        shown = (rel[split][1]["pass_at_k"], rel[split][2]["pass_at_k"], rel[split][2]["pass_hat_k"])
        assert [float(x) for x in (solved, any2, all2)] == pytest.approx(shown, abs=5e-5)
    # `envsched status` names the kept checkpoints and what to do with them
    assert main(["--lake", str(lake.root), "status", "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["checkpoints"] == [0, 2, 3]
    assert st["best_heldout"] == {
        "step": best,
        "score": pytest.approx(top),
        **{
            f"heldout_{k[1]}": pytest.approx(v)
            for k, v in recorded.items()
            if k[0] == best and k[2] == "score"
        },
        "policy": None if best == 1 else str(lake.root / f"checkpoints/step={best}/neural.pt"),
    }
    assert main(["--lake", str(lake.root), "status"]) == 0
    text = capsys.readouterr().out
    assert (
        "  policy kept after steps: 0, 2, 3 (3 kept; `envsched evaluate --step K` scores the policy after any "
        "step K (one not kept is made again), `envsched rewind --to K+1` goes back to one)" in text
    )
    shown = ", ".join(f"{split} {st['best_heldout'][f'heldout_{split}']:.4f}" for split in ("seen", "unseen"))
    where = (
        "its checkpoint was dropped; `envsched evaluate --best` makes it again"
        if best == 1
        else f"policy in {lake.root}/checkpoints/step={best}/neural.pt"
    )
    assert (
        f"  best held-out so far: step {best}, score {top:.4f} (the mean over the splits evaluated: {shown}); {where}"
        in text
    )
    # a best policy whose checkpoint the lake dropped (step 1's, its held-out record raised to the
    # top here): status says so, and --best makes it again and scores it as the run first did
    rows = lake.read("evals", step=1).to_pylist()
    lake.write(
        "evals", [{**r, "score": 1.0} if r["benchmark"].startswith("heldout_") else r for r in rows], step=1
    )
    assert main(["--lake", str(lake.root), "status"]) == 0
    assert (
        "  best held-out so far: step 1, score 1.0000 (the mean over the splits evaluated: seen 1.0000, unseen "
        "1.0000); its checkpoint was dropped; `envsched evaluate --best` makes it again"
        in capsys.readouterr().out
    )
    got = evaluated(lake, capsys, "--best")
    assert got["step"] == 1 and got["made_again"]["remade"] == [1]
    assert {r["split"]: r["mean"] for r in got["splits"]} == pytest.approx(
        {k[1]: v for k, v in recorded.items() if k[0] == 1 and k[2] == "score"}
    )
    # two dropped checkpoints in a row (step 2's gone too): scored in turn, each is made again from
    # the one before it, step 2's from step 1's policy made again just before, not twice from step 0's
    (lake.root / "checkpoints/step=2/neural.pt").unlink()
    curve = evaluated(lake, capsys, "--steps", "2,1")
    assert [(c["step"], c["made_again"]["from"], c["made_again"]["remade"]) for c in curve] == [
        (2, 1, [2]),
        (1, 0, [1]),
    ]
    assert curve[0]["checkpoint"].startswith("not kept: made again from step 1's policy, 1 step(s)")
    for c in curve:
        assert {r["split"]: r["mean"] for r in c["splits"]} == pytest.approx(
            {k[1]: v for k, v in recorded.items() if k[0] == c["step"] and k[2] == "score"}
        )
    # a transfer evaluation: another pool's held-out split (a pool the lake holds), nothing recorded
    # beside it; its tasks are that pool's
    other = ["pool", "create", "synthetic", "--name", "mini2", "--envs", "3", "--tasks-per-env", "3"]
    other += ["--seed", "5", "--heldout-tasks", "1", "--heldout-envs", "1"]
    assert main(["--lake", str(lake.root), *other]) == 0
    capsys.readouterr()
    got = evaluated(lake, capsys, "--step", "3", "--pool", "mini2", "--tasks", "200")
    assert (got["pool"], got["own_pool"], got["recorded"]) == ("mini2", False, {})
    theirs, ours = (
        Counter(r["split"] for r in lake.read("eval_tasks", pool=name).to_pylist())
        for name in ("mini2", "mini")
    )
    assert theirs != ours and {r["split"]: r["tasks"] for r in got["splits"]} == theirs
    assert main(["--lake", str(lake.root), "evaluate", "--step", "3", "--pool", "mini2"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(", on pool mini2's held-out split")
    # refused in one line, naming what to ask for instead
    for flags, says in (
        (["--step", "5"], "--step 5: the run has not trained step 5 (its steps: 0..3)"),
        (["--pool", "nope"], "--pool nope: no such pool in"),
        (["--samples", "5000"], "policy_config.eval_samples"),
    ):
        assert main(["--lake", str(lake.root), "evaluate", *flags]) == 2
        assert says in capsys.readouterr().err


def test_a_policy_without_weights_of_its_own_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    lake = tmp_path / "lake"
    train = ["train", "--batch-size", "4", "--group-size", "2", "--steps", "1"]
    assert main(["--lake", str(lake), *["pool", "create", "synthetic", "--name", "mini", "--envs", "2"]]) == 0
    assert main(["--lake", str(lake), *train, "--pool", "mini"]) == 0
    capsys.readouterr()
    for flags in ([], ["--steps", "0"], ["--best"]):
        assert main(["--lake", str(lake), "evaluate", *flags]) == 2
        assert (
            "the run's policy is 'simulated': envsched evaluates the policies it trains"
            in capsys.readouterr().err
        )


def test_the_best_policy_keeps_its_checkpoint_while_it_is_the_best(tmp_path, monkeypatch, capsys):
    """The lake keeps the neural learner's checkpoint of step 0, of every 20th step and of the newest
    two, and besides them the best evaluated step's while it is the best: a best beaten later by
    one more than a step after it gives its checkpoint up, so the run ends with one extra at most."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    lake = Lake(tmp_path / "lake")
    pool = ["pool", "create", "synthetic", "--name", "mini", "--envs", "2", "--tasks-per-env", "3"]
    assert main(["--lake", str(lake.root), *pool]) == 0
    train = ["train", "--pool", "mini", "--policy", "neural", "--batch-size", "4", "--group-size", "2"]
    train += ["--steps", "10", "--eval-every", "1", "--eval-tasks", "4", "--eval-samples", "4", "--seed", "2"]
    train += ["--resident"]  # one process for the ten steps (the same numbers: tests/test_resident.py)
    assert main(["--lake", str(lake.root), *train]) == 0
    capsys.readouterr()
    means: dict[int, list[float]] = {}
    for e in lake.sql("select * from evals where benchmark like 'heldout_%'").to_pylist():
        means.setdefault(e["step"], []).append(e["score"])
    mean = {t: sum(v) / len(v) for t, v in sorted(means.items())}
    # the best so far after each step (the earlier at a tie), and the bests beaten two or more steps on
    best_after, best = {}, None
    for t, m in mean.items():
        if best is None or m > mean[best]:
            best = t
        best_after[t] = best
    beaten = {best_after[t - 1] for t in mean if t and best_after[t] == t and best_after[t - 1] <= t - 2}
    assert beaten - {0} and best not in (0, 8, 9)  # this seed exercises both: kept, then given up
    assert sorted(lake.artifact_steps("checkpoints")) == sorted({0, 8, 9, best})
    got = evaluated(lake, capsys, "--best")
    assert got["step"] == best and got["made_again"] is None
    assert got["checkpoint"].endswith(f"checkpoints/step={best}/neural.pt")
