"""The runs in a folder of lakes (``envsched runs [DIR...]``): one line per lake (scheduler, seed,
how far it is, its latest numbers), and the ``envsched compare`` commands its runs allow.

Judging a scheduler takes one lake per (scheduler, seed) — the quick start alone makes nine — so a
user needs to see which lakes hold what and which of them can be set side by side: runs of the same
pool, policy, B and G, grouped by scheduler, paired by seed. A lake that cannot be read is listed
with the reason, never skipped in silence.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import duckdb
import pyarrow as pa

from envsched_pipeline.analysis.compare import heldout_scores, short_label
from envsched_pipeline.core.loop import explain, next_action
from envsched_pipeline.errors import EnvschedError
from envsched_pipeline.lake import Lake
from envsched_pipeline.run import RUN_FILE, load_run, steps_of

BASELINE = "random"  # the scheduler the suggested comparisons judge the others against


def find_lakes(dirs: Sequence[str | Path]) -> list[Lake]:
    """The lakes named or found one level below each of ``dirs`` (a folder or an object-store
    prefix, ``s3://bucket/prefix``, holding ``run.json``), sorted by path."""
    found: dict[str, Lake] = {}
    for d in dirs:
        if "://" in str(d):
            top = Lake(d)
            lakes = [top] if top.exists(RUN_FILE) else []
            lakes += [Lake(top.where(rel.rsplit("/", 1)[0])) for rel in top.store.glob(f"*/{RUN_FILE}")]
            found.update((str(lake.root), lake) for lake in lakes)
            continue
        path = Path(d)
        for candidate in [path, *sorted(p for p in path.iterdir() if p.is_dir())] if path.is_dir() else []:
            if (candidate / RUN_FILE).is_file():
                found[str(candidate)] = Lake(candidate)
    return [found[k] for k in sorted(found)]


def parent_of(lake: Lake) -> str:
    """The folder (or object-store prefix) holding ``lake``, where its sibling runs are; a lake at
    a bucket's top is its own."""
    if not lake.remote:
        return str(lake.root.parent)
    url = str(lake.root).rstrip("/")
    scheme, path = url.split("://", 1)
    return f"{scheme}://{path.rsplit('/', 1)[0]}" if "/" in path else url


def describe(lake: Lake) -> dict:
    """One lake's run: what it is, how far it has come, its latest held-out and its per-step means;
    ``problem`` (and little else) when the run cannot be read."""
    row = {"lake": str(lake.root)}
    try:
        spec = load_run(lake)
        if spec is None:
            return {**row, "problem": "no run"}
        done = lake.steps("statistics")
        action = next_action(lake)
        row.update(
            run_id=spec.run_id,
            scheduler=short_label(spec),
            seed=spec.seed,
            policy=spec.policy,
            pool=spec.pool,
            batch_size=spec.batch_size,
            group_size=spec.group_size,
            steps=len(done),
            max_steps=spec.max_steps,
            against=list(spec.against),  # the runs its report compares with (`train --against`)
            state="complete" if action is None else _state(lake, action),
            heldout=_last_heldout(lake),
            means=_means(lake) if done else {},
        )
    except (EnvschedError, OSError, ValueError, duckdb.Error, pa.ArrowException) as exc:
        # a broken run.json, a damaged table: the lake is listed with why, the listing goes on
        if isinstance(exc, EnvschedError):
            return {**row, "problem": str(exc)}
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return {**row, "problem": f"its tables cannot be read ({type(exc).__name__}: {first})"}
    return row


def _state(lake: Lake, action: tuple[str, int]) -> str:
    kind, step = action
    if kind in ("halted", "broken"):
        return explain(lake, action)
    return {"wait": f"waiting for the trainer's rollouts of step {step}"}.get(
        kind, f"next: {kind} step {step}"
    )


def _last_heldout(lake: Lake) -> dict:
    """Benchmark -> (step, score) of its latest evaluation."""
    out = {}
    for bench, by_step in heldout_scores(lake).items():
        last = max(by_step)
        out[bench] = (last, by_step[last][0])
    return out


def _means(lake: Lake) -> dict:
    row = lake.sql(
        "select avg(batch_variance) as batch_variance, avg(zero_variance_fraction) as zero_variance_fraction "
        "from step_summary"
    ).to_pylist()[0]
    return {k: float(v) for k, v in row.items() if v is not None}


def shown(path: str) -> str:
    """``path`` as a person would type it here: relative to the working folder when under it."""
    if "://" in path:
        return path
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def comparisons(rows: list[dict]) -> list[dict]:
    """The ``envsched compare`` commands the runs allow: for each (pool, policy, B, G) with runs of
    ``BASELINE`` and of another scheduler sharing two seeds or more, every such scheduler judged
    against it (one --runs each; of two lakes of one scheduler and seed, the first by path).
    ``command``: the command line; ``seeds``: the seeds any of them shares with the baseline;
    ``notes``: the lakes left out because another lake holds the same scheduler's run of that seed."""
    groups: dict[tuple, dict[str, dict[int, str]]] = {}
    left: dict[tuple, list[str]] = {}
    for r in sorted((r for r in rows if "problem" not in r), key=lambda r: r["lake"]):
        key = (r["pool"], r["policy"], r["batch_size"], r["group_size"])
        seeds = groups.setdefault(key, {}).setdefault(r["scheduler"], {})
        if r["seed"] in seeds:
            left.setdefault(key, []).append(
                f"{shown(r['lake'])} left out: {seeds[r['seed']]} holds {r['scheduler']}'s run of seed {r['seed']} "
                "too (a comparison takes one run per seed)"
            )
            continue
        seeds[r["seed"]] = shown(r["lake"])
    out = []
    for (pool, policy, b, g), by_sched in sorted(groups.items()):
        base = by_sched.get(BASELINE)
        if not base:
            continue
        sides = []
        for name in sorted(s for s in by_sched if s != BASELINE):
            shared = sorted(set(by_sched[name]) & set(base))
            if len(shared) >= 2:
                sides.append((name, shared))
        if not sides:
            continue
        seeds = sorted(set().union(*(set(s) for _, s in sides)))
        runs = " ".join("--runs " + " ".join(by_sched[name][s] for s in shared) for name, shared in sides)
        against = " ".join(base[s] for s in seeds)
        out.append(
            {
                "pool": pool,
                "policy": policy,
                "batch_size": b,
                "group_size": g,
                "schedulers": [name for name, _ in sides],
                "seeds": seeds,
                "command": f"envsched compare {runs} --against {against}",
                "notes": left.get((pool, policy, b, g), []),
            }
        )
    return out


def table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """The listing's header and cells: one row per lake."""
    benches = sorted({b for r in rows for b in r.get("heldout", {})})
    head = ["lake", "scheduler", "seed", "policy", "pool", "B x G", "steps", "state"]
    head += ["batch variance", "zero-variance"] + [f"{b} (step)" for b in benches]
    cells = []
    for r in rows:
        if "problem" in r:
            cells.append(
                [shown(r["lake"]), "—", "—", "—", "—", "—", "—", r["problem"], *["—"] * (2 + len(benches))]
            )
            continue
        m = r["means"]
        cells.append(
            [
                shown(r["lake"]),
                r["scheduler"],
                str(r["seed"]),
                r["policy"],
                r["pool"],
                f"{r['batch_size']} x {r['group_size']}",
                steps_of(r["steps"], r["max_steps"], "/"),
                r["state"],
                f"{m['batch_variance']:.4f}" if "batch_variance" in m else "—",
                f"{m['zero_variance_fraction']:.3f}" if "zero_variance_fraction" in m else "—",
                *[
                    f"{r['heldout'][b][1]:.4f} ({r['heldout'][b][0]})" if b in r["heldout"] else "—"
                    for b in benches
                ],
            ]
        )
    return head, cells
