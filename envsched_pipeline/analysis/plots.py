"""PNG plots for asset metadata and reports (matplotlib, Agg backend, written into the lake).

Step plots are written once per step and kind (``plots/step=t/<kind>.png``), never overwritten by a
later step, so every partition in the UI shows its own plots; :func:`embed` turns one into markdown
with the image inline (what the Dagster UI renders). Every figure is written as a palette PNG
(:func:`write_png`): a step's four plots sit inline in the Dagster event log, which keeps every
step's for the whole run.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np


def _plt():
    import matplotlib  # the backend must be chosen before pyplot loads

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after matplotlib.use: headless rendering

    return plt


def graph_report(lake, pool: str, graph) -> dict:
    """Degree histogram + similarity distributions, and cross-environment neighbour examples."""
    plt = _plt()
    out_dir = lake.local / "plots" / f"pool={pool}"
    out_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.6))
    ws = graph.within_sim[graph.within_idx >= 0]
    xs = graph.cross_sim[graph.cross_idx >= 0]
    ax[0].hist(ws, bins=40, color="#4878d0")
    ax[0].set_title("within-env similarity (candidates)")
    ax[1].hist(xs, bins=40, color="#ee854a")
    ax[1].set_title("cross-env similarity (candidates)")
    indeg = np.bincount(graph.cross_idx[graph.cross_idx >= 0], minlength=len(graph.task_ids))
    ax[2].hist(indeg, bins=40, color="#6acc64")
    ax[2].set_title("cross-env in-degree")
    path = write_png(fig, out_dir / "graph.png")
    tasks = {
        r["task_id"]: r
        for r in lake.read("tasks", pool=pool, columns=["task_id", "env_id", "instruction"]).to_pylist()
    }
    rows = ["| task | env | nearest cross-env task | env | sim |", "|---|---|---|---|---|"]
    rng = np.random.default_rng(0)
    for i in rng.choice(len(graph.task_ids), size=min(5, len(graph.task_ids)), replace=False):
        j = graph.cross_idx[i, 0]
        if j < 0:
            continue
        a, b = tasks[graph.task_ids[i]], tasks[graph.task_ids[j]]
        clip = lambda s: (s[:90] + "...") if len(s) > 90 else s  # noqa: E731
        rows.append(
            f"| {clip(a['instruction'])} | {a['env_id']} | {clip(b['instruction'])} | {b['env_id']} "
            f"| {graph.cross_sim[i, 0]:.2f} |"
        )
    return {"plot": str(path), "examples_md": "\n".join(rows)}


def embed(path: str, alt: str = "plot") -> str:
    """Markdown with the PNG inline (a data URI), for ``MetadataValue.md``."""
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f"![{alt}](data:image/png;base64,{data})"


def manifest_plot(lake, step: int, rows: list[dict]) -> str:
    plt = _plt()
    fig, ax = plt.subplots(1, 2, figsize=(11, 3.4))
    scores = [r["score"] for r in rows]
    halves = sorted({r["half"] for r in rows})
    finite = [s for s in scores if s == s]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    edges = np.linspace(lo, hi if hi > lo else lo + 1e-6, min(20, max(2, len(finite))) + 1)
    for h in halves:
        vals = [r["score"] for r in rows if r["half"] == h and r["score"] == r["score"]]
        if vals:
            ax[0].hist(vals, bins=edges, alpha=0.6, label=h)
    ax[0].set_title(f"step {step}: pick scores by half")
    if halves:
        ax[0].legend()
    envs: dict[str, int] = {}
    for r in rows:
        envs[r["env_id"]] = envs.get(r["env_id"], 0) + 1
    names = sorted(envs, key=lambda e: -envs[e])
    ax[1].bar(range(len(names)), [envs[n] for n in names], color="#4878d0")
    ax[1].set_title(f"{len(names)} environments, {len(scores)} tasks")
    ax[1].set_xticks([])
    return _save(fig, lake, "manifest", step)


def bench_plots(result: dict, out_dir: Path, prefix: str = "scheduler") -> list[str]:
    """Per-step curves of every scheduler in a benchmark result (simulated learner)."""
    plt = _plt()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    series = result["series"]
    panels = [
        ("batch_variance", "batch within-task reward variance"),
        ("zero_variance_fraction", "zero-variance group fraction"),
        ("envs_touched", "environments touched"),
        ("heldout", "held-out expected reward"),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5))
    for ax, (key, title) in zip(axes.flat, panels, strict=True):
        for name, s in series.items():
            y = np.asarray(s[key], dtype=float)
            if key != "heldout" and len(y) > 10:
                y = np.convolve(y, np.ones(10) / 10, mode="valid")
            ax.plot(y, label=name, lw=2.2 if name == "envsched" else 1.2)
        ax.set_title(title + (" (10-step mean)" if key != "heldout" else ""))
        ax.set_xlabel("step")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(
        "Simulated learner (docs/algorithm.md §8): "
        + json.dumps({k: result["setup"][k] for k in ("envs", "tasks_per_env", "steps", "seeds")})
    )
    paths.append(write_png(fig, out_dir / f"{prefix}_curves.png"))
    return paths


SCHEDULER_COLORS = {
    "random": "#7f7f7f",
    "envsched": "#d62728",
    "exploit-only": "#ff7f0e",
    "coverage-only": "#2ca02c",
    "variance-greedy": "#9467bd",
    "greso": "#8c564b",
    "mopps": "#e377c2",
    "dps": "#17becf",
    "oracle": "#000000",
}


def scheduler_color(name: str) -> str:
    """One colour per scheduler, the same in every plot and report (variants share their base's hue)."""
    base = name.split("@")[0]
    return SCHEDULER_COLORS.get(base if "@" not in name else name, SCHEDULER_COLORS.get(base, "#bcbd22"))


def heldout_plots(result: dict, out_path: Path) -> str:
    """Held-out curves per scheduler (seen and unseen environments, mean over seeds, with the
    standard error band of the evaluation), per-step batch variance, and every seed's final held-out
    difference against random (neural learner)."""
    plt = _plt()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 4, figsize=(21, 4.8))
    seeds = {n: m.get("seeds", result["setup"]["seeds"]) for n, m in result["schedulers"].items()}
    mixed = len(set(seeds.values())) > 1  # rows averaged over different numbers of seeds are marked
    for name, s in result["series"].items():
        ev = s["evals"]
        x = [e["step"] for e in ev]
        style = {
            "color": scheduler_color(name),
            "lw": 2.4 if name.startswith("envsched") else 1.3,
            "ls": "--" if "@" in name else "-",
        }
        label = f"{name} ({seeds.get(name)} seeds)" if mixed else name
        for ax, split in zip(axes[:2], ("seen", "unseen"), strict=True):
            y = np.array([e[f"{split}_mean"] for e in ev])
            se = np.array([e[f"{split}_se"] for e in ev])
            ax.plot(x, y, marker="o", ms=3, label=label, **style)
            ax.fill_between(x, y - 2 * se, y + 2 * se, color=style["color"], alpha=0.08)
        v = np.asarray(s["batch_variance"], dtype=float)
        if len(v) > 10:
            v = np.convolve(v, np.ones(10) / 10, mode="valid")
        axes[2].plot(v, label=label, **style)
    paired = result.get("paired_vs_random") or {}
    names = [n for n in result["series"] if n in paired]
    for j, name in enumerate(names):
        for k, (split, marker) in enumerate((("seen", "o"), ("unseen", "s"))):
            d = paired[name].get(f"heldout_{split}_final", {}).get("per_seed", [])
            xs = j + (k - 0.5) * 0.3 + np.linspace(-0.05, 0.05, len(d)) if d else []
            axes[3].scatter(
                xs,
                d,
                marker=marker,
                s=22,
                color=scheduler_color(name),
                facecolors=scheduler_color(name) if split == "seen" else "none",
                label=f"{split} environments" if j == 0 else None,
            )
    axes[3].axhline(0.0, color="0.4", lw=0.8)
    axes[3].set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
    axes[3].set_title("final held-out minus random's, per seed")
    if names:
        axes[3].legend(fontsize=8)
    axes[0].set_title("held-out reward: unseen tasks, training environments")
    axes[1].set_title("held-out reward: environments never trained on")
    axes[2].set_title("batch reward variance (10-step mean)")
    for ax in axes[:3]:
        ax.set_xlabel("step")
    axes[0].legend(fontsize=8)
    setup = result["setup"]
    fig.suptitle(
        f"{setup.get('learner', 'simulated')} learner: {setup['envs']} x {setup['tasks_per_env']} pool, "
        f"B={setup['batch_size']} G={setup['group_size']}, {setup['steps']} steps, "
        f"mean of {max(seeds.values(), default=setup['seeds'])} seeds"
        + (" (fewer where marked)" if mixed else "")
        + "".join(f", {k}={v}" for k, v in sorted((setup.get("learner_config") or {}).items()))
    )
    return write_png(fig, out_path)


PNG_COLORS = 128  # a palette this size keeps matplotlib's anti-aliased lines and fills smooth


# Margins of a step's plots, in inches (left, right, top, bottom, and the gap between two panels,
# which holds the right panel's tick labels and y label): room at 10 pt for tick labels of seven
# characters ("-0.0125"), a short y label, and a title above an axis's offset text ("1e-5").
STEP_MARGINS = {"left": 0.75, "right": 0.2, "top": 0.5, "bottom": 0.5, "gap": 1.0}


def fixed_layout(fig, left: float, right: float, top: float, bottom: float, gap: float) -> None:
    """Place a figure's row(s) of panels at fixed margins given in inches, where ``tight_layout``
    would measure every label first (a second render: the larger part of a small plot's cost)."""
    w, h = fig.get_size_inches()
    grid = fig.axes[0].get_subplotspec().get_gridspec()
    rows, cols = grid.get_geometry()
    panel_w = (w - left - right - gap * (cols - 1)) / cols
    panel_h = (h - top - bottom - gap * (rows - 1)) / rows
    fig.subplots_adjust(
        left=left / w,
        right=1 - right / w,
        top=1 - top / h,
        bottom=bottom / h,
        wspace=gap / panel_w,
        hspace=gap / panel_h,
    )


def write_png(fig, path: str | Path, dpi: int = 90, margins: dict | None = None) -> str:
    """Lay out, write and close a figure: rendered at ``dpi``, then reduced to a palette of
    PNG_COLORS colours (about a third of the bytes of matplotlib's own RGBA PNG, at no visible
    cost for line and bar charts); its path. Laid out by ``tight_layout``, or at ``margins``
    (:func:`fixed_layout`'s, in inches) when given: one render instead of two."""
    from PIL import Image  # matplotlib's own dependency; loads only with a plot

    path = Path(path)
    fig.set_dpi(dpi)
    if margins is None:
        fig.tight_layout()
    else:
        fixed_layout(fig, **margins)
    fig.canvas.draw()
    pixels = np.asarray(fig.canvas.buffer_rgba())
    _plt().close(fig)
    image = Image.fromarray(pixels[..., :3]).quantize(colors=PNG_COLORS, method=Image.Quantize.FASTOCTREE)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format="PNG")
    return str(path)


def _kind_panels(n: int):
    """A figure with one panel per held-out kind, side by side: (figure, the panels)."""
    fig, axes = _plt().subplots(1, n, figsize=(5 * n, 3.8), squeeze=False)
    return fig, list(axes[0])


def _difference_axis(ax, kind: str, xlabel: str, what: str) -> None:
    """Label a panel of paired differences against random on one held-out kind (zero marked)."""
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"held-out {kind}: scheduler - random")
    ax.set_title(f"{kind}: paired difference {what}")
    ax.legend(fontsize=8)


def _save(fig, lake, kind: str, step: int | None = None) -> str:
    """Write a figure to ``plots/step=<t>/<kind>.png`` (or ``plots/<kind>.png``) and close it."""
    path = Path(lake.local) / "plots" / (f"step={int(step)}" if step is not None else "") / f"{kind}.png"
    return write_png(fig, path, dpi=80, margins=STEP_MARGINS)


def _series(lake, query: str) -> dict[str, list]:
    return _series_each(lake, query)[0]


def _series_each(lake, *queries: str) -> list[dict[str, list]]:
    """Each query's columns as lists, all read on one connection (the lake's views built once)."""
    return [{c: t.column(c).to_pylist() for c in t.column_names} for t in lake.sql_each(list(queries))]


def training_curves(lake, step: int | None = None) -> str:
    """Loss, reward mean/median and zero-variance fraction over all steps so far."""
    plt = _plt()
    s, held = _series_each(
        lake,
        "select * from train_metrics order by step",
        "select * from evals where benchmark like 'heldout_%' order by benchmark, step",
    )
    for col in ("loss", "reward_mean", "reward_median", "zero_variance_fraction", "batch_variance"):
        s.setdefault(col, [None] * len(s["step"]))  # external trainers report fewer columns
    s = {k: [np.nan if v is None else v for v in vals] for k, vals in s.items()}
    fig, ax = plt.subplots(1, 4 if held.get("step") else 3, figsize=(17 if held.get("step") else 13, 3.4))
    ax[0].set_title("GRPO loss")
    if all(v != v for v in s["loss"]):  # the simulated learner, or a trainer that reports none
        ax[0].text(
            0.5,
            0.5,
            "no loss reported\n(the simulated learner has none)",
            ha="center",
            va="center",
            transform=ax[0].transAxes,
            color="grey",
        )
        ax[0].set_yticks([])
        if s["step"]:
            ax[0].set_xlim(min(s["step"]), max(max(s["step"]), min(s["step"]) + 1))
    else:
        ax[0].plot(s["step"], s["loss"], marker=".")
    ax[1].plot(s["step"], s["reward_mean"], label="mean")
    ax[1].plot(s["step"], s["reward_median"], label="median of groups")
    ax[1].legend()
    ax[1].set_title("reward")
    ax[2].plot(s["step"], s["zero_variance_fraction"], color="#d65f5f", label="zero-variance groups")
    ax[2].plot(s["step"], s["batch_variance"], color="#4878d0", label="batch variance")
    ax[2].legend()
    ax[2].set_title("signal")
    if held.get("step"):
        _heldout_panel(ax[3], held)
    for a in ax:
        a.set_xlabel("step")
    return _save(fig, lake, "training_curves", step)


def _heldout_panel(ax, held: dict[str, list]) -> None:
    """Held-out reward per split over the steps that evaluated, with a band of two standard errors."""
    ses = held.get("se") or [None] * len(held["step"])  # evals written without an error have none
    for bench in sorted(set(held["benchmark"])):
        rows = [
            (st, sc, se)
            for st, b, sc, se in zip(held["step"], held["benchmark"], held["score"], ses, strict=True)
            if b == bench
        ]
        x = np.array([r[0] for r in rows])
        y = np.array([np.nan if r[1] is None else r[1] for r in rows], dtype=float)
        se = np.array([0.0 if r[2] is None else r[2] for r in rows], dtype=float)
        split, _, note = bench.removeprefix("heldout_").partition(" ")  # e.g. "seen (simulated)"
        label = f"{split} environments {note}".strip()
        line = ax.plot(x, y, marker="o", ms=3, label=label)[0]
        ax.fill_between(x, y - 2 * se, y + 2 * se, color=line.get_color(), alpha=0.15)
    ax.legend()
    ax.set_title("held-out reward (± 2 s.e.)")


def statistics_trends(lake, pool: str, step: int | None = None) -> str:
    """Batch variance, environments touched and pool coverage over steps."""
    plt = _plt()
    s, seen = _series_each(
        lake,
        "select step, batch_variance, envs_touched from step_summary order by step",
        "select step, count(*) over (order by step rows unbounded preceding) as c from "
        "(select min(step) as step, task_id from rollouts group by task_id) order by step",
    )
    n = lake.read("tasks", pool=pool, columns=["task_id"]).num_rows or 1
    cover: dict[int, int] = {}
    for st_, c in zip(seen["step"], seen["c"], strict=True):
        cover[st_] = c
    running, ys = 0, []
    for st_ in s["step"]:
        running = cover.get(st_, running)
        ys.append(running / n)
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.4))
    ax[0].plot(s["step"], s["batch_variance"], marker=".")
    ax[0].set_title("batch within-task reward variance")
    ax[1].plot(s["step"], s["envs_touched"], marker=".", color="#6acc64")
    ax[1].set_title("environments touched")
    ax[2].plot(s["step"], ys, marker=".", color="#956cb4")
    ax[2].set_ylim(0, 1.05)
    ax[2].set_title("fraction of pool seen")
    for a in ax:
        a.set_xlabel("step")
    return _save(fig, lake, "statistics_trends", step)


def yield_calibration_plot(lake, step: int | None = None) -> str:
    """Predicted vs realized share of informative groups per step."""
    plt = _plt()
    s = _series(lake, "select step, predicted_yield, realized_yield from yields order by step")
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.4))
    ax[0].plot(s["step"], s["predicted_yield"], label="predicted", marker=".")
    ax[0].plot(s["step"], s["realized_yield"], label="realized", marker=".")
    ax[0].set_ylim(0, 1.05)
    ax[0].set_title("informative-group yield per step")
    ax[0].legend()
    ax[1].scatter(s["predicted_yield"], s["realized_yield"], s=12)
    ax[1].plot([0, 1], [0, 1], color="grey", lw=1)
    ax[1].set_xlabel("predicted")
    ax[1].set_ylabel("realized")
    ax[1].set_title("calibration")
    return _save(fig, lake, "yield_calibration", step)


def headroom_plot(probes: dict[str, list[dict]], out_path: Path) -> str:
    """Per scheduler, the share of groups with spread at each pool probe (``bench scheduler
    --probe-every``): in its batch (solid), in an oracle's batch of the same size (dashed) and in the
    pool, i.e. a uniform pick (dotted)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 4.2))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, (name, rows) in enumerate(probes.items()):
        c = colours[k % len(colours)]
        steps = [r["step"] for r in rows]
        ax.plot(steps, [r["batch_spread"] for r in rows], "-o", color=c, label=f"{name}: batch")
        ax.plot(steps, [r["oracle_spread"] for r in rows], "--", color=c, label=f"{name}: oracle")
        ax.plot(steps, [r["pool_spread"] for r in rows], ":", color=c, label=f"{name}: pool")
    ax.set_xlabel("step")
    ax.set_ylabel("share of groups with reward spread")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("Headroom: batch vs oracle vs pool (neural learner)")
    return write_png(fig, out_path)


def draws_plot(
    diffs: dict[str, dict[int, list[float]]], out_path: Path, labels: tuple[str, ...] | None = None
) -> str:
    """Per held-out kind, each seed's paired difference against random in every draw of it (one
    marker per draw, a line between a seed's draws): how far a seed's verdict moves between runs
    of the same schedules. ``diffs[kind][seed]``: the differences, draw 0 first; ``labels``: one
    legend entry per draw (default "draw k")."""
    most = max((len(ds) for by_seed in diffs.values() for ds in by_seed.values()), default=0)
    if labels is not None and len(labels) < most:
        raise ValueError(f"draws_plot: {len(labels)} labels for seeds with {most} draws")
    fig, axes = _kind_panels(len(diffs))
    for ax, (kind, by_seed) in zip(axes, diffs.items(), strict=True):
        for s, ds in sorted(by_seed.items()):
            ax.plot([s] * len(ds), ds, "-", color="0.6", lw=1)
            for k, d in enumerate(ds):
                ax.plot(
                    s,
                    d,
                    "os^D"[k % 4],
                    color=f"C{k}",
                    ms=6,
                    label=(labels[k] if labels else f"draw {k}") if s == min(by_seed) else None,
                )
        ax.set_xticks(sorted(by_seed))
        _difference_axis(ax, kind, "seed", "per seed and draw")
    return write_png(fig, out_path)


def within_run_plot(series: dict[str, dict[int, tuple[list[int], list[float]]]], out_path: Path) -> str:
    """Per held-out kind, one line per seed: a scheduler's held-out minus random's at every
    evaluation of the run (``series[kind][seed] = (steps, differences)``): how a seed's verdict
    moves with the step it is read at."""
    fig, axes = _kind_panels(len(series))
    for ax, (kind, by_seed) in zip(axes, series.items(), strict=True):
        for i, (s, (steps, d)) in enumerate(sorted(by_seed.items())):
            ax.plot(steps, d, "-o", color=f"C{i}", ms=2.5, lw=1.2, label=f"seed {s}")
        _difference_axis(ax, kind, "step", "at every evaluation")
    return write_png(fig, out_path)


def breadth_window_plot(
    most_served: dict[str, list[float]], deltas: dict[str, dict[int, float]], out_path: Path
) -> str:
    """Left: per scheduler, the informative groups of the environment that held the most in each
    3-step window, by the window's last step (mean over seeds; ``most_served[name]``). Right: per
    seed, one variant's final held-out minus another's on each kind (``deltas[kind][seed]``)."""
    plt = _plt()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    for k, (name, ys) in enumerate(most_served.items()):
        left.plot(range(2, 2 + len(ys)), ys, "-", color=f"C{k}", lw=1.2, label=name)
    left.set_xlabel("step (end of the 3-step window)")
    left.set_ylabel("informative groups, most-served env")
    left.set_title("Where the signal went: the most-served environment")
    left.legend(fontsize=7)
    for k, (kind, by_seed) in enumerate(deltas.items()):
        seeds = sorted(by_seed)
        right.plot(seeds, [by_seed[s] for s in seeds], "o", color=f"C{k + 2}", ms=6, label=kind)
    right.axhline(0, color="k", lw=0.8)
    right.set_xlabel("seed")
    right.set_ylabel("final held-out: variant - form")
    right.set_title("Paired difference per seed")
    right.legend(fontsize=8)
    return write_png(fig, out_path)


def levers_plot(rows: list[dict], fits: dict[str, dict], targets: dict[str, float], out_path: Path) -> str:
    """Per held-out kind, every paired run's held-out difference against its difference in the
    zero-variance share (both against random at the same seed and draw), one marker per scheduler,
    the straight line of ``fits[kind]`` and the difference every seed would need (``targets``)."""
    fig, axes = _plt().subplots(1, len(fits), figsize=(5 * len(fits) + 3.2, 4.2), squeeze=False)
    axes = list(axes[0])
    names = sorted({r["scheduler"] for r in rows})
    xs = np.array([r["delta"]["zero_variance_fraction"] for r in rows])
    line = np.linspace(min(xs.min(), 0.0), max(xs.max(), 0.0), 50)
    for ax, (kind, fit) in zip(axes, fits.items(), strict=True):
        for i, name in enumerate(names):  # variants share a base hue elsewhere: one marker each here
            mine = [r for r in rows if r["scheduler"] == name]
            ax.plot(
                [r["delta"]["zero_variance_fraction"] for r in mine],
                [r["delta"][f"heldout_{kind}_final"] for r in mine],
                "os^Dv<>ph*"[i % 10],
                color=f"C{i % 10}",
                ms=3.5,
                alpha=0.75,
                label=name.replace("envsched@success+adaptive+covsampled", "envsched@…covsampled"),
            )
        ax.plot(line, fit["intercept"] + fit["slope"] * line, "k--", lw=1, label="fitted line")
        if kind in targets:
            ax.axhline(targets[kind], color="C3", lw=1, ls=":", label="every seed needs")
        _difference_axis(ax, kind, "zero-variance share: scheduler - random", "against groups without spread")
        ax.get_legend().remove()
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return write_png(fig, out_path)


def seeds_plot(result: dict, out_path: Path) -> str:
    """One panel per verdict of ``envsched compare``: each seed's paired difference (the held-out
    ones with their 95% sampling interval), the mean over seeds with its t interval as a band, and
    zero marked."""
    verdicts = result["verdicts"]
    cols = min(4, len(verdicts))
    rows = -(-len(verdicts) // cols)
    fig, axes = _plt().subplots(rows, cols, figsize=(4.6 * cols, 3.9 * rows), squeeze=False)
    for ax in axes.flat[len(verdicts) :]:
        ax.set_visible(False)
    name, other = result["runs"]["name"], result["against"]["name"]
    for ax, v in zip(axes.flat, verdicts, strict=False):
        seeds, d = v["seeds"], v["per_seed"]
        se = v.get("pair_se") or []
        errs = [1.96 * x for x in se] if se and all(np.isfinite(x) for x in se) else None
        ax.errorbar(seeds, d, yerr=errs, fmt="o", color=scheduler_color(name), capsize=3, label="one seed")
        ax.axhline(v["mean"], color=scheduler_color(name), lw=1.4, label=f"mean over {v['n']} seeds")
        ax.axhspan(v["ci"][0], v["ci"][1], color=scheduler_color(name), alpha=0.12, label="95% t interval")
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xticks(seeds)
        ax.set_xlabel("seed")
        ax.set_ylabel("paired difference")
        ax.set_title(f"{v['key'].replace('_', ' ')} ({v['better_is']} is better)", fontsize=10)
        ax.legend(fontsize=7)
    fig.suptitle(f"{name} against {other}, paired by seed")
    return write_png(fig, out_path)


def rows_plot(result: dict, out_path: Path) -> str:
    """The ablation over seeds (``envsched compare`` with several ``--runs``): one panel per metric,
    each scheduler's mean paired difference against the baseline with its 95% t interval over
    seeds, zero marked (a forest plot)."""
    rows = result["rows"]
    keys = [
        v["key"] for v in rows[0]["verdicts"] if v["kind"] in ("per_step", "heldout")
    ]  # the per-step metrics and held-out at the last evaluation
    keys += sorted(
        {v["key"] for r in rows for v in r["verdicts"] if v["kind"] in ("per_step", "heldout")} - set(keys)
    )
    cols = min(2, len(keys))  # the schedulers' names label the first column only
    nrows = -(-len(keys) // cols)
    height = max(2.6, 0.55 * len(rows) + 1.6)
    fig, axes = _plt().subplots(
        nrows, cols, figsize=(5.2 * cols + 2.5, height * nrows), squeeze=False, sharey=True
    )
    for ax in axes.flat[len(keys) :]:
        ax.set_visible(False)
    names = [r["runs"]["name"] for r in rows]
    for ax, key in zip(axes.flat, keys, strict=False):
        better_is = None
        for y, r in enumerate(rows):
            v = next((v for v in r["verdicts"] if v["key"] == key), None)
            if v is None:
                continue
            better_is = v["better_is"]
            lo, hi = v["ci"]
            col = scheduler_color(r["runs"]["name"])
            ax.errorbar(
                [v["mean"]], [y], xerr=[[v["mean"] - lo], [hi - v["mean"]]], fmt="o", color=col, capsize=3
            )
        ax.axvline(0, color="k", lw=0.8)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(names, fontsize=8)
        ax.set_xlabel(f"minus {result['against']['name']} (mean over seeds, 95% t interval)", fontsize=8)
        ax.set_title(f"{key.replace('_', ' ')} ({better_is} is better)", fontsize=10)
    axes.flat[0].invert_yaxis()  # shared: the first row on top in every panel
    fig.suptitle(f"{len(rows)} schedulers against {result['against']['name']}, paired by seed")
    return write_png(fig, out_path)


def per_step_plot(panels: dict[str, dict[str, list[float]]], out_path: Path) -> str:
    """One panel per measure (``panels[ylabel][mode] = value at steps 0, 1, ...``), one line per
    mode: how a per-step cost moves as a run grows."""
    fig, axes = _kind_panels(len(panels))
    for ax, (ylabel, lines) in zip(axes, panels.items(), strict=True):
        for k, (mode, values) in enumerate(lines.items()):
            ax.plot(range(len(values)), values, "-o", ms=3, color=f"C{k}", label=mode)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    return write_png(fig, out_path)
