"""What the loop does next, the run's status, and the per-step summary, all read from the lake
(the single source of truth, so the sensor, the CLI and a resumed run agree)."""

from __future__ import annotations

import math

from envsched_pipeline.core.gates import checkpointed_steps, halt_message, halted, patience_count
from envsched_pipeline.errors import EnvschedError, LakeError
from envsched_pipeline.lake import BEST_CHECKPOINT, Lake, best_evaluated, best_record
from envsched_pipeline.lease import holders
from envsched_pipeline.run import CHECKPOINT_FILES, SAMPLER_METRICS, load_run


def _done(lake: Lake, external: bool) -> tuple[set, set, set]:
    sel = set(lake.steps("manifests"))
    roll = set(lake.steps("rollouts"))
    if not external:
        roll &= set(lake.steps("train_metrics"))
    stats = set(lake.steps("statistics"))  # a state is saved before them (and folded again if dropped)
    return sel, roll, stats


def consistency_problems(lake: Lake) -> list[str]:
    """Partitions missing below the run's frontier: a step that has later steps but lacks its own
    manifest, rollouts, metrics or statistics (e.g. a deleted partition). A step's rollouts and
    statistics are due once a manifest was chosen from them, so the last ``select_lag`` manifests
    of a run that selects ahead may wait for theirs."""
    spec = load_run(lake)
    if spec is None:
        return []
    sel, roll, stats = _done(lake, spec.trainer == "external")
    written = set(lake.steps("rollouts"))  # ``roll`` less an internal step's unfinished ones
    every = sel | written | stats
    frontier = max(every) if every else -1
    # a step's rollouts and statistics are due once a later step has them or a manifest was chosen
    # from them: the next one, or select_lag further for a run that selects ahead of its rollouts
    due = {
        "manifest": frontier,
        "rollouts": max(written | stats, default=-1),
        "statistics": max(stats, default=-1),
    }
    problems = []
    for t in range(frontier):
        missing = [
            name
            for name, have in (("manifest", sel), ("rollouts", roll), ("statistics", stats))
            if t not in have and (t < due[name] or t + 1 + spec.select_lag in sel)
        ]
        if missing:
            problems.append(f"step {t}: {', '.join(missing)} missing although step {frontier} exists")
    return problems


def status(lake: Lake) -> dict:
    """Where the run stands (what `envsched status` prints), from one read of each thing it asks
    about (``Lake.snapshot``)."""
    with lake.snapshot():
        return _status(lake)


def _status(lake: Lake) -> dict:
    spec = load_run(lake)
    sel, roll, stats = lake.steps("manifests"), lake.steps("rollouts"), lake.steps("statistics")
    problems = consistency_problems(lake)
    return {
        "lake": str(lake.root),
        "run": spec.to_dict() if spec else None,
        "last_selected": sel[-1] if sel else None,
        "last_ingested": roll[-1] if roll else None,
        "last_statistics": stats[-1] if stats else None,
        "next": next_action(lake) if spec else None,
        "halted": halted(lake),
        "consistent": not problems,
        "problems": problems,
        "best_heldout": best_heldout(lake),
        # the early stop's count (`--eval-patience`): evaluations since the best without a better one
        "patience": patience_count(lake, stats[-1], spec) if spec and stats else None,
        # the steps after which the policy is on disk (none for a policy with no weights here)
        "checkpoints": sorted(checkpointed_steps(lake))
        if spec and spec.trainer != "external" and spec.policy != "openai"
        else [],
        "against": [partner(path) for path in spec.against] if spec else [],
        **holders(lake),
    }


def partner(path: str) -> dict:
    """How far a run the report compares with (a lake of the run's ``against``) has got: ``state``
    is "complete", "under way", "not started" or "unreadable" (``problem`` says why), with its
    scheduler and statistics steps where it has a run."""
    other = Lake(path)
    try:
        spec = load_run(other)
        if spec is None:
            return {"lake": str(other.root), "state": "not started"}
        stats = other.steps("statistics")
        return {
            "lake": str(other.root),
            "state": "complete" if next_action(other) is None else "under way",
            "scheduler": spec.scheduler,
            "steps": len(stats),
            "last_step": stats[-1] if stats else None,
            "max_steps": spec.max_steps,
        }
    except (EnvschedError, OSError) as exc:  # a damaged partner: named, never the status's end
        return {"lake": str(other.root), "state": "unreadable", "problem": str(exc)}


def best_heldout(lake: Lake) -> dict | None:
    """The step whose policy scored best on held-out so far, its scores (``score``: the mean over the
    splits evaluated; ``heldout_<split>``: each split's) and where its policy is: a language model's
    kept copy (``checkpoints/best``); for the neural learner, whose lake keeps that step's checkpoint
    while it is the best (a run from before that keep may have dropped it), the
    best evaluated step (:func:`best_evaluated`) with its checkpoint's place where the lake still
    keeps it (``policy``; None when `envsched evaluate --best` makes it again). None before the
    first evaluation."""
    record = best_record(lake)
    if record is not None:
        return {**record, "policy": str(lake.local / BEST_CHECKPOINT / "policy")}
    spec = load_run(lake)
    if spec is None or spec.policy != "neural" or spec.trainer == "external":
        return None
    best = best_evaluated(lake)
    if best is None:
        return None
    rel = Lake.artifact_rel("checkpoints", best["step"], CHECKPOINT_FILES["neural"])
    return {**best, "policy": lake.where(rel) if lake.exists(rel) else None}


def best_heldout_text(best: dict) -> str:
    """:func:`best_heldout` in words, as `envsched status` and the report say it: the step, its mean
    score and each split's, and where its policy is."""
    splits = ", ".join(
        f"{k.removeprefix('heldout_')} {v:.4f}" for k, v in best.items() if k.startswith("heldout_")
    )
    where = (  # the neural learner's: the step's checkpoint, or none where an older run dropped it
        f"policy in {best['policy']}"
        if best["policy"]
        else "its checkpoint was dropped; `envsched evaluate --best` makes it again"
    )
    return (
        f"step {best.get('step')}, score {best.get('score', float('nan')):.4f} (the mean over the "
        f"splits evaluated{': ' + splits if splits else ''}); {where}"
    )


def next_action(lake: Lake) -> tuple[str, int] | None:
    """What the loop should do next: ("select", t), ("train", t), ("stats", t), ("wait", t)
    (an external trainer has not ingested step t yet), ("halted", t) (a gate failed: see
    ``halt.json``), ("broken", t) (a partition below the frontier is missing), or None when the
    run is complete.

    The lake is the single source of truth, so the sensor, the CLI and a resumed run agree.
    """
    spec = load_run(lake)
    if spec is None:
        return None
    record = halted(lake)
    if record is not None:
        return ("halted", int(record["step"]))
    problems = consistency_problems(lake)
    if problems:
        return ("broken", int(problems[0].split(":")[0].split()[1]))
    sel, roll, stats = _done(lake, spec.trainer == "external")
    t = 0
    while t < spec.max_steps:
        if t not in sel:
            return ("select", t)
        if t not in roll:
            return ("wait", t) if spec.trainer == "external" else ("train", t)
        if t not in stats:
            return ("train", t) if spec.trainer == "external" else ("stats", t)
        t += 1
    return None


def explain(lake: Lake, action: tuple[str, int]) -> str:
    """Why the loop cannot go on, in words (for "halted" and "broken")."""
    kind, step = action
    if kind == "halted":
        return halt_message(halted(lake))
    if kind == "broken":
        return (
            f"the lake is inconsistent ({'; '.join(consistency_problems(lake)[:3])}); restore the partitions, "
            f"or `envsched rewind --to {step}` to redo the run from there"
        )
    return f"{kind} step {step}"


def step_summary(lake: Lake) -> list[dict]:
    """Per-step table for the CLI (computed from the lake, so a resumed run prints every step)."""
    # the documented step_summary view (warehouse/views.sql) + timing and held-out score
    q = """
        select s.step, s.batch_variance, s.zero_variance_fraction, s.envs_touched, s.mean_reward,
               tm.seconds as seconds, ev.seen as heldout_seen, ev.unseen as heldout_unseen
        from step_summary s
        left join train_metrics tm on tm.step = s.step
        left join (select step,
                          avg(score) filter (where benchmark like 'heldout_seen%') as seen,
                          avg(score) filter (where benchmark like 'heldout_unseen%') as unseen
                   from evals group by step) ev on ev.step = s.step
        order by s.step
        """
    con = lake.connect([q])  # only the views it reads
    try:
        cur = con.execute(q)
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        # the trainer's own metrics (loss, grad norm, KL, ...) where the summary has no such column
        cur = con.execute("select * from train_metrics")
        tm_names = [d[0] for d in cur.description]
        by_step = {r[tm_names.index("step")]: dict(zip(tm_names, r, strict=True)) for r in cur.fetchall()}
        for r in rows:
            for k, v in by_step.get(r["step"], {}).items():
                r.setdefault(k, v)
        return rows
    except Exception as exc:
        raise LakeError(f"cannot summarize steps in {lake.root}: {exc}") from exc
    finally:
        con.close()


HELDOUT_DROP_FLOOR = (
    0.01  # a drop smaller than this is never flagged (a learner whose evaluation has no error)
)


# the share of a step's trained tokens the sampler correction changed past which the sampler and the
# trainer are called apart (a language model's; trainer.loss.sampler_weights): the update is then
# noticeably off policy, worth a look at the engine's precision or kernels (docs/deployment.md)
SAMPLER_CORRECTED_WARN = 0.05


def sampler_drift(lake: Lake, step: int) -> dict:
    """How far a language model's sampler and trainer were apart at ``step`` (its train_metrics):
    {"measured", "drifting", and the step's sampler numbers}. A step without them (another policy,
    or an update that trained no token) is not measured, and not drifting."""
    rows = lake.read("train_metrics", step=step).to_pylist() if lake.has("train_metrics", step=step) else []
    got = {k: rows[0].get(k) for k in SAMPLER_METRICS} if rows else dict.fromkeys(SAMPLER_METRICS)
    got = {k: v if isinstance(v, (int, float)) and math.isfinite(v) else None for k, v in got.items()}
    measured = got["sampler_corrected_fraction"] is not None
    return {
        "measured": measured,
        "drifting": measured and got["sampler_corrected_fraction"] > SAMPLER_CORRECTED_WARN,
        **got,
    }


def heldout_drops(lake: Lake, step: int) -> dict:
    """Held-out splits whose score at ``step`` fell below their best earlier score by more than two
    standard errors of the difference (and at least HELDOUT_DROP_FLOOR): {"evaluated", "drops",
    "splits": [{split, score, best, best_step, drop, threshold}]}. Steps without an evaluation
    report ``evaluated`` False."""
    rows = [
        r
        for r in lake.sql(
            f"select * from evals where benchmark like 'heldout_%' and step <= {int(step)} order by step"
        ).to_pylist()
        if r.get("score") is not None
    ]
    now = {r["benchmark"]: r for r in rows if r["step"] == step}
    splits = []
    for bench, r in sorted(now.items()):
        earlier = [e for e in rows if e["benchmark"] == bench and e["step"] < step]
        if not earlier:
            continue
        best = max(earlier, key=lambda e: (e["score"], -e["step"]))
        se = ((r.get("se") or 0.0) ** 2 + (best.get("se") or 0.0) ** 2) ** 0.5
        threshold = max(2 * se, HELDOUT_DROP_FLOOR)
        drop = best["score"] - r["score"]
        splits.append(
            {
                "split": bench.removeprefix("heldout_"),
                "score": r["score"],
                "best": best["score"],
                "best_step": best["step"],
                "drop": drop,
                "threshold": threshold,
            }
        )
    return {
        "evaluated": bool(now),
        "drops": [s for s in splits if s["drop"] > s["threshold"]],
        "splits": splits,
    }
