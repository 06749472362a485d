"""The language-model GRPO update's time, this tree against an earlier commit, side by side on one
machine.

One update of the tiny Qwen3 (the CPU policy, a wider hidden size so the layers weigh beside the
vocabulary projection) on a fixed batch shaped like agent episodes (prompt of 150 tokens, replies
of 50 to 1000, log-uniform, half of each group rewarded), under a few settings of the update: one epoch, one
epoch with activation checkpointing, two epochs. Each tree runs in its own Python process (the
earlier commit from a git worktree), one after the other, with the same interpreter and packages;
each time is the median of the repeats, and the weights each tree's update leaves are compared by
digest (the same update, or not).

    python bench/update_costs.py --base 85a7443 [--hidden 256] [--repeats 3] [--write]

``--write`` puts the table in the ``update_costs`` section of ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from sections.common import earlier_tree, machine, short_rev, write_section  # noqa: E402

SETTINGS = {  # label -> GRPOConfig settings (only settings both trees have)
    "one epoch": {},
    "one epoch, activation checkpointing": {"activation_checkpointing": True},
    "two epochs": {"epochs": 2},
}

# run inside each tree's own process: only APIs both trees have
MEASURE = r"""
import hashlib, json, statistics, sys, time
import numpy as np
import torch
from trainer.model import qwen3_tokenizer, tiny_qwen3
from trainer.update import GRPOConfig, GRPOTrainer

hidden, repeats, settings, into = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
tok = qwen3_tokenizer()
rng = np.random.default_rng(0)
seqs, masks = [], []
for _ in range(16):  # agent episodes: replies of 50 to 1000 tokens, log-uniform
    reply = int(np.exp(rng.uniform(np.log(50), np.log(1000))))
    seqs.append(rng.integers(10, 150000, 150 + reply).tolist())
    masks.append([0] * 150 + [1] * reply)
rewards = np.tile([1.0, 0.0], 8)
out = {}
for label, given in settings.items():
    seconds, digests = [], set()
    for _ in range(repeats):
        model = tiny_qwen3(seed=0, hidden=hidden, heads=4, kv_heads=2)
        trainer = GRPOTrainer(model, tok, GRPOConfig(lr=1e-5, micro_batch=4, **given))
        t0 = time.perf_counter()
        trainer.update(seqs, masks, rewards, 2)
        seconds.append(time.perf_counter() - t0)
        h = hashlib.sha256()
        for name, p in sorted(model.state_dict().items()):
            h.update(name.encode() + p.detach().cpu().numpy().tobytes())
        digests.add(h.hexdigest()[:12])
    torch.save(model.state_dict(), f"{into}/{len(out)}.pt")  # the weights, for the other tree's
    out[label] = {"seconds": seconds, "median": statistics.median(seconds), "digest": sorted(digests)}
    print(f"  {label}: {[round(s, 2) for s in seconds]} s", file=sys.stderr, flush=True)
print("RESULT " + json.dumps(out))
"""


def measure(tree: Path, hidden: int, repeats: int, into: Path) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE", "Haswell"),
    }
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(hidden), str(repeats), json.dumps(SETTINGS), str(into)],
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        timeout=3600,
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"{tree}: rc {out.returncode}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def weight_gap(a: Path, b: Path) -> float:
    """The largest |difference| of one weight between two saved state dicts (0: bit for bit)."""
    import torch  # the two trees' weights, read only here

    x, y = torch.load(a), torch.load(b)
    return max(float((x[k].double() - y[k].double()).abs().max()) for k in x)


def table(base: str, results: dict[str, dict], gaps: dict[str, float]) -> list[str]:
    b, h = results["base"], results["head"]
    rows = [
        f"| update of 16 episodes (median seconds) | commit {base} | this tree | this tree / {base} "
        "| the same weights | largest weight difference |",
        "|---|---|---|---|---|---|",
    ]
    for label in SETTINGS:
        same = "yes" if b[label]["digest"] == h[label]["digest"] else "no"
        rows.append(
            f"| {label} | {b[label]['median']:.2f} | {h[label]['median']:.2f} | "
            f"{h[label]['median'] / b[label]['median']:.2f}x | {same} | {gaps[label]:.1e} |"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the earlier commit to compare with")
    ap.add_argument("--hidden", type=int, default=256, help="the tiny Qwen3's hidden size")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--write", action="store_true", help="write the section of bench/RESULTS.md")
    args = ap.parse_args(argv)
    base, head = short_rev(args.base), short_rev("HEAD")
    results = {}
    with tempfile.TemporaryDirectory() as d, earlier_tree(base, Path(d)) as tree:
        for name, where in (("base", tree), ("head", ROOT)):
            print(f"measuring {name} ({where})", flush=True)
            (Path(d) / name).mkdir()
            results[name] = measure(where, args.hidden, args.repeats, Path(d) / name)
        gaps = {
            label: weight_gap(Path(d) / "base" / f"{k}.pt", Path(d) / "head" / f"{k}.pt")
            for k, label in enumerate(SETTINGS)
        }
    rows = table(base, results, gaps)
    print("\n".join(rows))
    if args.write:
        write_section(
            "update_costs",
            "\n".join(
                [
                    "## The language-model update's time, against an earlier commit (`bench/update_costs.py`)",
                    "",
                    f"This tree (HEAD {head} and its changes) against commit {base}, each in its own process on "
                    f"one machine, one after the other: one GRPO update of the tiny Qwen3 (hidden size "
                    f"{args.hidden}, 2 layers, the Qwen vocabulary) on 16 sequences shaped like agent episodes "
                    "(a 150-token prompt, replies of 50 to 1000 tokens drawn log-uniform, half of each group of 2 "
                    "rewarded), "
                    f"micro-batches of 4, the median of {args.repeats} updates; the same weights = the two "
                    "trees' updates leave bit-identical weights, else the largest difference of one "
                    "weight between them (Adam's step moves a weight by about lr = 1e-5, and one whose "
                    "gradient is next to nothing can move otherwise on float rounding alone). On the CPU; a GPU's proportions differ "
                    f"(the vocabulary projection weighs less there). Machine: {machine()}.",
                    "",
                    *rows,
                ]
            ),
            after="gpu_path_on_cpu",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
