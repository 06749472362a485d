"""`envsched report`: a self-contained page with the run's config, verdicts with confidence intervals
against baselines re-run on the run's own pool, one colour per scheduler, and charts that a real
headless Chromium renders from the embedded script (no network)."""

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from envs.registry import load_synthetic
from envsched_pipeline.analysis.compare import episode_difference, steps_to_reach
from envsched_pipeline.analysis.passk import heldout_reliability
from envsched_pipeline.analysis.report import (
    COLOURS,
    MIN_GROUPS,
    SAMPLER_GAP_TITLE,
    block_bootstrap_ci,
    build_report,
)
from envsched_pipeline.assets.report import run_report
from envsched_pipeline.cli import main
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.errors import EnvschedError
from envsched_pipeline.lake import LATEST_REPORT, Lake
from envsched_pipeline.resources.lake import LakeResource
from envsched_pipeline.run import RunSpec, start_run
from tests.conftest import run_steps

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def finished_run(small_pool):
    start_run(
        small_pool,
        RunSpec(pool="synthetic", scheduler="envsched", seed=3, batch_size=8, group_size=4, max_steps=8),
    )
    return run_steps(small_pool, 8)


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
    assert SAMPLER_GAP_TITLE not in summary["charts"]  # no sampler either
    assert all(t["groups"] >= MIN_GROUPS for t in summary["top_tasks"])
    assert "pool" in page and "Verdicts" in page


def test_a_language_model_s_sampler_gap_is_charted_where_its_steps_measured_it(finished_run, tmp_path):
    """The steps' sampler-vs-trainer log-probability gap (LM runs; here written into a finished
    run's step metrics, NaN at a step whose update trained nothing) is one panel in this run's
    colour: the mean and the largest gap, the unmeasured step a hole."""
    gaps = {s: (0.001 * (s + 1), 0.01 * (s + 1)) for s in range(8) if s != 3}
    for s in range(8):
        row = finished_run.read("train_metrics", step=s).to_pylist()[0]
        mean, largest = gaps.get(s, (math.nan, math.nan))
        finished_run.write(
            "train_metrics",
            [{**row, "sampler_logprob_diff": mean, "sampler_logprob_diff_max": largest}],
            step=s,
        )
    index = build_report(finished_run, tmp_path / "rep", baselines=False, log=lambda *_: None)
    chart = next(c for c in charts_of(index.read_text()) if c["title"] == SAMPLER_GAP_TITLE)
    assert [s["name"].rsplit(": ", 1)[1] for s in chart["series"]] == ["mean", "largest"]
    assert {s["color"] for s in chart["series"]} == {COLOURS["envsched"]}
    assert chart["series"][0]["y"] == [gaps[s][0] if s in gaps else None for s in range(8)]
    assert chart["series"][1]["y"] == [gaps[s][1] if s in gaps else None for s in range(8)]


def test_the_command_prints_the_verdicts_against_random(finished_run, tmp_path, capsys):
    assert main(["report", "--out", str(tmp_path / "rep")]) == 0
    printed = capsys.readouterr().out.splitlines()
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    against_random = [v["text"] for v in summary["verdicts"] if v["baseline"] == "random"]
    assert [line[4:] for line in printed[:-1]] == against_random and printed[-1].startswith("wrote ")


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


# ---------------------------------------------------------------------------- --against another lake
def neural_run(root, scheduler: str, seed: int = 0, batch_size: int = 4, steps: int = 3) -> Lake:
    lake = Lake(root)
    import_pool(lake, load_synthetic("synthetic", n_envs=3, tasks_per_env=4, heldout_per_env=1, seed=5))
    start_run(
        lake,
        RunSpec(
            pool="synthetic",
            policy="neural",
            scheduler=scheduler,
            seed=seed,
            batch_size=batch_size,
            group_size=4,
            max_steps=steps,
            policy_config={"warm_start_steps": 5, "eval_every": 2},
        ),
    )
    return run_steps(lake, steps)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("against")
    return neural_run(root / "envsched", "envsched"), neural_run(root / "random", "random")


def test_a_run_is_compared_with_another_schedulers_run_in_another_lake(two_runs, tmp_path, capsys):
    mine, rand = two_runs
    out = tmp_path / "rep"
    assert main(["--lake", str(mine.root), "report", "--out", str(out), "--against", str(rand.root)]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["against"][0]["name"] == "random" and summary["against"][0]["lake"] == str(rand.root)
    assert "not re-run in the simulated learner" in summary["baselines"]["note"]
    assert (
        "judged over seeds by `envsched compare" in summary["baselines"]["note"]
        and "envsched compare" in printed
    )
    by_metric = {v["metric"]: v for v in summary["verdicts"] if v["baseline"] == "random"}
    # the per-step metrics, over the steps both runs hold, against random's own per-step numbers
    bv = by_metric["Batch reward variance"]
    mine_bv = [r["batch_variance"] for r in mine.sql("select * from step_summary order by step").to_pylist()]
    rand_bv = [r["batch_variance"] for r in rand.sql("select * from step_summary order by step").to_pylist()]
    assert bv["run"] == pytest.approx(np.mean(mine_bv)) and bv["base"] == pytest.approx(np.mean(rand_bv))
    # held-out at the last common evaluation (step 2), from both runs' episodes on the same tasks
    for split in ("seen", "unseen"):
        v = by_metric[f"Held-out heldout_{split} (last common evaluation)"]
        assert v["step"] == 2
        rows = {}
        for name, lk in (("mine", mine), ("rand", rand)):
            rows[name] = lk.sql(
                f"select task_id, avg(reward) as m, var_samp(reward) / count(*) as v from eval_rollouts "
                f"where step = 2 and split = '{split}' group by task_id"
            ).to_pylist()
        n = len(rows["mine"])
        assert n == len(rows["rand"]) > 0
        diff = np.mean([r["m"] for r in rows["mine"]]) - np.mean([r["m"] for r in rows["rand"]])
        se = np.sqrt(sum(r["v"] for rs in rows.values() for r in rs)) / n
        assert v["diff"] == pytest.approx(diff) and v["se"] == pytest.approx(se)
        assert v["ci"] == pytest.approx([diff - 1.96 * se, diff + 1.96 * se])
        assert (v["better"] is None) == (abs(diff) <= 1.96 * se) and "same tasks" in v["text"]
        # the paper's count: where this run first reached random's best held-out score
        scores = {
            e["step"]: e["score"]
            for e in rand.read("evals").to_pylist()
            if e["benchmark"] == f"heldout_{split}"
        }
        assert v["reach"]["best"] == max(scores.values())
        mine_scores = {
            e["step"]: e["score"]
            for e in mine.read("evals").to_pylist()
            if e["benchmark"] == f"heldout_{split}"
        }
        first = min((s for s, x in mine_scores.items() if x >= v["reach"]["best"]), default=None)
        assert v["reach"]["reached_at"] == first
        assert v["text"] in printed
    # the best held-out step of each run (the mean over the splits), from its recorded scores, named
    # in the Run table as `envsched status` names it
    page = (out / "index.html").read_text()
    for lk, mark, entry in (
        (mine, "best held-out", summary["best_heldout"]),
        (rand, "best held-out (random)", summary["against"][0]["best_heldout"]),
    ):
        scores = {}
        for e in lk.read("evals").to_pylist():
            scores.setdefault(e["step"], []).append(e["score"])
        means = {t: np.mean(v) for t, v in scores.items()}
        step = min(t for t in means if means[t] == max(means.values()))
        assert entry["step"] == step and entry["score"] == pytest.approx(means[step])
        assert f"<td>{mark}</td><td>step {step}, score {means[step]:.4f} (the mean" in page
    for r in summary["heldout_by_env"]:
        assert r["difference"] == pytest.approx(r["mean_reward"] - r["random mean_reward"])
    # solved over repeated attempts at the last evaluation, random's beside, from both runs' episodes
    rel = summary["heldout_reliability"]
    assert rel["step"] == 2 and {(r["split"], r["k"]) for r in rel["rows"]} == {
        (split, k)
        for split in ("seen", "unseen")
        for k in (1, 2, 4, 8)  # 8 episodes a task
    }
    ours, theirs = heldout_reliability(mine, 2)["splits"], heldout_reliability(rand, 2)["splits"]
    for r in rel["rows"]:
        a = next(x for x in ours[r["split"]] if x["k"] == r["k"])
        b = next(x for x in theirs[r["split"]] if x["k"] == r["k"])
        assert r["tasks"] == a["tasks"] and r["pass^k"].startswith(f"{a['pass_hat_k']:.4f}")
        diff = a["pass_at_k"] - b["pass_at_k"]
        assert r["random pass@k"].startswith(f"{b['pass_at_k']:.4f} ({diff:+.4f}")
        assert (" ± " in r["random pass@k"]) == (r["k"] < 8)  # no error at k = the episodes a task has
    drawn = charts_of((out / "index.html").read_text())
    chart = next(c for c in drawn if c["title"].startswith("Held-out solved in any of k"))
    who = ("this run (envsched (the paper's constants))", "random")
    assert {s["name"] for s in chart["series"]} == {
        f"{w}: {split} {what}" for w in who for split in ("seen", "unseen") for what in ("pass@k", "pass^k")
    }
    # and at every evaluation: solved once and in all 8, each run's from its own episodes
    trend = {s["name"]: s for c in drawn if c["title"].endswith("over the steps") for s in c["series"]}
    for w, lk in zip(who, (mine, rand), strict=True):
        for split in ("seen", "unseen"):
            view = lk.sql(
                f"select * from heldout_pass_at_k where split = '{split}' order by step"
            ).to_pylist()
            once, every = trend[f"{w}: {split} solved once"], trend[f"{w}: {split} pass^K"]
            assert once["x"] == every["x"] == lk.steps("eval_rollouts") == [0, 2]
            assert once["y"] == pytest.approx([r["pass_at_k"] for r in view if r["k"] == 1])
            assert every["y"] == pytest.approx([r["pass_hat_k"] for r in view if r["k"] == 8])
    charts = charts_of((out / "index.html").read_text())
    names = {s["name"]: s["color"] for c in charts for s in c.get("series", [])}
    assert names["random"] == COLOURS["random"] and names["random: heldout_unseen"] == COLOURS["random"]


def test_runs_of_one_scheduler_read_apart_by_seed(two_runs, tmp_path):
    mine, rand = two_runs
    other = neural_run(tmp_path / "random1", "random", seed=1, steps=2)
    build_report(mine, tmp_path / "rep", log=lambda *_: None, against=[rand, other])
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert [a["name"] for a in summary["against"]] == ["random seed 0", "random seed 1"]
    assert summary["against"][1]["notes"] == ["seed 1 (this run: 0)"]
    # a shorter run is compared over the steps both hold
    v = next(v for v in summary["verdicts"] if v["baseline"] == "random seed 1")
    assert "over 2 steps" in v["text"]


@pytest.mark.parametrize("what", ["batch", "pool", "same", "none"])
def test_a_run_that_cannot_be_compared_is_refused_by_name_and_nothing_is_written(two_runs, tmp_path, what):
    mine, _ = two_runs
    if what == "batch":
        other, field = neural_run(tmp_path / "other", "random", batch_size=2, steps=1), "batch_size is 2"
    elif what == "pool":
        other = Lake(tmp_path / "other")
        import_pool(other, load_synthetic("synthetic", n_envs=3, tasks_per_env=4, heldout_per_env=1, seed=6))
        start_run(other, RunSpec(pool="synthetic", policy="neural", batch_size=4, group_size=4))
        field = "other training tasks"
    elif what == "same":
        other, field = mine, "this run's own lake"
    else:
        other, field = Lake(tmp_path / "nowhere"), "no lake at"
    with pytest.raises(EnvschedError, match=field) as err:
        build_report(mine, tmp_path / "rep", log=lambda *_: None, against=[other])
    assert str(other.root) in str(err.value)
    assert not (tmp_path / "rep").exists()


def test_held_out_on_different_task_subsets_counts_the_spread_over_tasks():
    a = {"t1": np.array([1.0, 1.0]), "t2": np.array([0.0, 1.0]), "t3": np.array([0.0, 0.0])}
    b = {"t4": np.array([1.0, 0.0]), "t5": np.array([1.0, 1.0])}
    d = episode_difference(a, b)
    ma, mb = np.array([1.0, 0.5, 0.0]), np.array([0.5, 1.0])
    assert d["diff"] == pytest.approx(ma.mean() - mb.mean()) and d["basis"] == "different tasks"
    assert d["se"] == pytest.approx(np.sqrt(ma.var(ddof=1) / 3 + mb.var(ddof=1) / 2))
    same = episode_difference(a, {k: 1 - v for k, v in a.items()})
    assert same["basis"] == "same tasks" and same["se"] == pytest.approx(np.sqrt(2 * 0.5 / 2) / 3)


def test_steps_to_reach_is_the_first_evaluation_at_the_others_best():
    theirs = {0: (0.2, 0.0), 40: (0.5, 0.0), 80: (0.6, 0.0), 120: (0.6, 0.0)}
    assert steps_to_reach({0: (0.3, 0.0), 20: (0.55, 0.0), 40: (0.61, 0.0)}, theirs) == {
        "best": 0.6,
        "best_step": 80,
        "reached_at": 40,
        "ratio": 2.0,
    }
    never = steps_to_reach({0: (0.3, 0.0)}, theirs)
    assert never["reached_at"] is None and never["best_step"] == 80


def materialize_report(lake: Lake, succeed: bool = True, **config) -> dict | None:
    """Materialize ``run_report`` for ``lake`` with ``config`` in a test instance; its metadata, or
    None where it is expected to fail (``succeed=False``) and did."""
    with dg.instance_for_test() as instance:
        res = dg.materialize(
            [run_report],
            instance=instance,
            resources={"lake": LakeResource(root=str(lake.root))},
            run_config={"ops": {"run_report": {"config": config}}},
            raise_on_error=succeed,
        )
    assert res.success == succeed
    return res.get_asset_materialization_events()[0].materialization.metadata if succeed else None


def test_the_report_is_an_asset_with_its_verdicts_in_the_ui(two_runs):
    mine, rand = two_runs
    meta = materialize_report(mine, against=[str(rand.root)])
    index = Path(meta["report"].value)
    assert index == Path(mine.local) / LATEST_REPORT / "index.html" and index.exists()
    summary = json.loads((index.parent / "summary.json").read_text())
    table = meta["verdicts"].value.splitlines()
    assert len(table) == 2 + len(summary["verdicts"]) and "random in" in meta["compared_with"].value
    for v, row in zip(summary["verdicts"], table[2:], strict=True):
        assert row.startswith(f"| {v['metric']} | random | {v['run']:.4g} | {v['base']:.4g} |")
