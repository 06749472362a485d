"""Watching a run: plots that never fail a step, the rollout viewer, readable picks, CLI manners."""

import json
import os
import subprocess
import sys

import pytest

from envsched_pipeline.analysis.plots import (
    PNG_COLORS,
    STEP_MARGINS,
    _plt,
    embed,
    fixed_layout,
    manifest_plot,
    write_png,
)
from envsched_pipeline.analysis.rollouts_view import render, samples
from envsched_pipeline.cli import main
from envsched_pipeline.core.gates import halt
from envsched_pipeline.core.loop import step_summary
from envsched_pipeline.core.select import select_manifest
from envsched_pipeline.lake import BEST_CHECKPOINT
from envsched_pipeline.lease import Lease
from envsched_pipeline.orchestration.metadata import picks_table, reason_in_words
from envsched_pipeline.run import load_run
from tests.conftest import run_steps
from trainer.step import run_step


@pytest.mark.parametrize(
    "rows",
    [
        [{"score": 0.5, "half": "exploit", "env_id": "a"}],
        [{"score": 0.2, "half": "coverage", "env_id": "a"}] * 8,
        [
            {"score": float("nan"), "half": "random", "env_id": "a"},
            {"score": float("nan"), "half": "random", "env_id": "b"},
        ],
        [{"score": 1e-9 * k, "half": "exploit", "env_id": str(k)} for k in range(3)],
        [],
    ],
)
def test_manifest_plots_survive_degenerate_batches(lake, rows):
    path = manifest_plot(lake, 7, rows)
    assert path.endswith("plots/step=7/manifest.png") and embed(path).startswith(
        "![plot](data:image/png;base64,"
    )


def test_plots_are_one_file_per_step_and_kind(lake):
    a = manifest_plot(lake, 0, [{"score": 0.1, "half": "cold", "env_id": "x"}])
    b = manifest_plot(lake, 1, [{"score": 0.9, "half": "exploit", "env_id": "y"}])
    assert a != b and open(a, "rb").read() != open(b, "rb").read()


def test_figures_are_palette_pngs_a_fraction_of_matplotlibs_size(tmp_path):
    from PIL import Image  # the PNG's own header says its mode and size

    def figure():
        fig, ax = _plt().subplots(1, 3, figsize=(13, 3.4))
        for k, a in enumerate(ax):
            a.plot(range(200), [((i * (k + 3)) % 17) / 17 for i in range(200)], marker=".", label="line")
            a.fill_between(range(200), 0, 0.3, alpha=0.15)
            a.legend()
            a.set_xlabel("step")
        return fig

    ours = write_png(figure(), tmp_path / "ours.png", dpi=80)
    reference = figure()
    reference.set_dpi(80)
    reference.tight_layout()
    reference.savefig(tmp_path / "theirs.png", dpi=80)
    with Image.open(ours) as im, Image.open(tmp_path / "theirs.png") as ref:
        assert im.mode == "P" and len(im.getpalette()) // 3 <= PNG_COLORS
        assert im.size == ref.size == (13 * 80, int(3.4 * 80))
        # the same picture: every pixel within a few levels of matplotlib's own on average
        diff = [
            abs(a - b) for a, b in zip(im.convert("RGB").tobytes(), ref.convert("RGB").tobytes(), strict=True)
        ]
        assert sum(diff) / len(diff) < 3
    assert os.path.getsize(ours) < 0.5 * os.path.getsize(tmp_path / "theirs.png")


def test_a_steps_plot_at_fixed_margins_keeps_every_label_inside_its_own_place():
    # the widest labels a step's plots meet: seven-character ticks beside a y label, and an offset
    # ("1e-5") under a long title
    fig, ax = _plt().subplots(1, 3, figsize=(13, 3.4))
    ax[0].plot([-0.0125, 0.0075])
    ax[1].plot([-0.0125, 0.0075])
    ax[1].set_ylabel("realized")
    ax[2].plot([0.0, 3e-5])
    ax[2].set_title("batch within-task reward variance")
    for a in ax:
        a.set_xlabel("step")
    fixed_layout(fig, **STEP_MARGINS)
    fig.set_dpi(80)
    renderer = fig.canvas.get_renderer()
    fig.canvas.draw()
    width, height = fig.bbox.width, fig.bbox.height
    for k, a in enumerate(ax):
        box = a.get_tightbbox(renderer)  # the panel with its ticks, labels, title and offset text
        assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= width and box.y1 <= height, (k, box)
        if k:  # clear of the panel on its left
            assert box.x0 > ax[k - 1].bbox.x1, (k, box.x0, ax[k - 1].bbox.x1)
    _plt().close(fig)


@pytest.mark.parametrize("loss", [None, 0.25])
def test_the_loss_panel_says_when_a_run_reports_no_loss(lake, monkeypatch, loss):
    import envsched_pipeline.analysis.plots as plots  # the figure is looked at before it is written

    for s in range(3):
        lake.write("train_metrics", [{"step": s, "seconds": 1.0, "loss": loss, "reward_mean": 0.5}], step=s)
    drawn = {}
    monkeypatch.setattr(plots, "write_png", lambda fig, path, **_: drawn.setdefault("fig", fig) and str(path))
    plots.training_curves(lake, 2)
    panel = drawn["fig"].axes[0]
    words = " ".join(t.get_text() for t in panel.texts)
    if loss is None:  # a note, no line, and the steps on the x axis (not matplotlib's default 0..1)
        assert "no loss reported" in words and not panel.lines and panel.get_xlim() == (0.0, 2.0)
    else:
        assert not words and list(panel.lines[0].get_ydata()) == [0.25] * 3


def test_picks_read_as_sentences(small_run):
    rows = select_manifest(small_run, 0)["rows"]
    table = picks_table(rows)
    assert "| why |" in table.splitlines()[0].replace("why", "why ").replace("  ", " ") or "why" in table
    assert "uniform draw from" in reason_in_words(rows[0])
    exploit = {
        "half": "exploit",
        "reason": json.dumps(
            {
                "half": "exploit",
                "own_var": 0.02,
                "prior_var": 0.05,
                "pred_var": 0.03,
                "n_within": 3,
                "n_cross": 5,
                "exposure_discount": 0.8,
                "similarity_penalty": 0.04,
            }
        ),
    }
    words = reason_in_words(exploit)
    assert (
        "predicted variance 0.030" in words
        and "exposure discount x0.80" in words
        and "3 within / 5 cross" in words
    )


def test_rollouts_show_prints_actions_outputs_and_checks(small_pool, capsys):
    from envsched_pipeline.run import RunSpec, start_run

    start_run(
        small_pool,
        RunSpec(
            pool="synthetic",
            scheduler="random",
            seed=1,
            batch_size=4,
            group_size=2,
            max_steps=1,
            policy_config={"mode": "real"},
        ),
    )
    select_manifest(small_pool, 0)
    run_step(small_pool, 0, log=lambda *_: None)
    capsys.readouterr()
    assert main(["--lake", str(small_pool.root), "rollouts", "show", "--step", "0", "--limit", "1"]) == 0
    out = capsys.readouterr().out
    assert (
        "instruction:" in out
        and "checks:" in out
        and ("actions (simulated):" in out or "no tool calls" in out)
    )
    rows = small_pool.read("rollouts", step=0).to_pylist()
    acted = next(r for r in rows if r["tool_calls"] > 0)
    capsys.readouterr()
    assert (
        main(
            [
                "--lake",
                str(small_pool.root),
                "rollouts",
                "show",
                "--step",
                "0",
                "--task",
                acted["task_id"],
                "--rollout",
                str(acted["rollout"]),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "actions (simulated):" in out and "->" in out
    show = ["--lake", str(small_pool.root), "rollouts", "show", "--step", "0", "--rollout", "9"]
    assert main(show) == 2 and "no rollout 9 at step 0 (rollouts 0..1)" in capsys.readouterr().err
    assert main([*show, "--task", acted["task_id"]]) == 2
    assert f"no rollout 9 of task {acted['task_id']!r} at step 0" in capsys.readouterr().err
    assert set(samples(rows)) >= {"best", "worst"}
    assert "[pass]" in render(rows[0]) or "[FAIL]" in render(rows[0])


@pytest.mark.parametrize(
    "args,match",
    [
        (["sql", "select 1"], "no lake at"),
        (["status"], "no lake at"),
        (["rollouts", "show", "--step", "0"], "no lake at"),
        (["bench", "scheduler", "--steps", "0"], "must be >= 1"),
        (["bench", "scheduler", "--schedulers", "nope", "--steps", "1"], "unknown scheduler"),
    ],
)
def test_cli_errors_are_one_line_exit_2_and_write_nothing(tmp_path, capsys, args, match):
    lake = tmp_path / "lake"
    code = main(["--lake", str(lake), *args])
    err = capsys.readouterr().err
    assert code == 2 and match in err and len(err.strip().splitlines()) == 1
    assert not lake.exists()


def test_json_output_is_valid_json(small_run, capsys):
    capsys.readouterr()
    assert (
        main(["--lake", str(small_run.root), "sql", "select 'nan'::double as x, 1 as y", "--format", "json"])
        == 0
    )
    assert json.loads(capsys.readouterr().out) == {"x": None, "y": 1}


def test_a_closed_pipe_ends_quietly(small_run):
    select_manifest(small_run, 0)
    proc = subprocess.run(
        f"{sys.executable} -m envsched_pipeline.cli --lake {small_run.root} sql "
        "'select * from range(200000)' | head -1",
        shell=True,
        capture_output=True,
        text=True,
    )
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


def test_env_run_verbose_prints_each_observation_and_names_unknown_tools(small_pool, tmp_path, capsys):
    task = small_pool.read("tasks", pool="synthetic").to_pylist()[0]
    actions = json.loads(task["gold"])[:1] + [{"name": "no_such_tool", "arguments": {}}]
    (tmp_path / "a.json").write_text(json.dumps(actions))
    capsys.readouterr()
    assert (
        main(
            [
                "--lake",
                str(small_pool.root),
                "env",
                "run",
                "--pool",
                "synthetic",
                "--task",
                task["task_id"],
                "--actions",
                str(tmp_path / "a.json"),
                "--verbose",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "unknown tool 'no_such_tool'" in out and out.count("->") == 2


def test_build_progress_is_a_bar_on_a_terminal_and_plain_lines_in_a_log():
    import io  # only this test needs these

    from envsched_pipeline.assets._common import progress_logger

    class Log:
        def __init__(self):
            self.lines = []

        def info(self, msg):
            self.lines.append(msg)

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stream in (io.StringIO(), Terminal()):
        ctx = type("Ctx", (), {"log": Log()})()
        cb = progress_logger(ctx, every=25, stream=stream)
        for done in range(0, 101, 5):
            cb("within", done, 100)
        # the run's log (the Dagster UI) gets a line every 25% either way
        assert ctx.log.lines == [f"within: {d}/100 ({d}%)" for d in (0, 25, 50, 75, 100)]
        text = stream.getvalue()
        if stream.isatty():  # a tqdm bar, redrawn in place and cleared when the stage ends
            assert "\r" in text and "within" in text and "within: 25/100 (25%)\n" not in text
        else:  # a file or CI log: the same lines as the run's log, no carriage returns
            assert "\r" not in text and text.splitlines() == ctx.log.lines


def test_a_failing_plot_is_a_note_but_a_ctrl_c_in_its_query_stops_the_step():
    """A plot that fails costs the plot, never the step; but DuckDB turns a Ctrl-C inside a plot's
    query into RuntimeError("Query interrupted"), which the step used to shrug off as a failed plot
    and finish (the driver then stopped after a step that had lost a plot): it stops the step now."""
    import dagster as dg  # the step context's logger

    from envsched_pipeline.assets._common import plot_md  # this test's subject

    context = dg.build_asset_context()

    def broken():
        raise ValueError("no rows")

    def interrupted():
        raise RuntimeError("Query interrupted")

    assert plot_md(context, "trends", broken) == {"trends_error": "ValueError: no rows"}
    with pytest.raises(KeyboardInterrupt):
        plot_md(context, "trends", interrupted)


def test_status_reads_as_sentences_and_a_table_with_json_for_scripts(small_run, capsys):
    lake = small_run
    run_steps(lake, 2)
    capsys.readouterr()
    assert main(["--lake", str(lake.root), "status", "--last", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"run {load_run(lake).run_id} in {lake.root}"
    assert "policy simulated, random, seed 1, B = 8, G = 4" in out[1]
    assert out[2].startswith(
        "  steps done: 2 of 3 (last selected 1, rollouts 1, statistics 1); next: select step 2"
    )
    last = step_summary(lake)[-1]
    assert out[-2].split()[:3] == ["step", "batch_var", "zero_var"] and out[-1].split()[:2] == [
        "1",
        f"{last['batch_variance']:.4f}",
    ]
    # what stops the run and who drives it, in words; the best held-out policy; the record as JSON
    best = lake.local / BEST_CHECKPOINT / "best.json"
    best.parent.mkdir(parents=True)
    best.write_text(json.dumps({"step": 1, "score": 0.812345}))
    halt(lake, 2, "manifest_is_valid", ["task t1 twice"])
    with Lease(lake, kind="envsched train"):
        assert main(["--lake", str(lake.root), "status"]) == 0
        text = capsys.readouterr().out
        assert "next: the run is halted at step 2: manifest_is_valid failed (task t1 twice)" in text
        assert f"  driver: envsched train (pid {os.getpid()} on " in text
        assert "  best held-out so far: step 1, score 0.8123 (the mean over the splits evaluated)" in text
        assert main(["--lake", str(lake.root), "status", "--json"]) == 0
        st = json.loads(capsys.readouterr().out)
    assert st["halted"]["problems"] == ["task t1 twice"] and st["driver"]["pid"] == os.getpid()
