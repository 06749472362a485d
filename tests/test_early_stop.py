"""Stopping a run early when held-out stalls (`--eval-patience N`): the run stops after the first
step at which N evaluations in a row have not beaten its best mean held-out score, says so, and
trains on after `envsched resume` with the patience counted again from there."""

import json
import time

import dagster as dg

from envsched_pipeline.cli import main
from envsched_pipeline.core.gates import PATIENCE_FILE, STALL_GATE, halted
from envsched_pipeline.core.loop import status
from envsched_pipeline.lake import Lake
from envsched_pipeline.run import load_run
from tests.procs import gone
from trainer.resident import read_info

STEPS = 12
TRAIN = ["train", "--pool", "mini", "--policy", "neural", "--batch-size", "4", "--group-size", "2"]
TRAIN += ["--eval-every", "1", "--eval-tasks", "2", "--eval-samples", "2", "--steps", str(STEPS)]
TRAIN += ["--resident"]  # one process for the run's steps (the same numbers: tests/test_resident.py)


def means(lake: Lake) -> dict[int, float]:
    """Each evaluated step's mean held-out score over its splits, from the recorded evaluations."""
    by: dict[int, list[float]] = {}
    for e in lake.read("evals").to_pylist():
        if e["benchmark"].startswith("heldout_"):
            by.setdefault(e["step"], []).append(e["score"])
    return {t: sum(v) / len(v) for t, v in sorted(by.items())}


def first_stall(scores: dict[int, float], after: int, patience: int) -> int | None:
    """The first evaluated step past ``after`` by which ``patience`` evaluations (after the best step
    so far, the earlier at a tie, and after ``after``) have not beaten the best; None when no step
    before the run's last does."""
    for t in scores:
        if t <= after or t >= STEPS - 1:
            continue
        seen = {u: v for u, v in scores.items() if u <= t}
        best = min(u for u in seen if seen[u] == max(seen.values()))
        if len([u for u in seen if u > max(best, after)]) >= patience:
            return t
    return None


def test_a_run_stops_when_held_out_stalls_and_trains_on_after_resume(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    lake = Lake(tmp_path / "lake")
    pool = ["pool", "create", "synthetic", "--name", "mini", "--envs", "2", "--tasks-per-env", "3"]
    assert main(["--lake", str(lake.root), *pool]) == 0
    assert main(["--lake", str(lake.root), *TRAIN, "--eval-patience", "2"]) == 0  # stopping is not failing
    out = capsys.readouterr().out
    scores = means(lake)
    stop = first_stall(scores, -1, 2)
    assert stop is not None, f"held-out never stalled twice in a row: {scores}"
    # every step up to the stop was trained and evaluated, none after it
    assert lake.steps("train_metrics") == list(range(stop + 1)) and list(scores) == list(range(stop + 1))
    record = halted(lake)
    assert (record["gate"], record["step"]) == (STALL_GATE, stop)
    # the run's resident worker sees the halt and exits (its memory freed until a resume)
    worker = read_info(lake)["pid"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not gone(worker):
        time.sleep(0.5)
    assert read_info(lake) is None and gone(worker)
    assert f"the run stopped early at step {stop}" in out and "`envsched resume` trains on" in out
    assert tuple(status(lake)["next"]) == ("halted", stop)
    best = min(t for t in scores if scores[t] == max(scores.values()))
    count = status(lake)["patience"]  # and `envsched status` counts it
    assert (count["best_step"], count["since"], count["stalled"]) == (best, best, True)
    assert count["evaluations"] == [t for t in scores if t > best] and len(count["evaluations"]) == 2
    assert main(["--lake", str(lake.root), "status"]) == 0
    assert "early stop: 2 of 2 evaluations since step" in capsys.readouterr().out
    with dg.DagsterInstance.get() as instance:  # the step's statistics say why, in the UI
        meta = instance.get_latest_materialization_event(
            dg.AssetKey("reward_statistics")
        ).asset_materialization.metadata
    assert meta["stopped_early"].value is True and meta["stop_reason"].value == record["problems"][0]
    # the same `envsched train` again stops at once, saying why; nothing failed, so nothing to redo
    assert main(["--lake", str(lake.root), *TRAIN]) == 0
    assert f"the run stopped early at step {stop}" in capsys.readouterr().out
    # the run's report says where and why it stopped
    assert main(["--lake", str(lake.root), "report", "--out", str(tmp_path / "rep")]) == 0
    config = json.loads((tmp_path / "rep" / "summary.json").read_text())["config"]
    assert config["stopped early"] == f"after step {stop}: {record['problems'][0]}"
    capsys.readouterr()
    assert main(["--lake", str(lake.root), "resume", "--redo"]) == 2
    assert "nothing to redo" in capsys.readouterr().err
    assert lake.steps("train_metrics") == list(range(stop + 1)) and halted(lake) == record
    # resumed: trains on, the patience counted from the stop (not from the best step, long past)
    assert main(["--lake", str(lake.root), "resume"]) == 0
    assert lake.read_json(PATIENCE_FILE) == {"from": stop} and halted(lake) is None
    assert main(["--lake", str(lake.root), *TRAIN]) == 0
    capsys.readouterr()
    scores = means(lake)
    again = first_stall(scores, stop, 2)
    last = again if again is not None else STEPS - 1
    assert lake.steps("train_metrics") == list(range(last + 1))
    assert (halted(lake) or {}).get("step") == again and last >= stop + 2
    # a rewind to before the stop undoes the resume's count
    assert main(["--lake", str(lake.root), "rewind", "--to", str(stop)]) == 0
    assert lake.read_json(PATIENCE_FILE) is None and halted(lake) is None


def test_patience_is_refused_where_nothing_is_evaluated(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    lake = Lake(tmp_path / "lake")
    assert (
        main(["--lake", str(lake.root), "pool", "create", "synthetic", "--name", "mini", "--envs", "2"]) == 0
    )
    capsys.readouterr()
    train = ["train", "--pool", "mini", "--policy", "simulated", "--steps", "1", "--eval-patience", "2"]
    assert main(["--lake", str(lake.root), *train]) == 2
    assert "eval_patience" in capsys.readouterr().err and load_run(lake) is None
