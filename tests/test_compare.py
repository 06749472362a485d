"""`envsched compare`: one scheduler's runs against another's, paired by seed, judged by the spread of
the paired differences over seeds (not by one pair's sampling error), on real runs in real lakes:
the simulated learner for the per-step metrics and the pairing, the neural learner for held-out
from evaluation episodes (where the pairs' own sampling error is known)."""

import base64
import json
import math
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from envs.registry import load_synthetic
from envsched_pipeline.analysis.ablation import compare_rows, table_cells, table_markdown
from envsched_pipeline.analysis.compare import changed_settings, heldout_verdicts
from envsched_pipeline.analysis.passk import heldout_reliability
from envsched_pipeline.analysis.seeds import (
    MAX_SEEDS,
    compare_seeds,
    over_seeds,
    seeds_for_power,
    seeds_to_resolve,
    t_power,
)
from envsched_pipeline.api import ExternalRun
from envsched_pipeline.assets.report import SEEDS_DIR
from envsched_pipeline.cli import main
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.errors import EnvschedError
from envsched_pipeline.lake import LATEST_REPORT, Lake
from envsched_pipeline.run import RunSpec, require_run, start_run
from envsched_pipeline.scheduler.variants import resolve
from tests.conftest import SMALL, run_steps
from tests.test_report import materialize_report, neural_run


class PageParts(HTMLParser):
    """A page's table rows (cell texts), image sources and list items."""

    def __init__(self):
        super().__init__()
        self.rows, self.images, self.items, self._text = [], [], [], None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th", "li"):
            self._text = ""
        elif tag == "img":
            self.images.append(dict(attrs)["src"])

    def handle_data(self, data):
        if self._text is not None:
            self._text += data

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.rows[-1].append(self._text)
        elif tag == "li":
            self.items.append(self._text)
        if tag in ("td", "th", "li"):
            self._text = None


def sim_run(root, scheduler: str, seed: int, steps: int = 6, pool_seed: int = SMALL["seed"]) -> Lake:
    lake = Lake(root)
    import_pool(lake, load_synthetic("synthetic", **{**SMALL, "seed": pool_seed}))
    name, config = resolve(scheduler)
    spec = RunSpec(
        pool="synthetic",
        scheduler=name,
        scheduler_config=config,
        seed=seed,
        batch_size=8,
        group_size=4,
        max_steps=max(steps, 1),
    )
    start_run(lake, spec)
    return run_steps(lake, steps)


@pytest.fixture(scope="module")
def sim_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("seeds")
    form = [sim_run(root / f"form-s{s}", "envsched@success+adaptive+covsampled+lr", s) for s in (0, 1, 2)]
    rand = [sim_run(root / f"random-s{s}", "random", s) for s in (2, 0, 1, 3)]  # seed 3: no partner
    return form, rand


def step_mean(lake: Lake, key: str) -> float:
    return float(np.mean([r[key] for r in lake.sql("select * from step_summary").to_pylist()]))


def last_score(lake: Lake, bench: str) -> float:
    rows = [r for r in lake.read("evals").to_pylist() if r["benchmark"] == bench]
    return max(rows, key=lambda r: r["step"])["score"]


def mean_score(lake: Lake, bench: str) -> float:
    return float(np.mean([r["score"] for r in lake.read("evals").to_pylist() if r["benchmark"] == bench]))


def test_runs_are_paired_by_seed_and_judged_by_their_spread_over_seeds(sim_runs):
    form, rand = sim_runs
    res = compare_seeds(form, rand)
    assert [p["seed"] for p in res["pairs"]] == [0, 1, 2]
    assert [p["against_lake"] for p in res["pairs"]] == [str(rand[i].root) for i in (1, 2, 0)]
    assert res["unpaired"] == {"--runs": [], "--against": [{"seed": 3, "lake": str(rand[3].root)}]}
    assert (
        res["runs"]["name"] == "envsched@success+adaptive+covsampled+lr"
        and res["against"]["name"] == "random"
    )
    by = {v["key"]: v for v in res["verdicts"]}
    # the per-step metrics: each seed's mean over its steps, this side minus the other, then over seeds
    for key, better in (
        ("batch_variance", "higher"),
        ("zero_variance_fraction", "lower"),
        ("envs_touched", "higher"),
    ):
        v = by[key]
        d = np.array([step_mean(form[i], key) - step_mean(rand[(1, 2, 0)[i]], key) for i in range(3)])
        assert v["per_seed"] == pytest.approx(d.tolist())
        ci = stats.ttest_1samp(d, 0.0).confidence_interval(0.95)
        assert v["ci"] == pytest.approx([ci.low, ci.high]) and v["se"] == pytest.approx(
            d.std(ddof=1) / math.sqrt(3)
        )
        clear = not (ci.low <= 0 <= ci.high)
        assert v["better"] == (None if not clear else (d.mean() > 0) == (better == "higher"))
        assert v["wins"] == int((d > 0).sum() if better == "higher" else (d < 0).sum())
        assert f"in {v['wins']} of 3 seeds" in v["text"]
    # held-out: each pair's last common evaluation, the simulator's exact scores (no sampling error),
    # so the whole spread over seeds is the runs' own
    for bench in ("heldout_seen (simulated)", "heldout_unseen (simulated)"):
        v = by[bench]
        d = [last_score(form[i], bench) - last_score(rand[(1, 2, 0)[i]], bench) for i in range(3)]
        assert v["per_seed"] == pytest.approx(d) and v["above"] == sum(x > 0 for x in d)
        assert "(Rough: the spread is estimated from 3 seeds.)" in v["text"]  # fewer than 5
        assert v["sampling_sd"] == 0.0 and v["luck_share"] == (1.0 if np.std(d) > 0 else None)
        # the whole curve: the mean over every evaluation both runs of a seed made
        curve = by[f"{bench} (curve)"]
        d = [mean_score(form[i], bench) - mean_score(rand[(1, 2, 0)[i]], bench) for i in range(3)]
        assert curve["per_seed"] == pytest.approx(d) and curve["sampling_sd"] is None


def test_a_side_must_be_one_scheduler_with_one_run_per_seed_and_nothing_is_written(
    sim_runs, tmp_path, capsys
):
    form, rand = sim_runs
    cases = [
        (form[:2] + rand[:1], rand, "--runs .*random-s2: its run's scheduler is random"),
        (form, rand + [sim_run(tmp_path / "again", "random", 0, steps=1)], "seed 0 again"),
        (form[:1], rand, "share 1 seed"),
        (form, rand[:2] + [Lake(tmp_path / "nowhere")], "--against .*nowhere: no lake at"),
        (rand[:2], rand[1:3], "on the --runs side too"),
        (form, rand[:2] + [sim_run(tmp_path / "empty", "random", 1, steps=0)], "empty: its run has no steps"),
        (
            form,
            [sim_run(tmp_path / "other-pool", "random", 0, steps=1, pool_seed=9)] + rand[2:3],
            "other training",
        ),
    ]
    for runs, against, msg in cases:
        with pytest.raises(EnvschedError, match=msg):
            compare_seeds(runs, against)
    argv = ["compare", "--runs", *[str(x.root) for x in form[:1]], "--against", *[str(x.root) for x in rand]]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    assert "share 1 seed" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_the_command_prints_the_table_and_verdicts_and_writes_the_page(sim_runs, tmp_path, capsys):
    form, rand = sim_runs
    out = tmp_path / "cmp"
    argv = ["compare", "--runs", *[str(x.root) for x in form], "--against", *[str(x.root) for x in rand]]
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert [p["seed"] for p in summary["pairs"]] == [0, 1, 2]
    for v in summary["verdicts"]:
        assert v["text"] in printed
    assert (
        f"note: Not paired (no run of that seed on the other side), left out: --against seed 3 ({rand[3].root})"
        in printed
    )
    assert f"wrote {out / 'index.html'}" in printed
    page = (out / "comparison.md").read_text()
    assert "![each seed's paired difference](by_seed.png)" in page and "| mean ± s.e. over seeds |" in page
    assert (out / "by_seed.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the page stands alone: the seed table, the plot inline, every note and verdict; nothing fetched
    seen = PageParts()
    seen.feed((out / "index.html").read_text())
    assert (
        len(seen.rows) == 1 + 3 + 1
        and seen.rows[1][0] == "0"
        and seen.rows[-1][0] == "mean ± s.e. over seeds"
    )
    assert [base64.b64decode(src.split(",", 1)[1]) for src in seen.images] == [
        (out / "by_seed.png").read_bytes()
    ]
    assert seen.items == [f"Note: {n}" for n in summary["notes"]] + [
        f"{'✔' if v['better'] else '✘' if v['better'] is False else '·'} {v['text']}"
        for v in summary["verdicts"]
    ]
    html_text = (out / "index.html").read_text()
    assert 'src="http' not in html_text and "<link" not in html_text and "<script" not in html_text
    assert main([*argv, "--json"]) == 0
    printed_json = json.loads(capsys.readouterr().out)  # the view's sums may differ in the last bit
    assert printed_json["verdicts"][0]["per_seed"] == pytest.approx(summary["verdicts"][0]["per_seed"])


def test_held_out_from_episodes_splits_the_spread_into_sampling_and_the_runs_luck(tmp_path):
    runs = [neural_run(tmp_path / f"env-s{s}", "envsched", seed=s, steps=2) for s in (0, 1)]
    rand = [neural_run(tmp_path / f"rnd-s{s}", "random", seed=s, steps=2) for s in (0, 1)]
    res = compare_seeds(runs, rand)
    v = next(v for v in res["verdicts"] if v["key"] == "heldout_unseen")
    diffs, ses = [], []
    for a, b in zip(runs, rand, strict=True):
        m = {}
        for name, lk in (("a", a), ("b", b)):
            m[name] = lk.sql(
                "select task_id, avg(reward) as m, var_samp(reward) / count(*) as v from eval_rollouts "
                "where step = 1 and split = 'unseen' group by task_id"
            ).to_pylist()
        n = len(m["a"])
        diffs.append(np.mean([r["m"] for r in m["a"]]) - np.mean([r["m"] for r in m["b"]]))
        ses.append(math.sqrt(sum(r["v"] for rs in m.values() for r in rs)) / n)
    assert v["per_seed"] == pytest.approx(diffs) and v["pair_se"] == pytest.approx(ses)
    sampling = np.mean(np.square(ses))
    assert v["sampling_sd"] == pytest.approx(math.sqrt(sampling))
    var = np.var(diffs, ddof=1)
    assert v["luck_share"] == pytest.approx(max(var - sampling, 0) / var)
    advice = "more seeds: more evaluation episodes would not" if v["luck_share"] >= 0.5 else "--eval-samples"
    assert advice in v["text"]
    # solved in one attempt, and in all 8 (pass^8), at the last common evaluation, over seeds
    assert [v["key"] for v in res["verdicts"] if v["kind"] == "reliability"] == [
        "heldout_seen_solved",
        "heldout_seen_pass_all",
        "heldout_unseen_solved",
        "heldout_unseen_pass_all",
    ]
    for split in ("seen", "unseen"):
        once = next(v for v in res["verdicts"] if v["key"] == f"heldout_{split}_solved")
        every = next(v for v in res["verdicts"] if v["key"] == f"heldout_{split}_pass_all")
        assert once["kind"] == every["kind"] == "reliability" and "all 8 attempts (pass^k)" in every["text"]
        rel = [
            (heldout_reliability(a, 1)["splits"][split], heldout_reliability(b, 1)["splits"][split])
            for a, b in zip(runs, rand, strict=True)
        ]
        assert once["per_seed"] == pytest.approx([x[0]["pass_at_k"] - y[0]["pass_at_k"] for x, y in rel])
        assert once["pair_se"] == pytest.approx(
            [math.hypot(x[0]["pass_at_k_se"], y[0]["pass_at_k_se"]) for x, y in rel]
        )
        assert every["per_seed"] == pytest.approx([x[-1]["pass_hat_k"] - y[-1]["pass_hat_k"] for x, y in rel])
        assert all(math.isnan(se) for se in every["pair_se"]) and every["sampling_sd"] is None  # k = n
        assert once["sampling_sd"] == pytest.approx(math.sqrt(np.mean(np.square(once["pair_se"]))))


def test_what_a_clear_answer_would_take_at_the_measured_spread():
    v = over_seeds(np.array([0.02, 0.01, -0.005, 0.03]), np.array([0.004, 0.004, 0.004, 0.004]))
    assert v["better"] is None and v["above"] == 3 and v["understated"] == pytest.approx(v["sd"] / 0.004)
    n = v["seeds_to_resolve"]
    half = lambda k: stats.t.ppf(0.975, k - 1) * v["sd"] / math.sqrt(k)  # noqa: E731
    assert half(n) < abs(v["mean"]) <= half(n - 1)
    assert seeds_to_resolve(0.0, 0.1) is None and seeds_to_resolve(0.001, 0.1) is None  # about 38,000: none
    # every one of the 4 seeds above zero with a chance of 0.9 at the needed mean (normal draws)
    draws = np.random.default_rng(0).normal(v["every_seed_needs"], v["sd"], size=(40_000, 4))
    assert (draws > 0).all(axis=1).mean() == pytest.approx(0.9, abs=0.01)
    with pytest.raises(ValueError, match="at least 2 seeds"):
        over_seeds(np.array([0.1]))


def test_planning_for_an_effect_gives_the_seeds_a_t_test_needs_to_find_it():
    # the one-sample two-sided t test's published sample sizes for a power of 0.8 at alpha 0.05
    # (Cohen's effect sizes d = effect / sd): 0.2 -> 199, 0.5 -> 34, 0.8 -> 15, 1.0 -> 10
    for d, n in ((0.2, 199), (0.5, 34), (0.8, 15), (1.0, 10)):
        assert seeds_for_power(0.01 * d, 0.01) == n and seeds_for_power(-0.01 * d, 0.01) == n
    # the chance itself, against simulated seeds: t intervals clear of zero over 20,000 draws of 6 seeds
    rng = np.random.default_rng(3)
    d = rng.normal(0.012, 0.015, size=(20_000, 6))
    half = stats.t.ppf(0.975, 5) * d.std(axis=1, ddof=1) / math.sqrt(6)
    assert t_power(0.012, 0.015, 6) == pytest.approx((np.abs(d.mean(axis=1)) > half).mean(), abs=0.01)
    assert seeds_for_power(0.0, 0.01) is None and seeds_for_power(1e-5, 0.01) is None  # over MAX_SEEDS
    assert seeds_for_power(0.01, 0.0) == 2 and MAX_SEEDS == 1000
    # an effect many standard errors out: a chance of (nearly) 1, never NaN (RESULTS printed "a chance
    # of nan" for +0.02 at 38 seeds, sd 0.0138: scipy's noncentral t cdf is NaN that far in its tail)
    assert t_power(0.02, 0.0138, 38) == pytest.approx(1.0)
    grid = [
        t_power(e, 0.01, n) for e in (0.001, 0.005, 0.01, 0.02, 0.05, 0.2) for n in (2, 3, 5, 10, 38, 200)
    ]
    assert all(0.0 <= p <= 1.0 for p in grid), grid


def test_compare_plans_for_the_effect_a_user_names(sim_runs, tmp_path, capsys):
    form, rand = sim_runs
    argv = ["compare", "--runs", *[str(x.root) for x in form], "--against", *[str(x.root) for x in rand]]
    assert main([*argv, "--effect", "0.01", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    held = [v for v in res["verdicts"] if v["kind"] != "per_step"]
    assert held and all("plan" not in v for v in res["verdicts"] if v["kind"] == "per_step")
    for v in held:
        p = v["plan"]
        assert p["seeds_for_power"] == seeds_for_power(0.01, v["sd"]) and p["power_now"] == pytest.approx(
            t_power(0.01, v["sd"], 3)
        )
        need = f"{p['seeds_for_power']} seeds" if p["seeds_for_power"] else f"over {MAX_SEEDS} seeds"
        assert "Planning for a true difference of +0.01: these 3 seeds would resolve it" in v["text"]
        assert f"a chance of 0.8 needs {need} of each scheduler" in v["text"]
    for bad in ("0", "nan", "inf"):
        assert main([*argv, "--effect", bad, "--out", str(tmp_path / "out")]) == 2
        assert "--effect: a held-out difference to plan for" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_pair_of_unequal_length_is_compared_over_the_steps_both_hold_and_said_so(sim_runs, tmp_path):
    form, rand = sim_runs
    short = sim_run(tmp_path / "short-s1", "random", 1, steps=3)
    res = compare_seeds(form[:2], [rand[1], short])
    pair = res["pairs"][1]
    assert (pair["steps"], pair["against_steps"]) == (6, 3)
    assert res["notes"] == [
        "Seed 1: the --runs run has 6 steps, the --against run 3; the pair is compared over the steps and "
        "evaluations both hold."
    ]
    key = "batch_variance"
    first3 = [r[key] for r in form[1].sql("select * from step_summary where step < 3").to_pylist()]
    assert (
        pair["per_step"][key]["run"] == pytest.approx(np.mean(first3)) and pair["per_step"][key]["steps"] == 3
    )
    assert pair["heldout"]["heldout_seen (simulated)"]["step"] == 2


def test_runs_of_your_own_trainer_are_judged_with_the_standard_errors_it_logged(tmp_path):
    """ExternalRun lakes: held-out is what the trainer logged (score and se), no episodes."""
    rng = np.random.default_rng(7)
    lakes, logged = {}, {}
    for sched in ("random", "envsched"):
        for seed in (0, 1, 2):
            lake = Lake(tmp_path / f"{sched}-s{seed}")
            import_pool(lake, load_synthetic("synthetic", **SMALL))
            run = ExternalRun(
                pool="synthetic", lake=lake, scheduler=sched, seed=seed, batch_size=6, group_size=2
            )
            for step in range(2):
                picks = run.manifest(step)
                run.observe(
                    step,
                    [
                        {"task_id": p["task_id"], "rollout": r, "reward": float(rng.integers(2))}
                        for p in picks
                        for r in range(2)
                    ],
                )
                score, se = float(rng.uniform(0.4, 0.8)), float(rng.uniform(0.01, 0.03))
                # a second benchmark whose logged sampling error dwarfs its spread over seeds
                seen = {"score": 0.6 + float(rng.normal(0, 0.01)), "se": 0.2}
                run.log_eval(step, {"heldout_unseen": {"score": score, "se": se}, "heldout_seen": seen})
                logged[(sched, seed, step)] = (score, se)
            lakes.setdefault(sched, []).append(lake)
    res = compare_seeds(lakes["envsched"], lakes["random"])
    v = next(v for v in res["verdicts"] if v["key"] == "heldout_unseen")
    d = [logged[("envsched", s, 1)][0] - logged[("random", s, 1)][0] for s in (0, 1, 2)]
    se = [math.hypot(logged[("envsched", s, 1)][1], logged[("random", s, 1)][1]) for s in (0, 1, 2)]
    assert v["per_seed"] == pytest.approx(d) and v["pair_se"] == pytest.approx(se)
    assert v["sampling_sd"] == pytest.approx(math.sqrt(np.mean(np.square(se))))
    # what would narrow each interval: more seeds where the runs' luck is most of the spread, more
    # evaluation episodes as well where the evaluation's sampling is
    assert v["luck_share"] > 0.5 and "more seeds: more evaluation episodes would not" in v["text"]
    seen = next(v for v in res["verdicts"] if v["key"] == "heldout_seen")
    assert (
        seen["luck_share"] < 0.5
        and "more evaluation episodes (`--eval-tasks`, `--eval-samples`)" in seen["text"]
    )


def test_the_report_asset_judges_the_run_over_seeds_in_the_ui(sim_runs):
    form, rand = sim_runs
    meta = materialize_report(
        form[0], seeds=[str(x.root) for x in form[1:]], against=[str(x.root) for x in rand], effect=0.02
    )
    page = Path(meta["over_seeds_page"].value)
    assert page == Path(form[0].local) / LATEST_REPORT / SEEDS_DIR / "index.html" and page.exists()
    summary = json.loads((page.parent / "summary.json").read_text())
    assert [p["seed"] for p in summary["pairs"]] == [0, 1, 2]
    assert all(v["plan"]["effect"] == 0.02 for v in summary["verdicts"] if v["kind"] != "per_step")
    by_seed = base64.b64encode((page.parent / "by_seed.png").read_bytes()).decode()
    table = meta["over_seeds"].value.splitlines()
    n = len(summary["verdicts"])
    for v, row in zip(summary["verdicts"], table[2 : 2 + n], strict=True):
        assert row.startswith(
            f"| {v['metric']} | 3 | {v['run']:.4g} | {v['against']:.4g} | {v['mean']:+.4g} ± "
        )
    assert table[2 + n :] == ["", f"![by seed](data:image/png;base64,{by_seed})"]
    # the report beside it judges one pair: this run (seed 0) against random's run of seed 0 only
    report = json.loads((Path(meta["report"].value).parent / "summary.json").read_text())
    named = [str(x.root) for x in rand if str(x.root) in report["baselines"]["note"]]
    assert named == [str(rand[1].root)] and require_run(rand[1]).seed == 0
    assert {v["baseline"] for v in report["verdicts"]} == {"random"}


def test_a_seeds_lake_the_report_asset_refuses_leaves_no_report(sim_runs, tmp_path):
    form, rand = sim_runs
    materialize_report(form[1], succeed=False, seeds=[str(tmp_path / "nowhere")], against=[str(rand[2].root)])
    assert not (
        Path(form[1].local) / LATEST_REPORT
    ).exists()  # form[0] is the one the other asset test reports on


def test_differing_policy_settings_are_named_both_ways():
    mine, theirs = {"lr": 0.001, "eval_every": 10}, {"lr": 0.002, "eval_every": 10, "resident": True}
    assert changed_settings(mine, theirs, "--against") == [
        "lr=0.001 (--against: 0.002)",
        "resident=None (--against: True)",
    ]
    assert changed_settings(mine, theirs, "this run", mine_first=False) == [
        "lr=0.002 (this run: 0.001)",
        "resident=True (this run: None)",
    ]


@pytest.fixture(scope="module")
def mopps_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("mopps")
    return [sim_run(root / f"mopps-s{s}", "mopps", s) for s in (1, 0)]  # no seed 2: two pairs only


def test_an_ablation_table_judges_each_scheduler_against_the_baseline_over_seeds(sim_runs, mopps_runs):
    form, rand = sim_runs
    res = compare_rows([form, mopps_runs], rand)
    assert [r["runs"]["name"] for r in res["rows"]] == ["envsched@success+adaptive+covsampled+lr", "mopps"]
    # each row is that scheduler's own comparison with the baseline, over the seeds it shares with it
    for row, group in zip(res["rows"], (form, mopps_runs), strict=True):
        alone = compare_seeds(group, rand)
        assert [p["seed"] for p in row["pairs"]] == [p["seed"] for p in alone["pairs"]]
        for v, w in zip(row["verdicts"], alone["verdicts"], strict=True):
            assert v["key"] == w["key"] and v["per_seed"] == pytest.approx(w["per_seed"])
    assert [p["seed"] for p in res["rows"][1]["pairs"]] == [0, 1]
    head, cells = table_cells(res)
    for bench in ("heldout_seen (simulated)", "heldout_unseen (simulated)"):
        means = {
            r["runs"]["name"]: next(v for v in r["verdicts"] if v["key"] == bench)["run"] for r in res["rows"]
        }
        lead = next(x for x in res["leaders"] if x["benchmark"] == bench)
        best, second = sorted(means, key=means.get, reverse=True)
        assert (lead["best"], lead["runner_up"]) == (best, second)
        # the lead: the two rows' runs paired by seed (seeds 0 and 1, the ones both ran)
        groups = {"envsched@success+adaptive+covsampled+lr": form, "mopps": mopps_runs}
        d = [
            last_score(next(x for x in groups[best] if require_run(x).seed == s), bench)
            - last_score(next(x for x in groups[second] if require_run(x).seed == s), bench)
            for s in (0, 1)
        ]
        assert lead["lead"]["seeds"] == [0, 1] and lead["lead"]["mean"] == pytest.approx(np.mean(d))
        assert f"paired by seed, {best} minus {second} {lead['lead']['mean']:+.4f}" in lead["text"]
        col = head.index(f"mean {bench}")
        marked = [c[0] for c in cells if c[col].endswith("(best)")]
        assert marked == [best]
    col = head.index("batch reward variance (x random)")
    v = next(v for v in res["rows"][1]["verdicts"] if v["key"] == "batch_variance")
    assert cells[1][col].startswith(f"{v['ratio']:.2f} ({v['wins']}/2)")


def test_the_ablation_command_writes_one_page_with_a_page_per_row(sim_runs, mopps_runs, tmp_path, capsys):
    form, rand = sim_runs
    out = tmp_path / "ablation"
    argv = ["compare", "--runs", *[str(x.root) for x in form], "--runs", *[str(x.root) for x in mopps_runs]]
    argv += ["--against", *[str(x.root) for x in rand]]
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    for line in table_markdown(summary):
        assert line in printed
    for lead in summary["leaders"]:
        assert lead["text"] in printed
    seen = PageParts()
    seen.feed((out / "index.html").read_text())
    assert len(seen.rows) == 1 + 2 and [r[0] for r in seen.rows[1:]] == [
        "envsched@success+adaptive+covsampled+lr",
        "mopps",
    ]
    assert [base64.b64decode(src.split(",", 1)[1]) for src in seen.images] == [
        (out / "rows.png").read_bytes()
    ]
    links = re.findall(r'href="([^"]+)"', (out / "index.html").read_text())
    assert len(links) == 2 and all((out / link).exists() for link in links)
    row_page = json.loads((out / links[1]).parent.joinpath("summary.json").read_text())
    assert row_page["runs"]["name"] == "mopps" and [p["seed"] for p in row_page["pairs"]] == [0, 1]
    # refusals name the group, and nothing is written
    bad = [
        (["--runs", *[str(x.root) for x in form], "--runs", *[str(x.root) for x in form[:2]]], "group 2"),
        (
            ["--runs", *[str(x.root) for x in form], "--runs", str(tmp_path / "nowhere"), str(rand[0].root)],
            "group 2",
        ),
    ]
    for runs, msg in bad:
        assert (
            main(["compare", *runs, "--against", *[str(x.root) for x in rand], "--out", str(tmp_path / "no")])
            == 2
        )
        assert f"--runs ({msg})" in capsys.readouterr().err
    assert not (tmp_path / "no").exists()


def test_runs_lists_every_lake_and_the_comparisons_they_allow(sim_runs, mopps_runs, tmp_path, capsys):
    form, rand = sim_runs
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "run.json").write_text("{not json")
    damaged = tmp_path / "damaged"  # a lake whose rollouts table is damaged
    shutil.copytree(rand[3].root, damaged)
    next((damaged / "rollouts" / "step=2").iterdir()).write_bytes(b"not parquet")
    again = tmp_path / "zz-form-again"  # a second lake of the form's seed 1: one run per seed is taken
    shutil.copytree(form[1].root, again)
    dirs = [str(form[0].root.parent), str(mopps_runs[0].root.parent), str(broken), str(damaged), str(again)]
    assert main(["runs", *dirs, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    by_lake = {r["lake"]: r for r in out["runs"]}
    assert set(by_lake) == {str(x.root) for x in (*form, *rand, *mopps_runs)} | {
        str(broken),
        str(damaged),
        str(again),
    }
    assert "run.json" in by_lake[str(broken)]["problem"]  # listed with why, not skipped
    assert by_lake[str(damaged)]["problem"].startswith("its tables cannot be read")
    for lk in (*form, *rand, *mopps_runs):
        r, spec = by_lake[str(lk.root)], require_run(lk)
        assert (r["seed"], r["steps"], r["max_steps"], r["state"]) == (spec.seed, 6, 6, "complete")
        assert r["means"]["batch_variance"] == pytest.approx(step_mean(lk, "batch_variance"))
        assert r["heldout"]["heldout_seen (simulated)"] == [
            5,
            pytest.approx(last_score(lk, "heldout_seen (simulated)")),
        ]
    (cmp,) = out["comparisons"]
    assert cmp["notes"] == [
        f"{again} left out: {form[1].root} holds envsched@success+adaptive+covsampled+lr's run of seed 1 too "
        "(a comparison takes one run per seed)"
    ]
    assert cmp["schedulers"] == ["envsched@success+adaptive+covsampled+lr", "mopps"] and cmp["seeds"] == [
        0,
        1,
        2,
    ]
    runs = lambda group: " ".join(str(x.root) for x in sorted(group, key=lambda x: require_run(x).seed))  # noqa: E731
    assert cmp["command"] == (
        f"envsched compare --runs {runs(form)} --runs {runs(mopps_runs)} --against {runs(rand[:3])}"
    )
    # the command it suggests runs as printed: the ablation table of those lakes
    assert main(["runs", *dirs]) == 0
    printed = capsys.readouterr().out
    assert cmp["command"] in printed and "| complete |" in printed and f"  note: {cmp['notes'][0]}" in printed
    assert main(cmp["command"].split()[1:]) == 0
    assert "Best mean heldout_seen (simulated)" in capsys.readouterr().out
    # nothing to list: said so, exit code 2
    (tmp_path / "empty").mkdir()
    for where, msg in ((tmp_path / "empty", "no lake in"), (tmp_path / "nowhere", "no such folder")):
        assert main(["runs", str(where)]) == 2
        assert msg in capsys.readouterr().err


def test_a_difference_below_the_fourth_decimal_keeps_its_digits(tmp_path):
    """A verdict of "below" beside a difference printed as -0.0000 reads as a contradiction: a
    difference that rounds to zero at four decimals is printed with its own digits."""
    lakes = []
    for sched, score in (("envsched", 0.657100), ("random", 0.657112)):
        lake = Lake(tmp_path / sched)
        import_pool(lake, load_synthetic("synthetic", **SMALL))
        run = ExternalRun(pool="synthetic", lake=lake, scheduler=sched, seed=0, batch_size=4, group_size=2)
        picks = run.manifest(0)
        run.observe(
            0, [{"task_id": p["task_id"], "rollout": r, "reward": float(r)} for p in picks for r in range(2)]
        )
        run.log_eval(
            0, {"heldout_seen": {"score": score, "se": 0.0}, "heldout_unseen": {"score": 0.5, "se": 0.0}}
        )
        lakes.append(lake)
    texts = {v["benchmark"]: v["text"] for v in heldout_verdicts(lakes[0], lakes[1], "random")}
    assert "difference -1.2e-05 (recorded without sampling error): below random" in texts["heldout_seen"]
    assert "difference +0.0000 (recorded without sampling error)" in texts["heldout_unseen"]
