"""Bring your own trainer: the Python API, the CLI step protocol, and the Dagster loop in external mode."""

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import dagster as dg
import pytest

from envsched_pipeline.api import ExternalRun
from envsched_pipeline.cli import main
from envsched_pipeline.errors import StepError
from envsched_pipeline.lake import Lake
from envsched_pipeline.run import OPEN_ENDED_STEPS, load_run, steps_of


def reward_of(step, task_id, rollout):
    """Deterministic fake trainer: the same rewards for both protocols."""
    h = zlib.crc32(f"{task_id}|{rollout}|{step // 2}".encode()) % 3
    return [0.0, 0.5, 1.0][h]


def rollouts_for(step, picks, g=4):
    return [
        {"task_id": p["task_id"], "rollout": r, "reward": reward_of(step, p["task_id"], r), "tokens": 10}
        for p in picks
        for r in range(g)
    ]


def cli(lake, *args, capsys):
    code = main(["--lake", str(lake), *args])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.fixture
def two_lakes(tmp_path, capsys):
    a, b = tmp_path / "api", tmp_path / "cli"
    for lake in (a, b):
        code, _, err = cli(
            lake,
            "pool",
            "create",
            "synthetic",
            "--name",
            "mini",
            "--envs",
            "5",
            "--tasks-per-env",
            "8",
            "--seed",
            "2",
            capsys=capsys,
        )
        assert code == 0, err
    return a, b


def test_cli_protocol_matches_python_api(two_lakes, tmp_path, capsys):
    a, b = two_lakes
    api = ExternalRun(pool="mini", lake=str(a), seed=7, batch_size=6, group_size=4)
    api_manifests = []
    for t in range(5):
        batch = api.manifest(t)
        api_manifests.append([(p["task_id"], p["half"], round(p["score"], 9)) for p in batch])
        api.observe(t, rollouts_for(t, batch))
    cli_manifests = []
    for t in range(5):
        code, out, err = cli(
            b,
            "step",
            "select",
            "--pool",
            "mini",
            "--step",
            str(t),
            "--seed",
            "7",
            "--batch-size",
            "6",
            "--group-size",
            "4",
            capsys=capsys,
        )
        assert code == 0, err
        picks = [json.loads(line) for line in out.splitlines()]
        cli_manifests.append([(p["task_id"], p["half"], round(p["score"], 9)) for p in picks])
        f = tmp_path / f"r{t}.jsonl"
        f.write_text("\n".join(json.dumps(r) for r in rollouts_for(t, picks)))
        code, out, err = cli(
            b, "step", "ingest", "--pool", "mini", "--step", str(t), "--rollouts", str(f), capsys=capsys
        )
        assert code == 0, err
    assert api_manifests == cli_manifests
    assert {h for m in api_manifests[1:] for _, h, _ in m} <= {"coverage", "exploit"}
    code, out, _ = cli(b, "step", "status", "--pool", "mini", capsys=capsys)
    assert json.loads(out)["last_selected"] == 4 and json.loads(out)["last_ingested"] == 4
    assert cli(b, "step", "status", capsys=capsys)[1] == out  # --pool only checks; the run names it
    assert cli(b, "step", "status", "--pool", "other", capsys=capsys)[0] == 2
    # re-selecting an existing step returns the stored manifest unchanged
    before = Lake(b).read("manifests", step=2).to_pylist()
    cli(b, "step", "select", "--pool", "mini", "--step", "2", capsys=capsys)
    assert Lake(b).read("manifests", step=2).to_pylist() == before


def test_restarted_trainer_continues(two_lakes):
    a, _ = two_lakes
    s1 = ExternalRun(pool="mini", lake=str(a), seed=1, batch_size=6, group_size=4)
    for t in range(2):
        s1.observe(t, rollouts_for(t, s1.manifest(t)))
    s2 = ExternalRun(pool="mini", lake=str(a), seed=1, batch_size=6, group_size=4)
    assert s2.next_step == 2
    picks = s2.manifest()
    assert len(picks) == 6
    # why step 2's batch is what it is, recomputed from the restarted run's lake
    why = s2.explain(2, picks[0]["task_id"])
    assert why["reproduced"] and why["task"]["picked"] and why["task"]["reason"] == picks[0]["reason"]


def test_an_external_run_rewinds_and_chooses_the_same_batches_again(two_lakes):
    """`ExternalRun.rewind(1)`: steps 1 and later move to archive/, the run goes on at step 1, and
    the same rollouts give the same manifests as the first time."""
    a, _ = two_lakes
    run = ExternalRun(pool="mini", lake=str(a), seed=1, batch_size=6, group_size=4)
    first = []
    for t in range(3):
        picks = run.manifest(t)
        first.append([p["task_id"] for p in picks])
        run.observe(t, rollouts_for(t, picks))
    moved = run.rewind(1)
    assert moved["moved"]["rollouts"] == [1, 2] and run.next_step == 1
    for t in (1, 2):
        picks = run.manifest(t)
        assert [p["task_id"] for p in picks] == first[t]
        run.observe(t, rollouts_for(t, picks))
    with pytest.raises(StepError, match="the run holds steps 0..2"):
        run.rewind(5)


@pytest.mark.parametrize(
    "bad,match",
    [
        ('{"task_id": "NOPE", "rollout": 0, "reward": 0.5}', "line 1: task 'NOPE' is not in manifest 0"),
        (
            '{"task_id": "@T", "rollout": 0, "reward": 1.5}',
            "line 1: reward 1.5 is not a finite number in \\[0, 1\\]",
        ),
        ('{"task_id": "@T", "rollout": 0, "reward": NaN}', "line 1: reward nan is not a finite"),
        (
            '{"task_id": "@T", "rollout": 0, "reward": 0.5}\n{"task_id": "@T", "rollout": 0, "reward": 0.5}',
            "line 2: duplicate rollout",
        ),
        ('{"task_id": "@T", "rollout": 0, "reward": 0.5}\n{"task_id": "@T", "rollo', "line 2: invalid JSON"),
        ('{"task_id": "@T", "reward": 0.5}', "line 1: missing field\\(s\\) rollout"),
        ("", "no rollouts given"),
        (b'{"task_id": "x", "rollout": 0, "reward": 0.5}\n{"task_id": "\xe9"}', "line 2: not UTF-8 text"),
    ],
)
def test_ingest_refusals_name_the_line_and_write_nothing(two_lakes, tmp_path, capsys, bad, match):
    _, b = two_lakes
    code, out, _ = cli(
        b, "step", "select", "--pool", "mini", "--step", "0", "--batch-size", "6", capsys=capsys
    )
    task = json.loads(out.splitlines()[0])["task_id"]
    f = tmp_path / "bad.jsonl"
    f.write_bytes(bad) if isinstance(bad, bytes) else f.write_text(bad.replace("@T", task))
    code, _, err = cli(
        b, "step", "ingest", "--pool", "mini", "--step", "0", "--rollouts", str(f), capsys=capsys
    )
    assert code == 2
    import re

    assert re.search(match, err), err
    assert str(f) in err
    assert not Lake(b).has("rollouts", step=0)


def test_select_refuses_when_previous_step_not_ingested(two_lakes, capsys):
    _, b = two_lakes
    cli(b, "step", "select", "--pool", "mini", "--step", "0", capsys=capsys)
    code, _, err = cli(b, "step", "select", "--pool", "mini", "--step", "1", capsys=capsys)
    assert code == 2 and "cannot select step 1: rollouts of step 0 are missing" in err


def test_parquet_ingest(two_lakes, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    a, _ = two_lakes
    s = ExternalRun(pool="mini", lake=str(a), batch_size=6, group_size=4)
    rows = rollouts_for(0, s.manifest(0))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "r.parquet")
    from envsched_pipeline.core.ingest import ingest_rollouts

    m = ingest_rollouts(s.lake, 0, str(tmp_path / "r.parquet"))
    assert m["rollouts"] == 24
    with pytest.raises(StepError, match="r.parquet row 0"):
        pq.write_table(pa.Table.from_pylist([{**rows[0], "reward": -1.0}]), tmp_path / "r.parquet")
        ingest_rollouts(s.lake, 0, str(tmp_path / "r.parquet"))


def test_the_api_takes_rollouts_as_records_tables_or_a_file_and_refuses_anything_else(two_lakes, tmp_path):
    import numpy as np
    import polars as pl
    import pyarrow as pa

    a, cli_lake = two_lakes
    run = ExternalRun(pool="mini", lake=a, batch_size=6, group_size=4)
    path = tmp_path / "r.jsonl"
    give = {
        0: lambda rows: pa.Table.from_pylist(rows),
        1: lambda rows: pl.DataFrame(rows),
        2: lambda rows: (path.write_text("\n".join(json.dumps(r) for r in rows)), path)[1],
        3: lambda rows: iter(rows),
    }
    for step, as_given in give.items():
        rows = rollouts_for(step, run.manifest(np.int64(step)))
        assert run.observe(step, as_given(rows))["rollouts"] == 24
        got = Lake(a).sql(f"select task_id, rollout, reward from rollouts where step = {step}").to_pylist()
        assert sorted((r["task_id"], r["rollout"], r["reward"]) for r in got) == sorted(
            (r["task_id"], r["rollout"], r["reward"]) for r in rows
        )
    task = run.manifest(4)[0]["task_id"]
    endless = ({"task_id": task, "rollout": k, "reward": 0.5} for k in range(10**9))
    for given, says in (
        (
            {"task_id": task, "rollout": 0, "reward": 1.0},
            "step 4: expected the rollouts as records.*got one mapping",
        ),
        (None, "step 4: expected the rollouts as records.*got NoneType"),
        (7, "got int"),
        (["abc"], "step 4 record 0: expected a mapping with task_id, rollout, reward, got 'abc'"),
        (endless, "step 4: more than 24 rollouts"),
    ):
        with pytest.raises(StepError, match=says):
            run.observe(4, given)
        assert not Lake(a).has("rollouts", step=4)
    for bad in ("4", 4.0, True):
        with pytest.raises(StepError, match=f"step must be an integer, got {type(bad).__name__}"):
            run.manifest(bad)
    # the run compared with one lake named alone (it was read as one lake per character), or
    # with lakes given as a Path or a Lake: each named by its root
    b = ExternalRun(pool="mini", lake=cli_lake, batch_size=6, group_size=4, against=str(a))
    assert b.spec.against == [str(Lake(a).root)]
    b = ExternalRun(lake=cli_lake, against=[a, Lake(tmp_path / "later")])
    assert b.spec.against == [str(Lake(a).root), str(Lake(tmp_path / "later").root)]


def test_dagster_loop_with_external_trainer(two_lakes):
    """With the trainer resource external, the sensor launches nothing and waits for ingested
    rollouts, then materializes statistics and the next manifest."""
    from envsched_pipeline.assets import training
    from envsched_pipeline.core.ingest import ingest_rollouts
    from envsched_pipeline.core.select import select_manifest
    from envsched_pipeline.orchestration.sensors import training_loop_sensor
    from envsched_pipeline.resources.lake import LakeResource
    from envsched_pipeline.resources.trainer import TrainerLauncher

    a, _ = two_lakes
    s = ExternalRun(pool="mini", lake=str(a), batch_size=6, group_size=4)
    lake = s.lake
    res = {"lake": LakeResource(root=str(lake.root)), "trainer": TrainerLauncher(mode="external")}
    with dg.instance_for_test() as inst:
        select_manifest(lake, 0)
        r = training_loop_sensor(dg.build_sensor_context(instance=inst, resources=res))
        assert isinstance(r, dg.SkipReason) and "waiting for the external trainer" in r.skip_message
        ingest_rollouts(lake, 0, rollouts_for(0, lake.read("manifests", step=0).to_pylist()))
        r = training_loop_sensor(dg.build_sensor_context(instance=inst, resources=res))
        req = r.run_requests[0]
        key = f"{s.spec.run_id}-0"
        assert req.job_name == "train_job" and req.partition_key == key
        inst.add_dynamic_partitions("training_steps", [key])
        out = dg.materialize(
            [training.training_step, training.reward_statistics],
            partition_key=key,
            instance=inst,
            resources=res,
        )
        assert out.success
        md = {
            m.asset_key.to_user_string(): m.materialization.metadata
            for m in out.get_asset_materialization_events()
        }
        assert md["training_step"]["trainer"].value == "external"
        assert lake.has("statistics", step=0)
        r = training_loop_sensor(dg.build_sensor_context(instance=inst, resources=res))
        assert (
            r.run_requests[0].job_name == "select_job"
            and r.run_requests[0].partition_key == f"{s.spec.run_id}-1"
        )


def test_external_run_takes_a_named_variant_under_explicit_overrides(two_lakes):
    from envsched_pipeline.errors import ConfigError

    a, _ = two_lakes
    with pytest.raises(ConfigError, match="unknown scheduler 'envsched@nope'"):
        ExternalRun(pool="mini", lake=str(a), scheduler="envsched@nope", batch_size=6, group_size=4)
    assert not Lake(a).has("manifests")
    s = ExternalRun(
        pool="mini", lake=str(a), scheduler="envsched@success+covscore", batch_size=6, group_size=4, rho=1.0
    )
    assert s.spec.scheduler == "envsched"
    assert s.spec.scheduler_config == {"target": "success", "coverage_pick": "score", "rho": 1.0}
    for t in range(2):
        picks = s.manifest(t)
        s.observe(t, rollouts_for(t, picks))
    assert {p["half"] for p in s.manifest(2)} == {"coverage"}  # rho = 1 (yours) over the variant's 0.5


def test_a_new_run_gets_the_recommended_form_and_envsched_alone_the_papers_constants(two_lakes, capsys):
    a, b = two_lakes
    s = ExternalRun(pool="mini", lake=str(a), batch_size=6, group_size=4)
    assert (s.spec.scheduler, s.spec.scheduler_config) == (
        "envsched",
        {"target": "success", "adaptive_rho": True, "coverage_pick": "sampled", "spread_model": "logistic"},
    )
    picks = s.manifest(0)
    s.observe(0, rollouts_for(0, picks))
    assert ExternalRun(lake=str(a)).spec.scheduler_config == s.spec.scheduler_config  # resumed: its own
    sizes = ["--batch-size", "6", "--group-size", "4"]
    code, _, err = cli(
        b, "step", "select", "--pool", "mini", "--step", "0", "--scheduler", "envsched", *sizes, capsys=capsys
    )
    assert code == 0, err
    spec = load_run(Lake(b))
    assert (spec.scheduler, spec.scheduler_config) == ("envsched", {})


def test_cli_protocol_takes_named_variants_and_keeps_the_runs_own_config(two_lakes, tmp_path, capsys):
    """`step select --scheduler` takes a named variant as `envsched train` and the API do; a plain
    `step select` resumes a run started with a variant under that variant's config (it neither
    drops it before the first manifest nor refuses the run after it); a bad name writes nothing."""
    a, b = two_lakes
    sel = ("step", "select", "--pool", "mini", "--batch-size", "6", "--group-size", "4")
    code, _, err = cli(b, *sel, "--step", "0", "--scheduler", "envsched@nope", capsys=capsys)
    assert code == 2 and "--scheduler: unknown scheduler 'envsched@nope'" in err
    assert not Lake(b).has("manifests") and Lake(b).read_json("run.json") is None
    code, _, err = cli(b, *sel, "--step", "0", "--scheduler", "envsched@success+covscore", capsys=capsys)
    assert code == 0, err
    variant = {"target": "success", "coverage_pick": "score"}
    assert Lake(b).read_json("run.json")["scheduler_config"] == variant
    # the API starts a run with a variant (run.json written, no manifest yet); the CLI drives it
    ExternalRun(pool="mini", lake=str(a), scheduler="envsched@success+covscore", batch_size=6, group_size=4)
    for t in range(3):
        code, out, err = cli(a, "step", "select", "--pool", "mini", "--step", str(t), capsys=capsys)
        assert code == 0, err
        assert Lake(a).read_json("run.json")["scheduler_config"] == variant
        picks = [json.loads(line) for line in out.splitlines()]
        f = tmp_path / f"r{t}.jsonl"
        f.write_text("\n".join(json.dumps(r) for r in rollouts_for(t, picks)))
        assert (
            cli(a, "step", "ingest", "--pool", "mini", "--step", str(t), "--rollouts", str(f), capsys=capsys)[
                0
            ]
            == 0
        )
    # asking for another variant of a run under way is refused, naming both configs
    code, _, err = cli(
        a, "step", "select", "--pool", "mini", "--step", "3", "--scheduler", "envsched", capsys=capsys
    )
    assert code == 2 and "the run was started with scheduler_config=" in err
    assert not Lake(a).has("manifests", step=3)


def test_a_restarted_trainer_passes_only_the_lake(two_lakes):
    """ExternalRun(lake=...) resumes the lake's run with its own pool, scheduler variant, seed, B and
    G; a setting that changes it is refused naming it; a bad override is refused before anything is
    written (before, the defaults stood in for settings left out, and an unknown override was
    written into run.json)."""
    from envsched_pipeline.errors import ConfigError

    a, b = two_lakes
    with pytest.raises(ConfigError, match="unknown scheduler config field"):
        ExternalRun(pool="mini", lake=str(b), bogus=1)
    assert Lake(b).read_json("run.json") is None
    first = ExternalRun(
        pool="mini", lake=str(a), scheduler="envsched@success+covscore", seed=3, batch_size=6, group_size=4
    )
    for t in range(2):
        first.observe(t, rollouts_for(t, first.manifest(t)))
    again = ExternalRun(lake=str(a))
    assert again.spec == first.spec and again.next_step == 2
    assert again.spec.scheduler_config == {"target": "success", "coverage_pick": "score"}
    again.observe(2, rollouts_for(2, again.manifest(2)))
    with pytest.raises(StepError, match="seed: lake has 3, asked 4"):
        ExternalRun(lake=str(a), seed=4)
    with pytest.raises(StepError, match="scheduler_config"):
        ExternalRun(lake=str(a), rho=0.25)  # an override changes the run's config: refused


def test_an_external_trainer_records_its_evaluations(two_lakes, tmp_path, capsys):
    """Your trainer's held-out scores (or any benchmark's) go into the lake beside the schedule:
    the step table's held-out columns, the trackers' and the report's numbers; bad entries are
    named and nothing is written."""
    from envsched_pipeline.core.loop import step_summary  # what `envsched train` prints
    from envsched_pipeline.trackers import step_metrics  # what the trackers are sent

    a, b = two_lakes
    run = ExternalRun(pool="mini", lake=str(a), seed=1, batch_size=6, group_size=4)
    run.observe(0, rollouts_for(0, run.manifest(0)))
    assert run.log_eval(0, {"heldout_seen": 0.61, "bfcl_v3": {"score": 0.318, "se": 0.004}})
    run.log_eval(0, {"heldout_seen": 0.625, "heldout_unseen": 0.5})  # heldout_seen replaced, bfcl kept
    got = {r["benchmark"]: (r["score"], r["se"]) for r in run.lake.read("evals", step=0).to_pylist()}
    assert got == {"heldout_seen": (0.625, None), "heldout_unseen": (0.5, None), "bfcl_v3": (0.318, 0.004)}
    row = step_summary(run.lake)[0]
    assert (row["heldout_seen"], row["heldout_unseen"]) == (0.625, 0.5)
    assert step_metrics(run.lake, 0)["eval/bfcl_v3"] == 0.318
    for bad, match in (
        ({"x": "0.5"}, "x: score '0.5' is not a finite number"),
        ({"x": {"score": 0.5, "se": -1}}, "se -1 is not a finite number >= 0"),
        ({"x": {"score": 0.5, "stderr": 0.1}}, "unknown field"),
        ({"": 0.5}, "benchmark name '' must be a non-empty string"),
        ({"y": 0.1, "x": float("nan")}, "x: score nan"),
    ):
        with pytest.raises(StepError, match=match):
            run.log_eval(0, bad)
    assert len(run.lake.read("evals", step=0).to_pylist()) == 3  # nothing written by a refusal
    with pytest.raises(StepError, match="step 1 has no ingested rollouts"):
        run.log_eval(1, {"heldout_seen": 0.5})
    # the CLI protocol: inline or from a file
    code, out, err = cli(
        b,
        "step",
        "select",
        "--pool",
        "mini",
        "--step",
        "0",
        "--batch-size",
        "6",
        "--group-size",
        "4",
        capsys=capsys,
    )
    f = tmp_path / "r0.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rollouts_for(0, [json.loads(x) for x in out.splitlines()])))
    assert (
        cli(b, "step", "ingest", "--pool", "mini", "--step", "0", "--rollouts", str(f), capsys=capsys)[0] == 0
    )
    scores = tmp_path / "scores.json"
    scores.write_text(json.dumps({"heldout_unseen": {"score": 0.4, "se": 0.01}}))
    code, out, err = cli(
        b, "step", "eval", "--pool", "mini", "--step", "0", "--scores", f"@{scores}", capsys=capsys
    )
    assert code == 0, err
    assert json.loads(out) == [{"step": 0, "benchmark": "heldout_unseen", "score": 0.4, "se": 0.01}]
    code, _, err = cli(
        b, "step", "eval", "--pool", "mini", "--step", "0", "--scores", '{"a": true}', capsys=capsys
    )
    assert code == 2 and "a: score True is not a finite number" in err


EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_the_custom_loop_example_runs_and_its_run_reads_as_open_ended(tmp_path, capsys):
    lake = tmp_path / "example"
    env = {**os.environ, "PYTHONPATH": str(EXAMPLES.parent)}
    got = subprocess.run(
        [sys.executable, str(EXAMPLES / "custom_loop.py"), "--lake", str(lake), "--steps", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert got.returncode == 0, got.stderr
    assert [line.split(":")[0] for line in got.stdout.splitlines()] == ["step 0", "step 1"]
    assert Lake(lake).steps("statistics") == [0, 1]
    # its trainer decides when it ends: no made-up end in what a person reads
    code, out, err = cli(lake, "status", capsys=capsys)
    assert code == 0, err
    assert "steps done: 2, open-ended (last selected 1" in out and "1000000" not in out
    code, out, err = cli(lake, "runs", str(lake), capsys=capsys)
    assert code == 0, err
    assert "| 2, open-ended |" in out and "1000000" not in out
    # the TRL example's arguments and imports (its training is test_trl's)
    got = subprocess.run(
        [sys.executable, str(EXAMPLES / "trl_grpo.py"), "--help"], capture_output=True, text=True, env=env
    )
    assert got.returncode == 0 and "--no-tools-in-prompt" in got.stdout, got.stderr


def test_a_run_with_an_end_reads_as_so_many_of_its_steps():
    assert steps_of(3, 200) == "3 of 200"
    assert steps_of(3, 200, "/") == "3/200"
    assert steps_of(3, 200, unit=" steps") == "3 of 200 steps"
    assert steps_of(3, OPEN_ENDED_STEPS, unit=" steps") == "3 steps, open-ended"
