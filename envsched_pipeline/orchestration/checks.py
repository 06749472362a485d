"""Asset checks next to the assets they guard. Blocking where a bad result must stop the loop:
a downstream step never runs on a manifest or rollouts that fail these."""

import warnings
from collections import Counter

import dagster as dg

from envsched_pipeline.core.gates import check_manifest, check_rollouts, halt, halt_message
from envsched_pipeline.core.loop import SAMPLER_CORRECTED_WARN, heldout_drops, sampler_drift
from envsched_pipeline.orchestration.metadata import md_table
from envsched_pipeline.orchestration.partitions import step_of, training_steps
from envsched_pipeline.resources.lake import LakeResource
from envsched_pipeline.run import load_run

# The per-step checks are partitioned like the assets they guard, which Dagster marks as a preview
# feature; we rely on it knowingly (a check's result must belong to its step), so the code server
# and `dagster dev` do not print the notice each time the definitions load.
warnings.filterwarnings(
    "ignore", message="Specifying a partitions_def on an AssetCheckSpec", category=dg.PreviewWarning
)


@dg.asset_check(
    asset="batch_manifest",
    blocking=True,
    partitions_def=training_steps,
    description="The batch has B distinct tasks; no environment takes more than its quota of the batch's slots "
    "this step, nor more than its quota over the last 3 steps; no task is picked three steps in a row, unless the "
    "scheduler relaxed (and recorded) a quota because the pool left no other choice. A problem is named with the "
    "environment and by how much it went over. A failure halts the run until `envsched resume`.",
)
def manifest_is_valid(context: dg.AssetCheckExecutionContext, lake: LakeResource) -> dg.AssetCheckResult:
    lk = lake.lake_for(context)
    step = step_of(context)
    with lk.snapshot():  # the check's reads, once each
        result = check_manifest(lk, step)
    if not result["passed"]:
        record = halt(lk, step, "manifest_is_valid", result["problems"])
        context.log.error(halt_message(record))
    return dg.AssetCheckResult(
        passed=result["passed"],
        metadata={
            "tasks": result["tasks"],
            "environments": result["environments"],
            "relaxations": ", ".join(result["relaxations"]) or "none",
            "problems": dg.MetadataValue.md("\n".join(f"- {p}" for p in result["problems"]) or "none"),
        },
    )


@dg.asset_check(
    asset="training_step",
    blocking=True,
    partitions_def=training_steps,
    description="Rewards finite and in [0, 1]; every selected task got exactly G rollouts with ids 0..G-1; "
    "no duplicates, no unselected tasks. A failure halts the run.",
)
def rollouts_are_complete(context: dg.AssetCheckExecutionContext, lake: LakeResource) -> dg.AssetCheckResult:
    lk = lake.lake_for(context)
    step = step_of(context)
    with lk.snapshot():  # the check's reads, once each
        result = check_rollouts(lk, step)
        if not result["passed"]:
            record = halt(lk, step, "rollouts_are_complete", result["problems"])
            context.log.error(halt_message(record))
        errors = (
            Counter(
                r or "none"
                for r in lk.read("rollouts", step=step, columns=["error_class"])
                .column("error_class")
                .to_pylist()
            )
            if lk.has("rollouts", step=step)
            else Counter()
        )
    return dg.AssetCheckResult(
        passed=result["passed"],
        metadata={
            "rollouts": result["rollouts"],
            "missing_groups": result["missing_groups"],
            "partial_groups": result["partial_groups"],
            "error_classes": dg.MetadataValue.json(dict(errors)),
            "plan_vs_realized": dg.MetadataValue.md(md_table(result["mix"], limit=60)),
            "problems": dg.MetadataValue.md("\n".join(f"- {p}" for p in result["problems"]) or "none"),
        },
    )


@dg.asset_check(
    asset="training_step",
    blocking=False,
    partitions_def=training_steps,
    description="Warns when an environment's infrastructure error rate spikes (it is quarantined).",
)
def infra_errors_are_low(context: dg.AssetCheckExecutionContext, lake: LakeResource) -> dg.AssetCheckResult:
    lk = lake.lake_for(context)
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


@dg.asset_check(
    asset="training_step",
    blocking=False,
    partitions_def=training_steps,
    description="Warns when a held-out score the step measured (neural and LM policies) fell below its best "
    "earlier score by more than two standard errors of the difference: the policy may be forgetting, or "
    "overfitting the training tasks. `envsched status` names the best policy so far; `--eval-patience N` "
    "stops the run after N evaluations in a row below it.",
)
def heldout_holds(context: dg.AssetCheckExecutionContext, lake: LakeResource) -> dg.AssetCheckResult:
    result = heldout_drops(lake.lake_for(context), step_of(context))
    return dg.AssetCheckResult(
        passed=not result["drops"],
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "evaluated": result["evaluated"],
            "splits_below_their_best": len(result["drops"]),
            "splits": dg.MetadataValue.md(
                md_table(result["splits"], limit=10) if result["splits"] else "none"
            ),
        },
    )


@dg.asset_check(
    asset="training_step",
    blocking=False,
    partitions_def=training_steps,
    description=f"Warns when a language model's sampler (vLLM, or another precision) and its trainer disagree "
    f"on more than {SAMPLER_CORRECTED_WARN:.0%} of the trained tokens by more than the sampler correction's "
    "cap: the update is training off policy. Passes where nothing was measured (other policies).",
)
def sampler_matches_trainer(
    context: dg.AssetCheckExecutionContext, lake: LakeResource
) -> dg.AssetCheckResult:
    result = sampler_drift(lake.lake_for(context), step_of(context))
    return dg.AssetCheckResult(
        passed=not result["drifting"],
        severity=dg.AssetCheckSeverity.WARN,
        metadata={k: v for k, v in result.items() if v is not None},
    )


@dg.asset_check(asset="topologies", blocking=True, description="Every task of the pool has a topology.")
def topologies_cover_pool(context: dg.AssetCheckExecutionContext, lake: LakeResource) -> dg.AssetCheckResult:

    lk = lake.lake_for(context)
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


ALL_CHECKS = [
    manifest_is_valid,
    rollouts_are_complete,
    infra_errors_are_low,
    heldout_holds,
    sampler_matches_trainer,
    topologies_cover_pool,
]
