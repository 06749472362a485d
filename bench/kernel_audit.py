"""Which graph each recorded run that reads the task graph was made with.

Every schedule that reads the graph (every envsched form, exploit-only, coverage-only) starts from
one cold-start batch, picked by the graph's similarities. Until commit 24ddfc9 the graph depended on
the BLAS kernels OpenBLAS picked for the CPU (identical topology vectors split into two groups under
its AVX-512 kernels; docs/experiments.md, "BLAS kernels"), so that batch, rolled out once under each
kernel, tells which graph made a record from before records named their kernels. The batches were
rolled out with the code before that commit (`first_batch` there, each kernel in a fresh process
with ``OPENBLAS_CORETYPE``) and are kept in ``bench/runs/kernels.json``; today's graph is the one
the Haswell (AVX2) kernels built, under any kernel, so this reads those batches and rolls out
nothing. A record labelled Haswell repeats with today's code on any CPU; one labelled SkylakeX was
made with a graph today's code no longer builds. The table goes to the ``kernels`` section of
``bench/RESULTS.md`` (``make bench`` refreshes it too) when every folder is read, and is printed
otherwise.

    python bench/kernel_audit.py [--dirs neural-noforced,neural-overrun] [--write]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from envsched_pipeline.scheduler import GRAPH_SCHEDULERS  # noqa: E402

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


def _key(seed: int, config: dict, kernel: str) -> str:
    return json.dumps({"seed": seed, "config": config, "kernel": kernel}, sort_keys=True)


def classify(first: float, by_kernel: dict[str, float]) -> str:
    """The kernels whose first batch a record's first step repeats: one name, "cannot tell" when
    every kernel rolls out the same batch, or "neither"."""
    match = [k for k, v in by_kernel.items() if abs(v - first) <= SAME]
    if not match:
        return "neither"
    return "cannot tell" if len(match) == len(by_kernel) else "/".join(sorted(match))


RECORD = re.compile(r"^(?P<name>.+)-s(?P<seed>\d+)-[0-9a-f]{12}$")


def records(folder: str) -> list[tuple[Path, int, dict]]:
    """(file, seed, record) of the graph-reading runs recorded in ``bench/runs/<folder>``."""
    out = []
    for f in sorted((RUNS / folder).glob("*.json")):
        m = RECORD.match(f.stem)
        if m and m["name"].split("@")[0] in GRAPH_SCHEDULERS:
            out.append((f, int(m["seed"]), json.loads(f.read_text())))
    return out


def name_kernel(f: Path, rec: dict, label: str) -> bool:
    """Write the kernels the audit found into a record that predates the field (True: written).
    Only a record that names its package versions, has no kernels of its own and matched exactly
    one kernel."""
    env = rec.get("environment")
    if label not in KERNELS or not env or "blas" in env:
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


def audit(dirs: list[str], write: bool = False) -> str:
    """Match every graph-reading record in ``dirs`` against the kept first batches; ``write``: name
    the kernels in the records (:func:`name_kernel`). Returns the RESULTS section. ValueError for a
    folder whose learner settings are not known."""
    unknown = [d for d in dirs if d not in DIR_CONFIGS]
    if unknown:
        raise ValueError(f"no learner settings known for {unknown} (kernel_audit.DIR_CONFIGS)")
    known = json.loads(FIRST_BATCHES.read_text())
    rows = [
        "| runs in | graph-reading records | " + " | ".join(KERNELS) + " | cannot tell (seeds) | neither | "
        "not audited |",
        "|" + "---|" * (len(KERNELS) + 5),
    ]
    for d in dirs:
        labels: dict[str, int] = {}
        blind: set[int] = set()
        written = 0
        recs = records(d)
        for f, seed, rec in recs:
            keys = {k: _key(seed, DIR_CONFIGS[d], k) for k in KERNELS}
            if not all(key in known for key in keys.values()):  # recorded after the audit
                labels["not audited"] = labels.get("not audited", 0) + 1
                continue
            label = classify(rec["mean_reward"][0], {k: known[key] for k, key in keys.items()})
            labels[label] = labels.get(label, 0) + 1
            if label == "cannot tell":
                blind.add(seed)
            if write:
                written += name_kernel(f, rec, label)
        if write:
            print(f"  {d}: named the kernels in {written} record(s)")
        tell = f"{labels.get('cannot tell', 0)} ({', '.join(map(str, sorted(blind))) or '—'})"
        cells = [str(labels.get(k, 0)) for k in KERNELS]
        rows.append(
            f"| `{d}/` | {len(recs)} | " + " | ".join(cells) + f" | {tell} | {labels.get('neither', 0)} | "
            f"{labels.get('not audited', 0)} |"
        )
    return "\n".join(
        [
            "## Which graph the graph-reading records were made with",
            "",
            "Every schedule that reads the task graph (every envsched form, exploit-only, coverage-only) "
            "starts from one cold-start batch picked by the graph's similarities. Until commit 24ddfc9 "
            "the graph depended on the OpenBLAS kernels (identical topology vectors split into two groups "
            'under the AVX-512 ones; docs/experiments.md, "BLAS kernels"), so each record\'s first step, '
            "matched against that batch rolled out under each kernel before the fix (kept in "
            "`bench/runs/kernels.json`; `python bench/kernel_audit.py`), says which graph made it. "
            "Today's graph is the Haswell column's on any CPU: those records' picks rest on the graph "
            "today's code builds (they repeat whole where nothing else in the arithmetic differs: the "
            "default learner's `+lr` form at seeds 0, 3 and 7 does under the AVX-512 kernels, the overrun "
            "learner's records from before runs kept their CPU depart at steps 9-14 even under Haswell); "
            "the SkylakeX column's were made with a graph it no longer builds (a second draw of the "
            "schedule's tie-breaks). *cannot tell*: seeds whose cold starts agreed under both; *not "
            "audited*: recorded after the audit.",
            "",
            *rows,
        ]
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dirs", default=",".join(DIR_CONFIGS), help="folders under bench/runs")
    ap.add_argument(
        "--write",
        action="store_true",
        help="name the kernels found in each record that predates the field (environment.blas, "
        "with blas_from naming this audit), so its tables and a resumed run say which kernels made it",
    )
    args = ap.parse_args()
    try:
        body = audit(args.dirs.split(","), args.write)
    except ValueError as e:
        print(f"kernel_audit: {e}", file=sys.stderr)
        return 2
    if sorted(args.dirs.split(",")) != sorted(DIR_CONFIGS):
        print(body)  # a partial audit: RESULTS keeps the whole table
        return 0
    from run_all import write_section  # here: run_all loads every bench section's imports (plots too)

    write_section("kernels", body, after="neural_unseen_split")
    print(f"wrote {HERE / 'RESULTS.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
