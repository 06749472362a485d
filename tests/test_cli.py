"""The envsched CLI end to end (the in-process Dagster loop on a real instance in a temp DAGSTER_HOME)."""

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys

import pyarrow as pa
import pytest

from envsched_pipeline.cli import build_parser, main
from envsched_pipeline.cli.sql import TABLE_ROWS, print_table
from envsched_pipeline.cli.train import requested_run
from envsched_pipeline.errors import ConfigError
from envsched_pipeline.run import RunSpec
from envsched_pipeline.scheduler.variants import RECOMMENDED


def envsched(*args, lake=None):
    cmd = (
        [sys.executable, "-m", "envsched_pipeline.cli"] + (["--lake", str(lake)] if lake else []) + list(args)
    )
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def test_train_resumes_without_duplicates(small_pool, dagster_home):
    lake = small_pool
    common = [
        "train",
        "--pool",
        "synthetic",
        "--policy",
        "simulated",
        "--batch-size",
        "8",
        "--group-size",
        "4",
        "--scheduler",
        "random",
        "--seed",
        "5",
    ]
    p = envsched(*common, "--steps", "3", lake=lake.root)
    assert p.returncode == 0, p.stderr
    assert "batch_var" in p.stdout and "SIMULATED" in p.stdout
    p = envsched(*common, "--steps", "4", lake=lake.root)
    assert p.returncode == 0, p.stderr
    p = envsched("train", "--steps", "5", lake=lake.root)  # no flags: the run's own settings
    assert p.returncode == 0, p.stderr
    assert "scheduler=random B=8 G=4" in p.stdout
    p = envsched("train", "--steps", "2", lake=lake.root)  # fewer than it holds: said, not "continuing"
    assert p.returncode == 0 and "the lake holds steps 0..4 (mean batch variance" in p.stdout
    assert "as many as --steps 2 asks for or more: nothing to do" in p.stdout and "continuing" not in p.stdout
    p = envsched("train", "--steps", "6", "--seed", "6", lake=lake.root)  # a changed setting: refused
    assert p.returncode == 2 and "seed: lake has 5, asked 6" in p.stderr
    q = envsched(
        "sql",
        "select count(*) as n, count(distinct (step, task_id, rollout)) as d, "
        "count(distinct step) as s from rollouts",
        "--format",
        "json",
        lake=lake.root,
    )
    assert json.loads(q.stdout) == {"n": 5 * 8 * 4, "d": 5 * 8 * 4, "s": 5}
    # the runs are on the Dagster instance, so they appear in the UI afterwards
    import dagster as dg

    with dg.DagsterInstance.from_config(str(dagster_home)) as inst:
        assert len(inst.get_run_records()) >= 10


def test_sql_streams_large_results_and_shows_the_first_rows_as_a_table(small_pool, capsys):
    """A result is read in batches as it is printed (`select * from rollouts` on a long run never
    sits in memory whole); the aligned table shows the first TABLE_ROWS and counts every row, CSV and
    JSON print them all, and an empty result still names its columns."""
    lake = small_pool
    assert [b.num_rows for b in lake.sql_batches("select * from range(25) t(k)", rows=10)] == [10, 10, 5]
    sql = ["--lake", str(lake.root), "sql"]
    n = TABLE_ROWS + 7
    assert main([*sql, f"select k, k * 2 as twice from range({n}) t(k)"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["k", "|", "twice"] and len(lines) == 2 + TABLE_ROWS + 1
    assert lines[-2].split() == [str(TABLE_ROWS - 1), "|", str(2 * (TABLE_ROWS - 1))]
    assert lines[-1] == f"({n} rows; the first {TABLE_ROWS} shown: `--format csv` or `json` prints them all)"
    assert main([*sql, f"select k from range({n}) t(k)", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines() == ["k", *map(str, range(n))]
    assert main([*sql, "select k from range(3) t(k)", "--format", "json"]) == 0
    assert capsys.readouterr().out.splitlines() == ['{"k": 0}', '{"k": 1}', '{"k": 2}']
    for fmt, expected in (("table", ["env_id", "-" * 6, "(0 rows)"]), ("csv", ["env_id"]), ("json", [])):
        assert main([*sql, "select env_id from tasks where false", "--format", fmt]) == 0
        assert [line.rstrip() for line in capsys.readouterr().out.splitlines()] == expected, fmt
    print_table(pa.table({"trace": pa.array([], pa.string())}))  # a table read whole (`bench trace --sql`)
    assert capsys.readouterr().out.splitlines() == ["trace", "-----", "(0 rows)"]


def test_sql_csv_and_errors(small_pool, capsys):
    lake = small_pool
    assert (
        main(
            [
                "--lake",
                str(lake.root),
                "sql",
                "select env_id, count(*) as n from tasks group by 1 order by 1",
                "--format",
                "csv",
            ]
        )
        == 0
    )
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows[0] == ["env_id", "n"] and len(rows) == 7
    assert main(["--lake", str(lake.root), "sql", "select nope from tasks"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("envsched: error: SQL error: Binder Error:") and '"nope"' in err, err
    assert "Candidate bindings:" in err and "\n" not in err, err  # DuckDB's hint, on the same line
    assert main(["--lake", str(lake.root), "sql", "select * from task"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith('does not exist! Did you mean "tasks"?') and "\n" not in err, err
    assert main(["--lake", str(lake.root), "sql", "select *\nfrom tasks where"]) == 2
    err = capsys.readouterr().err.strip()  # where a syntax error is: line, column, the text there
    assert err.endswith("(line 2, column 12: 'where')") and "\n" not in err, err
    for empty in ("", "  ", " ; "):  # printed an empty table, exit 0
        assert main(["--lake", str(lake.root), "sql", empty]) == 2
        assert "the query is empty" in capsys.readouterr().err


def test_pool_list(small_pool, capsys):
    assert main(["--lake", str(small_pool.root), "pool", "list"]) == 0
    out = capsys.readouterr().out
    assert "synthetic" in out and "yes" in out


def test_max_steps_leaves_the_rest_to_the_sensor(small_pool, dagster_home):
    from envsched_pipeline.core.loop import next_action
    from envsched_pipeline.run import load_run

    p = envsched(
        "train",
        "--batch-size",
        "8",
        "--group-size",
        "4",
        "--steps",
        "1",
        "--max-steps",
        "5",
        lake=small_pool.root,
    )
    assert p.returncode == 0, p.stderr
    assert load_run(small_pool).max_steps == 5 and next_action(small_pool) == ("select", 1)


def test_train_runs_a_named_bench_variant_with_extra_overrides(small_pool, dagster_home, capsys, tmp_path):
    from envsched_pipeline.run import load_run

    lake = small_pool
    base = [
        "--lake",
        str(lake.root),
        "train",
        "--policy",
        "simulated",
        "--batch-size",
        "8",
        "--group-size",
        "4",
    ]
    # settings may come from a file; its errors name the file too
    (tmp_path / "rho.json").write_text('{"rho": 2}')
    (tmp_path / "cut.json").write_text('{"rho":\n')
    (tmp_path / "list.json").write_text("[0.25]")
    (tmp_path / "latin1.json").write_bytes(b'{"rho": 0.25, "note": "caf\xe9"}')
    (tmp_path / "folder.json").mkdir()
    # a bad name, bad JSON, an unknown field or a missing file stops before anything is written,
    # naming the flag
    for extra, says in (
        (["--scheduler", "envsched@nope"], "--scheduler: unknown scheduler 'envsched@nope'"),
        (["--scheduler-config", "{rho: 1"], "--scheduler-config: not JSON"),
        (["--scheduler-config", '{"rhoo": 0.2}'], "unknown scheduler config field(s): rhoo"),
        (["--scheduler-config", '{"coverage_pick": "newest"}'], "coverage_pick"),
        (
            ["--scheduler-config", f"@{tmp_path / 'rho.json'}"],
            f"--scheduler-config {tmp_path / 'rho.json'}: scheduler_config.rho: 2 must be",
        ),
        (
            ["--scheduler-config", str(tmp_path / "cut.json")],
            f"--scheduler-config {tmp_path / 'cut.json'}: not JSON (Expecting value at line 2 column 1)",
        ),
        (["--scheduler-config", str(tmp_path / "list.json")], "list.json: a JSON object of settings"),
        (["--scheduler-config", "@missing.json"], "--scheduler-config missing.json: no such file"),
        (
            ["--scheduler-config", f"@{tmp_path / 'latin1.json'}"],
            "latin1.json: not UTF-8 text (byte 26 is 0xe9)",
        ),
        (["--scheduler-config", str(tmp_path / "folder.json")], "folder.json: a folder; name a file"),
        (
            ["--scheduler-config", "@s3://bucket/rho.json"],
            "--scheduler-config: s3://bucket/rho.json is a URL",
        ),
    ):
        assert main(base + ["--steps", "1"] + extra) == 2
        assert says in capsys.readouterr().err
        assert not lake.has("manifests")
    variant = "envsched@success+adaptive+covscore"
    good = tmp_path / "overrides.json"
    good.write_text('{"rho": 0.25}')
    p = envsched(
        *base[2:],
        "--steps",
        "2",
        "--scheduler",
        variant,
        "--scheduler-config",
        f"@{good}",
        lake=lake.root,
    )
    assert p.returncode == 0, p.stderr
    spec = load_run(lake)
    assert spec.scheduler == "envsched"
    assert spec.scheduler_config == {
        "target": "success",
        "adaptive_rho": True,
        "coverage_pick": "score",
        "rho": 0.25,
    }
    q = envsched(
        "sql",
        "select half, count(*) as n from manifests where step = 1 group by 1 order by 1",
        "--format",
        "json",
        lake=lake.root,
    )
    halves = {r["half"]: r["n"] for r in map(json.loads, q.stdout.splitlines())}
    assert halves == {"coverage": 2, "exploit": 6}  # rho 0.25 of B = 8 (the adaptive share needs yields)
    p = envsched("bench", "variants")
    assert p.returncode == 0 and variant in p.stdout and '"coverage_pick": "score"' in p.stdout
    # the recommended form is a listed variant, marked on its own line, and `train --help` names it
    (marked,) = [
        line for line in p.stdout.splitlines() if line.endswith("(recommended: a new run's default)")
    ]
    assert marked.split()[0] == RECOMMENDED and '"spread_model": "logistic"' in marked
    assert RECOMMENDED in envsched("train", "--help").stdout


def test_train_flags_left_out_keep_the_resumed_runs_settings(tmp_path):
    """What `envsched train` asks for: the flags given, over the lake's run (its scheduler variant,
    policy config and pool included), over a new run's defaults when the lake holds none."""

    def asked(*flags, current=None):
        return requested_run(build_parser().parse_args(["train", *flags]), current)

    fresh = asked("--steps", "3")
    assert (fresh.pool, fresh.policy, fresh.scheduler, fresh.seed, fresh.batch_size) == (
        "synthetic",
        "simulated",
        "envsched",
        0,
        64,
    )
    # a new run: the recommended form's overrides; `--scheduler envsched` alone: the paper's constants
    assert fresh.scheduler_config == {
        "target": "success",
        "adaptive_rho": True,
        "coverage_pick": "sampled",
        "spread_model": "logistic",
    }
    assert fresh.max_steps == 3 and fresh.trainer == "subprocess"
    assert asked("--steps", "3", "--scheduler", "envsched").scheduler_config == {}
    variant = ["--scheduler", "envsched@success+covscore"]
    started = asked("--policy", "neural", "--overrun-penalty", "0.1", *variant, "--pool", "p")
    resumed = asked("--steps", "40", current=started)
    assert resumed == RunSpec(**{**started.to_dict(), "max_steps": 40})
    assert resumed.scheduler_config == started.scheduler_config != {}
    assert resumed.policy_config == {"overrun_penalty": 0.1}
    more = asked("--lr", "0.001", "--scheduler-config", '{"rho": 0.25}', current=started)
    assert more.policy_config == {"overrun_penalty": 0.1, "lr": 0.001}
    assert more.scheduler_config == {**started.scheduler_config, "rho": 0.25}
    other = asked("--policy", "simulated", current=started)  # another policy: not the old one's config
    assert other.policy == "simulated" and other.policy_config == {}


def test_env_sandbox_reports_every_layer_and_why_one_is_missing():
    out = envsched("env", "sandbox")
    assert out.returncode == 0, out.stderr
    layers = [line.split()[0] for line in out.stdout.splitlines() if not line.startswith("note:")]
    assert layers == ["processes", "network", "files", "user", "syscalls"]
    off = subprocess.run(
        [sys.executable, "-m", "envsched_pipeline.cli", "env", "sandbox"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ENVSCHED_SANDBOX_CONFINE": "0"},
    )
    assert off.returncode == 0, off.stderr
    assert "processes  shared with the host" in off.stdout and "ENVSCHED_SANDBOX_CONFINE=0" in off.stdout
    assert "less confined" in off.stderr  # told once, as a warning


def test_env_sandbox_as_the_root_of_a_user_namespace_that_maps_one_uid():
    """A rootless container's root: the worker keeps its namespaces, private root and filter, and
    stays that root (its own user is not mapped there), saying so."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here (util-linux)")
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no user namespaces here: {probe.stderr.decode()[-200:]}")
    cmd = [
        "unshare",
        "--user",
        "--map-root-user",
        sys.executable,
        "-m",
        "envsched_pipeline.cli",
        "env",
        "sandbox",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(None, 1) for line in out.stdout.splitlines() if not line.startswith("note:"))
    if lines["processes"].strip() != "own PID namespace":
        pytest.skip(f"this host refuses namespaces inside a user namespace: {out.stdout}")
    assert lines["files"].strip() == "private root" and lines["user"].strip() == "root"
    assert "maps no uid" in out.stdout


def _integer_options(parser, path=()):
    """(command path, option, its minimum) for every integer option of every command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _integer_options(sub, (*path, name))
        elif action.type is int:
            yield path, action.option_strings, None  # unbounded: the test below names it
        elif getattr(action.type, "__name__", "").startswith("integer >= "):
            yield path, action.option_strings, int(action.type.__name__.split(">= ")[1])


def test_every_integer_option_refuses_what_it_cannot_mean(tmp_path, capsys):
    """A count below one, a negative seed, step or index, a group of one rollout: refused by the
    parser in one line naming the option (exit code 2), before anything runs or is written."""
    options = list(_integer_options(build_parser()))
    assert len(options) >= 25 and [o for o in options if o[2] is None] == []
    for path, flags, minimum in options:
        code = main(["--lake", str(tmp_path / "lake"), *path, flags[0], str(minimum - 1)])
        err = capsys.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1, (path, err)
        assert f"argument {'/'.join(flags)}: must be >= {minimum}" in err, (path, err)
    assert main(["--lake", str(tmp_path / "lake"), "train", "--steps", "2x"]) == 2
    assert "argument --steps: invalid int value: '2x'" in capsys.readouterr().err
    assert not (tmp_path / "lake").exists()
    with pytest.raises(ConfigError, match="seed must be >= 0, got -1"):
        RunSpec(seed=-1).validate()  # a run asked for from Python or the Dagster launchpad


def test_train_on_an_unknown_pool_writes_nothing(tmp_path, capsys):
    """A pool that is neither registered nor in the lake is refused in one line naming it and the
    pools there are, before run.json or any table is written (no Dagster job starts)."""
    lake = tmp_path / "lake"
    assert main(["--lake", str(lake), "train", "--pool", "nope", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "pool 'nope' is neither in" in err
    assert "synthetic" in err and "Traceback" not in err
    assert not lake.exists()


def test_output_paths_that_cannot_be_written_are_refused_before_any_work(tmp_path, capsys, monkeypatch):
    """Every flag that names where a command writes (--json, --cache, --trace, --out, --dir) is
    checked before the command runs anything: a file where a folder goes, a folder where a file goes,
    a place under a file, or a URL (a local folder named after its scheme used to be made) is one
    line naming the flag, exit code 2, no traceback and nothing written."""
    monkeypatch.chdir(tmp_path)  # where a URL taken for a path would have made its folder
    a_file = tmp_path / "a_file"
    a_file.write_text("keep")
    bench = ["bench", "scheduler", "--steps", "1", "--schedulers", "random", "--envs", "2", "--tasks", "2"]
    cases = [
        ([*bench, "--json", str(a_file / "out.json")], "--json: cannot write " + str(a_file / "out.json")),
        ([*bench, "--json", str(tmp_path)], "--json: " + str(tmp_path) + " is a folder"),
        ([*bench, "--cache", str(a_file)], "--cache: " + str(a_file) + " is a file"),
        ([*bench, "--trace", str(a_file / "t")], "--trace: cannot write into"),
        (["bench", "replay", "--json", str(a_file / "r.json")], "is a file"),
        (
            ["deploy", "render", "--target", "docker", "--out", str(a_file)],
            "--out: " + str(a_file) + " is a file",
        ),
        (["bench", "scheduler", "--schedulers", ""], "--schedulers names no scheduler"),
        ([*bench, "--json", "s3://bucket/out.json"], "--json: s3://bucket/out.json is a URL; name a file"),
        (
            ["compare", "--runs", "a", "b", "--against", "c", "d", "--out", "s3://bucket/page"],
            "--out: s3://bucket/page is a URL; name a folder",
        ),
        (
            ["sweep", "--dir", "gs://b/sw", "--schedulers", "mopps", "--seeds", "0,1", "--steps", "1"],
            "--dir: 'gs://b/sw': gs:// is not supported; use a local path or s3://bucket/prefix",
        ),
        (  # checked and fine, then refused for a flag read later: the folder is not made either
            [*bench, "--cache", str(tmp_path / "new" / "cache"), "--learner-config", "{"],
            "--learner-config",
        ),
    ]
    for argv, expected in cases:
        code = main(["--lake", str(tmp_path / "lake"), *argv])
        captured = capsys.readouterr()
        assert code == 2 and expected in captured.err, (argv, captured.err)
        assert len(captured.err.strip().splitlines()) == 1 and "benchmark (" not in captured.out, argv
    assert a_file.read_text() == "keep" and sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_train_refuses_a_policy_this_machine_cannot_run_before_writing(tmp_path, capsys):
    """`envsched train` runs the trainer here: a vllm or hf policy without a checkpoint folder, vLLM
    missing (CI has no `gpu` extra; the vLLM case checks what this machine lacks), or the external
    policy (trained outside envsched) are refused in one line; no run.json, no pool, no retries."""
    import importlib.util  # only this test asks what is installed

    lake = tmp_path / "lake"
    base = ["--lake", str(lake), "train", "--steps", "1", "--batch-size", "4", "--group-size", "2"]
    cases = [
        (["--policy", "vllm"], "policy vllm needs model_path"),
        (["--policy", "hf", "--model-path", str(tmp_path / "none")], "is not a folder"),
        (["--policy", "hf", "--model-path", "s3://bucket/ckpt"], "--model-path: s3://bucket/ckpt is a URL"),
        (["--policy", "external"], "argument --policy: invalid choice: 'external'"),
    ]
    if importlib.util.find_spec("vllm") is None:
        cases.append((["--policy", "vllm", "--model-path", str(tmp_path)], "needs vllm, which this machine"))
    for extra, expected in cases:
        assert main([*base, *extra]) == 2, extra
        err = capsys.readouterr().err
        assert expected in err and len(err.strip().splitlines()) == 1, (extra, err)
    assert not lake.exists()
    with pytest.raises(ConfigError, match="policy 'external' is trained outside envsched"):
        RunSpec(policy="external", trainer="subprocess").validate()  # the Dagster launchpad's path
    RunSpec(policy="external", trainer="external").validate()  # what ExternalRun and `step` start


def test_a_failing_training_step_reads_as_lines_naming_its_cause(small_pool, dagster_home, tmp_path):
    """A trainer that fails inside the step (here: an hf checkpoint folder without config.json,
    found only when the trainer loads it) costs one line per attempt naming the cause, and the halt
    names it too; no Dagster stack trace or Python traceback reaches the terminal, while the run's
    event log keeps the trainer's exception with its traceback for the UI."""
    empty = tmp_path / "ckpt"
    empty.mkdir()
    argv = ["train", "--steps", "1", "--policy", "hf", "--model-path", str(empty)]
    p = envsched(*argv, "--batch-size", "4", "--group-size", "2", lake=small_pool.root)
    assert p.returncode == 2, p.stderr
    cause = "not a local model folder (no config.json)"
    attempts = [line for line in p.stderr.splitlines() if line.startswith("step 0 (train) failed, attempt")]
    assert len(attempts) == 3 and all(cause in line for line in attempts), p.stderr
    assert "trainer: step 0 failed" not in p.stderr  # the trainer's own line would say it twice
    assert "Traceback" not in p.stderr and "Stack Trace" not in p.stderr and "dagster._core" not in p.stderr
    halt = p.stderr.strip().splitlines()[-1]
    assert halt.startswith("envsched: error: the run is halted at step 0") and cause in halt
    import dagster as dg  # the instance this run wrote to

    with dg.DagsterInstance.from_config(str(dagster_home)) as inst:
        run = inst.get_run_records(limit=1)[0].dagster_run
        events = [r.dagster_event for r in inst.all_logs(run.run_id) if r.dagster_event is not None]
        reported = [e.engine_event_data.error for e in events if "closed with exception" in (e.message or "")]
        assert reported and "FileNotFoundError" in reported[0].to_string()


def test_a_failed_pool_import_names_its_cause(tmp_path, dagster_home, capsys):
    """The pool job's failure is reported by its innermost cause (the op's own exception), in one
    line, with nothing of Dagster's stack trace on the terminal."""
    from envsched_pipeline.errors import StepError  # the driver's user error
    from envsched_pipeline.lake import Lake
    from envsched_pipeline.orchestration.driver import materialize_pool  # Dagster: this test only

    with pytest.raises(
        StepError, match=r"importing pool nope failed \(Dagster run \w+\): KeyError: .unknown pool"
    ):
        materialize_pool("nope", Lake(tmp_path / "lake"))
    captured = capsys.readouterr()
    assert "Stack Trace" not in captured.err + captured.out and "Traceback" not in captured.err


def test_a_policy_that_cannot_act_in_the_pools_environments_is_refused_before_any_step(
    tmp_path, dagster_home, capsys
):
    """The neural learner acts only in EnvScaler-style environments: on a reasoning-gym pool it is
    refused in one line before any step runs (it used to fail three tries of step 0 and halt)."""
    from envs.registry import load_pool  # this test's pool only
    from envsched_pipeline.core.pools import import_pool
    from envsched_pipeline.lake import Lake

    lake = Lake(tmp_path / "lake")
    import_pool(lake, load_pool("reasoning_gym"))
    argv = [
        "--lake",
        str(lake.root),
        "train",
        "--pool",
        "reasoning_gym",
        "--policy",
        "neural",
        "--steps",
        "1",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--policy neural: the neural learner acts in EnvScaler-style environments" in err
    assert "['reasoning_gym']" in err and len(err.strip().splitlines()) == 1
    assert lake.steps("manifests") == [] and not (lake.root / "run.json").exists()


def test_an_unknown_scheduler_or_variant_is_refused_by_every_bench_command(small_run, capsys):
    """`bench scheduler` used to run `envsched@<anything>` as the paper's envsched under that name,
    and `bench replay` died with a traceback on an unknown name: both are one line now."""
    lake = str(small_run.root)
    cases = [
        (["bench", "scheduler", "--steps", "1", "--schedulers", "random,envsched@bogus"], "envsched@bogus"),
        (["bench", "replay", "--schedulers", "random,nope"], "unknown scheduler 'nope'"),
    ]
    for argv, expected in cases:
        assert main(["--lake", lake, *argv]) == 2, argv
        err = capsys.readouterr().err
        assert expected in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_a_place_the_machine_refuses_to_write_is_one_line_before_the_run_is_written(
    tmp_path, monkeypatch, capsys
):
    """A lake or $DAGSTER_HOME the machine will not let envsched write (here sysfs; a read-only
    mount or a full disk alike) is one line naming the path and the system's reason, exit code 2
    (it was a PermissionError traceback); a $DAGSTER_HOME that cannot be made is found before the
    run's run.json is written."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    assert main(["--lake", "/sys/envsched-lake", "train", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err == "envsched: error: /sys/envsched-lake: Operation not permitted\n"
    monkeypatch.setenv("DAGSTER_HOME", "/sys/envsched-dagster-home")
    lake = tmp_path / "lake"
    assert main(["--lake", str(lake), "train", "--steps", "1"]) == 2
    assert capsys.readouterr().err == "envsched: error: /sys/envsched-dagster-home: Operation not permitted\n"
    assert not lake.exists()
