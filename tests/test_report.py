"""`envsched report`: a self-contained page with the run's config, verdicts with confidence intervals
against baselines re-run on the run's own pool, one colour per scheduler, and charts that a real
headless Chromium renders from the embedded script (no network)."""

import json
import re
import shutil
import subprocess

import numpy as np
import pytest

from envsched_pipeline.analysis.report import COLOURS, MIN_GROUPS, block_bootstrap_ci, build_report
from envsched_pipeline.core.select import select_manifest
from envsched_pipeline.core.statistics import statistics_step
from envsched_pipeline.run import RunSpec, start_run
from trainer.step import run_step

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def finished_run(small_pool):
    start_run(
        small_pool,
        RunSpec(pool="synthetic", scheduler="envsched", seed=3, batch_size=8, group_size=4, max_steps=8),
    )
    for t in range(8):
        select_manifest(small_pool, t)
        run_step(small_pool, t, log=lambda *_: None)
        statistics_step(small_pool, t)
    return small_pool


def charts_of(page: str) -> list[dict]:
    return json.loads(
        re.search(r'<script id="charts" type="application/json">(.*?)</script>', page, re.S).group(1)
    )


def test_report_states_config_verdicts_and_consistent_colours(finished_run, tmp_path):
    index = build_report(finished_run, tmp_path / "rep", log=lambda *_: None)
    page = index.read_text()
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    cfg = summary["config"]
    assert cfg["pool"] == "synthetic" and cfg["B (tasks per step)"] == 8 and cfg["G (rollouts per task)"] == 4
    assert cfg["seed"] == 3 and cfg["run id"] and cfg["scheduler config hash"] != "—"
    assert "re-run on this run's own pool ('synthetic'" in summary["baselines"]["note"]
    assert "envsched" not in summary["baselines"]["names"] and "random" in summary["baselines"]["names"]
    # one verdict per headline metric and baseline, each with its interval around the difference
    against_random = [v for v in summary["verdicts"] if v["baseline"] == "random"]
    assert {v["metric"] for v in against_random} >= {"Batch reward variance", "Zero-variance group fraction"}
    for v in against_random:
        if v["ci"]:
            assert v["ci"][0] <= v["diff"] <= v["ci"][1] and "95% CI" in v["text"]
    # no external resource: the page works offline
    assert "<script src" not in page and "<img" not in page and "https://" not in page
    # one colour per scheduler on every panel; this run wears its scheduler's colour
    charts = charts_of(page)
    seen: dict[str, set] = {}
    for c in charts:
        for s in c.get("series", []):
            key = "this run" if s["name"].startswith("this run") else s["name"].replace(" (simulated)", "")
            seen.setdefault(key, set()).add(s["color"])
    assert seen["this run"] == {COLOURS["envsched"]}
    assert all(len(v) == 1 for k, v in seen.items() if k not in ("this run",)), seen
    assert COLOURS["envsched"] not in set().union(*(v for k, v in seen.items() if k != "this run"))
    # panels only for data that exists: the simulated learner has no loss
    assert "GRPO loss" not in summary["charts"] and "Held-out score" in summary["charts"]
    assert all(t["groups"] >= MIN_GROUPS for t in summary["top_tasks"])
    assert "pool" in page and "Verdicts" in page


def test_report_without_baselines_says_so(finished_run, tmp_path):
    build_report(finished_run, tmp_path / "rep", baselines=False, log=lambda *_: None)
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert summary["verdicts"] == [] and "not re-run" in summary["baselines"]["note"]


def test_block_bootstrap_interval_widens_with_autocorrelation():
    rng = np.random.default_rng(0)
    iid = rng.normal(0.1, 1.0, 400)
    walk = np.convolve(rng.normal(0, 1, 420), np.ones(20) / np.sqrt(20), mode="valid")[:400] + 0.1
    lo_i, hi_i = block_bootstrap_ci(iid)
    lo_w, hi_w = block_bootstrap_ci(walk)
    assert lo_i < iid.mean() < hi_i
    assert (hi_w - lo_w) > 1.5 * (hi_i - lo_i)  # neighbouring steps are not independent evidence


def test_report_charts_render_in_headless_chromium(finished_run, tmp_path):
    assert CHROMIUM, "chromium is not installed (make test installs it)"
    index = build_report(finished_run, tmp_path / "rep", log=lambda *_: None)
    charts = charts_of(index.read_text())
    dom = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'chrome'}",
            "--window-size=1200,3000",
            "--virtual-time-budget=8000",
            "--dump-dom",
            index.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert f'data-charts-rendered="{len(charts)}"' in dom, dom[-2000:]
    lines = sum(1 for c in charts for s in c.get("series", []) if not s.get("points"))
    assert dom.count('class="line"') >= lines
    heat = next(c for c in charts if c["kind"] == "heatmap")
    assert dom.count('class="cell"') == len(heat["rows"]) * len(heat["cols"])
