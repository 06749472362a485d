"""A step's fixed costs, this tree against an earlier commit, side by side on one machine.

What a step costs besides the learner's own work: an `envsched` command's start, a simulated step
through the Dagster jobs (select, train, statistics; its trainer process, plots, scheduler) and a
neural step with the resident worker, and the neural run's step 0 (its warm start). Each tree runs
in its own Python process (the earlier commit from a git worktree), one after the other, with the
same interpreter and packages and their bytecode compiled first; each measurement is the median of
its steps 1.. (step 0 pays the pool's graph and the warm start). Each tree runs the neural learner
twice at one seed, in two lakes: its first run makes the seed's warm start, its second finds it
in the tree's cache where the tree keeps one.

    python bench/step_costs.py --base 02e8e99 [--sim-steps 12] [--neural-steps 6] [--write]

``--write`` puts the table in the ``step_costs`` section of ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from sections.common import earlier_tree, machine, short_rev, write_section  # noqa: E402

# run inside each tree's own process: only APIs both trees have
MEASURE = r"""
import json, os, sys, tempfile, time
import dagster as dg
from envs.registry import load_synthetic
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.lake import Lake
from envsched_pipeline.orchestration.driver import run_loop
from envsched_pipeline.run import RunSpec, start_run

policy, steps, root = sys.argv[1], int(sys.argv[2]), sys.argv[3]
lake = Lake(root)
if not lake.has("tasks", pool="synthetic"):
    import_pool(lake, load_synthetic("synthetic"))
config = {"resident": True} if policy == "neural" else {}
start_run(lake, RunSpec(pool="synthetic", policy=policy, batch_size=64, group_size=8, max_steps=steps,
                        seed=7, policy_config=config))
walls = []
with dg.instance_for_test() as instance:
    run_loop(lake, steps, instance=instance, on_step=lambda _s, w: walls.append(w))
m = lake.sql("select step, seconds from train_metrics order by step").to_pylist()
print("RESULT " + json.dumps({"walls": walls, "trainer": [r["seconds"] for r in m]}))
"""


def _tree_env(tree: Path, cache: Path) -> dict:
    return {
        **os.environ,
        "PYTHONPATH": str(tree),
        "ENVSCHED_CACHE": str(cache),
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE", "Haswell"),
    }


def _status_seconds(tree: Path, lake: str, cache: Path, repeats: int = 7) -> float:
    """Median wall of `envsched status` on ``lake`` (a fresh interpreter each time)."""
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "envsched_pipeline.cli", "--lake", lake, "status"],
            cwd=tree,
            env=_tree_env(tree, cache),
            capture_output=True,
            check=True,
            timeout=300,
        )
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls)


def _loop(tree: Path, policy: str, steps: int, lake: str, cache: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, policy, str(steps), lake],
        cwd=tree,
        env=_tree_env(tree, cache),
        capture_output=True,
        text=True,
        timeout=3600,
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"{tree} ({policy}): rc {out.returncode}\n{out.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def measure(tree: Path, sim_steps: int, neural_steps: int, work: Path) -> dict:
    cache = work / "cache"
    # both trees' bytecode compiled first: a fresh worktree would pay it in its first runs
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "envsched_pipeline", "trainer", "envs", "warehouse"],
        cwd=tree,
        check=True,
        timeout=600,
    )
    sim = _loop(tree, "simulated", sim_steps, str(work / "sim"), cache)
    print(f"  {tree.name}: simulated walls {[round(w, 2) for w in sim['walls']]}", flush=True)
    status = _status_seconds(tree, str(work / "sim"), cache)
    print(f"  {tree.name}: envsched status {status:.2f} s", flush=True)
    first = _loop(tree, "neural", 1, str(work / "neural-first"), cache)  # the seed's warm start, made
    again = _loop(tree, "neural", neural_steps, str(work / "neural"), cache)
    print(f"  {tree.name}: neural walls {[round(w, 2) for w in again['walls']]}", flush=True)
    return {
        "status": status,
        "sim_step": statistics.median(sim["walls"][1:]),
        "neural_step": statistics.median(again["walls"][1:]),
        "neural_trainer": statistics.median(again["trainer"][1:]),
        "neural_first_step0": first["walls"][0],
        "neural_step0": again["walls"][0],
    }


def table(base: str, results: dict[str, dict]) -> list[str]:
    b, h = results["base"], results["head"]
    rows = [
        f"| what (median seconds) | commit {base} | this tree | this tree / {base} |",
        "|---|---|---|---|",
    ]
    for key, label in (
        ("status", "`envsched status` (a fresh process)"),
        ("sim_step", "simulated step through the Dagster jobs (wall)"),
        ("neural_step", "neural step, resident worker (wall)"),
        ("neural_trainer", "  of which the learner's own work"),
        ("neural_first_step0", "neural step 0, the seed's first run"),
        ("neural_step0", "neural step 0, a later run of the seed"),
    ):
        rows.append(f"| {label} | {b[key]:.2f} | {h[key]:.2f} | {h[key] / b[key]:.2f}x |")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the earlier commit to compare with")
    ap.add_argument("--sim-steps", type=int, default=12)
    ap.add_argument("--neural-steps", type=int, default=6)
    ap.add_argument("--write", action="store_true", help="write the section of bench/RESULTS.md")
    args = ap.parse_args(argv)
    base, head = short_rev(args.base), short_rev("HEAD")
    results = {}
    with tempfile.TemporaryDirectory() as d, earlier_tree(base, Path(d)) as tree:
        for name, where in (("base", tree), ("head", ROOT)):
            print(f"measuring {name} ({where})", flush=True)
            work = Path(d) / name
            work.mkdir()
            results[name] = measure(where, args.sim_steps, args.neural_steps, work)
    rows = table(base, results)
    print("\n".join(rows))
    if args.write:
        write_section(
            "step_costs",
            "\n".join(
                [
                    "## A step's fixed costs, against an earlier commit (`bench/step_costs.py`)",
                    "",
                    f"This tree (HEAD {head} and its changes) against commit {base}, each in its own processes on "
                    f"one machine, one after the other: the default synthetic pool, 64 x 8, seed 7, the "
                    f"recommended form; the simulated learner {args.sim_steps} steps and the neural learner "
                    f"with its resident worker {args.neural_steps} steps through the Dagster jobs in-process "
                    "(medians of steps 1..; the neural run's last step also measures held-out). Step 0 "
                    "builds the pool's graph, evaluates held-out and pays the neural learner's warm start: a "
                    "seed's first run makes it, a later run of the seed (here: the same tree's second run, "
                    "in another lake) loads it where the tree keeps it. "
                    f"Machine: {machine()}.",
                    "",
                    *rows,
                ]
            ),
            after="resident_neural",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
