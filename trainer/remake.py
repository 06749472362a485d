"""Make again a policy checkpoint the lake no longer keeps (``python -m trainer.remake``).

The simulated and neural learners keep the checkpoint of step 0, of every ``KEEP_EVERY``-th step
and of the newest two (:func:`envsched_pipeline.lake.superseded`; the neural learner's best held-out
step's too, while it is the best); each step records the digest of
the checkpoint it wrote (``checkpoint_digest`` in ``train_metrics``). Going back to a step after a
dropped checkpoint (``envsched rewind``) first makes it again from the nearest kept one before it:

* simulated: each step's update applied again to the rewards its rollouts recorded;
* neural: each step run again, its rollouts (seeded by the run's seed and the step) and update.

Every step made again must give the checkpoint whose digest its step recorded, so a pool, a
setting or a code change since is refused (naming the step) rather than handing the redo another
policy. Only the checkpoint asked for is written.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping

import numpy as np
import pyarrow as pa

import envsched_pipeline.lake as lake_module
from envsched_pipeline.errors import StepError
from envsched_pipeline.lake import Lake
from envsched_pipeline.run import RunSpec, config_changes, require_run, spec_at
from trainer.step import CHECKPOINT_FILES, checkpoint_rel, simulated_learner

DIGEST = "checkpoint_digest"  # the train_metrics field each step records


def remake(lake: Lake, after: int, log=print) -> dict:
    """Write the checkpoint of step ``after`` again, made from the nearest kept checkpoint before it
    and checked step by step against the digests the steps recorded. Returns what was done
    (``remade``: the steps made again; empty when the checkpoint is there)."""
    name = CHECKPOINT_FILES.get(require_run(lake).policy)
    if name is not None and lake.exists(checkpoint_rel(after, name)):  # kept: nothing to make or read
        return {"after": after, "from": after, "from_kept": True, "remade": [], "seconds": 0.0}
    data, done = made_again(lake, after, log)
    if done["remade"]:
        lake.write_bytes(checkpoint_rel(after, name), data)
    return done


def made_again(
    lake: Lake, after: int, log=print, known: Mapping[int, bytes] | None = None
) -> tuple[bytes, dict]:
    """The checkpoint of step ``after`` (its bytes) and what was done to have it: read where the lake
    keeps it, else made again from the nearest checkpoint before it, kept or in ``known`` (steps'
    checkpoints already made again, by step), each step checked against the digest it recorded.
    Nothing is written (``envsched evaluate`` scores a dropped checkpoint this way while the run goes
    on)."""
    known = known or {}
    if after in known:
        return known[after], {"after": after, "from": after, "from_kept": False, "remade": [], "seconds": 0.0}
    spec = require_run(lake)
    if spec.policy not in CHECKPOINT_FILES:
        raise StepError(
            f"policy {spec.policy!r} keeps no per-step checkpoint that can be made again "
            f"(only {', '.join(CHECKPOINT_FILES)} do)"
        )
    name = CHECKPOINT_FILES[spec.policy]
    kept = lake.artifact_steps("checkpoints", name)
    if after in kept:
        data = lake.read_bytes(checkpoint_rel(after, name))
        if data is not None:
            return data, {"after": after, "from": after, "from_kept": True, "remade": [], "seconds": 0.0}
    base = max((s for s in {*kept, *known} if s < after), default=None)
    if base is None:
        raise StepError(
            f"no {spec.policy} checkpoint before step {after} is in the lake to make it again from"
        )
    digests = _recorded(lake, range(base + 1, after + 1))
    t0 = time.perf_counter()
    source = (
        f"step {base}'s checkpoint" if base in kept else f"the policy after step {base}, made again before"
    )
    log(f"making the policy after step {after} again from {source} ({_steps(after - base)})")
    changes = config_changes(lake)
    pool = set(lake.read("tasks", pool=spec.pool, columns=["task_id"]).column("task_id").to_pylist())
    now = spec_at(spec, changes, base + 1)
    learner = _learner(
        lake, now, known[base] if base in known else lake.read_bytes(checkpoint_rel(base, name))
    )
    try:
        for s in range(base + 1, after + 1):
            at = spec_at(spec, changes, s)  # the policy settings in force at the step
            if at.policy_config != now.policy_config:  # changed from this step: as its own process did
                data = _bytes(learner)
                _close(learner)
                learner, now = _learner(lake, at, data), at
            differs = _redo[spec.policy](lake, at, learner, s, _manifest(lake, spec, s, pool))
            if learner.digest() != digests[s]:
                raise StepError(
                    f"step {s} done again from step {s - 1}'s policy does not give the checkpoint it "
                    f"wrote the first time (its digest in train_metrics[{s}]; {differs}): the pool, "
                    "the policy settings or the trainer changed since; the lake keeps step 0's "
                    f"checkpoint, every {lake_module.KEEP_EVERY}th and the newest two"
                )
            log(f"  step {s}: the checkpoint made again matches ({s - base}/{after - base})")
        data = _bytes(learner)
    finally:
        _close(learner)
    return data, {
        "after": after,
        "from": base,
        "from_kept": base in kept,
        "remade": list(range(base + 1, after + 1)),
        "seconds": time.perf_counter() - t0,
    }


def _steps(n: int) -> str:
    return f"{n} step" + ("" if n == 1 else "s")


def _recorded(lake: Lake, steps: range) -> dict[int, str]:
    found: dict[int, str] = {}
    for s in steps:
        rows = lake.read("train_metrics", step=s).to_pylist() if lake.has("train_metrics", step=s) else []
        digest = rows[0].get(DIGEST) if rows else None
        if not digest:
            raise StepError(
                f"the policy checkpoint after step {s} is not kept and train_metrics[{s}] records no "
                f"{DIGEST} to make it again against (a step trained before checkpoints were dropped, or "
                "not trained)"
            )
        found[s] = digest
    return found


def _manifest(lake: Lake, spec: RunSpec, step: int, pool: set[str]) -> pa.Table:
    """Step ``step``'s manifest, each of its tasks still in the pool (``pool``: its task ids)."""
    if not lake.has("manifests", step=step):
        raise StepError(f"manifest of step {step} is missing: the policy after it cannot be made again")
    manifest = lake.read("manifests", step=step).sort_by("slot")
    gone = sorted(set(manifest.column("task_id").to_pylist()) - pool)
    if gone:
        raise StepError(
            f"{len(gone)} task(s) of step {step} are no longer in pool {spec.pool!r} (first: {gone[0]!r}; "
            "it was imported again with edits since): the steps after it cannot be done again"
        )
    return manifest


def _learner(lake: Lake, spec: RunSpec, data: bytes | None):
    """A learner with ``spec``'s policy settings holding the checkpoint ``data``."""
    if data is None:
        raise StepError("the kept checkpoint to make the policy again from went while it was read")
    if spec.policy == "simulated":
        learner = simulated_learner(lake, spec)
    else:
        from trainer.neural.runner import new_learner  # torch: only the neural learner loads it

        learner = new_learner(lake, spec)
    learner.load_bytes(data)
    return learner


def _bytes(learner) -> bytes:
    return learner.state_bytes() if hasattr(learner, "state_bytes") else learner.to_bytes()


def _close(learner) -> None:
    if hasattr(learner, "close"):  # the neural learner's environment processes
        learner.close()


def _recorded_rewards(lake: Lake, spec: RunSpec, step: int, manifest: pa.Table) -> np.ndarray:
    """The rewards step ``step``'s rollouts recorded, (tasks in manifest order, G)."""
    task_ids = manifest.column("task_id").to_pylist()
    got = lake.read("rollouts", step=step, columns=["task_id", "rollout", "reward"]).to_pylist()
    cell = {(r["task_id"], r["rollout"]): r["reward"] for r in got}
    g = spec.group_size
    missing = [(t, k) for t in task_ids for k in range(g) if (t, k) not in cell]
    if missing:
        raise StepError(
            f"rollouts of step {step} lack {len(missing)} of the manifest's rollouts "
            f"(first: task {missing[0][0]!r}, rollout {missing[0][1]}): its update cannot be done again"
        )
    return np.array([[cell[(t, k)] for k in range(g)] for t in task_ids], dtype=float)


def _redo_simulated(lake: Lake, spec: RunSpec, learner, step: int, manifest: pa.Table) -> str:
    """The simulated update of ``step`` applied again to the rewards its rollouts recorded."""
    learner.learn(manifest.column("task_id").to_pylist(), _recorded_rewards(lake, spec, step, manifest))
    return "the update, done again on the rewards its rollouts recorded, differs"


def _redo_neural(lake: Lake, spec: RunSpec, learner, step: int, manifest: pa.Table) -> str:
    """Step ``step`` run again; what differs from its first run, should its checkpoint differ."""
    from trainer.neural.runner import roll_and_learn  # torch: only the neural learner loads it

    _, out, _, _ = roll_and_learn(lake, spec, learner, step, manifest)
    first = _recorded_rewards(lake, spec, step, manifest)
    moved = int((~np.isclose(out["reward"], first, rtol=0, atol=1e-9)).sum())
    if moved:
        return (
            f"{moved} of its {first.size} rollouts earned other rewards than it recorded (the policy "
            "before it, its sampling settings or an environment that behaves differently run to run)"
        )
    return "its rollouts earned the rewards it recorded, and the update differs"


_redo = {"simulated": _redo_simulated, "neural": _redo_neural}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.remake", description=__doc__.splitlines()[0])
    ap.add_argument("--lake", required=True)
    ap.add_argument("--after", type=int, required=True, help="the step whose checkpoint to make again")
    args = ap.parse_args(argv)
    try:
        out = remake(Lake(args.lake), args.after, log=lambda m: print(m, flush=True))
    except StepError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"trainer.remake: interrupted; the policy after step {args.after} was not written",
            file=sys.stderr,
        )
        return 130
    if out["remade"]:
        print(
            f"made the policy after step {args.after} again ({_steps(len(out['remade']))}, {out['seconds']:.1f} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
