"""A lake on an object store: ``s3://bucket/prefix`` against a real S3 endpoint (moto's server, a
separate process speaking the S3 HTTP API). Tables, artifacts, SQL, the CLI loop and the external
protocol run there unchanged; a writer killed mid-upload never leaves a partial partition."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pytest

from envs.registry import load_synthetic
from envsched_pipeline.api import ExternalRun
from envsched_pipeline.cli import main
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.errors import LakeError, StepError
from envsched_pipeline.lake import Lake
from envsched_pipeline.lease import Lease, current, step_lock
from envsched_pipeline.run import RunSpec, load_run, start_run
from tests.procs import free_port, stop, wait_for_port

pytest.importorskip("s3fs")
pytest.importorskip("moto")

G = 4


@pytest.fixture(scope="module")
def s3_server():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for_port(port, proc, "moto's S3 server")
    yield f"http://127.0.0.1:{port}"
    stop(proc)


@pytest.fixture
def s3(s3_server, monkeypatch, tmp_path, request):
    """A fresh bucket, credentials and endpoint in the environment (as a deployment sets them)."""
    import boto3

    env = {
        "AWS_ENDPOINT_URL": s3_server,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "ENVSCHED_LOCAL_DIR": str(tmp_path / "local"),
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    bucket = "lake-" + request.node.name.lower().replace("_", "-")[:40]
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/envsched", dict(os.environ)


def test_tables_artifacts_and_sql_round_trip(s3):
    url, _ = s3
    lake = Lake(url)
    assert lake.remote and str(lake.root) == url
    with pytest.raises(LakeError, match=r"no lake at s3://.*nothing under that prefix"):
        lake.require()
    with pytest.raises(LakeError, match="there is no bucket 'not-a-bucket-here' at http://127.0.0.1:"):
        Lake("s3://not-a-bucket-here/run").require()
    rows = [{"step": 2, "task_id": f"t{i}", "env_id": "e", "rollout": 0, "reward": 0.5} for i in range(3)]
    written = lake.write("rollouts", rows, step=2)
    lake.write("statistics", [], step=2)
    assert str(written) == f"{url}/rollouts/step=2/part-0.parquet"
    assert lake.read("rollouts", step=2).column("task_id").to_pylist() == ["t0", "t1", "t2"]
    assert lake.has("statistics", step=2) and lake.steps("statistics") == [2]
    lake.require()
    lake.write_json("runs/current.json", {"a": 1})
    assert lake.read_json("runs/current.json") == {"a": 1}
    lake.write_bytes("checkpoints/step=1/x.bin", b"\x00\x01")
    assert lake.read_bytes("checkpoints/step=1/x.bin") == b"\x00\x01" and lake.exists(
        "checkpoints/step=1/x.bin"
    )
    lake.delete("checkpoints/step=1/x.bin")
    assert lake.read_bytes("checkpoints/step=1/x.bin") is None
    # SQL goes straight to the objects
    n = lake.sql("select count(*) as n from rollouts where reward = 0.5").column("n")[0].as_py()
    assert n == 3 and lake.sql("select count(*) as n from statistics").column("n")[0].as_py() == 0
    # the bucket holds the data; the machine-local folder holds nothing of the lake's tables
    assert not (lake.local / "rollouts").exists()


def test_an_s3_lake_without_s3fs_installed_is_one_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "s3fs", None)  # as on a machine without the deploy extra
    assert main(["--lake", "s3://bucket/run", "status"]) == 2
    err = capsys.readouterr().err
    assert "lake s3://bucket/run: an object-store lake needs s3fs" in err and "[deploy]" in err


def test_cli_trains_and_answers_sql_on_an_s3_lake(s3, capsys):
    url, _ = s3
    assert main(["--lake", url, *"pool create synthetic --name mini --envs 4 --tasks-per-env 6".split()]) == 0
    code = main(
        ["--lake", url, "train", "--pool", "mini", "--steps", "1", "--batch-size", "8", "--group-size", "4"]
    )
    assert code == 0, capsys.readouterr()
    assert Lake(url).steps("rollouts") == [0]
    # resuming continues the same run from the bucket
    code = main(
        ["--lake", url, "train", "--pool", "mini", "--steps", "2", "--batch-size", "8", "--group-size", "4"]
    )
    assert code == 0, capsys.readouterr()
    capsys.readouterr()
    assert (
        main(["--lake", url, "sql", "select count(*) as n, count(distinct step) as steps from rollouts"]) == 0
    )
    out = capsys.readouterr().out
    assert "64" in out and "2" in out, out
    lake = Lake(url)
    assert lake.steps("rollouts") == [0, 1] and lake.steps("manifests") == [0, 1]
    assert main(["--lake", url, "status"]) == 0


def test_external_protocol_on_an_s3_lake(s3):
    url, _ = s3
    lake = Lake(url)
    import_pool(lake, load_synthetic("mini", n_envs=4, tasks_per_env=6, seed=2))
    run = ExternalRun(pool="mini", lake=lake, batch_size=6, group_size=G)
    for step in range(2):
        manifest = run.manifest(step)
        assert len(manifest) == 6
        run.observe(
            step,
            [
                {"task_id": p["task_id"], "rollout": r, "reward": float((r + step) % 2)}
                for p in manifest
                for r in range(G)
            ],
        )
    assert Lake(url).steps("statistics") == [0, 1]


def test_step_protocol_cli_and_report_on_an_s3_lake(s3, tmp_path, capsys):
    url, _ = s3
    assert main(["--lake", url, *"pool create synthetic --name mini --envs 4 --tasks-per-env 6".split()]) == 0
    for step in range(2):
        capsys.readouterr()
        sel = [
            "step",
            "select",
            "--pool",
            "mini",
            "--step",
            str(step),
            "--batch-size",
            "6",
            "--group-size",
            "4",
        ]
        assert main(["--lake", url, *sel]) == 0
        picks = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
        assert len(picks) == 6
        f = tmp_path / f"r{step}.jsonl"
        f.write_text(
            "\n".join(
                json.dumps({"task_id": p["task_id"], "rollout": r, "reward": float((r + step) % 2)})
                for p in picks
                for r in range(G)
            )
        )
        assert (
            main(
                ["--lake", url, "step", "ingest", "--pool", "mini", "--step", str(step), "--rollouts", str(f)]
            )
            == 0
        )
    lake = Lake(url)
    assert lake.steps("rollouts") == [0, 1] and lake.read("rollouts").num_rows == 2 * 6 * G
    assert lake.steps("statistics") == [0]  # step 1 is folded in when step 2 is selected
    # a bad file is refused and nothing is written to the bucket
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"task_id": "nope", "rollout": 0, "reward": 2.0}))
    assert (
        main(["--lake", url, "step", "ingest", "--pool", "mini", "--step", "2", "--rollouts", str(bad)]) == 2
    )
    assert not Lake(url).has("rollouts", step=2)
    # the report reads the bucket and writes a local page
    assert main(["--lake", url, "report", "--out", str(tmp_path / "rep"), "--no-baselines"]) == 0
    assert "envsched run report" in (tmp_path / "rep" / "index.html").read_text()


WRITER = textwrap.dedent(
    """
    import sys
    import numpy as np, pyarrow as pa
    from envsched_pipeline.lake import Lake
    lake = Lake(sys.argv[1])
    n = 600_000
    rng = np.random.default_rng(int(sys.argv[2]))
    big = pa.table({
        "run_id": ["r"] * n, "step": np.full(n, 5), "task_id": [f"t{i}" for i in range(n)],
        "mean": rng.random(n), "var": rng.random(n), "n": np.full(n, 8),
    })
    print("uploading", flush=True)
    lake.write("statistics", big, step=5)
    print("done", flush=True)
    """
)


def test_a_writer_killed_mid_upload_leaves_the_old_partition(s3, tmp_path):
    url, env = s3
    lake = Lake(url)
    old = pa.Table.from_pylist(
        [{"run_id": "r", "step": 5, "task_id": "old", "mean": 0.25, "var": 0.0, "n": 8}]
    )
    lake.write("statistics", old, step=5)
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    killed = 0
    for attempt, delay in enumerate((0.0, 0.05, 0.2)):
        proc = subprocess.Popen(
            [sys.executable, str(script), url, str(attempt)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=os.getcwd(),
        )
        assert proc.stdout.readline().strip() == "uploading"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        rest = proc.stdout.read()
        killed += "done" not in rest
        got = Lake(url).read("statistics", step=5)
        # all of the old partition or all of a new one: never a torn object
        assert got.num_rows in (1, 600_000), got.num_rows
        if got.num_rows == 1:
            assert got.column("task_id").to_pylist() == ["old"]
        else:
            assert np.isfinite(np.asarray(got.column("mean"))).all()
    assert killed >= 1  # at least one writer really died before finishing


def test_one_driver_and_one_writer_across_machines_sharing_a_bucket(s3, tmp_path, monkeypatch):
    """Leases and step locks live in the bucket (conditional PUT), not on one machine's disk."""
    url, _ = s3
    here = Lake(url)
    monkeypatch.setenv("ENVSCHED_LOCAL_DIR", str(tmp_path / "other-machine"))
    there = Lake(url)
    assert here.local != there.local
    with ThreadPoolExecutor(8) as ex:  # eight racing creators: exactly one wins
        wins = list(ex.map(lambda i: here.create("locks/race.lock", str(i).encode()), range(8)))
    assert wins.count(True) == 1
    lease = Lease(here).acquire()
    try:
        with pytest.raises(StepError, match="being driven by"):
            Lease(there).acquire()
        assert current(there)["id"] == lease.id
        with step_lock(here, "ingest-3"):
            with pytest.raises(StepError, match="already running"):
                with step_lock(there, "ingest-3"):
                    pass
    finally:
        lease.release()
    assert current(there) is None
    # a dead driver's lease (no heartbeat for 10 minutes) is taken over from the other machine
    stale = {"id": "old", "kind": "envsched train", "pid": 1, "host": "gone", "heartbeat": time.time() - 600}
    here.write_json("lease.json", stale)
    taken = Lease(there).acquire()
    assert taken.took_over["id"] == "old"
    taken.release()
    # a step lock left by a pod that crashed on the other machine goes stale instead of blocking
    here.write_json("locks/train-step=3.lock", {**stale, "kind": "train-step=3"})
    with step_lock(there, "train-step=3") as lock, there.fenced(lock.check):
        assert lock.took_over["id"] == "old"
        there.write_bytes("checkpoints/step=3/policy.json", b"{}")  # fenced write: the lock is ours
    assert here.read_bytes("locks/train-step=3.lock") is None


def test_swap_on_an_s3_lake_never_overwrites_a_write_made_after_its_read(s3, tmp_path, monkeypatch):
    """Compare and swap on an object store is conditional on the ETag of the version read
    (If-Match): a heartbeat or a stale-lease discard that read the record just before another
    machine rewrote it loses, instead of overwriting or deleting the other machine's record."""
    url, _ = s3
    here = Lake(url)
    monkeypatch.setenv("ENVSCHED_LOCAL_DIR", str(tmp_path / "other-machine"))
    there = Lake(url)
    here.write_bytes("lease.json", b"mine")
    assert not here.swap("lease.json", b"not what it holds", b"x")
    assert here.swap("lease.json", b"mine", b"mine, later")
    assert there.read_bytes("lease.json") == b"mine, later"

    read = here.store._read_tagged

    gap_writes = []

    def taken_over_in_the_gap(rel):
        got = read(rel)
        gap_writes.append(f"the taker's, heartbeat {len(gap_writes)}".encode())
        there.write_bytes(rel, gap_writes[-1])  # another machine writes between our read and our write
        return got

    monkeypatch.setattr(here.store, "_read_tagged", taken_over_in_the_gap)
    assert not here.swap("lease.json", b"mine, later", b"mine, even later")
    assert there.read_bytes("lease.json") == gap_writes[-1]
    assert not here.discard("lease.json", gap_writes[-1])  # rewritten again after this read: kept
    assert there.read_bytes("lease.json") == gap_writes[-1]
    monkeypatch.setattr(here.store, "_read_tagged", read)
    assert here.discard("lease.json", gap_writes[-1]) and there.read_bytes("lease.json") is None
    assert not here.swap("lease.json", gap_writes[-1], b"x")  # gone: nothing to swap


def test_swap_falls_back_on_a_store_without_conditional_writes(s3, monkeypatch):
    """A store that answers NotImplemented to If-Match (stands in for S3-compatible stores that lack
    conditional writes; moto has them) gets the re-read-then-write swap, still refusing a stale read."""
    from botocore.exceptions import ClientError  # only for this store's refusal

    url, _ = s3
    lake = Lake(url)
    lake.write_bytes("lease.json", b"a")
    call = lake.store.fs.call_s3

    def no_if_match(method, **kw):
        if "IfMatch" in kw:
            err = OSError(5, "not implemented")
            err.__cause__ = ClientError({"Error": {"Code": "NotImplemented"}}, method)
            raise err
        return call(method, **kw)

    monkeypatch.setattr(lake.store.fs, "call_s3", no_if_match)
    assert lake.swap("lease.json", b"a", b"b") and not lake.store.conditional
    assert not lake.swap("lease.json", b"a", b"c") and lake.read_bytes("lease.json") == b"b"
    assert lake.discard("lease.json", b"b") and lake.read_bytes("lease.json") is None


def test_rewind_on_an_s3_lake_archives_the_local_model_checkpoints_too(s3):
    """On an `s3://` lake a language model's checkpoints live on local disk: `rewind` moves those of
    the redone steps to the local archive with the bucket's partitions (it left them in place)."""
    from envsched_pipeline.core.gates import checkpointed_steps, rewind  # this test's subject

    url, _ = s3
    lake = Lake(url)
    import_pool(lake, load_synthetic("mini", n_envs=4, tasks_per_env=6, seed=2))
    run = ExternalRun(pool="mini", lake=lake, batch_size=6, group_size=G)
    for step in range(3):
        rows = [
            {"task_id": p["task_id"], "rollout": r, "reward": float(r % 2)}
            for p in run.manifest(step)
            for r in range(G)
        ]
        run.observe(step, rows)
    for s in range(3):  # what an LM trainer saves beside an s3 lake
        (lake.local / "checkpoints" / f"step={s}" / "policy").mkdir(parents=True)
        (lake.local / "checkpoints" / f"step={s}" / "policy" / "trainer.json").write_text(f'{{"step": {s}}}')
    assert checkpointed_steps(lake) == {0, 1, 2}
    out = rewind(lake, 1)
    assert out["moved"]["local checkpoints"] == [1, 2] and out["moved"]["rollouts"] == [1, 2]
    assert sorted(p.name for p in (lake.local / "checkpoints").iterdir()) == ["step=0"]
    kept = list((lake.local / "archive").glob("rewind-to-step1-*/checkpoints/step=2/policy/trainer.json"))
    assert len(kept) == 1 and Lake(url).steps("rollouts") == [0]


def test_a_rewind_on_an_s3_lake_makes_a_dropped_policy_checkpoint_again(
    s3, dagster_home, monkeypatch, capsys
):
    """The simulated policy's checkpoints on a bucket: `envsched rewind` makes one the lake dropped
    again in the trainer's own process, reading and writing the bucket, and the redo repeats."""
    import envsched_pipeline.lake as lake_module  # its keep rule, shortened for this test
    from tests.test_state_keep import one_step  # select, train and fold a step in-process

    url, _ = s3
    monkeypatch.setattr(lake_module, "KEEP_EVERY", 2)  # keeps steps 0, 1, 3 and the newest two
    lake = Lake(url)
    import_pool(lake, load_synthetic("mini", n_envs=4, tasks_per_env=6, seed=2))
    start_run(lake, RunSpec(pool="mini", seed=4, batch_size=6, group_size=G, max_steps=5))
    for t in range(5):
        one_step(lake, t)
    assert lake.artifact_steps("checkpoints") == [0, 1, 3, 4]
    by_step = [("step", "ascending"), ("task_id", "ascending"), ("rollout", "ascending")]
    first = lake.read("rollouts", columns=["step", "task_id", "rollout", "reward"]).sort_by(by_step)
    capsys.readouterr()
    assert main(["--lake", url, "rewind", "--to", "3"]) == 0
    said = capsys.readouterr().out
    assert "making the policy after step 2 again from step 1's checkpoint (1 step)" in said, said
    assert lake.artifact_steps("checkpoints") == [0, 1, 2] and lake.steps("rollouts") == [0, 1, 2]
    for t in (3, 4):
        one_step(lake, t)
    assert lake.read("rollouts", columns=["step", "task_id", "rollout", "reward"]).sort_by(by_step) == first


@pytest.fixture
def s3_calls(monkeypatch):
    """The S3 API calls this process makes (s3fs's one entry point), by method name."""
    import s3fs

    calls: list[str] = []
    real = s3fs.S3FileSystem._call_s3

    async def counting(self, method, *args, **kwargs):
        calls.append(method if isinstance(method, str) else method.__name__)
        return await real(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counting)
    return calls


def test_a_steps_reads_cost_the_same_requests_whatever_the_runs_length(s3, s3_calls):
    """On an object store every request is a round trip: listing a table's steps, finding the
    steps with a scheduler state and querying a table cost one listing each, however many steps the
    run has (they were one listing per step folder, one HEAD per state, a HEAD and a GET per file
    per query); a partition written again is read again."""
    from envsched_pipeline.core.state_store import state_rel, state_steps

    url, _ = s3
    lake = Lake(url)

    def rows(s, n=4):
        return [{"step": s, "task_id": f"t{i}", "env_id": "e", "rollout": 0, "reward": 0.5} for i in range(n)]

    query = "select step, count(*) as n from rollouts group by 1 order by 1"
    costs = {}
    for n in (3, 12):
        for s in range(n):
            if not lake.has("rollouts", step=s):
                lake.write("rollouts", rows(s), step=s)
                lake.write_bytes(state_rel(s), b"state")
        lake.sql(query)  # the first read of new partitions fetches them
        cost = []
        for read, want in (
            (lambda: lake.steps("rollouts"), list(range(n))),
            (lambda: state_steps(lake), set(range(n))),
            (lambda: [r["n"] for r in lake.sql(query).to_pylist()], [4] * n),
            (lambda: lake.read("rollouts").num_rows, 4 * n),
        ):
            s3_calls.clear()
            assert read() == want
            cost.append(list(s3_calls))
        costs[n] = cost
    assert costs[3] == costs[12] == [["list_objects_v2"]] * 4, costs  # one listing; nothing read again
    for read in (lambda: lake.read("rollouts", step=2), lambda: lake.read_bytes(state_rel(2))):
        s3_calls.clear()
        read()
        assert s3_calls == ["get_object"]  # one GET (s3fs's cat_file asks for the size first)
    lake.write("rollouts", rows(5, 9), step=5)  # step 5 again: its new rows are read
    assert lake.sql("select count(*) as n from rollouts where step = 5").column("n").to_pylist() == [9]


def test_an_unchanged_partition_read_again_is_a_get_that_brings_no_bytes(s3, monkeypatch):
    """Every op of a step reads the pool's tasks and graph (half a megabyte and more at the default
    pool's size): read again by this process, an unchanged partition is one GET conditional on the
    ETag it was read at, answered 304 with no body; one replaced by another machine is read anew."""
    import boto3  # the other machine's write, straight to the bucket
    import pyarrow.parquet as pq  # its bytes
    import s3fs

    url, env = s3
    lake = Lake(url)
    lake.write(
        "rollouts",
        [{"step": 0, "task_id": f"t{i}", "env_id": "e", "rollout": 0, "reward": 1.0} for i in range(5)],
        step=0,
    )
    answers = []  # (conditional?, bytes of the body or 304)
    real = s3fs.S3FileSystem._call_s3

    async def watching(self, method, *args, **kwargs):
        name = method if isinstance(method, str) else method.__name__
        try:
            out = await real(self, method, *args, **kwargs)
        except OSError as exc:
            if name == "get_object":
                answers.append((bool(kwargs.get("IfNoneMatch")), str(exc.__cause__)[:40]))
            raise
        if name == "get_object":
            answers.append((bool(kwargs.get("IfNoneMatch")), out["ContentLength"]))
        return out

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", watching)
    for columns in (None, ["reward"], None):
        assert lake.read("rollouts", step=0, columns=columns).num_rows == 5
    size = answers[0][1]
    assert size > 500 and answers[1:] == [(True, "An error occurred (304) when calling the")] * 2, answers
    buf = pa.BufferOutputStream()
    pq.write_table(
        pa.table({"step": [0], "task_id": ["t9"], "env_id": ["e"], "rollout": [0], "reward": [0.0]}), buf
    )
    bucket, prefix = url[len("s3://") :].split("/", 1)
    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"]).put_object(
        Bucket=bucket, Key=f"{prefix}/rollouts/step=0/part-0.parquet", Body=buf.getvalue().to_pybytes()
    )
    answers.clear()
    assert lake.read("rollouts", step=0).column("task_id").to_pylist() == ["t9"]
    assert len(answers) == 1 and answers[0][0] and answers[0][1] > 500, answers  # asked, and it came
    monkeypatch.setenv("ENVSCHED_LAKE_CACHE_MB", "0")  # the cache off: plain GETs
    answers.clear()
    assert lake.read("rollouts", step=0).num_rows == lake.read("rollouts", step=0).num_rows == 1
    assert [a[0] for a in answers] == [False, False], answers


def test_a_snapshot_asks_the_store_once_per_object_and_listing(s3, s3_calls):
    """A planning pass or a step's bookkeeping asks the same questions several times (the run, the
    halt, the steps of each table, a partition for different columns): inside ``Lake.snapshot``
    each is one request."""
    url, _ = s3
    lake = Lake(url)
    lake.write("rollouts", [{"step": 0, "task_id": "t", "env_id": "e", "rollout": 0, "reward": 1.0}], step=0)
    lake.write_json("run.json", {"run": 1})
    with lake.snapshot():
        s3_calls.clear()
        for _ in range(3):
            assert lake.read("rollouts", step=0, columns=["reward"]).column("reward").to_pylist() == [1.0]
            assert lake.read("rollouts", step=0).num_rows == 1 and lake.has("rollouts", step=0)
            assert lake.read_json("run.json") == {"run": 1} and lake.steps("rollouts") == [0]
        assert sorted(s3_calls) == ["get_object", "get_object", "list_objects_v2"], s3_calls
    s3_calls.clear()
    lake.read_json("run.json")
    lake.read_json("run.json")
    assert s3_calls == ["get_object"] * 2  # outside a snapshot every read asks the store


def test_a_delete_is_one_listing_and_one_bulk_delete_and_takes_only_what_it_names(s3, s3_calls):
    """A run drops a step's state and checkpoint folder every step: on an object store that is one
    listing and one bulk delete (it was a HEAD, two listings and the delete), and the folder
    ``step=1`` is not a prefix of ``step=10``."""
    url, _ = s3
    lake = Lake(url)
    for rel in (
        "state/step=1/scheduler.npz",
        "state/step=1/other",
        "state/step=10/scheduler.npz",
        "halt.json",
    ):
        lake.write_bytes(rel, b"x")
    s3_calls.clear()
    lake.delete("state/step=1")
    assert s3_calls == ["list_objects_v2", "delete_objects"], s3_calls
    assert lake.store.glob("state/step=*/*") == ["state/step=10/scheduler.npz"]
    lake.delete("halt.json")
    lake.delete("nothing/step=3")  # nothing there: nothing to do, no error
    assert not lake.exists("halt.json") and lake.exists("state/step=10/scheduler.npz")


def test_a_store_that_cannot_be_reached_or_lacks_the_bucket_is_one_line(s3, monkeypatch, capsys):
    """An endpoint nobody answers at, or a bucket that is not there, is one line naming the
    endpoint and where its settings come from (it was a botocore traceback)."""
    import s3fs

    url, env = s3
    s3fs.S3FileSystem.clear_instance_cache()  # s3fs keeps one client per process: start afresh
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    try:
        assert main(["--lake", url, "status"]) == 2
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
    err = capsys.readouterr().err
    assert err.startswith("envsched: error: the lake's object store (http://127.0.0.1:")
    assert "Could not connect to the endpoint URL" in err and "$AWS_ENDPOINT_URL" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    monkeypatch.setenv("AWS_ENDPOINT_URL", env["AWS_ENDPOINT_URL"])
    create = "pool create synthetic --name mini --envs 2 --tasks-per-env 3".split()
    assert main(["--lake", "s3://no-such-bucket-here/run", *create]) == 2
    err = capsys.readouterr().err
    assert "could not be used" in err and "The specified bucket does not exist" in err


def test_a_sweep_keeps_its_lakes_and_its_record_on_a_bucket(s3, dagster_home, tmp_path, capsys):
    """`envsched sweep --dir s3://bucket/prefix`: each run's lake under the prefix, the record
    beside them (so `--dir` alone resumes the sweep), the logs and the table's page on this machine;
    `envsched runs` lists the prefix's lakes (it took the prefix for one lake with no run)."""
    url, env = s3
    sweep_url = f"{url}/sweep"
    for name in ("random-s0", "random-s1", "mopps-s0", "mopps-s1"):
        import_pool(Lake(f"{sweep_url}/{name}"), load_synthetic("mini", n_envs=4, tasks_per_env=6, seed=2))
    argv = f"sweep --dir {sweep_url} --schedulers mopps --seeds 0,1 --steps 1 --jobs 2".split()
    shape = ["--", "--pool", "mini", "--batch-size", "6", "--group-size", "4"]
    p = subprocess.run(
        [sys.executable, "-m", "envsched_pipeline.cli", *argv, *shape],
        capture_output=True,
        text=True,
        timeout=900,
        env={**env, "DAGSTER_HOME": str(dagster_home)},
    )
    assert p.returncode == 0, p.stdout + p.stderr
    for name in ("random-s0", "random-s1", "mopps-s0", "mopps-s1"):
        lake = Lake(f"{sweep_url}/{name}")
        assert lake.steps("statistics") == [0]
        assert load_run(lake).against == (
            [] if name.startswith("random") else [f"{sweep_url}/random-{name[-2:]}"]
        )
    assert json.loads(Lake(sweep_url).read_bytes("sweep.json"))["schedulers"] == "mopps"
    local = Lake(sweep_url).local
    assert (local / "logs" / "mopps-s1.log").is_file() and (local / "comparison" / "index.html").is_file()
    assert f"in {sweep_url}; logs in {local / 'logs'}" in p.stdout
    assert "over 2 seeds: mopps 0." in p.stdout and f"wrote {local / 'comparison' / 'index.html'}" in p.stdout
    again = subprocess.run(
        [sys.executable, "-m", "envsched_pipeline.cli", "sweep", "--dir", sweep_url, "--dry-run"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "DAGSTER_HOME": str(dagster_home)},
    )
    assert again.returncode == 0, again.stderr
    # `envsched runs` on the prefix finds the sweep's lakes as it would in a folder, and the
    # comparison it suggests runs on the bucket
    lakes = {(s, seed): f"{sweep_url}/{s}-s{seed}" for s in ("random", "mopps") for seed in (0, 1)}
    assert main(["runs", sweep_url, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert sorted(r["lake"] for r in found["runs"]) == sorted(lakes.values())
    assert {(r["scheduler"], r["seed"]) for r in found["runs"]} == set(lakes)
    [suggested] = found["comparisons"]
    assert suggested["seeds"] == [0, 1] and lakes["random", 0] in suggested["command"]
    # the default: the prefix holding --lake, so a run's siblings are listed beside it
    assert main(["--lake", lakes["random", 0], "runs", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["runs"]) == 4
    # a lake named itself is listed alone; a prefix with no lake is an error naming it
    assert main(["runs", lakes["random", 1], "--json"]) == 0
    assert [r["lake"] for r in json.loads(capsys.readouterr().out)["runs"]] == [lakes["random", 1]]
    assert main(["runs", f"{url}/nothing-here"]) == 2
    assert f"no lake in {url}/nothing-here" in capsys.readouterr().err
    assert main(suggested["command"].split()[1:]) == 0, capsys.readouterr()  # as a user pastes it
    assert "over 2 seeds" in capsys.readouterr().out
    assert (
        "4 runs, 0 to run" in again.stdout
        and f"done    mopps s0: 1 step in {sweep_url}/mopps-s0" in again.stdout
    )
