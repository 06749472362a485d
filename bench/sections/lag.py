"""What selecting ahead of the rollouts costs (``RunSpec.select_lag``): the recommended form choosing
step t from the rollouts up to t-1-lag, as a trainer that asks for the next batch while one trains
does, beside the same form without a lag and random, through the product's step service."""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np

from sections.common import machine, pm, write_section

LAGS = (0, 1, 2)


def _run(pool, scheduler: str | None, lag: int, seed: int, steps: int) -> dict:
    """One simulated run of ``steps`` steps in-process (select, train, fold, as the Dagster jobs
    do): its per-step batch variance and zero-variance share, and its seconds."""
    # the step service loads only for this section
    from envsched_pipeline.core.build import new_run
    from envsched_pipeline.core.pools import import_pool
    from envsched_pipeline.core.select import select_manifest
    from envsched_pipeline.core.statistics import statistics_step
    from envsched_pipeline.lake import Lake
    from envsched_pipeline.run import start_run
    from trainer.step import run_step

    with tempfile.TemporaryDirectory() as d:
        lake = Lake(os.path.join(d, "lake"))
        import_pool(lake, pool)
        settings = {"scheduler": scheduler} if scheduler else {}
        start_run(lake, new_run(policy="simulated", seed=seed, max_steps=steps, select_lag=lag, **settings))
        t0 = time.perf_counter()
        for t in range(steps):
            select_manifest(lake, t)
            run_step(lake, t, log=lambda *_: None)
            statistics_step(lake, t)
        seconds = time.perf_counter() - t0
        rows = lake.sql("select step, batch_variance, zero_variance_fraction from step_summary order by step")
        return {
            "batch_variance": np.array(rows.column("batch_variance").to_pylist(), dtype=float),
            "zero_variance": np.array(rows.column("zero_variance_fraction").to_pylist(), dtype=float),
            "seconds": seconds,
        }


def section_select_lag(steps: int = 100, seeds: int = 4) -> None:
    """Random, and the recommended form at each of LAGS, on the simulated learner (its mechanics:
    batch variance and the share of groups without spread, never held-out), paired by seed."""
    from envs.registry import load_synthetic  # the pool loads only for this section

    pool = load_synthetic("synthetic")
    rows: dict[str, list[dict]] = {}
    forms = [("random", "random", 0)] + [(f"the form, select_lag {k}", None, k) for k in LAGS]
    for seed in range(seeds):
        for label, scheduler, lag in forms:
            r = _run(pool, scheduler, lag, seed, steps)
            rows.setdefault(label, []).append(r)
            print(
                f"select_lag bench: seed {seed} {label}: batch variance {r['batch_variance'].mean():.4f}, "
                f"zero-variance {r['zero_variance'].mean():.3f} ({r['seconds']:.0f} s)",
                flush=True,
            )

    def per_seed(label: str, key: str) -> np.ndarray:
        return np.array([r[key].mean() for r in rows[label]])

    base = "the form, select_lag 0"
    table = [
        "| scheduler | batch variance | × random | × select_lag 0 | zero-variance share | × random | "
        "× select_lag 0 | paired Δ batch variance vs select_lag 0 (seeds above) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, _, _ in forms:
        bv, zv = per_seed(label, "batch_variance"), per_seed(label, "zero_variance")
        rand_bv, rand_zv = per_seed("random", "batch_variance"), per_seed("random", "zero_variance")
        b0, z0 = per_seed(base, "batch_variance"), per_seed(base, "zero_variance")
        diff = bv - b0
        paired = (
            f"{pm(diff.mean(), diff.std(ddof=1) / np.sqrt(len(diff)))} ({int((diff > 0).sum())}/{len(diff)})"
            if label not in ("random", base)
            else "—"
        )
        table.append(
            f"| {label} | {bv.mean():.4f} | {bv.mean() / rand_bv.mean():.2f} | {bv.mean() / b0.mean():.2f} | "
            f"{zv.mean():.3f} | {zv.mean() / rand_zv.mean():.2f} | {zv.mean() / z0.mean():.2f} | {paired} |"
        )
    late = [
        f"{label}: {np.mean([r['batch_variance'][steps // 2 :].mean() for r in rows[label]]):.4f}"
        for label, _, _ in forms
    ]
    write_section(
        "select_lag",
        "\n".join(
            [
                "## Selecting ahead of the rollouts: what a stale selection costs",
                "",
                "A trainer that asks for the next batch while the current one trains (a prefetching "
                "data loader, one-step off-policy RL) needs manifest t before step t-1's rewards are "
                "back. With `select_lag` k (`ExternalRun(select_lag=k)`, `step select --select-lag k`, "
                "`envsched train --select-lag k`) manifest t is chosen from the rollouts up to step "
                "t-1-k, the picks of the k manifests in between counted as spent so they are not "
                "picked again at once. Here: the simulated learner (mechanics only: batch variance "
                f"and the share of groups without spread), the default synthetic pool, B = 64, G = 8, "
                f"{steps} steps, seeds 0-{seeds - 1}, each run through the product's step service "
                "in-process (select, train, fold); means over all steps, then over seeds. "
                f"Machine: {machine()}.",
                "",
                *table,
                "",
                "Over the second half of the runs, batch variance: " + "; ".join(late) + ".",
            ]
        ),
        after="sim_sweep",
    )
