"""`envsched evaluate`: a trained policy's held-out scores from its checkpoint, outside training (the
neural learner here; the language models' in tests/test_heldout.py): the run's own settings repeat
the scores it recorded, more samples or another seed look again, and nothing is written."""

import json

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
    train += ["--steps", "2", "--eval-every", "1", "--eval-tasks", "2", "--eval-samples", "2"]
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
    for flags, step in (((), 1), (("--step", "0"), 0)):  # the newest kept by default
        out = lake.root.parent / f"episodes-{step}.parquet"
        got = evaluated(lake, capsys, *flags, "--episodes", str(out))
        assert got["step"] == step and got["checkpoint"].endswith(f"checkpoints/step={step}/neural.pt")
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
    assert json.loads(capsys.readouterr().out)["checkpoints"] == [0, 1]
    assert main(["--lake", str(lake.root), "status"]) == 0
    assert "  policy kept after steps: 0, 1 (2 kept; `envsched evaluate --step K` scores one again" in (
        capsys.readouterr().out
    )
    # refused in one line, naming what to ask for instead
    for flags, says in (
        (
            ["--step", "5"],
            "--step 5: the neural learner's checkpoint after that step is not kept; these are: 0, 1",
        ),
        (["--best"], "--best: the neural learner keeps a checkpoint per step; name one with --step"),
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
    assert main(["--lake", str(lake), "evaluate"]) == 2
    assert (
        "the run's policy is 'simulated': envsched evaluates the policies it trains"
        in capsys.readouterr().err
    )
