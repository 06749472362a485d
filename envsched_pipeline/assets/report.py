"""``run_report``: the run's report page (``envsched report``) as an asset, for whoever watches the
run in the Dagster UI: materialize it at any point of a run, optionally against runs in other lakes,
and, given this scheduler's runs at other seeds, judged over seeds (``envsched compare``)."""

import json
from pathlib import Path

import dagster as dg
from pydantic import Field

from envsched_pipeline.analysis.compare import VERDICT_WORD, interval_text
from envsched_pipeline.analysis.plots import embed
from envsched_pipeline.analysis.seeds import compare_seeds, write_comparison
from envsched_pipeline.lake import LATEST_REPORT, Lake
from envsched_pipeline.resources.lake import LakeResource

SEEDS_DIR = "seeds"  # under LATEST_REPORT: the page over seeds


class ReportConfig(dg.Config):
    against: list[str] = Field(
        default_factory=list,
        description="Lakes holding runs of the same pool, policy, B and G to compare with (another "
        "scheduler's, e.g. random's); empty: the runs this run names (`envsched train --against`) that "
        "hold steps, else baselines re-run in the simulated learner.",
    )
    seeds: list[str] = Field(
        default_factory=list,
        description="Lakes holding this scheduler's runs at other seeds (one per seed): with `against` "
        "holding the other scheduler's runs of the same seeds, the runs are also judged over seeds, as "
        "`envsched compare` does, and that page is written beside the report; the report itself then "
        "compares this run with the `against` run of its own seed only.",
    )
    effect: float | None = Field(
        default=None,
        description="With `seeds`: a held-out difference worth finding (e.g. 0.01); each held-out verdict "
        "over seeds then says how many seeds would resolve it (`envsched compare --effect`).",
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
        lines.append(
            f"| {v['metric']} | {v['baseline']} | {v['run']:.4g} | {v['base']:.4g} | "
            f"{v['diff']:+.4g}{interval_text(v.get('ci'))} | "
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
    # the runs over seeds are checked (and compared) before anything is written: a lake refused there
    # leaves no report behind
    against = [Lake(a) for a in config.against] or None  # none named here: the run's own
    seeds = (
        compare_seeds([lk, *[Lake(x) for x in config.seeds]], against or [], effect=config.effect)
        if config.seeds
        else None
    )
    if seeds is not None:
        # the report judges one pair of runs: this run against the other scheduler's run of its own
        # seed (the rest of `against` are the other seeds' partners, judged on the page over seeds)
        mine = str(lk.root)
        against = [Lake(p["against_lake"]) for p in seeds["pairs"] if p["run_lake"] == mine]
    index = build_report(
        lk,
        Path(lk.local) / LATEST_REPORT,
        baselines=config.baselines,
        log=context.log.info,
        against=against,
    )
    summary = json.loads((index.parent / "summary.json").read_text())
    metadata = {
        "report": dg.MetadataValue.path(str(index)),
        "steps": summary["config"]["steps"],
        "scheduler": summary["config"]["scheduler"],
        "compared_with": summary["baselines"]["note"],
        "verdicts": dg.MetadataValue.md(verdict_table(summary["verdicts"])),
    }
    if summary["not_compared"]:  # runs this run names, not started or without steps yet
        metadata["not_compared_yet"] = dg.MetadataValue.md(
            "\n".join(f"- {w}" for w in summary["not_compared"])
        )
    if seeds is not None:
        page = write_comparison(seeds, index.parent / SEEDS_DIR)
        metadata["over_seeds_page"] = dg.MetadataValue.path(str(page))
        metadata["over_seeds"] = dg.MetadataValue.md(
            "\n".join(
                [*seeds_table(seeds["verdicts"]), "", embed(str(page.parent / "by_seed.png"), "by seed")]
            )
        )
    return dg.MaterializeResult(metadata=metadata)


def seeds_table(verdicts: list[dict]) -> list[str]:
    """The verdicts over seeds as markdown rows (the UI renders them)."""
    lines = [
        "| metric | seeds | this scheduler | theirs | mean difference ± s.e. [95% t interval] | better in | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in verdicts:
        lines.append(
            f"| {v['metric']} | {v['n']} | {v['run']:.4g} | {v['against']:.4g} | {v['mean']:+.4g} ± {v['se']:.2g} "
            f"[{v['ci'][0]:+.4g}, {v['ci'][1]:+.4g}] | {v['wins']} of {v['n']} | {VERDICT_WORD[v['better']]} |"
        )
    return lines
