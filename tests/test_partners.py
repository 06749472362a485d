"""A run that names the runs its report compares with (`envsched train --against`, ExternalRun's
``against``): the report at the run's end, `envsched report` and `run_report` compare with them
without being told again, and the sensor reports again when a partner completes later. Real lakes,
the simulated learner, a real Dagster instance."""

import json
from dataclasses import replace
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from envs.registry import load_synthetic
from envsched_pipeline.analysis.seeds import mark
from envsched_pipeline.api import ExternalRun
from envsched_pipeline.cli import main
from envsched_pipeline.core.loop import status
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.definitions import defs
from envsched_pipeline.errors import ConfigError
from envsched_pipeline.lake import LATEST_REPORT, Lake
from envsched_pipeline.orchestration.sensors import training_loop_sensor
from envsched_pipeline.run import RunSpec, load_run, start_run
from tests.conftest import SMALL, run_steps
from tests.test_dagster import resources

TRAIN = ["train", "--pool", "synthetic", "--policy", "simulated", "--batch-size", "8", "--group-size", "4"]


def pool_lake(root: Path) -> Lake:
    lake = Lake(root)
    import_pool(lake, load_synthetic("synthetic", **SMALL))
    return lake


def step_mean(lake: Lake, key: str) -> float:
    return float(np.mean([r[key] for r in lake.sql("select * from step_summary").to_pylist()]))


def test_a_run_compares_itself_with_the_runs_it_names_at_its_end(small_pool, dagster_home, tmp_path, capsys):
    mine, rand, later = small_pool, pool_lake(tmp_path / "random"), tmp_path / "later"
    assert (
        main(["--lake", str(rand.root), *TRAIN, "--seed", "3", "--scheduler", "random", "--steps", "3"]) == 0
    )
    capsys.readouterr()
    # named before it starts: `later` holds no run yet
    argv = [*TRAIN, "--seed", "3", "--steps", "3", "--against", str(rand.root), "--against", str(later)]
    assert main(["--lake", str(mine.root), *argv]) == 0
    out = capsys.readouterr().out
    assert load_run(mine).against == [str(rand.root), str(later)]
    index = mine.local / LATEST_REPORT / "index.html"
    summary = json.loads((index.parent / "summary.json").read_text())
    assert [a["lake"] for a in summary["against"]] == [str(rand.root)]
    assert summary["not_compared"] == [f"{later} holds no run yet"]
    assert f"Not compared yet: {later} holds no run yet." in summary["baselines"]["note"]
    # this run's per-step means against random's own, from the two lakes' step tables
    bv = next(v for v in summary["verdicts"] if v["metric"] == "Batch reward variance")
    assert bv["baseline"] == "random"
    assert bv["run"] == pytest.approx(step_mean(mine, "batch_variance"))
    assert bv["base"] == pytest.approx(step_mean(rand, "batch_variance"))
    for v in summary["verdicts"]:
        assert f"  {mark(v['better'])} {v['text']}" in out
    assert f"  not compared yet: {later} holds no run yet" in out and f"report: {index}" in out
    assert main(["--lake", str(mine.root), "status"]) == 0
    status = capsys.readouterr().out
    assert f"  compared with: {rand.root} (random, 3 of 3 steps, complete)\n" in status
    assert f"  compared with: {later} (no run there yet)\n" in status
    # the partner runs later: `envsched report` without --against compares with both
    pool_lake(later)
    assert main(["--lake", str(later), *TRAIN, "--seed", "3", "--scheduler", "mopps", "--steps", "2"]) == 0
    capsys.readouterr()
    assert main(["--lake", str(mine.root), "report", "--out", str(tmp_path / "rep")]) == 0
    again = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert [a["lake"] for a in again["against"]] == [str(rand.root), str(later)] and not again["not_compared"]
    assert {v["baseline"] for v in again["verdicts"]} == {"random", "mopps"}
    capsys.readouterr()
    assert main(["runs", str(tmp_path), "--json"]) == 0
    rows = {r["lake"]: r for r in json.loads(capsys.readouterr().out)["runs"]}
    assert (
        rows[str(mine.root)]["against"] == [str(rand.root), str(later)]
        and rows[str(rand.root)]["against"] == []
    )
    # resumed with `--against none`: compared with nothing, the usual closing line
    assert main(["--lake", str(mine.root), "train", "--steps", "4", "--against", "none"]) == 0
    assert load_run(mine).against == [] and "envsched report --out DIR" in capsys.readouterr().out


def test_a_named_run_that_cannot_be_compared_is_refused_before_anything_is_written(
    small_pool, dagster_home, tmp_path, capsys
):
    mine, other = small_pool, pool_lake(tmp_path / "other")
    assert (
        main(
            ["--lake", str(other.root), *TRAIN[:5], "--batch-size", "4", "--group-size", "4", "--steps", "1"]
        )
        == 0
    )
    capsys.readouterr()
    cases = [
        (
            [*TRAIN, "--steps", "2", "--against", str(other.root)],
            "its run's batch_size is 4, this run's is 8",
        ),
        ([*TRAIN, "--steps", "2", "--against", str(mine.root)], "that is this run's own lake"),
        (
            [*TRAIN, "--steps", "2", "--against", "none", "--against", " "],
            "run.against[0]: expected a lake's path",
        ),
    ]
    for argv, why in cases:
        assert main(["--lake", str(mine.root), *argv]) == 2
        err = capsys.readouterr().err
        assert why in err and (why.startswith("run.") or f"against[0] {argv[-1]}: " in err)
        assert load_run(mine) is None and not mine.steps("manifests")
    # a resumed run too: its run.json stays as it was
    assert main(["--lake", str(mine.root), *TRAIN, "--steps", "1"]) == 0
    before = (mine.root / "run.json").read_text()
    assert main(["--lake", str(mine.root), "train", "--steps", "2", "--against", str(other.root)]) == 2
    assert "batch_size is 4" in capsys.readouterr().err and (mine.root / "run.json").read_text() == before
    # your own trainer's run (ExternalRun) checks the runs it names the same way
    ext = pool_lake(tmp_path / "ext")
    with pytest.raises(
        ConfigError, match=r"against\[0\] .*other: its run's policy is 'simulated', this run's is 'external'"
    ):
        ExternalRun(pool="synthetic", lake=ext, batch_size=8, group_size=4, against=[str(other.root)])
    assert load_run(ext) is None
    run = ExternalRun(
        pool="synthetic", lake=ext, batch_size=8, group_size=4, against=[str(tmp_path / "theirs")]
    )
    assert load_run(ext).against == [str(tmp_path / "theirs")] == run.spec.against


def test_the_sensor_reports_again_when_a_named_partner_completes_later(small_run, tmp_path):
    partner = pool_lake(tmp_path / "partner")
    start_run(
        partner, RunSpec(pool="synthetic", scheduler="mopps", seed=1, batch_size=8, group_size=4, max_steps=3)
    )
    run_steps(partner, 1)  # under way when this run completes
    mine = small_run
    start_run(mine, replace(load_run(mine), against=[str(partner.root)]))
    run_steps(mine, 3)
    rid = load_run(mine).run_id

    def report(instance, req) -> dict:
        res = defs.resolve_job_def("report_job").execute_in_process(
            instance=instance, resources=resources(mine), tags=req.tags
        )
        assert res.success
        (mat,) = res.get_asset_materialization_events()
        meta = mat.materialization.metadata
        summary = json.loads((Path(meta["report"].value).parent / "summary.json").read_text())
        # the UI names the runs not compared yet beside the verdicts
        shown = meta["not_compared_yet"].value if "not_compared_yet" in meta else ""
        assert shown == "\n".join(f"- {w}" for w in summary["not_compared"])
        return summary

    with dg.instance_for_test() as instance:
        r = training_loop_sensor(dg.build_sensor_context(instance=instance, resources=resources(mine)))
        (req,) = r.run_requests
        assert req.run_key == f"{rid}-report-2-r0-vs-open"
        summary = report(instance, req)
        assert [a["lake"] for a in summary["against"]] == [str(partner.root)]
        bv = next(v for v in summary["verdicts"] if v["metric"] == "Batch reward variance")
        # over the one step the partner holds so far
        first = mine.sql("select batch_variance from step_summary where step = 0").to_pylist()[0]
        assert bv["run"] == pytest.approx(first["batch_variance"]) and bv["better"] is None
        assert "over 1 step (an interval needs two or more): no clear difference from mopps" in bv["text"]
        again = training_loop_sensor(
            dg.build_sensor_context(instance=instance, resources=resources(mine), cursor=r.cursor)
        )
        assert isinstance(again, dg.SkipReason)
        # a named lake damaged meanwhile: named on the report and by the status, never their end
        (broken := tmp_path / "broken").mkdir()
        (broken / "run.json").write_text("[1, 2]")
        start_run(mine, replace(load_run(mine), against=[str(partner.root), str(broken)]))
        r = training_loop_sensor(
            dg.build_sensor_context(instance=instance, resources=resources(mine), cursor=r.cursor)
        )
        (req,) = r.run_requests
        assert req.run_key == f"{rid}-report-2-r0-vs-open.open"
        summary = report(instance, req)
        assert [a["lake"] for a in summary["against"]] == [str(partner.root)]
        assert summary["not_compared"] == [
            f"{broken} cannot be read ({broken / 'run.json'}: expected a JSON object)"
        ]
        (bad,) = [p for p in status(mine)["against"] if p["lake"] == str(broken)]
        assert bad["state"] == "unreadable" and "expected a JSON object" in bad["problem"]
        start_run(mine, replace(load_run(mine), against=[str(partner.root)]))
        run_steps(partner, [1, 2])  # the partner completes: the report is asked for again
        r = training_loop_sensor(
            dg.build_sensor_context(instance=instance, resources=resources(mine), cursor=r.cursor)
        )
        (req,) = r.run_requests
        assert req.run_key == f"{rid}-report-2-r0-vs-2"
        summary = report(instance, req)
        bv = next(v for v in summary["verdicts"] if v["metric"] == "Batch reward variance")
        assert bv["run"] == pytest.approx(step_mean(mine, "batch_variance"))
        assert bv["base"] == pytest.approx(step_mean(partner, "batch_variance"))
