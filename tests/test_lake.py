import os
import re

import pyarrow as pa
import pytest

from envsched_pipeline.lake import Lake, LakeError


def rollout_rows(step, n=3):
    return [{"step": step, "task_id": f"t{i}", "rollout": 0, "env_id": "e", "reward": 0.5} for i in range(n)]


def test_write_read_roundtrip_is_hive_partitioned(tmp_path):
    lake = Lake(tmp_path)
    path = lake.write("rollouts", rollout_rows(2), step=2)
    assert path == tmp_path / "rollouts" / "step=2" / "part-0.parquet"
    assert lake.read("rollouts", step=2).num_rows == 3
    assert lake.steps("rollouts") == [2]


def test_rewrite_replaces_partition_and_leaves_no_temp_files(tmp_path):
    lake = Lake(tmp_path)
    lake.write("rollouts", rollout_rows(0, 5), step=0)
    lake.write("rollouts", rollout_rows(0, 2), step=0)
    assert lake.read("rollouts").num_rows == 2
    leftovers = [p for p in (tmp_path / "rollouts").rglob("*") if p.is_file() and p.name != "part-0.parquet"]
    assert leftovers == []


def test_writes_are_fsynced_unless_the_lake_is_marked_throwaway(tmp_path, monkeypatch):
    """Every write is fsynced (the file, then its folder after the rename) by default; with
    $ENVSCHED_LAKE_FSYNC=0 (what the test suite sets) none is, and the write is whole all the same.
    A value other than 0 or 1 is refused by name when the lake is opened, before anything is written."""
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd)))
    for value, expect in (("", True), ("1", True), ("0", False)):
        monkeypatch.setenv("ENVSCHED_LAKE_FSYNC", value)
        synced.clear()
        lake = Lake(tmp_path / f"lake{value}")
        lake.write("rollouts", rollout_rows(0), step=0)
        part = lake.root / "rollouts" / "step=0"
        assert lake.read("rollouts", step=0).num_rows == 3 and os.listdir(part) == ["part-0.parquet"]
        if expect:  # the temp file's bytes (renamed to part-0.parquet since), then the folder's entry
            assert len(synced) == 2 and synced[1] == str(part)
            assert os.path.dirname(synced[0]) == str(part)
            assert os.path.basename(synced[0]).startswith(".part-0.parquet.")
        else:
            assert synced == []
    for bad in ("yes", "2", "off"):
        monkeypatch.setenv("ENVSCHED_LAKE_FSYNC", bad)
        with pytest.raises(LakeError, match=rf"\$ENVSCHED_LAKE_FSYNC: expected 1 .* or 0, got '{bad}'"):
            Lake(tmp_path / "refused")
        assert not (tmp_path / "refused").exists()


def test_missing_required_column_is_refused_and_nothing_written(tmp_path):
    lake = Lake(tmp_path)
    with pytest.raises(LakeError, match="rollouts: missing required column 'reward'"):
        lake.write("rollouts", [{"step": 0, "task_id": "t", "rollout": 0, "env_id": "e"}], step=0)
    assert not (tmp_path / "rollouts").exists()


def test_wrong_type_is_refused(tmp_path):
    lake = Lake(tmp_path)
    bad = pa.table({"step": [0], "task_id": ["t"], "rollout": [0], "env_id": ["e"], "reward": ["high"]})
    with pytest.raises(LakeError, match="rollouts.reward: expected float"):
        lake.write("rollouts", bad, step=0)


def test_sql_over_views_and_empty_tables(tmp_path):
    lake = Lake(tmp_path)
    assert lake.sql("select count(*) as n from rollouts").column("n").to_pylist() == [0]
    lake.write("rollouts", rollout_rows(0), step=0)
    lake.write("rollouts", rollout_rows(1, 4), step=1)
    out = lake.sql("select step, count(*) as n from rollouts group by 1 order by 1").to_pylist()
    assert out == [{"step": 0, "n": 3}, {"step": 1, "n": 4}]
    summary = lake.sql("select step, groups from step_summary order by step").to_pylist()
    assert summary == [{"step": 0, "groups": 3}, {"step": 1, "groups": 4}]


def test_a_query_builds_only_the_views_it_reads(tmp_path):
    """Every view reads the footer of each file of its table, so building all of them cost a query
    more with every step of the run; a query now gets the views it names and what they are built on."""

    def views(con):
        rows = con.execute("select view_name from duckdb_views() where not internal").fetchall()
        return {r[0] for r in rows if not r[0].startswith("_")}  # _x_empty: an empty table's arrow

    lake = Lake(tmp_path)
    lake.write("rollouts", rollout_rows(0), step=0)
    assert views(lake.connect(["select count(*) from rollouts"])) == {"rollouts"}
    assert views(lake.connect(["select * from pick_reasons"])) == {
        "pick_reasons",
        "manifests",
        "task_history",
        "rollouts",
    }
    assert views(lake.connect(["select * from eval_rollouts"])) == {"eval_rollouts"}  # not "rollouts"
    every = views(lake.connect())
    assert views(lake.connect(["show tables"])) == every and {"step_summary", "tasks", "evals"} <= every
    assert lake.sql("select count(*) as n from step_summary").to_pylist() == [{"n": 1}]


def test_env_var_sets_root(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVSCHED_LAKE", str(tmp_path / "x"))
    assert Lake().root == (tmp_path / "x").resolve()


def test_corrupt_file_error_names_the_file(tmp_path):
    lake = Lake(tmp_path)
    p = lake.write("rollouts", rollout_rows(0), step=0)
    p.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(LakeError, match="part-0.parquet"):
        lake.read("rollouts", step=0)


@pytest.mark.parametrize(
    "url, says",
    [
        ("gs://bucket/lake", "gs:// is not supported; use a local path or s3://bucket/prefix"),
        ("https://host/lake", "https:// is not supported"),
        ("s3://", "the URL names no bucket (s3://bucket/prefix)"),
    ],
)
def test_a_lake_url_it_cannot_use_is_refused_not_taken_for_a_folder(url, says, tmp_path, monkeypatch):
    """Before, gs://bucket/lake became a local folder named 'gs:' and s3:// an IndexError."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LakeError, match=re.escape(says)):
        Lake(url)
    assert not any(tmp_path.iterdir())


def test_a_replaced_partition_is_read_again_and_a_big_table_is_not_cached(tmp_path, monkeypatch):
    """Whole-table reads and SQL views read a table's files once per process and keep them (by
    inode, modification time and size); a partition written again is read again, and a table larger
    than $ENVSCHED_LAKE_CACHE_MB is read from its files as before."""
    lake = Lake(tmp_path)
    for s in range(3):
        lake.write("rollouts", rollout_rows(s), step=s)
    query = "select step, count(*) as n, sum(reward) as r from rollouts group by 1 order by 1"
    first = lake.sql(query).to_pylist()
    assert [r["n"] for r in first] == [3, 3, 3] and lake.read("rollouts").num_rows == 9
    lake.write("rollouts", rollout_rows(1, 5), step=1)  # step 1 again, with five rollouts
    again = lake.sql(query).to_pylist()
    assert [r["n"] for r in again] == [3, 5, 3] and lake.read("rollouts").num_rows == 11
    assert Lake(tmp_path).read("rollouts").num_rows == 11  # another Lake object in the process too
    lake.delete_partition("rollouts", step=2)
    assert [r["step"] for r in lake.sql(query).to_pylist()] == [0, 1]
    for mb in ("0", "0.000001"):  # nothing cached: DuckDB reads the files themselves
        monkeypatch.setenv("ENVSCHED_LAKE_CACHE_MB", mb)
        assert [r["n"] for r in lake.sql(query).to_pylist()] == [3, 5]
        assert lake.read("rollouts", columns=["step"]).column_names == ["step"]
    for bad in ("lots", "-1", "nan"):
        monkeypatch.setenv("ENVSCHED_LAKE_CACHE_MB", bad)
        with pytest.raises(LakeError, match=r"\$ENVSCHED_LAKE_CACHE_MB: expected megabytes"):
            lake.sql(query)


def test_a_partition_read_again_comes_from_the_cache_until_its_file_changes(tmp_path, monkeypatch):
    """One partition read by several ops of a step (a pool's tasks, its graph) is parsed once per
    process and version of its file: a file replaced by another process (not through this lake, so
    this process cannot have forgotten it) is read again, and a missing one reads as empty."""
    import pyarrow.parquet as pq  # the other process's write, byte for byte

    import envsched_pipeline.lake as lake_module  # its Parquet reader, counted

    lake = Lake(tmp_path)
    lake.write("rollouts", rollout_rows(0), step=0)
    parsed = []
    real = lake_module.read_parquet_file
    monkeypatch.setattr(lake_module, "read_parquet_file", lambda *a, **k: parsed.append(1) or real(*a, **k))
    for columns in (None, ["reward"], ["task_id", "reward"], None):
        assert lake.read("rollouts", columns=columns, step=0).num_rows == 3
    assert Lake(tmp_path).read("rollouts", step=0, columns=["reward"]).num_rows == 3  # another Lake object
    assert len(parsed) == 1, parsed
    path = tmp_path / "rollouts" / "step=0" / "part-0.parquet"
    table = real(path)
    other = tmp_path / "other.parquet"
    pq.write_table(table.slice(0, 2), other)
    os.replace(other, path)  # as another process's atomic write
    assert lake.read("rollouts", step=0).num_rows == 2 and len(parsed) == 2
    path.unlink()
    assert lake.read("rollouts", step=0).num_rows == 0
    monkeypatch.setenv("ENVSCHED_LAKE_CACHE_MB", "0")  # the cache off: every read parses the file
    lake.write("rollouts", rollout_rows(0), step=0)
    for _ in range(2):
        assert lake.read("rollouts", step=0, columns=["reward"]).column_names == ["reward"]
    assert len(parsed) == 4, parsed


def test_reading_the_lake_loads_neither_pyarrows_dataset_layer_nor_pandas(tmp_path):
    """A process that only reads the lake (every `envsched` command, a neural step's trainer
    process) reads Parquet files without pyarrow's dataset layer, which imports pandas: ~0.4 s of
    its start."""
    import subprocess  # a fresh process: what it imports is the question
    import sys  # the same interpreter

    lake = Lake(tmp_path)
    lake.write("rollouts", rollout_rows(0), step=0)
    lake.write("rollouts", rollout_rows(1), step=1)
    code = (
        "import sys; from envsched_pipeline.lake import Lake; lake = Lake(sys.argv[1]); "
        "n = [lake.read('rollouts', step=0).num_rows, lake.read('rollouts', columns=['reward']).num_rows, "
        "lake.read('rollouts', step=7).num_rows, lake.sql('select count(*) n from rollouts').column('n')[0].as_py()]; "
        "print(n, [m for m in ('pandas', 'pyarrow.dataset') if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[3, 6, 0, 6] []"


def test_a_snapshot_reads_each_thing_once_and_forgets_on_its_own_writes(tmp_path, monkeypatch):
    """Inside ``Lake.snapshot`` this thread reads each object, listing and partition once; a write
    through the lake forgets what was read; other Lake objects' writes are not seen until the block
    ends, and other threads never see the snapshot."""
    import threading  # a second thread reads beside the snapshot

    lake = Lake(tmp_path)
    lake.write("rollouts", rollout_rows(0), step=0)
    lake.write_json("run.json", {"v": 1})
    reads = []
    store = type(lake.store)
    for name in ("get", "exists", "glob", "read_partition"):
        real = getattr(store, name)
        monkeypatch.setattr(
            store,
            name,
            lambda self, *a, _real=real, _name=name, **k: reads.append(_name) or _real(self, *a, **k),
        )

    def ask():
        return (
            lake.read_json("run.json"),
            lake.exists("run.json"),
            lake.steps("rollouts"),
            lake.read("rollouts", step=0, columns=["reward"]).num_rows,
            lake.has("rollouts", step=0),
        )

    other = Lake(tmp_path)  # another writer in the same process
    with lake.snapshot():
        assert ask() == ({"v": 1}, True, [0], 3, True)
        first = list(reads)
        assert ask() == ask()  # the same answers, read from the store no more
        assert reads == first == ["get", "glob", "read_partition"]  # has(): the partition was read
        other.write_json("run.json", {"v": 2})
        other.write("rollouts", rollout_rows(1), step=1)
        assert ask()[0] == {"v": 1} and ask()[2] == [0]  # the snapshot's view
        seen = []
        reader = threading.Thread(target=lambda: seen.append(ask()))
        reader.start()
        reader.join(timeout=30)
        assert seen and seen[0][0] == {"v": 2} and seen[0][2] == [0, 1]  # another thread: the lake now
        with lake.snapshot():  # nested: the same snapshot
            assert ask()[0] == {"v": 1}
        lake.write_json("halt.json", {})  # a write through this lake forgets what was read
        assert ask()[0] == {"v": 2} and ask()[2] == [0, 1]
    other.write_json("run.json", {"v": 3})
    assert ask()[0] == {"v": 3}  # after the block: the lake as it is


def test_a_corrupt_file_is_named_on_the_cached_path_too(tmp_path):
    lake = Lake(tmp_path)
    lake.write("rollouts", rollout_rows(0), step=0)
    lake.write("rollouts", rollout_rows(1), step=1)
    bad = tmp_path / "rollouts" / "step=1" / "part-0.parquet"
    bad.write_bytes(b"not parquet at all")
    with pytest.raises(LakeError, match=r"step=1/part-0.parquet: cannot read Parquet"):
        lake.sql("select count(*) from rollouts")
    with pytest.raises(LakeError, match=r"step=1/part-0.parquet: cannot read Parquet"):
        lake.read("rollouts")
    assert lake.sql("select count(*) as n from tasks").column("n").to_pylist() == [0]  # other tables answer


def test_the_per_step_plot_has_a_panel_per_measure(tmp_path):
    """The lake benchmark's plot: one panel per measure side by side, a line per mode."""
    from PIL import Image

    from envsched_pipeline.analysis.plots import per_step_plot

    one = per_step_plot({"requests": {"before": [3, 5, 7], "now": [3, 3, 3]}}, tmp_path / "one.png")
    two = per_step_plot(
        {
            "requests": {"before": [3, 5, 7], "now": [3, 3, 3]},
            "wall s": {"before": [1, 2, 3], "now": [1, 1, 1]},
        },
        tmp_path / "two.png",
    )
    with Image.open(one) as a, Image.open(two) as b:
        assert a.format == b.format == "PNG" and b.size[0] == 2 * a.size[0] and a.size[1] == b.size[1]


def test_a_partition_this_process_writes_again_is_read_again_even_with_the_same_version(
    tmp_path, monkeypatch
):
    """A file's version (inode, modification time, size) can repeat: timestamps tick in
    milliseconds and a freed inode is reused. A partition this process writes is forgotten, so it
    is read again even when its listed version did not change."""
    import envsched_pipeline.lake as lake_module

    real = lake_module._LocalStore.objects

    def same_versions(self, folder, name):  # every rewrite lands on the same inode, tick and size
        return {rel: ("v", size) for rel, (_, size) in real(self, folder, name).items()}

    monkeypatch.setattr(lake_module._LocalStore, "objects", same_versions)
    lake = Lake(tmp_path)
    lake.write("rollouts", rollout_rows(0), step=0)
    assert lake.sql("select count(*) as n from rollouts").column("n").to_pylist() == [3]
    lake.write("rollouts", rollout_rows(0, 6), step=0)
    assert lake.sql("select count(*) as n from rollouts").column("n").to_pylist() == [6]
    assert lake.read("rollouts").num_rows == 6
