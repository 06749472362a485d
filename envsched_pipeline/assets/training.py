"""``training_step[t]``: the GRPO step for manifest t, launched (not imported) through Pipes."""

import dagster as dg

from envsched_pipeline.analysis.passk import headline_reliability, split_episodes
from envsched_pipeline.analysis.plots import statistics_trends, training_curves, yield_calibration_plot
from envsched_pipeline.analysis.rollouts_view import render, samples
from envsched_pipeline.assets._common import guard, materialized, plot_md
from envsched_pipeline.core.gates import check_manifest, halt, halt_message
from envsched_pipeline.core.loop import best_heldout
from envsched_pipeline.core.statistics import statistics_step
from envsched_pipeline.orchestration.metadata import scalar_metadata
from envsched_pipeline.orchestration.partitions import step_of, training_steps
from envsched_pipeline.resources.lake import LakeResource
from envsched_pipeline.resources.trainer import TrainerLauncher
from envsched_pipeline.run import require_run
from envsched_pipeline.trackers import log_step


@dg.asset(
    partitions_def=training_steps,
    deps=["batch_manifest"],
    group_name="training",
    kinds={"pytorch", "parquet"},
    pool="gpu",
    description="Rollouts (G per task) and the policy update for step t; writes rollouts and train_metrics. "
    "Runs in the `gpu` concurrency pool: two GPU steps never overlap.",
)
def training_step(context: dg.AssetExecutionContext, lake: LakeResource, trainer: TrainerLauncher):

    step = step_of(context)
    lk = lake.lake_for(context)
    with lk.snapshot():  # the gates before the launch read the lake once
        guard(context, lk)
        gate = check_manifest(lk, step)
        if not gate["passed"]:  # never train on a manifest that fails its check, whoever asks
            raise dg.Failure(halt_message(halt(lk, step, "manifest_is_valid", gate["problems"])))
        mode = trainer.resolved_mode(require_run(lk).trainer)
    if mode == "external":
        if not lk.has("rollouts", step=step):
            raise dg.Failure(
                f"external trainer: rollouts of step {step} are not ingested yet "
                "(`envsched step ingest --step {step} ...`)"
            )
        r = lk.read("rollouts", step=step)
        return materialized(
            context, {"dagster/row_count": r.num_rows, "trainer": "external", **step_views(context, lk, step)}
        )
    result = trainer.launch(context, str(lk.root), step, mode=mode).get_materialize_result()
    return materialized(context, {**(result.metadata or {}), **step_views(context, lk, step)})


def step_views(context, lk, step: int) -> dict:
    """The step's curves (inline), its held-out scores when it evaluated (numbers, so the asset's
    plots chart them over the steps), a few of its rollouts, rendered (the best, the worst and one
    zero-variance group), and its worst held-out episode of each split; the lake read once."""
    with lk.snapshot():
        return _step_views(context, lk, step)


def _step_views(context, lk, step: int) -> dict:
    out = plot_md(context, "curves", training_curves, lk, step)
    for e in lk.read("evals", step=step).to_pylist():
        name = (e.get("benchmark") or "").split(" ")[0]  # "heldout_seen (simulated)": heldout_seen
        if name.startswith("heldout_") and e.get("score") is not None:
            out[name] = float(e["score"])
            if e.get("se") is not None:
                out[f"{name}_se"] = float(e["se"])
    if any(k.startswith("heldout_") for k in out):  # which policy to keep, so far: `evaluate --best`'s
        best = best_heldout(lk)
        if best is not None:
            out["heldout_best_step"] = int(best["step"])
            out["heldout_best_score"] = float(best["score"])
    try:
        spec = require_run(lk)
        rows = lk.read("rollouts", step=step).to_pylist()
        tasks = {
            t["task_id"]: t
            for t in lk.read("tasks", pool=spec.pool, columns=["task_id", "instruction"]).to_pylist()
        }
        shown = samples(rows)
        if shown:
            text = "\n\n".join(
                f"**{label}**\n\n```\n{render(r, tasks.get(r['task_id']), width=110)}\n```"
                for label, r in shown.items()
            )
            out["sample_rollouts"] = dg.MetadataValue.md(
                text + f"\n\n_more: `envsched rollouts show --step {step}`_"
            )
        if lk.has("eval_rollouts", step=step):  # the worst held-out episode of each split
            table = lk.read("eval_rollouts", step=step)
            out.update(headline_reliability(split_episodes(table)))
            held = table.to_pylist()
            ev_tasks = {
                t["task_id"]: t
                for t in lk.read("eval_tasks", pool=spec.pool, columns=["task_id", "instruction"]).to_pylist()
            }
            worst = {}
            for r in sorted(held, key=lambda r: (r["reward"], r["task_id"], r["sample"])):
                worst.setdefault(r["split"], r)
            out["heldout_failures"] = dg.MetadataValue.md(
                "\n\n".join(
                    f"**worst held-out episode, {split} environments**\n\n```\n"
                    f"{render(r, ev_tasks.get(r['task_id']), width=110)}\n```"
                    for split, r in sorted(worst.items())
                )
                + f"\n\n_more: `envsched rollouts show --step {step} --heldout`_"
            )
    except Exception as exc:  # noqa: BLE001 - a rendering problem must not fail the step
        context.log.warning(f"sample rollouts could not be rendered: {exc}")
    return out


@dg.asset(
    partitions_def=training_steps,
    deps=["training_step"],
    group_name="training",
    kinds={"parquet", "numpy"},
    description="Per-task reward statistics after step t and the scheduler state they update.",
)
def reward_statistics(context: dg.AssetExecutionContext, lake: LakeResource) -> dg.MaterializeResult:

    lk = lake.lake_for(context)
    with lk.snapshot():  # the lake read once for the step's bookkeeping
        guard(context, lk)
        out = statistics_step(lk, step_of(context))
        spec = require_run(lk)
        if spec.report_to:
            try:
                log_step(lk, spec, step_of(context))
            except Exception as exc:  # noqa: BLE001 - a tracker being down must not fail the step
                context.log.warning(f"experiment tracker logging failed: {type(exc).__name__}: {exc}")
        return materialized(
            context,
            {
                "dagster/row_count": out["tasks_updated"],
                **scalar_metadata(out),
                **plot_md(context, "trends", statistics_trends, lk, spec.pool, step_of(context)),
                **plot_md(context, "yield_calibration", yield_calibration_plot, lk, step_of(context)),
            },
        )
