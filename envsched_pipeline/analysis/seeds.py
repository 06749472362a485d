"""One scheduler against another over seeds (``envsched compare --runs LAKE... --against LAKE...``).

A verdict of one pair of runs (``envsched report --against``) judges those two runs: its standard
error is the evaluation's own sampling. Two runs of one scheduler at one seed can differ by more
than that (which tasks came up, the order of the updates), so whether a *scheduler* is ahead is a
question over seeds. Each run of one side is paired with the other side's run of the same seed,
and the mean paired difference is judged by its spread over the seeds (Student's t interval). That
spread is then split into the part the evaluation's sampling explains (the pairs' own standard
errors) and the rest, the runs' luck, which no single pair of runs can show; and the comparison
says what a clear answer would take at the measured spread: the seeds for an interval that
excludes zero, and the mean difference at which every seed comes out ahead with a chance of 0.9
(the way ``bench/RESULTS.md`` states its held-out targets).
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from envsched_pipeline.analysis.compare import (
    HEADLINES,
    against_runs,
    aligned,
    changed_settings,
    compare_reliability,
    heldout_verdicts,
    relation,
    short_label,
)
from envsched_pipeline.analysis.passk import heldout_reliability
from envsched_pipeline.analysis.plots import _series, seeds_plot
from envsched_pipeline.analysis.spread import every_seed_needs
from envsched_pipeline.errors import ConfigError, EnvschedError
from envsched_pipeline.lake import Lake, json_safe
from envsched_pipeline.run import require_run
from envsched_pipeline.scheduler.variants import scheduler_label

STEP_QUERY = f"select step, {', '.join(k for k, _, _ in HEADLINES)} from step_summary order by step"
EVERY_SEED_CHANCE = 0.9
ROUGH_BELOW = 5  # fewer seeds than this: what a clear answer would take is a rough figure
MAX_SEEDS = 1000  # beyond this, no practical number of seeds resolves the mean
POWER = 0.8  # planning for an effect: the chance of resolving it that a number of seeds should give


def _stats():
    """``scipy.stats``, loaded on first use: it takes half a second, which every `envsched` command
    would otherwise pay at start."""
    from scipy import stats  # see the docstring: only the spread over seeds needs it

    return stats


def _side(lakes: Sequence[Lake], flag: str) -> list[dict]:
    """The runs a side names, each with its spec; one scheduler and one run per seed."""
    if not lakes:
        raise ConfigError(f"{flag}: name at least one lake")
    runs = []
    for lk in lakes:
        try:
            runs.append({"lake": lk, "spec": require_run(lk.require())})
        except EnvschedError as exc:  # no lake, no run, an unreadable run.json: which option named it
            raise ConfigError(f"{flag} {lk.root}: {exc}") from exc
    first = runs[0]
    label = scheduler_label(first["spec"].scheduler, first["spec"].scheduler_config)
    seen: dict[int, Lake] = {}
    for r in runs:
        mine = scheduler_label(r["spec"].scheduler, r["spec"].scheduler_config)
        if mine != label:
            raise ConfigError(
                f"{flag} {r['lake'].root}: its run's scheduler is {mine}, {first['lake'].root}'s is {label} "
                f"(each side is one scheduler's runs)"
            )
        seed = r["spec"].seed
        if seed in seen:
            raise ConfigError(
                f"{flag} {r['lake'].root}: seed {seed} again (also {seen[seed].root}); name one run per seed"
            )
        seen[seed] = r["lake"]
    return runs


def over_seeds(d: np.ndarray, se: np.ndarray | None = None) -> dict:
    """The mean of per-seed paired differences ``d`` judged by their spread over seeds: the t
    interval, the seeds above zero, and, given each pair's own sampling standard error ``se``, how
    much of the spread that sampling explains. Needs two seeds at least."""
    d = np.asarray(d, dtype=float)
    n = len(d)
    if n < 2:
        raise ValueError(f"need at least 2 seeds to judge a spread over seeds (got {n})")
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    sem = sd / math.sqrt(n)
    t = float(_stats().t.ppf(0.975, n - 1))
    ci = [mean - t * sem, mean + t * sem]
    out = {
        "n": n,
        "mean": mean,
        "sd": sd,
        "se": sem,
        "ci": ci,
        "better": None if ci[0] <= 0 <= ci[1] else mean > 0,
        "above": int((d > 0).sum()),
        "below": int((d < 0).sum()),
        "per_seed": d.tolist(),
        "sampling_sd": None,
        "luck_share": None,
        "understated": None,
    }
    if se is not None and len(se) == n and np.all(np.isfinite(se)):
        sampling = float(np.mean(np.asarray(se, dtype=float) ** 2))
        out["sampling_sd"] = math.sqrt(sampling)
        if sd > 0:
            out["luck_share"] = max(sd**2 - sampling, 0.0) / sd**2
            out["understated"] = sd / math.sqrt(sampling) if sampling > 0 else math.inf
    out["seeds_to_resolve"] = seeds_to_resolve(mean, sd)
    out["every_seed_needs"] = every_seed_needs(sd, n, EVERY_SEED_CHANCE)
    return out


def seeds_to_resolve(mean: float, sd: float) -> int | None:
    """The fewest seeds whose 95% t interval excludes zero at this mean and spread over seeds
    (None when the mean is zero or it would take more than ``MAX_SEEDS``)."""
    if sd == 0:
        return 2 if mean != 0 else None
    if mean == 0:
        return None
    n = max(2, math.ceil((1.96 * sd / abs(mean)) ** 2))  # the normal approximation, a lower bound
    while n <= MAX_SEEDS:
        if _stats().t.ppf(0.975, n - 1) * sd / math.sqrt(n) < abs(mean):
            return n
        n += 1
    return None


def t_power(effect: float, sd: float, n: int) -> float:
    """The chance that ``n`` seeds' 95% t interval excludes zero when the true mean paired
    difference is ``effect`` and its sd over seeds ``sd`` (the noncentral t distribution)."""
    if sd == 0:
        return float(effect != 0)
    df, nc = n - 1, abs(effect) * math.sqrt(n) / sd
    crit = float(_stats().t.ppf(0.975, df))
    below = float(_stats().nct.cdf(-crit, df, nc))  # an interval wholly below zero
    if not math.isfinite(below):
        # scipy's nct.cdf gives NaN this far out (nc >= 7.6); the chance is under that of Z + nc < 0,
        # Phi(-7.6) = 1.5e-14, so it adds nothing the printed chance could show
        below = 0.0
    return min(1.0, float(_stats().nct.sf(crit, df, nc)) + below)


def seeds_for_power(effect: float, sd: float, power: float = POWER) -> int | None:
    """The fewest seeds at which a true mean paired difference of ``effect`` (sd over seeds ``sd``)
    gives a 95% t interval that excludes zero with a chance of ``power``; None when it would take
    more than ``MAX_SEEDS``."""
    if effect == 0:
        return None
    if sd == 0:
        return 2
    z = _stats().norm.ppf(0.975) + _stats().norm.ppf(power)
    n = max(2, math.ceil((z * sd / abs(effect)) ** 2))  # the normal approximation, a lower bound
    while n <= MAX_SEEDS:
        if t_power(effect, sd, n) >= power:
            return n
        n += 1
    return None


def plan(v: dict, effect: float) -> dict:
    """What resolving a true mean difference of ``effect`` would take at verdict ``v``'s measured
    spread over seeds: the chance these seeds had, and the seeds for a chance of ``POWER``."""
    return {
        "effect": effect,
        "power_now": t_power(effect, v["sd"], v["n"]),
        "seeds_for_power": seeds_for_power(effect, v["sd"]),
        "power": POWER,
    }


def plan_text(p: dict, n: int, other: str) -> str:
    need = p["seeds_for_power"]
    return (
        f" Planning for a true difference of {p['effect']:+.4g}: these {n} seeds would resolve it (a 95% t "
        f"interval clear of zero) with a chance of {p['power_now']:.2f}; a chance of {p['power']:g} needs "
        + (f"{need} seeds" if need is not None else f"over {MAX_SEEDS} seeds")
        + f" of each scheduler at this spread (with fewer, a true effect of that size is easily read as level "
        f"with {other})."
    )


def check_effect(effect: float | None) -> float | None:
    """``effect`` as given, or :class:`ConfigError` when it is not a finite number other than 0."""
    if effect is not None and (not math.isfinite(effect) or effect == 0):
        raise ConfigError(
            f"--effect: a held-out difference to plan for, a finite number other than 0 (got {effect})"
        )
    return effect


def compare_seeds(runs: Sequence[Lake], against: Sequence[Lake], effect: float | None = None) -> dict:
    """``runs`` (one scheduler's runs, one per seed) against ``against`` (another's), paired by seed.
    Every lake must hold a run of the same pool, policy, B and G (nothing differs but the scheduler,
    the seed and what the notes name). Raises :class:`ConfigError` naming the lake that does not.
    ``effect``: a held-out difference to plan for (each held-out verdict then says how many seeds
    would resolve it at the measured spread)."""
    check_effect(effect)
    mine, theirs = _side(runs, "--runs"), _side(against, "--against")
    both = {str(r["lake"].root) for r in mine} & {str(r["lake"].root) for r in theirs}
    ids = {r["spec"].run_id for r in mine if r["spec"].run_id}
    both |= {str(r["lake"].root) for r in theirs if r["spec"].run_id in ids}
    if both:
        raise ConfigError(f"--against {sorted(both)[0]}: that run is on the --runs side too")
    head = mine[0]
    # every other run checked against the first (pool content, policy, batch shape; not the same run)
    for side, flag in ((mine[1:], "--runs"), (theirs, "--against")):
        against_runs(head["lake"], head["spec"], [r["lake"] for r in side], flag=flag)
    name, other = short_label(head["spec"]), short_label(theirs[0]["spec"])
    if other == name:  # one scheduler at two settings (policy settings, a lake prior): read by side
        name, other = f"{name} (--runs)", f"{other} (--against)"
    by_seed = {r["spec"].seed: r for r in theirs}
    pairs, unpaired = [], {"--runs": [], "--against": []}
    for r in sorted(mine, key=lambda r: r["spec"].seed):
        o = by_seed.pop(r["spec"].seed, None)
        if o is None:
            unpaired["--runs"].append({"seed": r["spec"].seed, "lake": str(r["lake"].root)})
            continue
        pairs.append(_pair(r, o, other))
    unpaired["--against"] = [{"seed": s, "lake": str(o["lake"].root)} for s, o in sorted(by_seed.items())]
    if len(pairs) < 2:
        raise ConfigError(
            f"--runs and --against share {len(pairs)} seed(s) "
            f"({', '.join(str(p['seed']) for p in pairs) or 'none'}): a spread over seeds needs two pairs "
            "of runs at least, each pair one seed (`envsched --lake DIR train --seed S ...`)"
        )
    verdicts = [
        _per_step_verdict(pairs, key, label, better, name, other)
        for key, label, better in HEADLINES
        if sum(key in p["per_step"] for p in pairs) >= 2
    ]
    benches = sorted({b for p in pairs for b in p["heldout"]})
    for bench in benches:
        have = [p for p in pairs if bench in p["heldout"]]
        if len(have) >= 2:
            verdicts.append(_heldout_verdict(have, bench, name, other))
            verdicts.append(_curve_verdict(have, bench, name, other))
    keys = {k for p in pairs for k in p["reliability"]}
    for key in sorted(
        keys, key=lambda k: (k.split("_")[1], k.endswith("_pass_all"))
    ):  # once, then every time
        have = [p for p in pairs if key in p["reliability"]]
        if len(have) >= 2:
            verdicts.append(_reliability_verdict(have, key, name, other))
    if effect is not None:
        for v in verdicts:
            if v["kind"] != "per_step":
                v["plan"] = plan(v, effect)
                v["text"] += plan_text(v["plan"], v["n"], other)
    return {
        "notes": _notes(pairs, unpaired),
        "runs": {"name": name, "lakes": [str(r["lake"].root) for r in mine]},
        "against": {"name": other, "lakes": [str(r["lake"].root) for r in theirs]},
        "setup": {k: getattr(head["spec"], k) for k in ("pool", "policy", "batch_size", "group_size")},
        "pairs": pairs,
        "unpaired": unpaired,
        "verdicts": verdicts,
    }


def _pair(r: dict, o: dict, other: str) -> dict:
    """One seed's two runs: the per-step metrics' means over the steps both hold, and the held-out
    difference (with its sampling standard error) at the last evaluation both made."""
    sa, sb = _series(r["lake"], STEP_QUERY), _series(o["lake"], STEP_QUERY)
    for series, run, flag in ((sa, r, "--runs"), (sb, o, "--against")):
        if not series.get("step"):
            raise ConfigError(f"{flag} {run['lake'].root}: its run has no steps to compare with")
    per_step = {}
    for key, _, _ in HEADLINES:
        steps, a, b = aligned(sa, sb, key)
        if steps:
            per_step[key] = {"run": float(a.mean()), "against": float(b.mean()), "steps": len(steps)}
    heldout = {}
    for v in heldout_verdicts(r["lake"], o["lake"], other):
        heldout[v["benchmark"]] = {
            "step": v["step"],
            "run": v["run"],
            "against": v["base"],
            "diff": v["diff"],
            "se": v["se"],
            "reached_at": v["reach"]["reached_at"],
            "best_step": v["reach"]["best_step"],
            "curve": v["curve"],
        }
    changed = changed_settings(r["spec"].policy_config, o["spec"].policy_config, "--against")
    return {
        "reliability": _reliability(r["lake"], o["lake"]),
        "seed": r["spec"].seed,
        "run_lake": str(r["lake"].root),
        "against_lake": str(o["lake"].root),
        "steps": len(sa.get("step", [])),
        "against_steps": len(sb.get("step", [])),
        "policy_settings_differ": changed,
        "per_step": per_step,
        "heldout": heldout,
    }


def _per_step_verdict(pairs: list[dict], key: str, label: str, better: str, name: str, other: str) -> dict:
    have = [p for p in pairs if key in p["per_step"]]
    a = np.array([p["per_step"][key]["run"] for p in have])
    b = np.array([p["per_step"][key]["against"] for p in have])
    v = over_seeds(a - b)
    v.update(
        metric=label,
        kind="per_step",
        key=key,
        better_is=better,
        seeds=[p["seed"] for p in have],
        run=float(a.mean()),
        against=float(b.mean()),
        ratio=float(a.mean() / b.mean()) if b.mean() else float("nan"),
    )
    higher = v["better"]  # over_seeds: the sign of a clear difference, None when unclear
    if higher is not None and better == "lower":
        v["better"] = not higher
    wins = v["above"] if better == "higher" else v["below"]
    v["wins"] = wins
    v["text"] = (
        f"{label} (mean over each run's steps) over {v['n']} seeds: {name} {v['run']:.4g} vs {other} "
        f"{v['against']:.4g} ({v['ratio']:.2f}x), paired difference {v['mean']:+.4g} ± {v['se']:.2g} "
        f"(s.e. over seeds; 95% t interval [{v['ci'][0]:+.4g}, {v['ci'][1]:+.4g}]): "
        f"{relation(higher, other)}. "
        f"{'Higher' if better == 'higher' else 'Lower'} (the better way) than {other} in {wins} of {v['n']} seeds."
    )
    return v


def _last_evaluation_verdict(pairs: list[dict], h: list[dict], metric: str, kind: str, key: str) -> dict:
    """``over_seeds`` of each pair's difference at its last common evaluation (``h``: per pair, the
    difference, its sampling standard error and both runs' values), labelled as a verdict."""
    v = over_seeds(np.array([x["diff"] for x in h]), np.array([x["se"] for x in h]))
    v.update(
        metric=metric,
        kind=kind,
        key=key,
        pair_se=[x["se"] for x in h],
        better_is="higher",
        seeds=[p["seed"] for p in pairs],
        run=float(np.mean([x["run"] for x in h])),
        against=float(np.mean([x["against"] for x in h])),
        wins=v["above"],
    )
    return v


def _heldout_verdict(pairs: list[dict], bench: str, name: str, other: str) -> dict:
    h = [p["heldout"][bench] for p in pairs]
    metric = f"Held-out {bench} (each pair's last common evaluation)"
    v = _last_evaluation_verdict(pairs, h, metric, "heldout", bench)
    reached = [x["reached_at"] for x in h]
    v.update(reached=sum(r is not None for r in reached), reached_median=_median_step(reached))
    text = (
        f"{bench} over {v['n']} seeds: {name} minus {other} {v['mean']:+.4f} ± {v['se']:.4f} (s.e. over "
        f"seeds; 95% t interval [{v['ci'][0]:+.4f}, {v['ci'][1]:+.4f}]): {relation(v['better'], other, ('above', 'below'))}. "
        f"Above {other} in {v['above']} of {v['n']} seeds."
    )
    if v["sampling_sd"] == 0:
        text += (
            " The scores carry no sampling error (exact), so the whole spread over seeds is the runs' luck."
        )
    elif v["luck_share"] is not None:
        text += (
            f" The evaluation's sampling explains sd {v['sampling_sd']:.4f} of the spread over seeds "
            f"(sd {v['sd']:.4f}); the rest, {100 * v['luck_share']:.0f}% of its variance, is the runs' luck"
        )
        if v["understated"] is not None and math.isfinite(v["understated"]) and v["understated"] > 1:
            text += f", so one pair of runs' interval is {v['understated']:.1f}x too narrow for the scheduler's effect"
        text += (
            ". To narrow it, more seeds: more evaluation episodes would not."
            if v["luck_share"] >= 0.5
            else ". To narrow it, more evaluation episodes (`--eval-tasks`, `--eval-samples`) as well as more seeds."
        )
    need = v["seeds_to_resolve"]
    if v["better"] is None:
        text += (
            f" At this mean and spread about {need} seeds would resolve it."
            if need is not None
            else f" At this mean and spread no practical number of seeds (over {MAX_SEEDS}) would resolve it."
        )
    if v["n"] < ROUGH_BELOW:
        text += f" (Rough: the spread is estimated from {v['n']} seeds.)"
    text += (
        f" Every seed above {other} with a chance of {EVERY_SEED_CHANCE:g} would need a mean difference of "
        f"about {v['every_seed_needs']:+.4f} at this spread."
    )
    text += f" Reached {other}'s best held-out in {v['reached']} of {v['n']} seeds" + (
        f" (median step {v['reached_median']:g})." if v["reached_median"] is not None else "."
    )
    v["text"] = text
    return v


def _notes(pairs: list[dict], unpaired: dict) -> list[str]:
    """What a reader should know before the verdicts: seeds left out, pairs of unequal length,
    pairs whose policy settings differ."""
    notes = [
        f"Not paired (no run of that seed on the other side), left out: {flag} "
        + ", ".join(f"seed {u['seed']} ({u['lake']})" for u in left)
        for flag, left in unpaired.items()
        if left
    ]
    for p in pairs:
        if p["steps"] != p["against_steps"]:
            notes.append(
                f"Seed {p['seed']}: the --runs run has {p['steps']} steps, the --against run {p['against_steps']}; "
                "the pair is compared over the steps and evaluations both hold."
            )
        if p["policy_settings_differ"]:
            notes.append(
                f"Seed {p['seed']}: policy settings differ: {', '.join(p['policy_settings_differ'])}."
            )
    return notes


def _curve_verdict(pairs: list[dict], bench: str, name: str, other: str) -> dict:
    """Held-out over the whole run: each pair's difference of the mean over the evaluations both
    runs made (how fast it learned as well as where it ended), judged over seeds."""
    c = [p["heldout"][bench]["curve"] for p in pairs]
    v = over_seeds(np.array([x["run"] - x["base"] for x in c]))
    v.update(
        metric=f"Held-out {bench} (mean over each pair's common evaluations)",
        kind="heldout_curve",
        key=f"{bench} (curve)",
        better_is="higher",
        seeds=[p["seed"] for p in pairs],
        run=float(np.mean([x["run"] for x in c])),
        against=float(np.mean([x["base"] for x in c])),
        wins=v["above"],
    )
    least, most = min(x["evaluations"] for x in c), max(x["evaluations"] for x in c)
    v["text"] = (
        f"{bench}, mean over the evaluations both runs made ({least}{f'-{most}' if most > least else ''} "
        f"per pair), over {v['n']} seeds: {name} minus {other} {v['mean']:+.4f} ± {v['se']:.4f} (s.e. over seeds; "
        f"95% t interval [{v['ci'][0]:+.4f}, {v['ci'][1]:+.4f}]): {relation(v['better'], other, ('above', 'below'))}. "
        f"Above {other} in {v['above']} of {v['n']} seeds."
    )
    return v


def _reliability(a: Lake, b: Lake) -> dict:
    """At the last evaluation both runs kept episodes of: each split's difference in the share solved
    in one attempt (``heldout_<split>_solved``) and in all of the most attempts both have
    (``heldout_<split>_pass_all``, pass^k), with its sampling standard error (NaN where a task has
    no more episodes than k: no jackknife); analysis.passk."""
    common = sorted(set(a.steps("eval_rollouts")) & set(b.steps("eval_rollouts")))
    if not common:
        return {}
    step = common[-1]
    mine, theirs = heldout_reliability(a, step)["splits"], heldout_reliability(b, step)["splits"]
    out = {}
    for split in sorted(set(mine) & set(theirs)):
        rows = compare_reliability(mine[split], theirs[split])
        if not rows:
            continue
        for key, row, est in (("solved", rows[0], "pass_at_k"), ("pass_all", rows[-1], "pass_hat_k")):
            se = row[f"{est}_diff_se"]
            out[f"heldout_{split}_{key}"] = {
                "step": step,
                "k": row["k"],
                "run": row[est],
                "against": row[f"other_{est}"],
                "diff": row[f"{est}_diff"],
                "se": math.nan if se is None else se,
            }
    return out


def _reliability_verdict(pairs: list[dict], key: str, name: str, other: str) -> dict:
    """Held-out solved in one attempt, or in every one of k (pass^k), at each pair's last common
    evaluation, judged over seeds."""
    h = [p["reliability"][key] for p in pairs]
    split = key.split("_")[1]
    ks = "/".join(str(k) for k in sorted({x["k"] for x in h}))
    what = "solved in one attempt" if key.endswith("_solved") else f"solved in all {ks} attempts (pass^k)"
    metric = f"Held-out {split}: {what} (each pair's last common evaluation)"
    v = _last_evaluation_verdict(pairs, h, metric, "reliability", key)
    v["text"] = (
        f"{split} held-out {what}, over {v['n']} seeds: {name} minus {other} {v['mean']:+.4f} ± {v['se']:.4f} "
        f"(s.e. over seeds; 95% t interval [{v['ci'][0]:+.4f}, {v['ci'][1]:+.4f}]): "
        f"{relation(v['better'], other, ('above', 'below'))}. Above {other} in {v['above']} of {v['n']} seeds."
    )
    return v


def _median_step(reached: list[int | None]) -> float | None:
    """The median of the steps at which each seed reached the other's best, a seed that never did
    counting as later than any: None when half the seeds or more never did."""
    n = len(reached)
    done = sorted(r for r in reached if r is not None)
    if len(done) * 2 <= n:
        return None
    ranked = done + [math.inf] * (n - len(done))
    mid = float(np.median(ranked))
    return mid if math.isfinite(mid) else None


def seed_cells(result: dict) -> tuple[list[str], list[list[str]]]:
    """The per-seed table: its header and rows, one per seed (each verdict's paired difference at
    that seed, held-out with the pair's sampling standard error), then the mean over seeds."""
    verdicts = result["verdicts"]
    head = ["seed", *[v["key"].replace("_", " ") for v in verdicts]]
    rows = []
    for p in result["pairs"]:
        cells = [str(p["seed"])]
        for v in verdicts:
            if p["seed"] not in v["seeds"]:
                cells.append("—")
                continue
            k = v["seeds"].index(p["seed"])
            se = v["pair_se"][k] if v.get("pair_se") else None
            cells.append(f"{v['per_seed'][k]:+.4f}" + (f" ± {se:.4f}" if se and math.isfinite(se) else ""))
        rows.append(cells)
    rows.append(["mean ± s.e. over seeds", *[f"{v['mean']:+.4f} ± {v['se']:.4f}" for v in verdicts]])
    return head, rows


def markdown_table(head: list[str], rows: list[list[str]]) -> list[str]:
    """A header and rows of cells as markdown table lines."""
    return ["| " + " | ".join(r) + " |" for r in (head, ["---"] * len(head), *rows)]


def seed_table(result: dict) -> list[str]:
    """:func:`seed_cells` as markdown rows."""
    return markdown_table(*seed_cells(result))


def mark(better: bool | None) -> str:
    """A verdict's sign for a terminal or a page: ✔ better, ✘ worse, · no clear difference."""
    return "✔" if better else "✘" if better is False else "·"


def write_comparison(result: dict, out_dir) -> Path:
    """``summary.json``, ``by_seed.png``, ``comparison.md`` and ``index.html`` (a self-contained
    page, the plot inline, that works offline) in ``out_dir``; the page's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(json_safe(result), indent=2) + "\n")
    png = out / "by_seed.png"
    seeds_plot(result, png)
    name, other = result["runs"]["name"], result["against"]["name"]
    setup = result["setup"]
    title = f"{name} against {other}, paired by seed"
    intro = (
        f"Pool {setup['pool']}, policy {setup['policy']}, B = {setup['batch_size']}, G = {setup['group_size']}; "
        f"{len(result['pairs'])} pairs of runs. Each cell: that seed's {name} minus {other} (held-out: ± the "
        "pair's sampling standard error)."
    )
    items = [f"Note: {n}" for n in result["notes"]]
    items += [f"{mark(v['better'])} {v['text']}" for v in result["verdicts"]]
    return write_page(
        out / "comparison.md", title, intro, seed_cells(result), png, "each seed's paired difference", items
    )


def write_page(
    md_path: Path,
    title: str,
    intro: str,
    cells: tuple[list[str], list[list[str]]],
    png: Path,
    alt: str,
    items: list[str],
    links: Sequence[tuple[str, str]] = (),
) -> Path:
    """One comparison written twice beside ``png``: as markdown (``md_path``) and as ``index.html``,
    a page that stands alone and works offline (the plot inline). ``cells``: the table's header and
    rows; ``items``: sentences listed under it; ``links``: (text, relative href) pairs. The page's
    path."""
    head, rows = cells
    md = [f"# {title}", "", intro, "", *markdown_table(head, rows), "", f"![{alt}]({png.name})", ""]
    md += [f"- {x}" for x in items] + [f"- [{text}]({href})" for text, href in links]
    md_path.write_text("\n".join(md) + "\n")
    table = "".join(
        "<tr>" + "".join(f"<{t}>{html.escape(c)}</{t}>" for c in r) + "</tr>"
        for t, r in (("th", head), *(("td", r) for r in rows))
    )
    li = [f"<li>{html.escape(x)}</li>" for x in items]
    li += [f'<li><a href="{html.escape(href)}">{html.escape(text)}</a></li>' for text, href in links]
    data = base64.b64encode(png.read_bytes()).decode()
    page = md_path.parent / "index.html"
    page.write_text(f"""<!doctype html>
<html><head><meta charset="utf-8"><title>envsched compare: {html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:1500px;margin:2em auto}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}li{{margin:0.4em 0}}img{{max-width:100%}}</style>
</head><body><h1>{html.escape(title)}</h1><p>{html.escape(intro)}</p><table>{table}</table>
<p><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></p><ul>{"".join(li)}</ul>
</body></html>
""")
    return page
