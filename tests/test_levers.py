"""What in a schedule goes with its held-out gain (envsched_pipeline/analysis/levers.py): pairing
runs with the baseline's, within-cell correlations, the zero-variance line and what it needs."""

import numpy as np
import pytest

from envsched_pipeline.analysis.levers import (
    FEATURES,
    needed_change,
    paired_runs,
    within_correlations,
    zero_variance_fit,
)


def summary(zv: float, seen: float, unseen: float, **extra) -> dict:
    out = {f: 0.0 for f in FEATURES}
    out.update(zero_variance_fraction=zv, heldout_seen_final=seen, heldout_unseen_final=unseen, **extra)
    return out


def synthetic(
    cells: int = 40, intercept: float = -0.01, slope: float = -0.1, noise: float = 0.002, seed: int = 0
):
    """Two groups x cells/2 seeds; per cell random plus three schedulers whose held-out follows the
    line in their zero-variance difference, on top of a large per-cell shift (the cell's pool and
    random run) that within-cell statistics must ignore."""
    rng = np.random.default_rng(seed)
    groups: dict = {"a": {}, "b": {}}
    for c in range(cells):
        g, s = ("a", "b")[c % 2], c // 2
        shift = rng.normal(0, 0.05)
        base_zv = 0.7 + rng.normal(0, 0.03)
        groups[g].setdefault("random", {})[s] = summary(
            base_zv, 0.9 + shift, 0.85 + shift, distinct_tasks=2500.0
        )
        for name, dzv in (("x", -0.3), ("y", -0.15), ("z", -0.05)):
            d = dzv + rng.normal(0, 0.02)
            gain = intercept + slope * d
            groups[g].setdefault(name, {})[s] = summary(
                base_zv + d,
                0.9 + shift + gain + rng.normal(0, noise),
                0.85 + shift + gain + rng.normal(0, noise),
                distinct_tasks=2500.0 + rng.normal(0, 50),  # unrelated to the gain
            )
    return groups


def test_paired_runs_pair_each_run_with_the_baseline_of_its_group_and_seed():
    groups = {
        "g1": {
            "random": {0: summary(0.7, 0.90, 0.80), 1: summary(0.6, 0.91, 0.82)},
            "x": {0: summary(0.4, 0.93, 0.84)},
        },
        # seed 5 has no random run in g2, and g1's random run is not its baseline
        "g2": {
            "random": {0: summary(0.8, 0.88, 0.79)},
            "x": {0: summary(0.5, 0.90, 0.80), 5: summary(0.1, 1.0, 1.0)},
        },
    }
    rows = paired_runs(groups)
    assert [(r["group"], r["seed"], r["scheduler"]) for r in rows] == [("g1", 0, "x"), ("g2", 0, "x")]
    assert rows[0]["delta"]["zero_variance_fraction"] == pytest.approx(-0.3)
    assert rows[0]["delta"]["heldout_unseen_final"] == pytest.approx(0.04)
    assert rows[1]["delta"]["zero_variance_fraction"] == pytest.approx(-0.3)
    assert rows[1]["delta"]["heldout_seen_final"] == pytest.approx(0.02)
    assert rows[1]["value"]["heldout_unseen_final"] == pytest.approx(0.80)


def test_a_summary_without_a_field_is_named():
    broken = summary(0.4, 0.9, 0.8)
    del broken["max_task_picks"]
    groups = {"g": {"random": {0: summary(0.7, 0.9, 0.8)}, "x": {0: broken}}}
    with pytest.raises(ValueError, match=r"g/x seed 0: no max_task_picks"):
        paired_runs(groups)
    # an older record without a field pairs on the features it has
    (row,) = paired_runs(groups, features=("zero_variance_fraction",))
    assert set(row["delta"]) == {"heldout_seen_final", "heldout_unseen_final", "zero_variance_fraction"}


def test_the_fit_recovers_the_line_and_the_correlations_ignore_each_cells_shift():
    rows = paired_runs(synthetic())
    fit = zero_variance_fit(rows, "unseen", boot=300)
    assert fit["intercept"] == pytest.approx(-0.01, abs=0.002)
    assert fit["slope"] == pytest.approx(-0.1, abs=0.01)
    assert 0 < fit["slope_se"] < 0.01 and 0 < fit["intercept_se"] < 0.003
    assert fit["runs"] == 120 and fit["cells"] == 40 and fit["r2"] > 0.9
    assert np.mean(fit["residual"]) == pytest.approx(0.0, abs=1e-9)
    corr = within_correlations(rows)
    assert corr["zero_variance_fraction"]["unseen"] < -0.9
    assert abs(corr["distinct_tasks"]["unseen"]) < 0.3
    assert np.isnan(corr["effective_envs"]["seen"])  # never varies
    # where the line reaches a target: its own extrapolation
    assert needed_change(fit, 0.05) == pytest.approx((0.05 - fit["intercept"]) / fit["slope"])
    assert needed_change(fit, 0.05) < -0.5


def test_noise_widens_the_bootstrap_and_too_few_cells_are_refused():
    quiet = zero_variance_fit(paired_runs(synthetic(noise=0.001)), "seen", boot=300)
    loud = zero_variance_fit(paired_runs(synthetic(noise=0.02)), "seen", boot=300)
    assert loud["slope_se"] > 3 * quiet["slope_se"]
    few = paired_runs(synthetic(cells=2))
    with pytest.raises(ValueError, match="too few to fit"):
        zero_variance_fit(few, "seen")
    with pytest.raises(ValueError, match="kind: 'both'"):
        zero_variance_fit(paired_runs(synthetic()), "both")


def test_the_plot_is_written(tmp_path):
    from envsched_pipeline.analysis.plots import levers_plot  # matplotlib: only the plot test needs it

    rows = paired_runs(synthetic(cells=6))
    fits = {k: zero_variance_fit(rows, k, boot=50) for k in ("seen", "unseen")}
    out = levers_plot(rows, fits, {"unseen": 0.05}, tmp_path / "levers.png")
    assert out == str(tmp_path / "levers.png")
    assert (tmp_path / "levers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
