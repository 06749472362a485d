"""Gates: what must hold before the loop goes on, and the run's halt record when it does not.

The blocking asset checks (Dagster) and the non-Dagster paths (the step protocol, the Python API,
a statistics-only run) evaluate the same gates. A failed gate writes ``halt.json`` in the lake:
the loop then does nothing for that run (the sensor skips with the reason, ``envsched train``
refuses with it, ``envsched status`` shows it) until ``envsched resume`` finds the gate passing
again (after a fix, or with ``--redo`` after dropping the failed partition so the step is redone).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections import Counter
from collections.abc import Callable

from envsched_pipeline.core.build import scheduler_config
from envsched_pipeline.core.fold import selection_state
from envsched_pipeline.errors import StepError
from envsched_pipeline.lake import BEST_CHECKPOINT, Lake, best_of, best_record, heldout_scores
from envsched_pipeline.rollouts import ERROR_CLASSES
from envsched_pipeline.run import HALT_FILE, REMADE_CHECKPOINTS, RunSpec, require_run
from envsched_pipeline.scheduler import make_scheduler

RETRIED_FILE = "retried_runs.json"  # failed attempts a resume answered (see retried_runs)
REWIND_ARCHIVE = "rewind-to-step"  # a rewind's archive folder: archive/<this><step>-<ms>/
STALL_GATE = "heldout_patience"  # the halt of a run stopped early (heldout_stall)
PATIENCE_FILE = "patience.json"  # the step a resume after an early stop counts the patience from


# ---------------------------------------------------------------------------- manifests
def manifest_problems(
    rows: list[dict],
    batch_size: int,
    config,
    relaxations: list[str],
    previous: list[list[dict]],
    applies_quotas: bool,
) -> list[str]:
    """Violations of the batch constraints (docs/algorithm.md §6) in a manifest; constraints the
    scheduler relaxed (and recorded) are allowed. Messages say what each cap means and by how much
    it was exceeded."""
    problems = []
    ids = [r["task_id"] for r in rows]
    if len(ids) != len(set(ids)):
        dup = [t for t, n in Counter(ids).items() if n > 1]
        problems.append(
            f"{len(ids) - len(set(ids))} duplicate pick(s) of the same task (a task may appear once per "
            f"batch): {dup[:5]}"
        )
    if len(ids) != batch_size:
        problems.append(f"{len(ids)} tasks, but the batch size is B = {batch_size}")
    if not applies_quotas:
        return problems  # the baselines run without quotas, as in the paper
    per_env = Counter(r["env_id"] for r in rows)
    if "C1 per-step cap" not in relaxations:
        for e, n in per_env.items():
            if n > config.cap_env_step:
                problems.append(
                    f"environment {e} got {n} picks this step; the per-step cap (C1) allows "
                    f"{config.cap_env_step} ({n - config.cap_env_step} too many)"
                )
    if "C3 window cap" not in relaxations and "C1 per-step cap" not in relaxations:
        window = Counter(per_env)
        for prev in previous[-2:]:
            window.update(r["env_id"] for r in prev)
        for e, n in window.items():
            if n > config.cap_env_window:
                problems.append(
                    f"environment {e} got {n} picks over the last 3 steps; the window cap (C3) allows "
                    f"{config.cap_env_window} ({n - config.cap_env_window} too many)"
                )
    if "consecutive cap" not in relaxations and len(previous) >= 2:
        streak = set(ids) & {r["task_id"] for r in previous[-1]} & {r["task_id"] for r in previous[-2]}
        if streak:
            problems.append(
                f"{len(streak)} task(s) picked three steps in a row (the consecutive cap allows two): "
                f"{sorted(streak)[:5]}"
            )
    return problems


def check_manifest(lake: Lake, step: int, spec: RunSpec | None = None) -> dict:
    """The manifest gate of ``step``: {"passed", "problems", "tasks", "environments", "relaxations"}."""
    spec = spec or require_run(lake)
    if not lake.has("manifests", step=step):
        return {
            "passed": False,
            "problems": [f"manifest {step} is missing"],
            "tasks": 0,
            "environments": 0,
            "relaxations": [],
        }
    rows = lake.read("manifests", step=step).to_pylist()
    audit = lake.read("audits", step=step).to_pylist()
    relax = json.loads(audit[0]["relaxations"]) if audit and audit[0].get("relaxations") else []
    prev = [
        lake.read("manifests", step=s).to_pylist()
        for s in (step - 2, step - 1)
        if s >= 0 and lake.has("manifests", step=s)
    ]
    pool_size = lake.read("tasks", pool=spec.pool, columns=["task_id"]).num_rows
    config = scheduler_config(spec)
    quotas = make_scheduler(spec.scheduler, config).applies_quotas
    problems = manifest_problems(rows, min(spec.batch_size, pool_size), config, relax, prev, quotas)
    return {
        "passed": not problems,
        "problems": problems,
        "tasks": len(rows),
        "environments": len({r["env_id"] for r in rows}),
        "relaxations": relax,
    }


# ---------------------------------------------------------------------------- rollouts
def rollout_problems(
    rollouts: list[dict], manifest: list[dict], group_size: int, partial_groups: bool = False
) -> tuple[list[str], dict]:
    """What is wrong with a step's rollouts given its manifest; and the plan-vs-realized mix."""
    problems = []
    bad = [
        r
        for r in rollouts
        if isinstance(r["reward"], bool)
        or not isinstance(r["reward"], (int, float))
        or not math.isfinite(r["reward"])
        or not 0.0 <= r["reward"] <= 1.0
    ]
    if bad:
        problems.append(
            f"{len(bad)} rewards not finite or outside [0, 1], e.g. {bad[0]['task_id']}: {bad[0]['reward']}"
        )
    per_task = Counter(r["task_id"] for r in rollouts)
    planned = {r["task_id"] for r in manifest}
    missing = sorted(planned - set(per_task))
    partial = {t: n for t, n in per_task.items() if t in planned and n != group_size}
    extra = sorted(set(per_task) - planned)
    if missing and not partial_groups:
        problems.append(f"{len(missing)} selected tasks got no rollouts: {missing[:5]}")
    if partial and not partial_groups:
        problems.append(
            f"{len(partial)} groups with != G = {group_size} rollouts: {dict(list(partial.items())[:5])}"
        )
    if extra:
        problems.append(f"{len(extra)} tasks rolled out that were not selected: {extra[:5]}")
    keys = Counter((r["task_id"], r["rollout"]) for r in rollouts)
    dup = [k for k, n in keys.items() if n > 1]
    if dup:
        problems.append(f"{len(dup)} duplicate (task_id, rollout) rows, e.g. {dup[0]}")
    odd = [r for r in rollouts if not isinstance(r["rollout"], int) or not 0 <= r["rollout"] < group_size]
    if odd and not partial_groups:
        problems.append(
            f"{len(odd)} rollout ids outside 0..{group_size - 1}, e.g. {odd[0]['task_id']}: {odd[0]['rollout']}"
        )
    classes = {r.get("error_class") or "none" for r in rollouts} - set(ERROR_CLASSES)
    if classes:
        problems.append(f"unknown error classes {sorted(classes)}")
    plan_env = Counter(r["env_id"] for r in manifest)
    real_env = Counter(r["env_id"] for r in rollouts)
    mix = [
        {
            "env_id": e,
            "planned_groups": plan_env[e],
            "rollouts": real_env.get(e, 0),
            "expected_rollouts": plan_env[e] * group_size,
        }
        for e in sorted(plan_env)
    ]
    return problems, {"missing_groups": len(missing), "partial_groups": len(partial), "mix": mix}


def check_rollouts(lake: Lake, step: int, spec: RunSpec | None = None) -> dict:
    """The rollouts gate of ``step``: {"passed", "problems", "rollouts", "missing_groups", ...}."""
    spec = spec or require_run(lake)
    if not lake.has("rollouts", step=step):
        return {
            "passed": False,
            "problems": [f"rollouts of step {step} are missing"],
            "rollouts": 0,
            "missing_groups": 0,
            "partial_groups": 0,
            "mix": [],
        }
    cols = ["task_id", "rollout", "reward", "env_id", "error_class"]
    rollouts = lake.read("rollouts", step=step, columns=cols).to_pylist()
    manifest = lake.read("manifests", step=step).to_pylist()
    partial = bool((lake.read_json(f"ingest/step={step}.json") or {}).get("partial_groups"))
    problems, info = rollout_problems(rollouts, manifest, spec.group_size, partial_groups=partial)
    return {"passed": not problems, "problems": problems, "rollouts": len(rollouts), **info}


# ---------------------------------------------------------------------------- early stop
def patience_count(lake: Lake, step: int, spec: RunSpec | None = None) -> dict | None:
    """Where the run stands against its ``eval_patience`` after ``step``: the evaluations (up to
    ``step``) that have not beaten the best mean held-out score before them (the earlier step at a
    tie, as `envsched evaluate --best` takes it), counted after the best step and after the step an
    `envsched resume` of an earlier stop went on from. ``{"patience", "best_step", "best_score",
    "since", "evaluations", "stalled"}``; None with no patience set, before the first evaluation
    and on an outside trainer's run."""
    spec = spec or require_run(lake)
    patience = spec.policy_settings().eval_patience
    if not patience or spec.trainer == "external":
        return None
    scores = heldout_scores(lake)  # read once: the best and the evaluations after it
    best = best_of(scores, upto=step)
    if best is None:
        return None
    since = max(best["step"], int((lake.read_json(PATIENCE_FILE) or {}).get("from", -1)))
    after = [t for t in scores if since < t <= step]
    return {
        "patience": patience,
        "best_step": best["step"],
        "best_score": best["score"],
        "since": since,
        "evaluations": after,
        "stalled": len(after) >= patience,
    }


def heldout_stall(lake: Lake, step: int, spec: RunSpec | None = None) -> dict | None:
    """:func:`patience_count` when the run should stop early after ``step`` (its patience is spent),
    else None."""
    count = patience_count(lake, step, spec)
    return count if count is not None and count["stalled"] else None


def stall_text(stall: dict) -> str:
    """:func:`heldout_stall`'s verdict in one line."""
    n = len(stall["evaluations"])
    return (
        f"held-out has not beaten step {stall['best_step']}'s mean score {stall['best_score']:.4f} in the "
        f"{n} evaluation{'s' * (n != 1)} since step {stall['since']} (steps "
        f"{', '.join(map(str, stall['evaluations']))}; eval_patience {stall['patience']})"
    )


def stop_if_stalled(lake: Lake, step: int, spec: RunSpec | None = None) -> dict | None:
    """After ``step``'s statistics: halt the run with :data:`STALL_GATE` when held-out has stalled
    (:func:`heldout_stall`), unless ``step`` is the run's last (it ends there anyway). The halt
    record, or None."""
    spec = spec or require_run(lake)
    stall = heldout_stall(lake, step, spec)
    if stall is None or step >= spec.max_steps - 1:
        return None
    return halt(lake, step, STALL_GATE, [stall_text(stall)])


# ---------------------------------------------------------------------------- halt
def halt(
    lake: Lake, step: int, gate: str, problems: list[str], failed_runs: list[str] = (), canceled: bool = False
) -> dict:
    """Record that the run stopped at ``step`` because ``gate`` failed: a blocking check, or a
    step's job that failed every attempt (``failed_runs``: their Dagster run ids), or whose run a
    person canceled (``canceled``; ``failed_runs`` then names the canceled run)."""
    record = {"step": int(step), "gate": gate, "problems": list(problems), "at": time.time()}
    if failed_runs:
        record["failed_runs"] = list(failed_runs)
    if canceled:
        record["canceled"] = True
    lake.write_json(HALT_FILE, record)
    return record


def retried_runs(lake: Lake) -> set[str]:
    """Dagster run ids of failed attempts that an `envsched resume` has already answered: they no
    longer count towards halting the run again."""
    return set(lake.read_json(RETRIED_FILE) or [])


def halted(lake: Lake) -> dict | None:
    return lake.read_json(HALT_FILE)


def halt_message(record: dict) -> str:
    if record["gate"] == STALL_GATE:
        return (
            f"the run stopped early at step {record['step']}: {record['problems'][0]}. `envsched evaluate "
            "--best` scores the best policy; `envsched resume` trains on (the patience counted again from "
            f"step {record['step']}), or `envsched rewind --to K` redoes the run from step K"
        )
    if record.get("canceled"):
        return (
            f"the run is halted at step {record['step']}: {record['problems'][0]}. `envsched resume` "
            "continues it (the step's job runs again)"
        )
    return (
        f"the run is halted at step {record['step']}: {record['gate']} failed ("
        f"{'; '.join(record['problems'][:3])}). Fix it, then `envsched resume` (or `envsched resume --redo` "
        "to redo that step)"
    )


def require_not_halted(lake: Lake) -> None:
    record = halted(lake)
    if record is not None:
        raise StepError(halt_message(record))


GATES = {"manifest_is_valid": check_manifest, "rollouts_are_complete": check_rollouts}


def resume(lake: Lake, redo: bool = False, failed_runs: list[str] | None = None) -> dict:
    """Clear the halt if its gate passes now; a halt after a job failed every attempt is cleared
    and the job gets its attempts again (its failed runs, ``failed_runs`` or the halt's own record
    of them, are kept in ``retried_runs.json``). ``redo`` first drops the failed partition (the
    manifest, or the step's rollouts and metrics) so the loop redoes that step."""
    record = halted(lake)
    if record is None:
        return {"resumed": False, "reason": "the run is not halted"}
    step, gate = record["step"], record["gate"]
    if gate == STALL_GATE:  # an early stop: nothing failed, so nothing to redo; train on from here
        if redo:
            raise StepError(
                f"the run stopped early at step {step} (held-out stalled): nothing failed, so nothing to "
                "redo; `envsched resume` trains on"
            )
        lake.write_json(PATIENCE_FILE, {"from": step})
        lake.delete(HALT_FILE)
        return {"resumed": True, "step": step, "redo": []}
    selection = gate == "manifest_is_valid" or gate.endswith("(select)")
    if redo:
        tables = (
            ("manifests", "audits") if selection else ("rollouts", "train_metrics", "evals", "eval_rollouts")
        )
        for table in tables:
            lake.delete_partition(table, step=step)
    if gate not in GATES:  # a job that failed every attempt: the fix is outside the lake, so try again
        answered = set(record.get("failed_runs", [])) | set(failed_runs or ())
        lake.write_json(RETRIED_FILE, sorted(retried_runs(lake) | answered))
    if redo or gate not in GATES:
        lake.delete(HALT_FILE)
        return {"resumed": True, "step": step, "redo": list(tables) if redo else []}
    result = GATES[gate](lake, step)
    if not result["passed"]:
        raise StepError(f"{gate} still fails at step {step}: {'; '.join(result['problems'][:3])}")
    lake.delete(HALT_FILE)
    return {"resumed": True, "step": step, "redo": []}


# ---------------------------------------------------------------------------- rewind
def checkpointed_steps(lake: Lake) -> set[int]:
    """Steps after which the policy is on disk: a per-step checkpoint (the simulated and neural
    learners' in the lake, a language model's periodic one in the lake's local folder) or the LM
    trainer's rolling ``latest``."""
    found = set(lake.artifact_steps("checkpoints"))
    if lake.local != lake.root:  # a remote lake keeps model checkpoints on local disk
        found.update(_local_checkpoint_steps(lake))
    latest = lake.local / "checkpoints" / "latest" / "trainer.json"
    if latest.exists():
        found.add(int(json.loads(latest.read_text())["step"]))
    return found


def _local_checkpoint_steps(lake: Lake) -> list[int]:
    """Steps with a checkpoint folder holding something under the lake's local folder."""
    found = []
    for path in (lake.local / "checkpoints").glob("step=*/*"):
        with contextlib.suppress(ValueError):
            found.append(int(path.parent.name.split("=", 1)[1]))
    return found


def rewinds(lake: Lake) -> int:
    """How many times the lake's run was rewound (its rewinds' archive folders)."""
    return len(lake.store.glob(f"archive/{REWIND_ARCHIVE}*"))


def rewind(
    lake: Lake, step: int, answered_runs: list[str] = (), remake: Callable[[int], object] | None = None
) -> dict:
    """Take the run back to ``step``: every partition and artifact of ``step`` and later (manifests,
    rollouts, metrics, evals, statistics, scheduler state, plots, checkpoints) moves to
    ``archive/rewind-to-step<step>-<ms>/``, so the loop redoes the run from there with the policy
    after ``step - 1`` (on disk, or made again by ``remake``) and the scheduler state after it
    (kept, or folded again from the kept one before it). A halt at ``step`` or later is
    cleared, and ``answered_runs`` (the Dagster runs of those steps that failed or were canceled)
    stop counting as attempts. ``remake(k)`` makes the policy after step k again where the lake no
    longer keeps it (the simulated and neural learners', from the kept one before it), before
    anything moves."""
    spec = require_run(lake)
    held = set(lake.steps("manifests")) | set(lake.steps("rollouts")) | set(lake.steps("statistics"))
    if not held:
        raise StepError(f"nothing to rewind: the run in {lake.root} holds no step yet")
    last = max(held)
    if not 0 <= step <= last:
        raise StepError(f"--to {step}: the run holds steps 0..{last}; rewind to one of them")
    record = halted(lake)
    if record is not None and record["step"] < step:
        raise StepError(
            f"the run is halted at step {record['step']}, before step {step}: rewind to step "
            f"{record['step']} or earlier, or fix it and `envsched resume`"
        )
    if step > 0:  # the state the redo selects from: a fold that fails is refused before anything moves
        selection_state(lake, spec, step)
    if step > 0 and spec.trainer != "external" and spec.policy != "openai":
        have, why = checkpointed_steps(lake), ""
        if step - 1 not in have and remake is not None and spec.policy in REMADE_CHECKPOINTS:
            try:
                remake(step - 1)
            except StepError as exc:
                why = f" and cannot be made again ({exc})"
            have = checkpointed_steps(lake)
        if step - 1 not in have:
            ok = sorted({0} | {c + 1 for c in have if c < last})
            raise StepError(
                f"--to {step}: the policy after step {step - 1} is not on disk{why}; rewind to a step "
                f"after one that is: {', '.join(map(str, ok[-12:]))}"
            )
    moved = lake.archive(f"{REWIND_ARCHIVE}{step}", lambda kind, s: s >= step)
    # checkpoints kept on local disk go to the same archive's folder there
    into = lake.local / "archive" / moved["archive"].rsplit("/", 1)[-1] / "checkpoints"
    best = best_record(lake)
    if best is not None and best.get("step", -1) >= step:  # the best held-out policy was of an undone step
        into.mkdir(parents=True, exist_ok=True)
        (lake.local / BEST_CHECKPOINT).rename(into / "best")
        moved["moved"]["best checkpoint"] = [int(best["step"])]
    if lake.local != lake.root:  # a remote lake's model checkpoints live on local disk: archived there
        for s in sorted(set(_local_checkpoint_steps(lake))):
            if s >= step:
                into.mkdir(parents=True, exist_ok=True)
                (lake.local / "checkpoints" / f"step={s}").rename(into / f"step={s}")
                moved["moved"].setdefault("local checkpoints", []).append(s)
    if record is not None:
        lake.delete(HALT_FILE)
    if (lake.read_json(PATIENCE_FILE) or {}).get("from", -1) >= step:  # a resume of an undone step
        lake.delete(PATIENCE_FILE)
    if answered_runs:
        lake.write_json(RETRIED_FILE, sorted(retried_runs(lake) | set(answered_runs)))
    return {
        "step": step,
        "archive": moved["archive"],
        "moved": moved["moved"],
        "steps": sorted({s for steps in moved["moved"].values() for s in steps}),
        "halt_cleared": record is not None,
    }
