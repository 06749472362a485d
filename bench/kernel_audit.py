"""Which OpenBLAS kernels the recorded runs that read the task graph were made under.

Every schedule that reads the graph (every envsched form, exploit-only, coverage-only) starts from
one cold-start batch, picked by the graph's similarities, and those round by the BLAS kernels
OpenBLAS picked for the CPU (docs/experiments.md, "BLAS kernels"). So the first batch's mean reward,
rolled out under each kernel, tells which kernels made a record from before records named them; at
a seed whose cold starts agree under every kernel it cannot tell. Each kernel runs in a fresh
process (OpenBLAS reads ``OPENBLAS_CORETYPE`` when it loads). The first batches are kept in
``bench/runs/kernels.json``, so running it again only rolls out seeds it has not seen; the table
goes to the ``kernels`` section of ``bench/RESULTS.md`` (``make bench`` refreshes it too) when every
folder is audited under the two kernels, and is printed otherwise.

    python bench/kernel_audit.py [--dirs neural-noforced,neural-overrun] [--kernels Haswell,SkylakeX] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from envsched_pipeline.analysis.bench import blas_kernel, make_learner, prepare_pool  # noqa: E402
from envsched_pipeline.scheduler import GRAPH_SCHEDULERS, make_scheduler  # noqa: E402
from envsched_pipeline.scheduler.config import SchedulerConfig  # noqa: E402
from envsched_pipeline.scheduler.state import SchedulerState  # noqa: E402

RUNS = HERE / "runs"
FIRST_BATCHES = RUNS / "kernels.json"
# the learner settings each directory's runs were recorded with (bench/runs/README.md); the first
# batch's rewards depend on them only through the overrun penalty
DIR_CONFIGS = {
    "neural": {"train_forced_stop": True},
    "neural-noforced": {"train_forced_stop": False},
    "neural-noforced-unseen48": {"train_forced_stop": False},
    "neural-overrun": {"overrun_penalty": 0.1, "train_forced_stop": False},
    "neural-overrun-probe": {"overrun_penalty": 0.1, "train_forced_stop": False},
    "neural-batch": {"train_forced_stop": True, "loss_denominator": "batch"},
    "neural-dualclip": {"train_forced_stop": True, "dual_clip": 3.0},
}
KERNELS = ("Haswell", "SkylakeX")  # AVX2 and AVX-512: the two the records were made under
SAME = 1e-12  # first_departure's tolerance: a mean reward that differs by more is another batch


def first_batch(seed: int, config: dict) -> dict:
    """The cold-start batch of a graph-reading schedule at ``seed``, rolled out once by the neural
    learner as `envsched bench scheduler` rolls out its step 0: its mean reward and this process's
    kernels (run it in a process started with ``OPENBLAS_CORETYPE`` set)."""
    pool = prepare_pool(51, 50, seed)
    tasks = pool["tasks"]
    state = SchedulerState.new(
        [t["task_id"] for t in tasks], [t["env_id"] for t in tasks], [t["content_hash"] for t in tasks]
    )
    sched = make_scheduler("envsched", SchedulerConfig(batch_size=64, group_size=8), graph=pool["graph"])
    picks = sched.select(state, 64, np.random.default_rng([seed, 0]), 0).picks
    lrn = make_learner("neural", pool, seed, learner_config=config)
    try:
        out = lrn.rollout([p.task_id for p in picks], 8, np.random.default_rng([seed, 99]))
    finally:
        lrn.close()
    return {"kernel": blas_kernel(), "mean_reward": float(np.mean(out["reward"]))}


def _key(seed: int, config: dict, kernel: str) -> str:
    return json.dumps({"seed": seed, "config": config, "kernel": kernel}, sort_keys=True)


def measure(needed: list[tuple[int, dict]], kernels: list[str], jobs: int) -> dict:
    """First batches for every (seed, settings) under every kernel, each in a fresh process; those
    already in ``kernels.json`` are read, not rolled out again."""
    known = json.loads(FIRST_BATCHES.read_text()) if FIRST_BATCHES.exists() else {}
    todo = [(s, c, k) for s, c in needed for k in kernels if _key(s, c, k) not in known]

    def one(item):
        seed, config, kernel = item
        env = {**os.environ, "OPENBLAS_CORETYPE": kernel}
        code = (
            "import json, sys; sys.path.insert(0, sys.argv[1]); from kernel_audit import first_batch; "
            "print(json.dumps(first_batch(int(sys.argv[2]), json.loads(sys.argv[3]))))"
        )
        args = [sys.executable, "-W", "ignore", "-c", code, str(HERE), str(seed), json.dumps(config)]
        done = subprocess.run(args, env=env, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"first batch of seed {seed} under {kernel} failed:\n{done.stderr[-2000:]}")
        got = json.loads(done.stdout.strip().splitlines()[-1])
        if got["kernel"] != kernel:  # OpenBLAS would not run what was asked (not an x86-64 CPU?)
            raise RuntimeError(f"asked OpenBLAS for {kernel}, it ran {got['kernel']}")
        return item, got

    with ThreadPoolExecutor(max_workers=jobs) as ex:
        for i, ((seed, config, kernel), got) in enumerate(ex.map(one, todo), 1):
            known[_key(seed, config, kernel)] = got["mean_reward"]
            FIRST_BATCHES.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")
            print(f"  [{i}/{len(todo)}] seed {seed} {kernel} {config}: {got['mean_reward']:.6f}", flush=True)
    return known


def classify(first: float, by_kernel: dict[str, float]) -> str:
    """The kernels whose first batch a record's first step repeats: one name, "cannot tell" when
    every kernel rolls out the same batch, or "neither"."""
    match = [k for k, v in by_kernel.items() if abs(v - first) <= SAME]
    if not match:
        return "neither"
    if len(match) == len(by_kernel) and len({round(v, 12) for v in by_kernel.values()}) == 1:
        return "cannot tell"
    return "/".join(sorted(match))


RECORD = re.compile(r"^(?P<name>.+)-s(?P<seed>\d+)-[0-9a-f]{12}$")


def records(folder: str) -> list[tuple[Path, int, dict]]:
    """(file, seed, record) of the graph-reading runs recorded in ``bench/runs/<folder>``."""
    out = []
    for f in sorted((RUNS / folder).glob("*.json")):
        m = RECORD.match(f.stem)
        if m and m["name"].split("@")[0] in GRAPH_SCHEDULERS:
            out.append((f, int(m["seed"]), json.loads(f.read_text())))
    return out


def name_kernel(f: Path, rec: dict, label: str, kernels: list[str]) -> bool:
    """Write the kernels the audit found into a record that predates the field (True: written).
    Only a record that names its package versions and matched exactly one kernel; a record that
    names other kernels than it matched is an error (its first step contradicts it)."""
    env = rec.get("environment")
    if label not in kernels or not env:
        return False
    if "blas" in env:
        if env["blas"] != label:
            raise ValueError(f"{f}: environment.blas is {env['blas']!r} but its first step is {label}'s")
        return False
    at = list(env).index("cpu") + 1 if "cpu" in env else len(env)
    items = list(env.items())
    rec["environment"] = dict(
        items[:at] + [("blas", label), ("blas_from", "bench/kernel_audit.py")] + items[at:]
    )
    tmp = f.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec))
    tmp.replace(f)
    return True


def audit(dirs: list[str], kernels: list[str], jobs: int = 2, write: bool = False) -> str:
    """Match every graph-reading record in ``dirs`` against the first batches under ``kernels``
    (rolling out those not yet kept); ``write``: name the kernels in the records (:func:`name_kernel`).
    Returns the RESULTS section. ValueError for a folder whose learner settings are not known;
    RuntimeError when OpenBLAS will not run a kernel asked for (not an x86-64 CPU with it)."""
    unknown = [d for d in dirs if d not in DIR_CONFIGS]
    if unknown:
        raise ValueError(f"no learner settings known for {unknown} (kernel_audit.DIR_CONFIGS)")
    recs = {d: records(d) for d in dirs}
    needed = sorted(
        {(s, json.dumps(DIR_CONFIGS[d], sort_keys=True)) for d in dirs for _, s, _ in recs[d]},
        key=lambda x: (x[1], x[0]),
    )
    print(f"kernel_audit: {len(needed)} (seed, settings) first batches x {len(kernels)} kernels", flush=True)
    known = measure([(s, json.loads(c)) for s, c in needed], kernels, jobs)
    rows = [
        "| runs in | graph-reading records | " + " | ".join(kernels) + " | cannot tell (seeds) | neither |",
        "|" + "---|" * (len(kernels) + 4),
    ]
    for d in dirs:
        labels: dict[str, int] = {}
        blind: set[int] = set()
        written = 0
        for f, seed, rec in recs[d]:
            by_kernel = {k: known[_key(seed, DIR_CONFIGS[d], k)] for k in kernels}
            label = classify(rec["mean_reward"][0], by_kernel)
            labels[label] = labels.get(label, 0) + 1
            if label == "cannot tell":
                blind.add(seed)
            if write:
                written += name_kernel(f, rec, label, kernels)
        if write:
            print(f"  {d}: named the kernels in {written} record(s)")
        tell = f"{labels.get('cannot tell', 0)} ({', '.join(map(str, sorted(blind))) or '—'})"
        cells = [str(labels.get(k, 0)) for k in kernels]
        rows.append(
            f"| `{d}/` | {len(recs[d])} | " + " | ".join(cells) + f" | {tell} | {labels.get('neither', 0)} |"
        )
    return "\n".join(
        [
            "## Which BLAS kernels the graph-reading records were made under",
            "",
            "Every schedule that reads the task graph (every envsched form, exploit-only, coverage-only) "
            "starts from one cold-start batch picked by the graph's similarities, which round by the "
            'OpenBLAS kernels (docs/experiments.md, "BLAS kernels"). Each record\'s first step is '
            "compared with that batch rolled out under each kernel in a fresh process "
            "(`OPENBLAS_CORETYPE`; `python bench/kernel_audit.py`, first batches kept in "
            "`bench/runs/kernels.json`). A record repeats only under the kernels it was made with; "
            "*cannot tell*: seeds whose cold starts agree under every kernel. `make bench` asks for "
            "Haswell's.",
            "",
            *rows,
        ]
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dirs", default=",".join(DIR_CONFIGS), help="folders under bench/runs")
    ap.add_argument("--kernels", default=",".join(KERNELS), help="OPENBLAS_CORETYPE values to compare")
    ap.add_argument("--jobs", type=int, default=2, help="first batches rolled out in parallel")
    ap.add_argument(
        "--write",
        action="store_true",
        help="name the kernels found in each record that predates the field (environment.blas, "
        "with blas_from naming this audit), so its tables and a resumed run say which kernels repeat it",
    )
    args = ap.parse_args()
    try:
        body = audit(args.dirs.split(","), args.kernels.split(","), args.jobs, args.write)
    except (ValueError, RuntimeError) as e:
        print(f"kernel_audit: {e}", file=sys.stderr)
        return 2
    if sorted(args.dirs.split(",")) != sorted(DIR_CONFIGS) or args.kernels.split(",") != list(KERNELS):
        print(body)  # a partial audit: RESULTS keeps the whole table
        return 0
    from run_all import write_section  # here: run_all loads every bench section's imports (plots too)

    write_section("kernels", body, after="neural_unseen_split")
    print(f"wrote {HERE / 'RESULTS.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
