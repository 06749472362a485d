"""Asset checks next to the assets they guard. Blocking where a bad result must stop the loop:
a downstream step never runs on a manifest or rollouts that fail these."""

import json
import math
from collections import Counter

import dagster as dg

from envsched_pipeline.core.build import scheduler_config
from envsched_pipeline.orchestration.metadata import md_table
from envsched_pipeline.orchestration.partitions import step_of, training_steps
from envsched_pipeline.resources.lake import LakeResource
from envsched_pipeline.run import load_run, require_run
from envsched_pipeline.scheduler import GRAPH_SCHEDULERS


def manifest_problems(
    rows: list[dict], batch_size: int, config, relaxations: list[str], previous: list[list[dict]]
) -> list[str]:
    """Violations of the batch constraints (docs/algorithm.md §6) in a manifest (constraints relaxed and logged are allowed)."""
    problems = []
    ids = [r["task_id"] for r in rows]
    if len(ids) != len(set(ids)):
        dup = [t for t, n in Counter(ids).items() if n > 1]
        problems.append(f"duplicate tasks: {dup[:5]}")
    if len(ids) != batch_size:
        problems.append(f"{len(ids)} tasks, expected B = {batch_size}")
    if rows and rows[0].get("scheduler") not in GRAPH_SCHEDULERS:
        return problems  # only the EnvSched family applies quotas; the baselines run without, as in the paper
    per_env = Counter(r["env_id"] for r in rows)
    if "C1 per-step cap" not in relaxations:
        over = {e: n for e, n in per_env.items() if n > config.cap_env_step}
        if over:
            problems.append(f"per-step environment cap C1 = {config.cap_env_step} exceeded: {over}")
    if "C3 window cap" not in relaxations and "C1 per-step cap" not in relaxations:
        window = Counter(per_env)
        for prev in previous[-2:]:
            window.update(r["env_id"] for r in prev)
        over = {e: n for e, n in window.items() if n > config.cap_env_window}
        if over:
            problems.append(f"3-step environment cap C3 = {config.cap_env_window} exceeded: {over}")
    if "consecutive cap" not in relaxations and len(previous) >= 2:
        streak = set(ids) & {r["task_id"] for r in previous[-1]} & {r["task_id"] for r in previous[-2]}
        if streak:
            problems.append(f"tasks picked at t-2, t-1 and t: {sorted(streak)[:5]}")
    return problems


@dg.asset_check(
    asset="batch_manifest",
    blocking=True,
    partitions_def=training_steps,
    description="B distinct tasks; per-step, 3-step and consecutive caps hold unless a relaxation is logged.",
)
def manifest_is_valid(context: dg.AssetCheckExecutionContext, lake: LakeResource) -> dg.AssetCheckResult:

    lk = lake.lake()
    step = step_of(context)
    spec = require_run(lk)
    rows = lk.read("manifests", step=step).to_pylist()
    audit = lk.read("audits", step=step).to_pylist()
    relax = json.loads(audit[0]["relaxations"]) if audit and audit[0].get("relaxations") else []
    prev = [
        lk.read("manifests", step=s).to_pylist()
        for s in (step - 2, step - 1)
        if s >= 0 and lk.has("manifests", step=s)
    ]
    problems = manifest_problems(
        rows, min(spec.batch_size, _pool_size(lk, spec.pool)), scheduler_config(spec), relax, prev
    )
    return dg.AssetCheckResult(
        passed=not problems,
        metadata={
            "tasks": len(rows),
            "environments": len({r["env_id"] for r in rows}),
            "relaxations": ", ".join(relax) or "none",
            "problems": dg.MetadataValue.md("\n".join(f"- {p}" for p in problems) or "none"),
        },
    )


def _pool_size(lake, pool: str) -> int:
    return lake.read("tasks", pool=pool, columns=["task_id"]).num_rows


def rollout_problems(rollouts: list[dict], manifest: list[dict], group_size: int) -> tuple[list[str], dict]:
    problems = []
    bad = [
        r
        for r in rollouts
        if not isinstance(r["reward"], (int, float))
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
    if missing:
        problems.append(f"{len(missing)} selected tasks got no rollouts: {missing[:5]}")
    if partial:
        problems.append(
            f"{len(partial)} groups with != G = {group_size} rollouts: {dict(list(partial.items())[:5])}"
        )
    if extra:
        problems.append(f"{len(extra)} tasks rolled out that were not selected: {extra[:5]}")
    keys = Counter((r["task_id"], r["rollout"]) for r in rollouts)
    dup = [k for k, n in keys.items() if n > 1]
    if dup:
        problems.append(f"{len(dup)} duplicate (task_id, rollout) rows")
    # plan vs realized environment mix
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


@dg.asset_check(
    asset="training_step",
    blocking=True,
    partitions_def=training_steps,
    description="Rewards finite and in [0, 1]; every selected task got exactly G rollouts; no duplicates.",
)
def rollouts_are_complete(context: dg.AssetCheckExecutionContext, lake: LakeResource) -> dg.AssetCheckResult:

    lk = lake.lake()
    step = step_of(context)
    spec = require_run(lk)
    rollouts = lk.read(
        "rollouts", step=step, columns=["task_id", "rollout", "reward", "env_id", "error_class"]
    ).to_pylist()
    manifest = lk.read("manifests", step=step).to_pylist()
    problems, info = rollout_problems(rollouts, manifest, spec.group_size)
    errors = Counter(r.get("error_class") or "none" for r in rollouts)
    return dg.AssetCheckResult(
        passed=not problems,
        metadata={
            "rollouts": len(rollouts),
            "missing_groups": info["missing_groups"],
            "partial_groups": info["partial_groups"],
            "error_classes": dg.MetadataValue.json(dict(errors)),
            "plan_vs_realized": dg.MetadataValue.md(md_table(info["mix"], limit=60)),
            "problems": dg.MetadataValue.md("\n".join(f"- {p}" for p in problems) or "none"),
        },
    )


@dg.asset_check(
    asset="training_step",
    blocking=False,
    partitions_def=training_steps,
    description="Warns when an environment's infrastructure error rate spikes (it is quarantined).",
)
def infra_errors_are_low(context: dg.AssetCheckExecutionContext, lake: LakeResource) -> dg.AssetCheckResult:
    lk = lake.lake()
    step = step_of(context)
    rows = lk.read("rollouts", step=step, columns=["env_id", "error_class"]).to_pylist()
    per_env: dict[str, list[int]] = {}
    for r in rows:
        per_env.setdefault(r["env_id"], [0, 0])
        per_env[r["env_id"]][0] += 1
        per_env[r["env_id"]][1] += int(
            (r.get("error_class") or "none") in ("timeout", "env_crash", "verifier_error", "infra")
        )
    rates = [
        {"env_id": e, "rollouts": n, "infra_errors": k, "rate": k / n}
        for e, (n, k) in sorted(per_env.items())
    ]
    high = [r for r in rates if r["rate"] > 0.5]
    return dg.AssetCheckResult(
        passed=not high,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "environments_over_50pct": len(high),
            "rates": dg.MetadataValue.md(md_table(sorted(rates, key=lambda r: -r["rate"]), limit=20)),
        },
    )


@dg.asset_check(asset="topologies", blocking=True, description="Every task of the pool has a topology.")
def topologies_cover_pool(context: dg.AssetCheckExecutionContext, lake: LakeResource) -> dg.AssetCheckResult:

    lk = lake.lake()
    run = load_run(lk)
    pool = run.pool if run else "synthetic"
    tasks = set(lk.read("tasks", pool=pool, columns=["task_id"]).column("task_id").to_pylist())
    topo = set(lk.read("topologies", pool=pool, columns=["task_id"]).column("task_id").to_pylist())
    missing = sorted(tasks - topo)
    return dg.AssetCheckResult(
        passed=not missing and bool(tasks),
        metadata={
            "tasks": len(tasks),
            "with_topology": len(tasks & topo),
            "missing": ", ".join(missing[:10]) or "none",
        },
    )


ALL_CHECKS = [manifest_is_valid, rollouts_are_complete, infra_errors_are_low, topologies_cover_pool]
