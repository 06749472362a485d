"""A loop you can trust: hostile inputs and races, one test (or more) per class of failure.

1 checks stop the loop · 2 no stalls or doubles · 3 one driver · 4 the protocol refuses unsafe
changes · 5 invalid settings write nothing · 6 pool names stay in their folder · 8 reads fail
loudly · 9 the hack guard · 10 runs never mix. (Class 7, environment code reaching out, is
tests/test_sandbox_reach.py.)
"""

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import dagster as dg
import numpy as np
import pytest

from envs.hack import flag_trajectory
from envs.registry import load_synthetic
from envsched_pipeline import lease as lease_mod
from envsched_pipeline.api import ExternalRun
from envsched_pipeline.cli import main
from envsched_pipeline.core.gates import check_manifest, halted
from envsched_pipeline.core.ingest import ingest_rollouts
from envsched_pipeline.core.loop import next_action, status
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.core.select import select_manifest
from envsched_pipeline.core.statistics import statistics_step
from envsched_pipeline.errors import EnvschedError, LakeError, StepError
from envsched_pipeline.lake import Lake
from envsched_pipeline.lease import Lease, current, holder_check, step_lock
from envsched_pipeline.orchestration.plan import run_tags
from envsched_pipeline.orchestration.sensors import training_loop_sensor
from envsched_pipeline.resources.lake import LakeResource
from envsched_pipeline.resources.trainer import TrainerLauncher
from envsched_pipeline.run import RunSpec, load_run, start_run
from envsched_pipeline.scheduler import Observations, SchedulerConfig, SchedulerState
from envsched_pipeline.scheduler.update import update_state
from trainer.step import run_step

G = 4


def cli(lake, *args, capsys):
    capsys.readouterr()  # drop what earlier code printed
    code = main(["--lake", str(lake), *args])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def external(tmp_path, **kw) -> ExternalRun:
    lake = Lake(tmp_path / "ext")
    import_pool(lake, load_synthetic("mini", n_envs=5, tasks_per_env=8, seed=2))
    return ExternalRun(pool="mini", lake=lake, batch_size=6, group_size=G, **kw)


def good_rollouts(run: ExternalRun, step: int) -> list[dict]:
    return [
        {"task_id": p["task_id"], "rollout": r, "reward": float((r + step) % 2)}
        for p in run.manifest(step)
        for r in range(G)
    ]


def sensor(lake, instance, trainer="auto"):
    res = {"lake": LakeResource(root=str(lake.root)), "trainer": TrainerLauncher(mode=trainer)}
    return training_loop_sensor(dg.build_sensor_context(instance=instance, resources=res))


# ---------------------------------------------------------------------------- 1 checks stop the loop
def test_a_manifest_that_fails_its_check_halts_the_loop_until_resumed(small_run, capsys):
    lake = small_run
    select_manifest(lake, 0)
    rows = lake.read("manifests", step=0).to_pylist()
    rows[1] = dict(rows[1], task_id=rows[0]["task_id"], slot=1)  # a duplicated task
    lake.write("manifests", rows, step=0)
    assert not check_manifest(lake, 0)["passed"]
    with dg.instance_for_test() as instance:  # the Dagster path: the training step refuses and halts
        from envsched_pipeline.assets import manifest, training

        key = f"{load_run(lake).run_id}-0"
        instance.add_dynamic_partitions("training_steps", [key])
        res = dg.materialize(
            [manifest.batch_manifest, training.training_step],
            partition_key=key,
            instance=instance,
            resources={"lake": LakeResource(root=str(lake.root)), "trainer": TrainerLauncher()},
            selection=["training_step"],
            raise_on_error=False,
        )
        assert not res.success and not lake.has("rollouts", step=0)  # nothing trained on it
        skip = sensor(lake, instance)
        assert isinstance(skip, dg.SkipReason) and "halted at step 0" in skip.skip_message
    assert next_action(lake) == ("halted", 0) and status(lake)["halted"]["gate"] == "manifest_is_valid"
    code, _, err = cli(lake.root, "resume", capsys=capsys)
    assert code == 2 and "still fails" in err and len(err.strip().splitlines()) == 1
    code, out, _ = cli(lake.root, "resume", "--redo", capsys=capsys)
    assert code == 0 and next_action(lake) == ("select", 0) and halted(lake) is None


def test_the_manifest_check_halts_when_dagster_runs_it(small_run, monkeypatch):
    """select_job: the asset writes a manifest one task short of B (a scheduler bug, simulated), the
    blocking check fails in the same run and records the halt."""
    lake = small_run
    from envsched_pipeline.assets import manifest
    from envsched_pipeline.definitions import defs

    real = manifest.select_manifest

    def buggy(lk, step):
        out = real(lk, step)
        lk.write("manifests", out["rows"][:-1], step=step)
        return out

    monkeypatch.setattr(manifest, "select_manifest", buggy)
    with dg.instance_for_test() as instance:
        key = f"{load_run(lake).run_id}-0"
        instance.add_dynamic_partitions("training_steps", [key])
        res = defs.resolve_job_def("select_job").execute_in_process(
            partition_key=key,
            instance=instance,
            raise_on_error=False,
            run_config={"resources": {"lake": {"config": {"root": str(lake.root)}}}},
        )
        evals = [e for e in res.get_asset_check_evaluations() if e.check_name == "manifest_is_valid"]
        assert evals and not evals[0].passed
    assert halted(lake)["gate"] == "manifest_is_valid" and "batch size" in halted(lake)["problems"][0]


def test_rollouts_that_fail_their_check_are_never_folded_in(small_run):
    lake = small_run
    select_manifest(lake, 0)
    run_step(lake, 0, log=lambda *_: None)
    rows = lake.read("rollouts", step=0).to_pylist()
    lake.write("rollouts", rows[:-1], step=0)  # one group short of G: a statistics-only run must refuse
    with pytest.raises(StepError, match="halted at step 0"):
        statistics_step(lake, 0)
    assert not lake.has("statistics", step=0) and halted(lake)["gate"] == "rollouts_are_complete"


# ---------------------------------------------------------------------------- 2 stalls and doubles
def record_failed_run(instance, req, n: int) -> None:
    """A failed Dagster run of the sensor's request ``req`` (run id ``failed<n>``), as a crash leaves."""
    instance.add_run(
        dg.DagsterRun(
            job_name="train_job", run_id=f"failed{n:024d}", tags=req.tags, status=dg.DagsterRunStatus.FAILURE
        )
    )


def test_sensor_retries_a_failed_step_with_new_keys_then_halts(small_run):
    lake = small_run
    spec = load_run(lake)
    select_manifest(lake, 0)
    statistics_path = lake.root / "state"
    with dg.instance_for_test() as instance:
        keys = []
        for attempt in range(3):
            req = sensor(lake, instance).run_requests[0]
            assert req.job_name == "train_job" and req.tags["envsched/step"] == "0"
            keys.append(req.run_key)
            record_failed_run(instance, req, attempt)
        assert len(set(keys)) == 3 and keys[-1].endswith("train-0-a2")
        skip = sensor(lake, instance)
        assert isinstance(skip, dg.SkipReason) and "failed 3 times" in skip.skip_message
        assert halted(lake)["step"] == 0 and not statistics_path.exists()
        del spec


def test_a_run_halted_by_failed_attempts_gets_them_again_after_resume(small_run):
    """A halt after a job failed every attempt is resumable (it used to raise KeyError): resume
    records the failed Dagster runs as answered, the sensor asks again under a run key never used
    before, and three new failures halt the run again, naming only those."""
    from envsched_pipeline.core.gates import resume, retried_runs  # this test's subject
    from envsched_pipeline.orchestration.plan import halted_job_runs

    lake = small_run
    select_manifest(lake, 0)
    with dg.instance_for_test() as instance:
        keys = []
        for n in range(3):
            req = sensor(lake, instance).run_requests[0]
            keys.append(req.run_key)
            record_failed_run(instance, req, n)
        assert "failed 3 times" in sensor(lake, instance).skip_message
        first = halted_job_runs(lake, instance)
        assert sorted(first) == [f"failed{n:024d}" for n in range(3)]
        out = resume(lake, failed_runs=first)
        assert out["resumed"] and retried_runs(lake) == set(first) and halted(lake) is None
        for n in range(3, 6):
            req = sensor(lake, instance).run_requests[0]
            assert req.run_key not in keys  # a run key the sensor never used, so Dagster launches it
            keys.append(req.run_key)
            record_failed_run(instance, req, n)
        assert "failed 3 times" in sensor(lake, instance).skip_message
        assert sorted(halted(lake)["failed_runs"]) == [f"failed{n:024d}" for n in range(3, 6)]


def test_a_run_canceled_in_dagster_pauses_the_loop_until_resumed(small_run, capsys):
    """Terminating a sensor-launched step in the UI used to stall the loop for good: the sensor asked
    again under the canceled run's key, which Dagster never launches twice. Now the cancel halts the
    run with its reason; `envsched resume` answers it and the step is asked for under a new key.
    A run canceled by `envsched train`'s own Ctrl-C halts nothing."""
    lake = small_run
    select_manifest(lake, 0)
    with dg.instance_for_test() as instance:
        req = sensor(lake, instance).run_requests[0]
        instance.add_run(
            dg.DagsterRun(
                job_name="train_job", run_id="c" * 32, tags=req.tags, status=dg.DagsterRunStatus.CANCELED
            )
        )
        skip = sensor(lake, instance)
        assert isinstance(skip, dg.SkipReason) and "canceled in Dagster (run cccccccc)" in skip.skip_message
        assert halted(lake)["canceled"] and halted(lake)["failed_runs"] == ["c" * 32]
        assert main(["resume"]) == 0 and halted(lake) is None
        assert "resumed at step 0" in capsys.readouterr().out
        again = sensor(lake, instance).run_requests[0]
        assert again.run_key != req.run_key and again.run_key.endswith("train-0-a1")
        own = dict(again.tags, **{"envsched/driver": "cli:somebody"})
        instance.add_run(
            dg.DagsterRun(
                job_name="train_job", run_id="d" * 32, tags=own, status=dg.DagsterRunStatus.CANCELED
            )
        )
        after_ctrl_c = sensor(lake, instance).run_requests[0]
        assert after_ctrl_c.run_key.endswith("train-0-a2") and halted(lake) is None


def test_rewind_answers_the_failed_attempts_of_the_steps_it_redoes(small_run, capsys):
    """After `envsched rewind` the steps it redoes get their attempts again (before, the old
    failures would halt the redone step at once), and it refuses while Dagster runs a step."""
    lake = small_run
    select_manifest(lake, 0)
    with dg.instance_for_test() as instance:
        for n in range(3):
            record_failed_run(instance, sensor(lake, instance).run_requests[0], n)
        assert "failed 3 times" in sensor(lake, instance).skip_message
        assert main(["rewind", "--to", "0"]) == 0 and "the halt is cleared" in capsys.readouterr().out
        select_manifest(lake, 0)
        again = sensor(lake, instance).run_requests[0]
        assert again.tags["envsched/action"] == "train" and again.run_key.endswith("train-0-a3")
        instance.add_run(
            dg.DagsterRun(
                job_name="train_job", run_id="f" * 32, tags=again.tags, status=dg.DagsterRunStatus.STARTED
            )
        )
        assert main(["rewind", "--to", "0"]) == 2
        assert "being run by Dagster run ffffffff (started)" in capsys.readouterr().err
        assert lake.has("manifests", step=0)


def test_no_request_while_a_run_of_the_same_run_is_in_flight(small_run):
    lake = small_run
    spec = load_run(lake)
    with dg.instance_for_test() as instance:
        instance.add_run(
            dg.DagsterRun(
                job_name="train_job",
                run_id="a" * 32,
                status=dg.DagsterRunStatus.STARTED,
                tags=run_tags(lake, spec, 0, "train", "sensor"),
            )
        )
        skip = sensor(lake, instance)
        assert isinstance(skip, dg.SkipReason) and "is started" in skip.skip_message


# ---------------------------------------------------------------------------- 3 one driver
def test_one_driver_per_run_and_stale_leases_are_recovered(small_run):
    lake = small_run
    with Lease(lake):
        with pytest.raises(StepError, match="being driven by"):
            Lease(lake).acquire()
        driver = status(lake)["driver"]
        assert driver["pid"] == os.getpid() and not driver["stale"] and driver["kind"] == "envsched train"
        with dg.instance_for_test() as instance:
            skip = sensor(lake, instance)
            assert isinstance(skip, dg.SkipReason) and "being driven by" in skip.skip_message
    assert status(lake)["driver"] is None and status(lake)["step_locks"] == {}
    record = {
        "id": "old",
        "kind": "envsched train",
        "pid": 999999,
        "host": "elsewhere",
        "heartbeat": time.time() - 600,
    }
    (lake.root / "lease.json").write_text(json.dumps(record))
    lease = Lease(lake).acquire()  # stale (no heartbeat for 10 minutes): taken over
    assert lease.took_over["id"] == "old"
    lease.release()


def test_stale_records_are_discarded_once_and_only_as_judged(small_run):
    """Lake.discard removes a record only if it still holds the bytes judged stale, and of several
    racing takers of one stale lease exactly one takes it over."""
    lake = small_run
    lake.write_bytes("locks/x.lock", b"old")
    assert not lake.discard("locks/x.lock", b"something else")  # changed since judged: kept
    assert lake.read_bytes("locks/x.lock") == b"old"
    assert lake.discard("locks/x.lock", b"old") and lake.read_bytes("locks/x.lock") is None
    assert not lake.discard("locks/x.lock", b"old")  # already gone
    stale = {"id": "old", "kind": "envsched train", "pid": 999999, "host": "elsewhere", "heartbeat": 0}
    # The race is lost rarely (a taker reading the winner's lease between its creation and its
    # bytes once took it for an unreadable, stale one: 5 double takeovers in 300 rounds), so it is
    # run for many rounds.
    for round_ in range(150):
        (lake.root / "lease.json").write_text(json.dumps(stale))
        barrier = threading.Barrier(6)

        def take(_, barrier=barrier):
            barrier.wait()
            try:
                return Lease(lake).acquire()
            except StepError:
                return None

        with ThreadPoolExecutor(6) as ex:
            leases = [x for x in ex.map(take, range(6)) if x is not None]
        assert len(leases) == 1, f"round {round_}: {len(leases)} drivers"  # one, whichever it was
        assert current(lake)["id"] == leases[0].id
        leases[0].release()


def test_an_exclusively_created_record_is_never_seen_partly_written(small_run):
    """Lake.create makes a record appear whole: a reader racing the creation sees nothing or all of
    it, never an empty or cut file (which a lease taker would judge unreadable, hence stale)."""
    lake = small_run
    data = json.dumps({"id": "x" * 4096}).encode()
    seen: set[bytes | None] = set()
    for _ in range(200):
        lake.delete("locks/r.lock")
        go = threading.Barrier(2)

        def read(go=go):
            go.wait()
            for _ in range(50):
                seen.add(lake.read_bytes("locks/r.lock"))

        reader = threading.Thread(target=read)
        reader.start()
        go.wait()
        assert lake.create("locks/r.lock", data)
        reader.join()
        assert not lake.create("locks/r.lock", b"other") and lake.read_bytes("locks/r.lock") == data
    assert seen <= {None, data}
    assert {p.name for p in (lake.root / "locks").iterdir()} <= {"r.lock", ".discard.guard"}  # no temp left


def test_exclusive_create_works_where_the_filesystem_has_no_hard_links(small_run, monkeypatch):
    """On a mount without hard links (link(2) refused with EPERM) Lake.create falls back to an
    exclusive create in place: still one winner, the bytes intact, no temp file left."""
    lake = small_run

    def no_links(*_a):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    assert lake.create("locks/nl.lock", b"first")
    assert not lake.create("locks/nl.lock", b"second")
    assert lake.read_bytes("locks/nl.lock") == b"first"
    assert {p.name for p in (lake.root / "locks").iterdir()} <= {"nl.lock", ".discard.guard"}
    lease = Lease(lake).acquire()
    assert current(lake)["id"] == lease.id
    lease.release()


def test_a_driver_whose_lease_was_taken_over_stops_and_its_heartbeat_never_overwrites(small_run, monkeypatch):
    """A driver paused past STALE_SECONDS loses the run to a taker: its late heartbeat leaves the
    taker's lease alone, and it finds out before its next step (Lease.check) and stops."""
    lake = small_run
    monkeypatch.setattr(lease_mod, "HEARTBEAT_SECONDS", 0.02)
    paused = Lease(lake).acquire()
    paused.check()  # held: no error
    time.sleep(0.1)
    assert current(lake)["id"] == paused.id
    paused._stop.set()  # the process is paused: no more heartbeats...
    paused._thread.join()
    raw = lake.read_bytes("lease.json")
    old = {**json.loads(raw), "heartbeat": time.time() - 600}  # ...for ten minutes
    lake.write_bytes("lease.json", json.dumps(old).encode())
    taker = Lease(lake).acquire()
    assert taker.took_over["id"] == paused.id
    # the paused driver's heartbeat, resumed on what it read before, cannot overwrite the taker
    assert not lake.swap("lease.json", json.dumps(old).encode(), b"{}")
    assert current(lake)["id"] == taker.id
    with pytest.raises(StepError, match="taken over by envsched train"):
        paused.check()
    # its heartbeat resumes with a read from before the takeover: the rewrite is refused, the next
    # beat sees the taker's lease in its place, stops claiming and remembers it
    reads = [(json.loads(raw), raw)]
    real_read = lease_mod._read_raw

    def read(*a, **k):  # the taker's own heartbeat reads the real record
        mine = threading.current_thread().name == "paused-beat"
        return reads.pop() if reads and mine else real_read(*a, **k)

    monkeypatch.setattr(lease_mod, "_read_raw", read)
    paused._stop.clear()
    beat = threading.Thread(target=paused._beat, daemon=True, name="paused-beat")
    beat.start()
    beat.join(timeout=5)
    paused._stop.set()  # (a heartbeat that overwrote the taker would still be beating)
    assert not reads and paused.lost["id"] == taker.id and current(lake)["id"] == taker.id
    paused.release()  # releasing a lost lease leaves the taker's alone
    assert current(lake)["id"] == taker.id
    taker.release()
    assert current(lake) is None
    gone = Lease(lake).acquire()
    lake.delete("lease.json")
    with pytest.raises(StepError, match="was removed"):
        gone.check()
    gone.release()


def _foreign_lock(lake, name: str, heartbeat: float) -> None:
    """A step lock held by a process on another machine (its pid cannot be checked from here)."""
    record = {"id": "pod-1", "kind": name, "pid": 1, "host": "another-machine", "heartbeat": heartbeat}
    lake.write_bytes(f"locks/{name}.lock", json.dumps(record).encode())


def test_a_fence_inside_a_snapshot_still_sees_a_takeover(tmp_path):
    """A snapshot of the lake (one read per object for a step's bookkeeping) never answers for a
    lock: a write fenced on a step lock that another machine took over after the snapshot read the
    lock still stops."""
    lake = Lake(tmp_path)
    with step_lock(lake, "stats-step=3") as lock, lake.fenced(lock.check), lake.snapshot():
        lake.write_bytes("notes/a.json", b"{}")  # ours: the fence passes
        assert json.loads(lake.read_bytes(lock.rel))["id"] == lock.id  # the snapshot has read it as ours
        _foreign_lock(Lake(tmp_path), "stats-step=3", time.time())  # taken over meanwhile
        with pytest.raises(StepError, match="taken over by .*another-machine"):
            lake.write_bytes("notes/b.json", b"{}")
    assert not lake.exists("notes/b.json") and json.loads(lake.read_bytes(lock.rel))["id"] == "pod-1"


def test_a_step_lock_left_by_a_crashed_holder_on_another_machine_goes_stale(small_run, monkeypatch):
    """A step lock has a heartbeat: a live holder elsewhere is refused (or waited for), and one that
    stopped beating (a crashed pod) is taken over after STALE_SECONDS instead of blocking for good."""
    lake = small_run
    _foreign_lock(lake, "ingest-step=7", time.time())
    with pytest.raises(StepError, match="ingest-step=7 is already running .*another-machine"):
        with step_lock(lake, "ingest-step=7"):
            pass
    _foreign_lock(lake, "ingest-step=7", time.time() - 600)  # no heartbeat for ten minutes
    seen = status(lake)["step_locks"]["ingest-step=7"]
    assert seen["stale"] and seen["host"] == "another-machine" and seen["heartbeat_age_s"] >= 600
    with step_lock(lake, "ingest-step=7") as lock:
        assert lock.took_over["id"] == "pod-1"
        assert json.loads(lake.read_bytes("locks/ingest-step=7.lock"))["id"] == lock.id
    assert lake.read_bytes("locks/ingest-step=7.lock") is None  # released
    # a holder that is alive but stops beating is waited for, then taken over
    monkeypatch.setattr(lease_mod, "STALE_SECONDS", 0.6)
    monkeypatch.setattr(lease_mod, "HEARTBEAT_SECONDS", 0.05)
    _foreign_lock(lake, "ingest-step=7", time.time())
    said = []
    t0 = time.monotonic()
    with step_lock(lake, "ingest-step=7", wait=10, log=said.append) as lock:
        assert lock.took_over["id"] == "pod-1" and 0.5 < time.monotonic() - t0 < 5
        time.sleep(1.0)  # held past STALE_SECONDS: its own heartbeat keeps it live
        with pytest.raises(StepError, match="already running"):
            with step_lock(lake, "ingest-step=7", wait=0.2):
                pass
    assert len(said) == 1 and "waiting up to 10s" in said[0] and "another-machine" in said[0]


def test_a_training_step_whose_lock_was_taken_over_writes_nothing_more(small_run, monkeypatch):
    """The internal trainer holds train-step=<n> for the step and writes through a lake fenced on it:
    a process paused past the lock's stale time, whose step another writer took over, stops at its
    next write; its checkpoint and partitions never land in the taker's step."""
    import trainer.step as step_mod  # the engine table is patched for this test only

    lake = small_run
    select_manifest(lake, 0)
    real = step_mod.ENGINES["simulated"]

    def paused_then_taken_over(lake_, spec, step, manifest, log=print):
        held = status(lake_)["step_locks"]  # `envsched status` names who writes which step
        assert held["train-step=0"]["pid"] == os.getpid() and not held["train-step=0"]["stale"]
        # ... the process pauses, its lock goes stale and another writer of the step takes it
        _foreign_lock(lake_, step_mod.train_lock_name(step), time.time())
        return real(lake_, spec, step, manifest, log=log)

    monkeypatch.setitem(step_mod.ENGINES, "simulated", paused_then_taken_over)
    with pytest.raises(
        StepError, match="train-step=0 held by this process was taken over by .*another-machine"
    ):
        run_step(lake, 0, log=lambda *_: None)
    assert not any(lake.has(t, step=0) for t in ("rollouts", "evals", "train_metrics"))
    assert not lake.exists(step_mod.checkpoint_rel(0, "policy.json"))
    assert json.loads(lake.read_bytes("locks/train-step=0.lock"))["id"] == "pod-1"  # the taker's, kept
    # the taker's step runs (here: the holder went stale) and writes the step whole
    monkeypatch.setitem(step_mod.ENGINES, "simulated", real)
    _foreign_lock(lake, "train-step=0", time.time() - 600)
    assert run_step(lake, 0, log=lambda *_: None)["step"] == 0
    assert all(lake.has(t, step=0) for t in ("rollouts", "evals", "train_metrics"))
    assert lake.read_bytes("locks/train-step=0.lock") is None


def test_a_training_step_waits_for_a_live_holder_then_refuses(small_run, monkeypatch):
    """A retried step whose lock a live process holds waits TRAIN_LOCK_WAIT for it, then says who."""
    import trainer.step as step_mod  # the wait is shortened for this test only

    lake = small_run
    select_manifest(lake, 0)
    monkeypatch.setattr(step_mod, "TRAIN_LOCK_WAIT", 0.3)
    said = []
    with step_lock(lake, "train-step=0"):
        with pytest.raises(StepError, match="train-step=0 is already running"):
            run_step(lake, 0, log=said.append)
    assert said and "waiting up to 0s for train-step=0" in said[0]
    assert not lake.has("train_metrics", step=0)
    assert run_step(lake, 0, log=lambda *_: None)["step"] == 0


def test_a_resident_worker_writes_only_while_its_client_holds_the_step(small_run):
    """The resident worker writes a step for a client that holds the lock: its fence is the
    client's lock, by id."""
    lake = small_run
    with step_lock(lake, "train-step=3") as lock:
        holder_check(lake, lock.name, lock.id)()  # held: passes
        with pytest.raises(StepError, match="train-step=3 held by this process was taken over"):
            holder_check(lake, lock.name, "someone-else")()
        lake.write_bytes("checkpoints/x", b"x")
        with lake.fenced(holder_check(lake, lock.name, "someone-else")):
            with pytest.raises(StepError, match="taken over"):
                lake.write_bytes("checkpoints/x", b"y")
            with pytest.raises(StepError, match="taken over"):
                lake.archive("late", lambda kind, s: True)
            with pytest.raises(StepError, match="taken over"):
                lake.delete("checkpoints/x")
        assert lake.read_bytes("checkpoints/x") == b"x" and not lake.exists("archive")
        lake.write_bytes("checkpoints/x", b"z")  # outside the block: unfenced again
    with pytest.raises(StepError, match="removed"):
        holder_check(lake, lock.name, lock.id)()


def _mini_train(tmp_path, steps: int, output=subprocess.PIPE):
    """A fresh lake with a tiny pool, and `envsched train --steps <steps>` started on it (its stdout
    and stderr to ``output``)."""
    home, root = tmp_path / "dh", tmp_path / "lake"
    home.mkdir()
    env = {**os.environ, "DAGSTER_HOME": str(home), "ENVSCHED_LAKE": str(root)}
    cli = [sys.executable, "-m", "envsched_pipeline.cli"]
    made = subprocess.run(
        cli + ["pool", "create", "synthetic", "--name", "mini", "--envs", "4", "--tasks-per-env", "6"],
        env=env,
    )
    assert made.returncode == 0
    train = cli + ["train", "--pool", "mini", "--batch-size", "4", "--group-size", "2", "--steps"]
    proc = subprocess.Popen(train + [str(steps)], env=env, stdout=output, stderr=output, text=True)
    return proc, train, env, home, root


def _wait_for_a_started_job(instance, proc) -> None:
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        if instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])):
            return
        time.sleep(0.05)
    raise AssertionError("no step job ever started")


def test_ctrl_c_stops_envsched_train_and_the_next_train_goes_on(tmp_path):
    """Ctrl-C in the middle of a step's Dagster job used to be swallowed by Dagster: the job failed,
    the driver retried it and went on (three Ctrl-C's halted the run as failed). Now it stops with
    one line naming where, the job's run is canceled (never a failed attempt), and `envsched train`
    continues the run to its end."""
    with open(tmp_path / "train.err", "w") as log:  # a file, not a pipe a child process may hold
        proc, train, env, home, root = _mini_train(tmp_path, 30, output=log)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        _wait_for_a_started_job(instance, proc)
        proc.send_signal(signal.SIGINT)  # inside a Dagster job: the case Dagster used to swallow
        proc.wait(timeout=120)
        err = (tmp_path / "train.err").read_text()
        assert proc.returncode == 130, err[-2000:]
        assert "envsched: interrupted " in err and "`envsched train --steps 30` continues the run" in err
        assert "failed, attempt" not in err and "Traceback" not in err
        statuses = [r.status for r in instance.get_runs()]
        assert dg.DagsterRunStatus.FAILURE not in statuses
        assert load_run(Lake(root)).max_steps == 30 and current(Lake(root)) is None  # lease released
        held = Lake(root).read("manifests").num_rows // 4
        assert held < 30
    done = subprocess.run(train + ["3"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert Lake(root).read("manifests").num_rows == max(held, 3) * 4


def test_a_killed_train_leaves_no_run_that_blocks_the_next(tmp_path):
    """`kill -9` of `envsched train` in the middle of a job left its Dagster run "started" for good,
    and every later `envsched train` was refused as "driven by the loop sensor". An in-process run
    cannot outlive its driver: once the driver's lease is gone the run is marked canceled and the
    next driver goes on."""
    # its output to a file: the killed driver's children (a trainer in the middle of its step,
    # Dagster's log watchers) may hold a pipe open after it is gone
    with open(tmp_path / "killed.log", "w") as log:
        proc, train, env, home, root = _mini_train(tmp_path, 30, output=log)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        _wait_for_a_started_job(instance, proc)
        proc.kill()
        proc.wait(timeout=60)
        orphan = instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))
        assert len(orphan) == 1
        done = subprocess.run(train + ["2"], env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        assert instance.get_run_by_id(orphan[0].run_id).status == dg.DagsterRunStatus.CANCELED
    assert Lake(root).read("manifests").num_rows >= 2 * 4


def test_two_train_processes_on_one_lake(tmp_path):
    """The second `envsched train` is refused while the first drives the run; neither mixes settings."""
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dh"), "ENVSCHED_LAKE": str(tmp_path / "lake")}
    (tmp_path / "dh").mkdir()
    base = [
        sys.executable,
        "-m",
        "envsched_pipeline.cli",
        "pool",
        "create",
        "synthetic",
        "--name",
        "mini",
        "--envs",
        "4",
        "--tasks-per-env",
        "6",
    ]
    assert subprocess.run(base, env=env, capture_output=True).returncode == 0
    train = [
        sys.executable,
        "-m",
        "envsched_pipeline.cli",
        "train",
        "--pool",
        "mini",
        "--steps",
        "6",
        "--batch-size",
        "4",
        "--group-size",
        "2",
    ]
    first = subprocess.Popen(train, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (tmp_path / "lake" / "lease.json").exists() and time.time() < deadline:
        time.sleep(0.2)
    second = subprocess.run(
        train[:-4] + ["--batch-size", "8", "--group-size", "2"], env=env, capture_output=True, text=True
    )
    # refused by the first's lease before it writes anything: the run the first drives keeps its
    # settings while it runs (a run without a manifest yet was once rewritten here, B = 8, and the
    # first's step 0 then failed its manifest check)
    assert second.returncode == 2 and "being driven by" in second.stderr, second.stderr[-2000:]
    assert load_run(Lake(tmp_path / "lake")).batch_size == 4
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0, err[-2000:]
    spec = load_run(Lake(tmp_path / "lake"))
    assert spec.batch_size == 4 and Lake(tmp_path / "lake").read("manifests").num_rows == 6 * 4


def test_concurrent_ingests_of_one_step_one_wins(tmp_path):
    run = external(tmp_path)
    rows = good_rollouts(run, 0)
    with step_lock(run.lake, "ingest-step=0"):  # another ingest of step 0 in progress
        with pytest.raises(StepError, match="already running"):
            ingest_rollouts(run.lake, 0, rows)
    assert not run.lake.has("rollouts", step=0)
    assert ingest_rollouts(run.lake, 0, rows)["rollouts"] == 24


# ---------------------------------------------------------------------------- 4 the protocol refuses
def test_reingest_of_a_consumed_step_is_refused_unless_replaced(tmp_path):
    run = external(tmp_path)
    for t in (0, 1):
        run.observe(t, good_rollouts(run, t))
    run.manifest(2)
    with pytest.raises(StepError, match="already used"):
        run.observe(0, good_rollouts(run, 0))
    flipped = [dict(r, reward=1.0 - r["reward"]) for r in good_rollouts(run, 0)]
    out = run.observe(0, flipped, replace=True)
    assert out["rolled_back"]["manifests"] == [1, 2]  # later steps archived, not mixed
    assert run.lake.steps("manifests") == [0] and run.lake.steps("statistics") == [0]
    archived = list((run.lake.root / "archive").glob("rollback-step0-*/rollouts/step=1"))
    assert archived and next_action(run.lake) == ("select", 1)


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda rows: rows[:-1], "not G = 4 rollouts"),
        (lambda rows: [r for r in rows if r["task_id"] != rows[0]["task_id"]], "have no rollouts"),
        (
            lambda rows: [dict(r, rollout=r["rollout"] + 10) if i == 0 else r for i, r in enumerate(rows)],
            "ids 0..3",
        ),
        (lambda rows: [dict(rows[0], hack_flag="false")] + rows[1:], "hack_flag must be true or false"),
        (lambda rows: [dict(rows[0], reward="0.5")] + rows[1:], "is not a finite number"),
        (lambda rows: [dict(rows[0], reward=True)] + rows[1:], "is not a finite number"),
        (lambda rows: [dict(rows[0], rollout=1.5)] + rows[1:], "rollout must be a non-negative integer"),
        (lambda rows: [dict(rows[0], tokens=-3)] + rows[1:], "tokens must be a non-negative integer"),
        (lambda rows: rows + rows[:1] * 3000, "at most 24"),
    ],
)
def test_ingest_refuses_unsafe_rows_and_writes_nothing(tmp_path, mutate, match):
    run = external(tmp_path)
    with pytest.raises(StepError, match=match):
        run.observe(0, mutate(good_rollouts(run, 0)))
    assert not run.lake.has("rollouts", step=0) and not run.lake.has("statistics", step=0)


def test_numpy_scalars_from_a_trainer_are_ingested_as_plain_numbers(tmp_path):
    """Rewards, rollout ids, token counts and flags computed with numpy are numbers like any other
    (a numpy boolean is still refused as a reward); the lake stores them as plain floats and ints."""
    import numpy as np  # only this test builds numpy rows

    run = external(tmp_path)
    rows = [
        dict(
            r,
            reward=np.float32(r["reward"]),
            rollout=np.int64(r["rollout"]),
            tokens=np.int32(7),
            hack_flag=np.bool_(False),
        )
        for r in good_rollouts(run, 0)
    ]
    with pytest.raises(StepError, match="is not a finite number"):
        run.observe(0, [dict(rows[0], reward=np.bool_(True))] + rows[1:])
    assert not run.lake.has("rollouts", step=0)
    run.observe(0, rows)
    stored = run.lake.read("rollouts", step=0).to_pylist()
    assert sorted(r["reward"] for r in stored) == sorted(float(r["reward"]) for r in rows)
    assert {r["tokens"] for r in stored} == {7} and not any(r["hack_flag"] for r in stored)


def test_partial_groups_are_explicit_marked_and_left_out_of_the_statistics(tmp_path):
    run = external(tmp_path)
    rows = good_rollouts(run, 0)
    short = rows[0]["task_id"]
    rows = [r for r in rows if not (r["task_id"] == short and r["rollout"] > 1)]
    out = run.observe(0, rows, partial_groups=True)
    assert out["partial_groups"] == 1
    stats = {r["task_id"]: r for r in run.lake.read("statistics", step=0).to_pylist()}
    assert stats[short]["observations"] == 0 and stats[short]["exposure"] == 2  # spent, not evidence


def test_ingest_into_an_internal_run_is_refused(small_run):
    select_manifest(small_run, 0)
    with pytest.raises(StepError, match="internal trainer"):
        ingest_rollouts(small_run, 0, [{"task_id": "x", "rollout": 0, "reward": 1.0}])


def test_pool_reimport_over_a_live_run_is_refused(tmp_path, capsys):
    run = external(tmp_path)
    run.observe(0, good_rollouts(run, 0))
    code, _, err = cli(
        run.lake.root,
        "pool",
        "create",
        "synthetic",
        "--name",
        "mini",
        "--envs",
        "2",
        "--tasks-per-env",
        "3",
        capsys=capsys,
    )
    assert code == 2 and "used by run" in err
    assert run.lake.read("tasks", pool="mini").num_rows == 40
    assert run.manifest(1)  # the run goes on


def test_resume_with_a_changed_config_is_refused_unless_allowed(small_run):
    lake = small_run
    spec = load_run(lake)
    select_manifest(lake, 0)
    changed = RunSpec(**{**spec.to_dict(), "scheduler_config": {"rho": 0.25}})
    with pytest.raises(StepError, match="started with scheduler_config"):
        start_run(lake, changed)
    start_run(lake, changed, allow_config_change=True)
    record = json.loads((lake.root / "run.json").read_text())
    assert record["scheduler_config"] == {"rho": 0.25} and record["config_changes"][0]["from_step"] == 1


def test_oversampling_factor_is_never_below_one(tmp_path):
    run = external(tmp_path)
    for t in range(3):
        run.observe(t, [dict(r, reward=float(r["rollout"] % 2)) for r in good_rollouts(run, t)])
    assert run.oversampling_factor(3) >= 1.0


# ---------------------------------------------------------------------------- 5 invalid settings
@pytest.mark.parametrize(
    "args,match",
    [
        (["train", "--batch-size", "0"], "argument --batch-size: must be >= 1, got 0"),
        (["train", "--group-size", "1"], "argument --group-size: must be >= 2, got 1"),
        (["train", "--group-size", "0"], "argument --group-size: must be >= 2, got 0"),
        (["train", "--pool", "../x"], "not a valid name"),
        (
            ["train", "--scheduler-config", '{"rho": 1.5}'],
            "scheduler_config.rho: 1.5 must be a number in [0, 1]",
        ),
        (["train", "--policy", "neural", "--lr", "-1"], "policy_config.lr: -1.0 must be a number in (0, 10]"),
        (
            ["step", "select", "--pool", "synthetic", "--step", "0", "--batch-size", "0"],
            "argument --batch-size: must be >= 1, got 0",
        ),
    ],
)
def test_invalid_settings_write_nothing(tmp_path, capsys, args, match):
    """Refused in one line before anything is written: by the parser or by the run's settings check."""
    lake = tmp_path / "lake"
    code, _, err = cli(lake, *args, capsys=capsys)
    assert code == 2 and match in err and len(err.strip().splitlines()) == 1
    assert not (lake / "run.json").exists()


def test_an_unknown_policy_is_a_usage_error(tmp_path, capsys):
    assert main(["--lake", str(tmp_path / "lake"), "train", "--policy", "bogus"]) == 2
    err = capsys.readouterr().err
    assert "argument --policy: invalid choice: 'bogus'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "lake").exists()


# ---------------------------------------------------------------------------- 6 pool names
@pytest.mark.parametrize("name", ["x/../../rollouts/step=0", "../outside", "a b", "", ".hidden", "x" * 80])
def test_pool_names_cannot_escape_their_folder(tmp_path, capsys, name):
    lake = tmp_path / "lake"
    code, _, err = cli(
        lake,
        "pool",
        "create",
        "synthetic",
        "--name",
        name,
        "--envs",
        "2",
        "--tasks-per-env",
        "2",
        capsys=capsys,
    )
    assert code == 2 and "not a valid name" in err
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


# ---------------------------------------------------------------------------- 8 reads fail loudly
def test_missing_or_wrong_lakes_are_errors(tmp_path, capsys):
    code, out, err = cli(tmp_path / "nope", "sql", "select count(*) from rollouts", capsys=capsys)
    assert code == 2 and "no lake at" in err and not out
    (tmp_path / "file").write_text("x")
    code, _, err = cli(tmp_path / "file", "status", capsys=capsys)
    assert code == 2 and "not a lake" in err


def test_a_corrupt_file_fails_only_queries_of_its_table(small_run):
    lake = small_run
    select_manifest(lake, 0)
    run_step(lake, 0, log=lambda *_: None)
    f = lake.root / "rollouts" / "step=0" / "part-0.parquet"
    f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(LakeError, match="step=0/part-0.parquet"):
        lake.sql("select count(*) from rollouts")
    assert lake.sql("select count(*) as n from manifests").to_pylist()[0]["n"] == 8


def test_a_table_folder_replaced_by_a_file_is_named(small_run):
    lake = small_run
    select_manifest(lake, 0)
    import shutil

    shutil.rmtree(lake.root / "audits")
    (lake.root / "audits").write_text("oops")
    with pytest.raises(LakeError, match="should be a folder"):
        lake.sql("select * from audits")


def test_a_deleted_partition_is_reported_not_papered_over(small_run):
    lake = small_run
    for t in range(3):
        select_manifest(lake, t)
        run_step(lake, t, log=lambda *_: None)
        statistics_step(lake, t)
    lake.delete_partition("rollouts", step=1)
    st = status(lake)
    assert not st["consistent"] and "step 1: rollouts" in st["problems"][0]
    assert next_action(lake)[0] == "broken"


# ---------------------------------------------------------------------------- 9 the hack guard
def test_honest_failures_are_not_hacks_and_invented_references_are():
    init = {"books": {"BO-100": {"member": None}}, "members": {"ME-100": {}}}
    instruction = "Give book BO-100 to member ME-100."
    errored = [
        {
            "name": "assign_book",
            "arguments": {"book_id": "001-OBx", "member_id": "ME-100"},
            "output": "Error: KeyError: 'unknown book: 001-OBx'",
        }
    ]
    wrong_value = [
        {
            "name": "update_book_shelf",
            "arguments": {"book_id": "BO-100", "value": "2Bx"},
            "output": '{"ok": true}',
        }
    ]
    invented = [
        {"name": "create_book", "arguments": {"book_id": "BO-999", "name": "x"}, "output": '{"ok": true}'}
    ]
    assert not flag_trajectory(errored, init, instruction)
    assert not flag_trajectory(wrong_value, init, instruction)
    assert flag_trajectory(invented, init, instruction)


def test_an_injected_hack_is_retired_within_five_steps():
    state = SchedulerState.new(["honest", "hacker"], ["e", "e"])
    config = SchedulerConfig()
    for t in range(5):
        rewards = [np.array([1.0, 0.0, 1.0, 0.0]), np.array([1.0, 1.0, 0.0, 1.0])]
        update_state(state, Observations.from_groups(t, [0, 1], rewards, hack_flags=[0.0, 3.0]), config)
        if state.arrays["retired"][1]:
            break
    assert state.arrays["retired"][1] == 1 and t < 5 and state.arrays["retired"][0] == 0


def test_no_hack_retirement_in_honest_real_environment_steps(small_pool):
    lake = small_pool
    start_run(
        lake,
        RunSpec(
            pool="synthetic",
            scheduler="envsched",
            seed=3,
            batch_size=8,
            group_size=4,
            max_steps=12,
            policy_config={"mode": "real"},
        ),
    )
    for t in range(12):
        select_manifest(lake, t)
        run_step(lake, t, log=lambda *_: None)
        statistics_step(lake, t)
    flags = lake.sql(
        "select sum(hack_flag::int) as f, count(*) as n from rollouts where reward > 0"
    ).to_pylist()[0]
    retired = lake.sql("select count(*) as n from statistics where hack_rate > 0.5").to_pylist()[0]["n"]
    assert retired == 0 and flags["f"] / flags["n"] < 0.05


# ---------------------------------------------------------------------------- 10 runs never mix
def test_two_experiments_on_one_instance_keep_their_partitions(tmp_path):
    from envsched_pipeline.orchestration.driver import run_loop

    lakes = []
    with dg.instance_for_test() as instance:
        for name in ("a", "b"):
            lake = Lake(tmp_path / name)
            import_pool(lake, load_synthetic("synthetic", n_envs=4, tasks_per_env=5, seed=1))
            start_run(
                lake, RunSpec(pool="synthetic", scheduler="random", batch_size=4, group_size=2, max_steps=2)
            )
            run_loop(lake, 2, instance=instance)
            lakes.append(lake)
        keys = instance.get_dynamic_partitions("training_steps")
        ids = [load_run(lk).run_id for lk in lakes]
        assert sorted(keys) == sorted(f"{i}-{s}" for i in ids for s in (0, 1))
        for lk, rid in zip(lakes, ids, strict=True):
            runs = instance.get_runs(filters=dg.RunsFilter(tags={"envsched/run_id": rid}))
            assert runs and all(
                r.tags["envsched/lake"] == str(lk.root) and r.tags["envsched/pool"] == "synthetic"
                for r in runs
            )
            assert all(r.tags["envsched/step"] in ("0", "1") for r in runs)


def test_envsched_errors_are_one_line(tmp_path, capsys):
    assert issubclass(StepError, EnvschedError) and issubclass(LakeError, EnvschedError)


def test_a_failure_is_named_by_its_class_without_the_module_and_never_by_a_wrapper():
    """The line a halt and the driver print for a failed job: a Pipes report's qualified class is
    shortened to the class, a message that merely contains dots keeps them, long ones are cut."""
    from dagster._utils.error import SerializableErrorInfo  # the error record Dagster stores

    from envsched_pipeline.orchestration.plan import error_line  # the Dagster layer's helper

    def err(message, cls_name):
        return SerializableErrorInfo(message=message, stack=[], cls_name=cls_name)

    assert error_line(err("envsched_pipeline.errors.StepError: checkpoint missing\n", "StepError")) == (
        "StepError: checkpoint missing"
    )
    assert error_line(err("FileNotFoundError: /tmp/a.b: no config.json\n", "FileNotFoundError")) == (
        "FileNotFoundError: /tmp/a.b: no config.json"
    )
    assert (
        error_line(err("scenarios.json: invalid JSON\nmore", "PoolError")) == "scenarios.json: invalid JSON"
    )
    assert error_line(err("x" * 500, None)) == "x" * 300


def test_the_terminal_logger_of_envsched_train_prints_warnings_in_one_line_and_no_errors(capsys):
    """`envsched train`'s in-process runs: a warning is one line naming its step; an error (with
    its stack trace) is left to the driver's own one-line report and the event log."""
    from envsched_pipeline.orchestration.console import envsched_console  # the logger under test

    logger = envsched_console.logger_fn(dg.build_init_logger_context(logger_config={"log_level": "WARNING"}))
    meta = {"step_key": "batch_manifest", "orig_message": "plot skipped: no data\nmore detail"}
    logger.warning("train_job - run - plot skipped: no data\nmore detail", extra={"dagster_meta": meta})
    logger.error("STEP_FAILURE\nTraceback (most recent call last):\n  ...", extra={"dagster_meta": meta})
    logger.info("an info line")
    assert capsys.readouterr().err == "[batch_manifest] warning: plot skipped: no data\n"
