"""What selecting ahead of the rollouts costs (``RunSpec.select_lag``): the recommended form choosing
step t from the rollouts up to t-1-lag, as a trainer that asks for the next batch while one trains
does, beside the same form without a lag and random, through the product's step service."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from sections.common import HERE, machine, pm, write_section

LAGS = (0, 1, 2)


def _run(pool, scheduler: str | None, lag: int, seed: int, steps: int, label: str) -> dict:
    """One simulated run of ``steps`` steps in-process (select, train, fold, as the Dagster jobs
    do): its per-step batch variance and zero-variance share, and its seconds."""
    # the step service loads only for this section
    from envsched_pipeline.core.build import new_run
    from envsched_pipeline.core.pools import import_pool
    from envsched_pipeline.lake import Lake
    from envsched_pipeline.run import start_run
    from sections.system import _steps_in_process  # the in-process step loop of the system benches

    with tempfile.TemporaryDirectory() as d:
        lake = Lake(os.path.join(d, "lake"))
        import_pool(lake, pool)
        settings = {"scheduler": scheduler} if scheduler else {}
        start_run(lake, new_run(policy="simulated", seed=seed, max_steps=steps, select_lag=lag, **settings))
        t0 = time.perf_counter()
        _steps_in_process(lake, steps, f"select_lag bench: seed {seed} {label}", every=25)
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
            r = _run(pool, scheduler, lag, seed, steps, label)
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


LAG_RECORDS = HERE / "runs" / "pipeline-lag"


def _lag_record_path(seed: int, lag: int, steps: int) -> Path:
    return LAG_RECORDS / f"neural-lag{lag}-s{seed}-{steps}.json"


def _lake_metrics(lake) -> dict:
    """What section pipeline_neural's verdicts compare, read from one run's lake: per-step means of
    batch variance, zero-variance share and environments touched, and the held-out scores (with
    their standard errors) at the last evaluation."""
    from envsched_pipeline.analysis.compare import heldout_scores  # the report's reading: this section only

    s = lake.sql("select batch_variance, zero_variance_fraction, envs_touched from step_summary")
    held = heldout_scores(lake)
    out = {
        "batch_variance": float(np.mean(s.column("batch_variance").to_pylist())),
        "zero_variance": float(np.mean(s.column("zero_variance_fraction").to_pylist())),
        "envs_touched": float(np.mean(s.column("envs_touched").to_pylist())),
    }
    for split in ("seen", "unseen"):
        scores = held[f"heldout_{split}"]
        last = max(scores)
        out[f"heldout_{split}"], out[f"heldout_{split}_se"] = scores[last]
        out["heldout_step"] = last
    return out


def run_lagged(seeds: tuple[int, ...], lag: int = 1, steps: int = 200, eval_every: int = 50) -> None:
    """The recommended form with ``select_lag`` = ``lag`` through `envsched train --policy neural
    --resident` at each of ``seeds`` without a record, two at once, each recorded."""
    from envsched_pipeline.lake import Lake  # the step service: this section only
    from sections.pipeline import start_train  # the same `envsched train` as pipeline_neural's runs

    todo = [s for s in seeds if not _lag_record_path(s, lag, steps).exists()]
    for pair in (todo[i : i + 2] for i in range(0, len(todo), 2)):
        with tempfile.TemporaryDirectory() as d:
            procs = {
                seed: start_train(
                    Path(d, f"s{seed}"), seed, steps, eval_every, ["--select-lag", str(lag)],
                    f"pipeline_lag: started seed {seed}",
                )
                for seed in pair
            }  # fmt: skip
            for seed, (proc, log, t0) in procs.items():
                code = proc.wait()
                wall = time.time() - t0
                log.close()
                if code != 0:
                    raise RuntimeError(
                        f"seed {seed}: envsched train exited {code} (see {Path(d, f's{seed}', 'train.log')})"
                    )
                rec = {
                    "seed": seed,
                    "select_lag": lag,
                    "steps": steps,
                    "eval_every": eval_every,
                    "machine": machine(),
                    "recorded": time.strftime("%Y-%m-%d"),
                    "wall_seconds": wall,
                    **_lake_metrics(Lake(Path(d, f"s{seed}", "lake"))),
                }
                path = _lag_record_path(seed, lag, steps)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(rec, indent=2) + "\n")
                print(f"pipeline_lag: seed {seed} recorded ({rec['wall_seconds']:.0f} s)", flush=True)


def section_pipeline_lag(
    seeds: tuple[int, ...] = (26, 27, 28, 29, 30, 31, 32, 33), lag: int = 1, steps: int = 200
) -> None:
    """The recorded form runs with ``select_lag`` = ``lag`` beside the same seeds' runs of section
    pipeline_neural (the form without a lag, and random), paired by seed."""
    from sections.pipeline import record_path  # the lag-0 records of the same seeds

    run_lagged(seeds, lag, steps)
    rows, diffs = [], {k: [] for k in ("batch_variance", "zero_variance", "heldout_seen", "heldout_unseen")}
    names = {
        "Batch reward variance": "batch_variance",
        "Zero-variance group fraction": "zero_variance",
        "Held-out heldout_seen (last common evaluation)": "heldout_seen",
        "Held-out heldout_unseen (last common evaluation)": "heldout_unseen",
    }
    vs_random = {k: [] for k in diffs}
    for seed in seeds:
        lagged = json.loads(_lag_record_path(seed, lag, steps).read_text())
        base = json.loads(record_path(seed, steps).read_text())
        form = {names[v["metric"]]: v["run"] for v in base["verdicts"] if v["metric"] in names}
        rand = {names[v["metric"]]: v["base"] for v in base["verdicts"] if v["metric"] in names}
        for k in diffs:
            diffs[k].append(lagged[k] - form[k])
            vs_random[k].append(lagged[k] - rand[k])
        rows.append(
            f"| {seed} | {lagged['batch_variance'] / form['batch_variance']:.2f} | "
            f"{lagged['zero_variance'] / form['zero_variance']:.2f} | "
            f"{lagged['heldout_seen'] - form['heldout_seen']:+.4f} | {lagged['heldout_unseen'] - form['heldout_unseen']:+.4f} | "
            f"{lagged['heldout_seen'] - rand['heldout_seen']:+.4f} | {lagged['heldout_unseen'] - rand['heldout_unseen']:+.4f} |"
        )

    def over(v: list[float]) -> str:
        a = np.array(v)
        return f"{pm(a.mean(), a.std(ddof=1) / np.sqrt(len(a)))} ({int((a > 0).sum())}/{len(a)} above)"

    write_section(
        "pipeline_lag",
        "\n".join(
            [
                f"## Selecting one step ahead on the neural learner, through the product (select_lag {lag})",
                "",
                f"`envsched train --policy neural --resident --select-lag {lag}` (the recommended form, the "
                f"default synthetic pool, 64 x 8, {steps} steps, held-out every 50 steps) at seeds "
                f"{', '.join(map(str, seeds))}, beside the same seeds' records of section pipeline_neural "
                "(the form without a lag, and random; the lag changes nothing of a run without one, so "
                "those records stand for today's code). Per seed: the lagged run over the form without a "
                "lag (ratios of the per-step means; held-out differences at the last evaluation), and its "
                f"held-out against random. Machine: {machine()}.",
                "",
                "| seed | batch variance × no lag | zero-variance × no lag | Δ seen vs no lag | Δ unseen vs no lag | "
                "Δ seen vs random | Δ unseen vs random |",
                "|---|---|---|---|---|---|---|",
                *rows,
                "",
                f"Over the {len(seeds)} seeds, lagged minus no lag: batch variance {over(diffs['batch_variance'])}, "
                f"zero-variance share {over(diffs['zero_variance'])}, held-out seen {over(diffs['heldout_seen'])}, "
                f"unseen {over(diffs['heldout_unseen'])}. Lagged minus random: seen "
                f"{over(vs_random['heldout_seen'])}, unseen {over(vs_random['heldout_unseen'])}. A paired "
                "held-out difference between two runs has a standard deviation of about 0.02 on this "
                'learner (RESULTS "Two runs of every seed"), so a handful of seeds bounds the cost of '
                "the lag only coarsely.",
            ]
        ),
        after="select_lag",
    )
