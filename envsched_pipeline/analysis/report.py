"""``envsched report --out DIR``: one HTML page with the plots a person wants after a run.

Batch variance per step against the baselines (re-run in the simulator on the same synthetic pool,
same B, G and steps — labelled simulated), environments touched, zero-variance fraction, held-out
curve, predicted vs realized variance, the most informative tasks, and an environment-by-step heatmap.
"""

from __future__ import annotations

import html
import json
import shutil
import time
from pathlib import Path

import numpy as np

from envsched_pipeline.analysis.bench import prepare_pool, run_one
from envsched_pipeline.analysis.plots import _plt, _series, yield_calibration_plot
from envsched_pipeline.lake import Lake
from envsched_pipeline.orchestration.metadata import md_table
from envsched_pipeline.run import require_run

BASELINES = ("random", "greso", "mopps", "dps")


def _md_to_html(md: str) -> str:
    lines = [ln for ln in md.splitlines() if ln.strip()]
    if len(lines) < 2 or not lines[0].startswith("|"):
        return f"<p>{html.escape(md)}</p>"
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    body = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:] if ln.startswith("|")]
    out = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"]
    out += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in body]
    return "\n".join(out) + "</table>"


def build_report(lake: Lake, out_dir: Path, baselines: bool = True, log=print) -> Path:
    plt = _plt()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = require_run(lake)
    s = _series(
        lake,
        "select step, batch_variance, zero_variance_fraction, envs_touched, mean_reward, median_reward "
        "from step_summary order by step",
    )
    if not s.get("step"):
        raise ValueError(f"no steps in {lake.root}: nothing to report")
    steps = s["step"]
    ev = _series(lake, "select step, avg(score) as score from evals group by step order by step")
    figs: list[tuple[str, str]] = []

    # 1. batch variance against baselines (simulated, same pool / B / G / steps)
    base_series = {}
    if baselines and spec.pool == "synthetic" and spec.policy == "simulated":
        log(f"re-running baselines {', '.join(BASELINES)} in the simulator for {len(steps)} steps ...")
        pool = prepare_pool(51, 50, 0)
        for name in BASELINES:
            base_series[name] = run_one(name, pool, len(steps), spec.seed, spec.batch_size, spec.group_size)
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot(steps, s["batch_variance"], lw=2.4, label=f"this run ({spec.scheduler})")
    for name, ser in base_series.items():
        ax.plot(
            range(len(ser["batch_variance"])),
            ser["batch_variance"],
            lw=1,
            alpha=0.8,
            label=f"{name} (simulated)",
        )
    ax.set_xlabel("step")
    ax.set_title("batch within-task reward variance")
    ax.legend(fontsize=8)
    figs.append(("variance.png", "Batch reward variance per step" + (" vs baselines" if base_series else "")))
    fig.tight_layout()
    fig.savefig(out_dir / figs[-1][0], dpi=90)
    plt.close(fig)

    # 2. envs touched + zero-variance fraction + held-out
    fig, ax = plt.subplots(1, 3, figsize=(14, 3.6))
    ax[0].plot(steps, s["envs_touched"], color="#6acc64")
    ax[0].set_title("environments touched")
    ax[1].plot(steps, s["zero_variance_fraction"], color="#d65f5f", label="this run")
    for name, ser in base_series.items():
        ax[1].plot(ser["zero_variance_fraction"], lw=1, alpha=0.7, label=name)
    ax[1].set_title("zero-variance group fraction")
    ax[1].legend(fontsize=7)
    if ev.get("step"):
        ax[2].plot(ev["step"], ev["score"], color="#956cb4", label="this run")
        for name, ser in base_series.items():
            ax[2].plot(ser["heldout"], lw=1, alpha=0.7, label=name)
        ax[2].legend(fontsize=7)
    ax[2].set_title("held-out score" + (" (simulated learner)" if spec.policy == "simulated" else ""))
    for a in ax:
        a.set_xlabel("step")
    fig.tight_layout()
    figs.append(("signal.png", "Coverage, wasted groups and held-out score"))
    fig.savefig(out_dir / figs[-1][0], dpi=90)
    plt.close(fig)

    # 3. predicted vs realized variance (calibration)
    cal = _series(
        lake,
        "select pred_var, realized_variance from pick_reasons "
        "where pred_var is not null and not isnan(pred_var) and realized_variance is not null",
    )
    if cal.get("pred_var"):
        fig, ax = plt.subplots(figsize=(5, 4))
        x, y = np.array(cal["pred_var"]), np.array(cal["realized_variance"])
        ax.scatter(x, y, s=5, alpha=0.3)
        bins = np.quantile(x, np.linspace(0, 1, 11))
        idx = np.clip(np.searchsorted(bins, x, side="right") - 1, 0, 9)
        mx = [x[idx == b].mean() for b in range(10) if (idx == b).any()]
        my = [y[idx == b].mean() for b in range(10) if (idx == b).any()]
        ax.plot(mx, my, color="black", marker="o", label="decile means")
        ax.set_xlabel("predicted (u)")
        ax.set_ylabel("realized group variance")
        ax.legend()
        fig.tight_layout()
        figs.append(("calibration.png", "Predicted vs realized variance"))
        fig.savefig(out_dir / figs[-1][0], dpi=90)
        plt.close(fig)

    # 3b. predicted vs realized yield (share of informative groups)

    if lake.steps("yields"):
        shutil.copy(yield_calibration_plot(lake), out_dir / "yield.png")
        figs.append(("yield.png", "Predicted vs realized yield of informative groups"))

    # 4. environment x step heatmap of picks
    picks = _series(lake, "select env_id, step, count(*) as n from manifests group by 1, 2")
    envs = sorted(set(picks["env_id"]))
    grid = np.zeros((len(envs), max(steps) + 1))
    for e, st, n in zip(picks["env_id"], picks["step"], picks["n"], strict=True):
        if st <= max(steps):
            grid[envs.index(e), st] = n
    fig, ax = plt.subplots(figsize=(12, max(3, 0.14 * len(envs))))
    im = ax.imshow(grid, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_yticks(range(len(envs)))
    ax.set_yticklabels(envs, fontsize=6)
    ax.set_xlabel("step")
    fig.colorbar(im, ax=ax, label="tasks picked")
    fig.tight_layout()
    figs.append(("heatmap.png", "Environment-by-step picks"))
    fig.savefig(out_dir / figs[-1][0], dpi=90)
    plt.close(fig)

    # 5. most informative tasks
    top = lake.sql(
        "select task_id, any_value(env_id) as env_id, count(*) as groups, avg(reward_variance) as mean_variance, "
        "avg(mean_reward) as mean_reward from task_history group by task_id "
        "order by mean_variance desc limit 15"
    ).to_pylist()
    summary = {
        "pool": spec.pool,
        "policy": spec.policy,
        "scheduler": spec.scheduler,
        "steps": len(steps),
        "batch_variance": float(np.mean(s["batch_variance"])),
        "zero_variance_fraction": float(np.mean(s["zero_variance_fraction"])),
        "envs_touched": float(np.mean(s["envs_touched"])),
        **{
            f"{n}_batch_variance (simulated)": float(np.mean(b["batch_variance"]))
            for n, b in base_series.items()
        },
    }
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>envsched report</title>",
        "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}img{max-width:100%}</style></head><body>",
        f"<h1>envsched run report</h1><p>lake <code>{html.escape(str(lake.root))}</code>, generated "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}</p>",
        "<p><b>The policy is the simulated learner</b> (docs/algorithm.md §8); baselines are re-run in the same "
        "simulator.</p>"
        if spec.policy == "simulated"
        else "",
        _md_to_html(md_table([{"metric": k, "value": v} for k, v in summary.items()], limit=50)),
    ]
    for fname, title in figs:
        parts.append(f"<h2>{html.escape(title)}</h2><img src='{fname}' alt='{html.escape(title)}'>")
    parts.append("<h2>Most informative tasks</h2>" + _md_to_html(md_table(top)))
    parts.append("</body></html>")
    index = out_dir / "index.html"
    index.write_text("\n".join(parts))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return index
