"""The resident policy worker: one long-lived process per run that keeps the model, the optimizer
and the rollout engine in memory across steps (``policy_config.resident``, ``--resident``): a
language model's :class:`trainer.policy_step.PolicySession`, or the neural learner's
:class:`trainer.neural.runner.NeuralSession` (which checkpoints every step).

    python -m trainer.resident --lake DIR          (started on demand by trainer.step; detached)

``training_step[t]`` still launches ``python -m trainer.step`` through Dagster Pipes, but that
process is now a thin client: it finds the worker through ``<lake>/resident/worker.json`` (pid,
host, port, a secret token), starts one if there is none (or the recorded one is dead), hands it
step t over a loopback socket, relays its log lines to Pipes, and reports the step's metrics. The
worker runs in its own session, so it survives a Dagster restart; it exits after ``IDLE_SECONDS``
without work, when the run's last step is done, or when the run halts (a failed check, an early
stop) with nothing unsaved: it frees its memory, a GPU's included, until ``envsched resume``, whose
next step starts a new worker from the newest checkpoint. A language model trained past its newest
checkpoint (``checkpoint_every``) stays, so a resume does not redo those steps.

Checkpoints (model, optimizer, tokenizer) are written every ``checkpoint_every`` steps and at the
last step, not every step. If a worker dies, the next one starts from the newest checkpoint c; the
steps after c that the dead worker trained are moved to ``archive/`` (their manifests, rollouts,
statistics and state), the request fails with the reason, and the loop redoes step c+1 on: the
lake never mixes rollouts of a policy that no longer exists.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from envsched_pipeline.errors import StepError
from envsched_pipeline.lake import Lake, atomic_write_bytes
from envsched_pipeline.lease import holder_check
from envsched_pipeline.rollouts import write_step_result
from envsched_pipeline.run import HALT_FILE, require_run, training_settings

IDLE_SECONDS = 1800.0
START_TIMEOUT = 600.0


def _info_path(lake: Lake) -> Path:
    return lake.local / "resident" / "worker.json"


def read_info(lake: Lake) -> dict | None:
    try:
        return json.loads(_info_path(lake).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _alive(info: dict) -> bool:
    if info.get("host") != socket.gethostname():
        return True  # cannot tell from here; the connection attempt decides
    try:
        os.kill(int(info["pid"]), 0)
        return True
    except (ProcessLookupError, ValueError, KeyError):
        return False
    except PermissionError:
        return True


# ---------------------------------------------------------------------------- wire format: JSON lines
def _send(conn: socket.socket, obj: dict) -> None:
    conn.sendall((json.dumps(obj, default=float) + "\n").encode())


def _lines(conn: socket.socket):
    buf = b""
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield json.loads(line)


# ---------------------------------------------------------------------------- the worker
class Worker:
    def __init__(self, lake: Lake):
        self.lake = lake
        self.spec = require_run(lake)
        self.token = secrets.token_hex(16)
        self.session = None
        self.next_step: int | None = None  # the step the in-memory policy is ready for
        self.built_with: dict = {}  # the training settings the in-memory policy was built with
        self.loads = 0
        self.steps_done: list[int] = []
        self.last_work = time.time()
        self.lock = threading.Lock()

    def _session(self, step: int, log):
        """The in-memory policy; built once from the newest checkpoint before ``step``. When the
        lake holds steps that checkpoint does not cover (a previous worker died), those steps are
        archived and the request is refused, so the loop redoes them with this policy. A request for
        any step but the one after the policy's last (`envsched rewind`, `resume --redo`, a retry
        after a failure inside a step) reloads from the checkpoint before it, never trains on a
        policy that already saw later steps."""
        if self.session is not None and step != self.next_step:
            log(
                f"step {step} is not the step after the in-memory policy's: reloading from the checkpoint before it"
            )
            self._drop()
        if self.session is not None:
            return self.session
        self.built_with = training_settings(self.spec.policy_config)
        if self.spec.policy == "neural":  # a checkpoint every step: it loads the one before `step`
            from trainer.neural.runner import NeuralSession  # torch: the worker's whole purpose

            self.session = NeuralSession(self.lake, self.spec, step, log)
            self.next_step = step
            self.loads += 1
            return self.session
        from trainer.policy_step import PolicySession, latest_checkpoint  # torch: the worker's whole purpose

        _, ckpt_step = latest_checkpoint(self.lake, step)
        if ckpt_step < step - 1:
            moved = self.lake.archive(f"resident-restart-from-step{ckpt_step}", lambda kind, s: s > ckpt_step)
            raise StepError(
                f"the resident worker restarted from the checkpoint of step {ckpt_step}; steps "
                f"{ckpt_step + 1}..{step - 1} were trained by a worker that is gone and were moved to "
                f"{moved['archive']}; the loop redoes them from step {ckpt_step + 1}"
            )
        self.session = PolicySession(self.lake, self.spec, step, log, resident=True)
        self.next_step = step
        self.loads += 1
        return self.session

    def _drop(self) -> None:
        """Forget the in-memory policy (its state is not the lake's); the next request reloads."""
        import gc  # only when a policy is dropped

        import torch  # the worker's sessions need it anyway; here only their GPU memory is freed

        if self.session is not None and hasattr(self.session, "close"):
            self.session.close()  # the neural learner's environment processes
        self.session, self.next_step = None, None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def handle(self, conn: socket.socket) -> None:
        with conn:
            req = next(_lines(conn), None)
            if not req or req.get("token") != self.token:
                _send(conn, {"error": "bad token"})
                return
            step = int(req["step"])
            self.spec = require_run(self.lake)  # the run's length may have grown since the worker started
            if self.session is not None and training_settings(self.spec.policy_config) != self.built_with:
                # resumed with other settings (--allow-config-change): the policy in memory was built
                # with the old ones, so it reloads from the checkpoint with the new
                _send(conn, {"log": "the run's policy settings changed: reloading the policy with them"})
                self._drop()
            if self.session is not None:
                self.session.spec = self.spec  # its checkpoint at the run's last step reads the length
            fence = holder_check(self.lake, *req["fence"]) if req.get("fence") else None
            with self.lock, self.lake.fenced(fence) if fence else contextlib.nullcontext():
                try:
                    log = lambda m: _send(conn, {"log": str(m)})  # noqa: E731
                    sess = self._session(step, log)
                    manifest = self.lake.read("manifests", step=step).sort_by("slot")
                    result = sess.step(step, manifest, log=log)
                    metrics = {**result["metrics"], "model_loads": self.loads, "worker_pid": os.getpid()}
                    write_step_result(self.lake, step, result, metrics)
                    self.steps_done.append(step)
                    self.next_step = step + 1
                    self._publish()
                    _send(conn, {"result": metrics})
                except StepError as exc:
                    self._drop()  # the step may have updated the policy before it failed
                    _send(conn, {"error": str(exc)})
                except Exception as exc:  # noqa: BLE001 - reported to the client, the worker goes on
                    self._drop()
                    _send(conn, {"error": f"{type(exc).__name__}: {exc}"})
                finally:
                    self.last_work = time.time()

    def _halted_with_nothing_unsaved(self) -> bool:
        """The run halted and the lake holds everything the worker does: no policy in memory, the
        neural learner's (checkpointed every step), or a language model's whose newest step is
        checkpointed. One trained past its newest checkpoint stays, as before (leaving would cost a
        resume the steps since, redone), until the loop goes on or it idles out."""
        if self.lake.read_json(HALT_FILE) is None:
            return False
        if self.session is None or self.spec.policy == "neural":
            return True
        from trainer.policy_step import latest_checkpoint  # the session's module, loaded already

        return latest_checkpoint(self.lake, self.next_step)[1] == self.next_step - 1

    def _publish(self) -> None:
        atomic_write_bytes(
            _info_path(self.lake),
            json.dumps(
                {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "port": self.port,
                    "token": self.token,
                    "run_id": self.spec.run_id,
                    "policy": self.spec.policy,
                    "started": self.started,
                    "loads": self.loads,
                    "steps_done": self.steps_done[-20:],
                }
            ).encode(),
        )

    def serve(self) -> None:
        srv = socket.create_server(("127.0.0.1", 0))
        srv.settimeout(5.0)
        self.port = srv.getsockname()[1]
        self.started = time.time()
        self._publish()
        try:
            while time.time() - self.last_work < IDLE_SECONDS:
                if self.steps_done and self.steps_done[-1] + 1 >= self.spec.max_steps:
                    break  # the run is done (its last checkpoint is written)
                if self._halted_with_nothing_unsaved():
                    break  # no step comes before a resume, which starts a new worker
                try:
                    conn, _ = srv.accept()
                except TimeoutError:
                    continue
                self.handle(conn)
        finally:
            self._drop()  # the neural learner's environment processes end with the worker
            srv.close()
            info = read_info(self.lake)
            if info and info.get("pid") == os.getpid():
                _info_path(self.lake).unlink(missing_ok=True)


# ---------------------------------------------------------------------------- the client (inside trainer.step)
def start_worker(lake: Lake) -> dict:
    """Start a detached worker for the lake's run and wait until it listens."""
    log_path = lake.local / "resident" / "worker.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    _info_path(lake).unlink(missing_ok=True)
    with open(log_path, "ab") as out:
        subprocess.Popen(
            [sys.executable, "-m", "trainer.resident", "--lake", str(lake.root)],
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
    deadline = time.time() + START_TIMEOUT
    while time.time() < deadline:
        info = read_info(lake)
        if info is not None:
            return info
        time.sleep(0.2)
    raise StepError(f"the resident worker did not start within {START_TIMEOUT:.0f}s (see {log_path})")


def run_resident(lake: Lake, step: int, log=print, fence: tuple[str, str] | None = None) -> dict:
    """Hand step ``step`` to the run's resident worker (starting one if needed); relay its logs.
    ``fence`` (lock name, holder id): the step lock the caller holds; the worker checks it before
    each of its writes for this step, as the caller's own fenced lake would."""
    info = read_info(lake)
    spec = require_run(lake)
    if info is None or info.get("run_id") != spec.run_id or not _alive(info):
        info = start_worker(lake)
        log(f"started the resident worker (pid {info['pid']})")
    try:
        conn = socket.create_connection(("127.0.0.1", int(info["port"])), timeout=30)
    except OSError:
        info = start_worker(lake)
        log(f"the resident worker was unreachable: started a new one (pid {info['pid']})")
        conn = socket.create_connection(("127.0.0.1", int(info["port"])), timeout=30)
    with conn:
        conn.settimeout(None)
        _send(conn, {"token": info["token"], "step": step, "fence": list(fence) if fence else None})
        for msg in _lines(conn):
            if "log" in msg:
                log(msg["log"])
            elif "result" in msg:
                return msg["result"]
            elif "error" in msg:
                raise StepError(f"resident worker: {msg['error']}")
    raise StepError(
        "the resident worker closed the connection without a result (it died); the next step "
        "restarts it from the newest checkpoint"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.resident", description=__doc__.splitlines()[0])
    ap.add_argument("--lake", required=True)
    args = ap.parse_args(argv)
    Worker(Lake(args.lake)).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
