"""--report-to: the step table's numbers land in TensorBoard, W&B (offline) and MLflow, read back."""

import pytest

from envsched_pipeline.cli import main
from envsched_pipeline.lake import Lake
from envsched_pipeline.run import load_run


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    lake = tmp_path_factory.mktemp("trk") / "lake"
    assert (
        main(
            [
                "--lake",
                str(lake),
                "pool",
                "create",
                "synthetic",
                "--name",
                "mini",
                "--envs",
                "3",
                "--tasks-per-env",
                "4",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "--lake",
                str(lake),
                "train",
                "--pool",
                "mini",
                "--steps",
                "2",
                "--batch-size",
                "4",
                "--group-size",
                "2",
                "--report-to",
                "tensorboard,wandb,mlflow",
            ]
        )
        == 0
    )
    return Lake(lake)


COLUMNS = {"batch_variance", "zero_variance_fraction", "envs_touched", "mean_reward", "trainer_s"}


def test_tensorboard_scalars_are_named_after_the_step_table(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tracked.root / "trackers" / "tensorboard" / load_run(tracked).run_id))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert COLUMNS <= tags and "heldout_seen" in tags
    assert [e.step for e in acc.Scalars("batch_variance")] == [0, 1]
    # at each evaluating step, the best mean held-out so far (the earlier step at a tie) and its step
    by: dict[int, list[float]] = {}
    for e in tracked.read("evals").to_pylist():
        if e["benchmark"].startswith("heldout_"):
            by.setdefault(e["step"], []).append(e["score"])
    mean = {t: sum(v) / len(v) for t, v in sorted(by.items())}
    best = [max(m for u, m in mean.items() if u <= t) for t in mean]
    assert len(mean) == 2 and [e.step for e in acc.Scalars("heldout_best_score")] == list(mean)
    assert [e.value for e in acc.Scalars("heldout_best_score")] == pytest.approx(best, abs=1e-6)
    at = [min(u for u in mean if u <= t and mean[u] == b) for t, b in zip(mean, best, strict=True)]
    assert [e.value for e in acc.Scalars("heldout_best_step")] == at


def test_wandb_offline_runs_hold_each_step(tracked):
    from envsched_pipeline.trackers import read_wandb_history

    rows = [
        row
        for f in sorted((tracked.root / "trackers" / "wandb").glob("offline-run-*/run-*.wandb"))
        for row in read_wandb_history(f)
    ]
    assert {r["_step"] for r in rows} == {0, 1}
    assert all(COLUMNS <= set(r) for r in rows)


def test_mlflow_file_store_has_the_history_and_the_config(tracked):
    import os

    import mlflow

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    mlflow.set_tracking_uri((tracked.root / "trackers" / "mlruns").resolve().as_uri())
    client = mlflow.MlflowClient()
    exp = client.get_experiment_by_name("envsched")
    run = client.search_runs([exp.experiment_id])[0]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "batch_variance")] == [0, 1]
    assert run.data.params["batch_size"] == "4" and run.data.params["pool"] == "mini"


def test_an_unknown_tracker_is_refused(tmp_path, capsys):
    code = main(["--lake", str(tmp_path / "l"), "train", "--report-to", "tensorbored"])
    assert code == 2 and "unknown tracker" in capsys.readouterr().err and not (tmp_path / "l").exists()


def test_the_best_held_out_so_far_is_the_earliest_best_up_to_the_step(tmp_path):
    """A curve that falls after its peak: each evaluating step logs the peak so far, not its own."""
    from envsched_pipeline.trackers import step_metrics

    lake = Lake(tmp_path / "lake")
    curve = {0: (0.50, 0.40), 1: (0.70, 0.60), 2: (0.65, 0.55), 3: (0.70, 0.60)}
    for t, (seen, unseen) in curve.items():
        rows = [
            {"step": t, "benchmark": f"heldout_{k}", "score": v, "se": 0.01}
            for k, v in (("seen", seen), ("unseen", unseen))
        ]
        lake.write("evals", rows, step=t)
    got = {t: step_metrics(lake, t) for t in curve}
    assert [(got[t]["heldout_best_step"], got[t]["heldout_best_score"]) for t in curve] == [
        (0, pytest.approx(0.45)),
        (1, pytest.approx(0.65)),
        (1, pytest.approx(0.65)),
        (1, pytest.approx(0.65)),  # a tie keeps the earlier step
    ]
