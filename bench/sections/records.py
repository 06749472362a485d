"""Reading recorded bench runs (one JSON per scheduler and seed) and the paired statistics every
neural table uses."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from scipy import stats

from envsched_pipeline.analysis.bench import (
    VARIANTS,
    run_benchmark,
)
from sections.common import pm


def paired_cell(p: dict | None, metric: str) -> str:
    """'Δ ± sd, wins/n' of one paired difference against random (— for random itself)."""
    if not p:
        return "—"
    d = p[metric]
    return f"{pm(d['mean'], d['sd'])}, {d['wins']}/{d['n']}"


def mean_se_wins(d) -> str:
    """``mean ± standard error (how many above 0/n)`` of paired differences over seeds."""
    d = np.asarray(d, dtype=float)
    return f"{d.mean():+.4f} ± {d.std(ddof=1) / np.sqrt(len(d)):.4f} ({(d > 0).sum()}/{len(d)})"


def t_half(d) -> float:
    """The half-width of the 95% Student t interval of the mean of ``d`` (paired differences over
    seeds): about 2.1 standard errors at 15 seeds, 2.3 at 10, 2.8 at 5. A mean beyond it is
    *resolved*; the tables before 2026-12-05 used two standard errors."""
    d = np.asarray(d, dtype=float)
    return float(stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d)))


def seed_span(seeds: list[int]) -> str:
    """``0-9`` for consecutive seeds, else the list."""
    if seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds))


def part_means(xs, parts: int = 4) -> list[float]:
    """The means of a per-step series over ``parts`` equal spans of its steps (quarters by default)."""
    edges = np.linspace(0, len(xs), parts + 1).astype(int)
    return [float(np.mean(xs[a:b])) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def recorded_files(runs: str | Path, name: str) -> dict[int, Path]:
    """The recorded runs of scheduler ``name`` in ``runs`` by seed, by exact name (the runs of
    ``envsched@success-sampled`` are not runs of ``envsched@success``)."""
    pat = re.compile(re.escape(name) + r"-s(\d+)-[0-9a-f]+\.json")
    found = ((pat.fullmatch(f.name), f) for f in sorted(Path(runs).glob(f"{name}-s*.json")))
    return {int(m.group(1)): f for m, f in found if m}


def recorded_seeds(runs: str | Path, name: str) -> list[int]:
    """The seeds of scheduler ``name`` on record in ``runs`` (:func:`recorded_files`)."""
    return sorted(recorded_files(runs, name))


def recorded_variants(runs: str | Path) -> list[str]:
    """Every scheduler variant with a run on record in ``runs``, in the order variants are defined:
    the rows a section shows when ``--extra`` does not name them (every experiment, kept or not)."""
    return [v for v in VARIANTS if recorded_seeds(runs, v)]


def mean_over(per: dict, metric: str, over: list[int]) -> float:
    return float(np.mean([per[s][metric] for s in over])) if over else float("nan")


def paired_mean(per: dict, rnd: dict, metric: str, over: list[int]) -> str:
    """Mean paired difference over ``over`` (± sd over seeds) and in how many seeds it is positive."""
    d = [per[s][metric] - rnd[s][metric] for s in over]
    if not d:
        return "—"
    return f"{pm(np.mean(d), np.std(d, ddof=1) if len(d) > 1 else 0.0)}, {sum(x > 0 for x in d)}/{len(d)}"


def ratio_over(per: dict, rnd: dict, metric: str, over: list[int]) -> float:
    return mean_over(per, metric, over) / mean_over(rnd, metric, over) if over else float("nan")


def recorded_at_seed(names: list[str], runs: str, seed: int, config: dict, steps: int) -> dict:
    """The neural runs of ``names`` on record in ``runs`` at one seed (learner ``config``, held-out
    every 50 steps), summarized per scheduler; a scheduler not on record is absent."""
    return run_benchmark(
        names,
        steps=steps,
        seed=seed,
        seeds=1,
        learner="neural",
        eval_every=50,
        recorded_only=True,
        log=lambda _m: None,
        cache_dir=runs,
        learner_config=config,
    )["schedulers"]


def records_keeping(runs: str | Path, name: str, field: str = "unseen_by_env") -> dict[int, dict]:
    """The records of ``name`` in ``runs`` by seed whose evaluations keep ``field`` (held-out per
    environment, or ``unseen_by_task``: per task)."""
    out = {}
    for seed in recorded_seeds(runs, name):
        for f in Path(runs).glob(f"{name}-s{seed}-*.json"):
            rec = json.loads(f.read_text())
            if rec.get("evals") and field in rec["evals"][-1]:
                out[seed] = rec
    return out


def recorded_kw(seeds: list[int], steps: int, learner_config: dict | None = None) -> dict:
    """``run_benchmark``'s keywords for a table read from the neural learner's records of ``seeds``
    (held-out every 50 steps; nothing is run)."""
    return {
        "steps": steps,
        "learner": "neural",
        "eval_every": 50,
        "recorded_only": True,
        "learner_config": dict(learner_config or {}),
        "seed": seeds[0],
        "seeds": seeds[-1] - seeds[0] + 1,
        "log": lambda _m: None,
    }


def record_of(runs: str | Path, name: str, seed: int) -> dict | None:
    """The one record of ``name`` at ``seed`` in ``runs`` (None if there is none)."""
    found = sorted(Path(runs).glob(f"{name}-s{seed}-*.json"))
    return json.loads(found[0].read_text()) if found else None
