"""``run_report``: the run's report page (``envsched report``) as an asset, for whoever watches the
run in the Dagster UI: materialize it at any point of a run, optionally against runs in other lakes."""

import json
from pathlib import Path

import dagster as dg
from pydantic import Field

from envsched_pipeline.analysis.compare import VERDICT_WORD
from envsched_pipeline.lake import Lake
from envsched_pipeline.resources.lake import LakeResource

REPORT_DIR = "reports/latest"


class ReportConfig(dg.Config):
    against: list[str] = Field(
        default_factory=list,
        description="Lakes holding runs of the same pool, policy, B and G to compare with (another "
        "scheduler's, e.g. random's); empty: baselines re-run in the simulated learner.",
    )
    baselines: bool = Field(
        default=True,
        description="Re-run baselines in the simulated learner (a simulated run without `against`).",
    )


def verdict_table(verdicts: list[dict]) -> str:
    """The report's verdicts as a markdown table (the UI renders it)."""
    if not verdicts:
        return "No baselines to compare with."
    lines = [
        "| metric | against | this run | theirs | difference [95% CI] | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for v in verdicts:
        ci = f" [{v['ci'][0]:+.4g}, {v['ci'][1]:+.4g}]" if v.get("ci") else ""
        lines.append(
            f"| {v['metric']} | {v['baseline']} | {v['run']:.4g} | {v['base']:.4g} | {v['diff']:+.4g}{ci} | "
            f"{VERDICT_WORD[v['better']]} |"
        )
    return "\n".join(lines)


@dg.asset(
    deps=["reward_statistics"],
    group_name="report",
    kinds={"html"},
    description="The run's report page: config, verdicts with confidence intervals against baselines "
    "or other runs, interactive charts (what `envsched report` writes).",
)
def run_report(
    context: dg.AssetExecutionContext, config: ReportConfig, lake: LakeResource
) -> dg.MaterializeResult:
    from envsched_pipeline.analysis.report import build_report  # can reach torch: only when it runs

    lk = lake.lake_for(context)
    index = build_report(
        lk,
        Path(lk.local) / REPORT_DIR,
        baselines=config.baselines,
        log=context.log.info,
        against=[Lake(a) for a in config.against],
    )
    summary = json.loads((index.parent / "summary.json").read_text())
    return dg.MaterializeResult(
        metadata={
            "report": dg.MetadataValue.path(str(index)),
            "steps": summary["config"]["steps"],
            "scheduler": summary["config"]["scheduler"],
            "compared_with": summary["baselines"]["note"],
            "verdicts": dg.MetadataValue.md(verdict_table(summary["verdicts"])),
        }
    )
