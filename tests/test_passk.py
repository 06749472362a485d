"""Held-out success over repeated attempts (envsched_pipeline/analysis/passk.py and the lake's view
``heldout_pass_at_k``): pass@k and pass^k against counting every k-subset of a task's episodes, their
standard errors against the held-out mean's where they coincide, and the SQL view against Python."""

import itertools
import math

import numpy as np
import pyarrow as pa
import pytest

from envsched_pipeline.analysis.compare import compare_reliability
from envsched_pipeline.analysis.passk import (
    default_ks,
    episodes_by_split,
    headline_reliability,
    heldout_reliability,
    pass_at_k,
    pass_hat_k,
    reliability,
)
from envsched_pipeline.lake import Lake
from envsched_pipeline.trackers import step_metrics
from trainer.heldout import summarize


def _subsets(solved: list[bool], k: int) -> tuple[float, float]:
    """pass@k and pass^k by counting: the share of k-subsets of the episodes with any (all) solved."""
    subsets = list(itertools.combinations(solved, k))
    return sum(any(s) for s in subsets) / len(subsets), sum(all(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_the_estimates_are_the_shares_of_k_subsets_that_solve(n):
    for c in range(n + 1):
        solved = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            any_k, all_k = _subsets(solved, k)
            assert pass_at_k(n, c, k) == pytest.approx(any_k) and pass_hat_k(n, c, k) == pytest.approx(all_k)
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_hat_k(3, 4, 1)


def test_a_split_averages_its_tasks_and_counts_only_those_with_k_episodes():
    episodes = {
        "a": [1.0, 0.0, 1.0, 0.5],  # 2 of 4 solved (0.5 is partial credit, not solved)
        "b": [1.0, 1.0, 1.0, 1.0],
        "c": [0.0, 0.2],  # two episodes only: not in k = 4
    }
    assert default_ks(4) == [1, 2, 4] and default_ks(5) == [1, 2, 4, 5] and default_ks(1) == [1]
    rows = {r["k"]: r for r in reliability(episodes)}
    assert sorted(rows) == [1, 2, 4] and [rows[k]["tasks"] for k in (1, 2, 4)] == [3, 3, 2]
    assert rows[1]["pass_at_k"] == pytest.approx((0.5 + 1 + 0) / 3) == rows[1]["pass_hat_k"]
    assert rows[2]["pass_at_k"] == pytest.approx((5 / 6 + 1 + 0) / 3)
    assert rows[2]["pass_hat_k"] == pytest.approx((1 / 6 + 1 + 0) / 3)
    assert rows[4]["pass_at_k"] == pytest.approx(1.0) and rows[4]["pass_hat_k"] == pytest.approx(0.5)
    # k = 2 is the most task c has: no jackknife over its episodes, so no error; nor at k = n
    assert rows[2]["pass_at_k_se"] is None and rows[4]["pass_hat_k_se"] is None
    assert rows[1]["pass_at_k_se"] is not None
    assert reliability({}) == [] and reliability({"a": [1.0]}, ks=[2]) == []


def test_pass_at_1_has_the_held_out_means_error_and_larger_k_a_jackknifes():
    rng = np.random.default_rng(3)
    rewards = (rng.random((40, 8)) < rng.random((40, 1))).astype(float)
    rows = {r["k"]: r for r in reliability({f"t{i}": list(r) for i, r in enumerate(rewards)})}
    held = summarize(rewards)  # what the run records as the held-out mean and its error
    assert rows[1]["pass_at_k"] == pytest.approx(held["mean"])
    assert rows[1]["pass_at_k_se"] == pytest.approx(held["se"])
    # the jackknife over one task's episodes, leaving each out in turn, by hand
    n, c, k = 8, 3, 4
    loo = [pass_hat_k(n - 1, c - 1, k)] * c + [pass_hat_k(n - 1, c, k)] * (n - c)
    mine = reliability({"t": [1.0] * c + [0.0] * (n - c)}, ks=[k])[0]
    assert mine["pass_hat_k_se"] == pytest.approx(
        math.sqrt((n - 1) / n * np.sum((np.array(loo) - np.mean(loo)) ** 2))
    )


def test_two_runs_compared_at_each_k_with_the_errors_combined():
    mine = [
        {
            "k": 1,
            "tasks": 9,
            "pass_at_k": 0.6,
            "pass_at_k_se": 0.03,
            "pass_hat_k": 0.6,
            "pass_hat_k_se": 0.03,
        },
        {
            "k": 4,
            "tasks": 9,
            "pass_at_k": 0.9,
            "pass_at_k_se": None,
            "pass_hat_k": 0.2,
            "pass_hat_k_se": None,
        },
    ]
    theirs = [
        {"k": 1, "tasks": 9, "pass_at_k": 0.5, "pass_at_k_se": 0.04, "pass_hat_k": 0.5, "pass_hat_k_se": 0.04}
    ]
    (row,) = compare_reliability(mine, theirs)  # k = 4: the other run has no such row
    assert row["k"] == 1 and row["pass_at_k_diff"] == pytest.approx(0.1)
    assert row["pass_at_k_diff_se"] == pytest.approx(0.05) and row["pass_at_k_better"] is True
    theirs[0]["pass_at_k"] = 0.55  # 0.05 apart: inside 1.96 errors
    assert compare_reliability(mine, theirs)[0]["pass_at_k_better"] is None
    theirs[0]["pass_at_k"], theirs[0]["pass_at_k_se"] = 0.7, None
    got = compare_reliability(mine, theirs)[0]
    assert got["pass_at_k_better"] is None and got["pass_at_k_diff_se"] is None


def test_the_lakes_view_gives_the_same_estimates_as_python(tmp_path):
    lake = Lake(tmp_path / "lake")
    rng = np.random.default_rng(0)
    rows = []
    for step in (0, 5):
        for split in ("seen", "unseen"):
            for t in range(6):
                n = 3 if t == 0 else 6  # one task evaluated fewer times
                p = rng.random()
                for s in range(n):
                    reward = 1.0 if rng.random() < p else float(rng.choice([0.0, 0.5]))
                    rows.append(
                        {
                            "step": step,
                            "split": split,
                            "task_id": f"{split}-{t}",
                            "sample": s,
                            "env_id": "e",
                            "reward": reward,
                        }
                    )
    for step in (0, 5):
        lake.write("eval_rollouts", pa.Table.from_pylist([r for r in rows if r["step"] == step]), step=step)
    view = lake.sql("select * from heldout_pass_at_k order by step, split, k").to_pylist()
    assert {r["k"] for r in view} == set(range(1, 7))
    for step in (0, 5):
        got = heldout_reliability(lake, step)
        assert got["step"] == step and sorted(got["splits"]) == ["seen", "unseen"]
        for split, mine in got["splits"].items():
            by_k = {r["k"]: r for r in view if r["step"] == step and r["split"] == split}
            for r in mine:
                assert by_k[r["k"]]["tasks"] == r["tasks"] == (6 if r["k"] <= 3 else 5)
                assert by_k[r["k"]]["pass_at_k"] == pytest.approx(r["pass_at_k"])
                assert by_k[r["k"]]["pass_hat_k"] == pytest.approx(r["pass_hat_k"])
            # every k of the view, counted over k-subsets of each task's episodes
            tasks = {}
            for e in rows:
                if e["step"] == step and e["split"] == split:
                    tasks.setdefault(e["task_id"], []).append(e["reward"] >= 1)
            for k, r in by_k.items():
                counted = [_subsets(v, k) for v in tasks.values() if len(v) >= k]
                assert r["pass_at_k"] == pytest.approx(np.mean([a for a, _ in counted]))
                assert r["pass_hat_k"] == pytest.approx(np.mean([b for _, b in counted]))
    assert heldout_reliability(lake)["step"] == 5  # the last evaluation by default
    # flat for a step's metadata (training_step) and the trackers: solved once, in any and in all of 6
    flat = headline_reliability(episodes_by_split(lake, 5))
    last = {s: rows[-1] for s, rows in heldout_reliability(lake, 5)["splits"].items()}
    for split in ("seen", "unseen"):
        assert (
            flat[f"heldout_{split}_solved"] == heldout_reliability(lake, 5)["splits"][split][0]["pass_at_k"]
        )
        assert flat[f"heldout_{split}_pass_at_6"] == last[split]["pass_at_k"] and last[split]["k"] == 6
        assert flat[f"heldout_{split}_pass_hat_6"] == last[split]["pass_hat_k"]
    assert {k: v for k, v in step_metrics(lake, 5).items() if k.startswith("heldout_")} == pytest.approx(flat)
    assert headline_reliability(episodes_by_split(lake, 3)) == {}  # a step that did not evaluate
    assert heldout_reliability(Lake(tmp_path / "empty")) == {"step": None, "splits": {}}
