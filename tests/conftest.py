import os
import warnings

import pytest

from envs.registry import load_synthetic
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.core.select import select_manifest
from envsched_pipeline.core.statistics import statistics_step
from envsched_pipeline.lake import SYNC_ENV, Lake
from envsched_pipeline.run import RunSpec, start_run
from trainer.step import run_step

warnings.filterwarnings("ignore", message=".*is currently in (preview|beta).*")

SMALL = dict(n_envs=6, tasks_per_env=10, heldout_per_env=2, seed=3)


def run_steps(lake: Lake, steps) -> Lake:
    """The step service's loop in this process, for each step of ``steps`` (a count or the steps):
    select, train, statistics, as the Dagster jobs run them."""
    for t in range(steps) if isinstance(steps, int) else steps:
        select_manifest(lake, t)
        run_step(lake, t, log=lambda *_: None)
        statistics_step(lake, t)
    return lake


@pytest.fixture
def lake(tmp_path, monkeypatch):
    root = tmp_path / "lake"
    monkeypatch.setenv("ENVSCHED_LAKE", str(root))
    return Lake(root)


@pytest.fixture
def small_pool(lake):
    import_pool(lake, load_synthetic("synthetic", **SMALL))
    return lake


@pytest.fixture
def small_run(small_pool):
    spec = RunSpec(pool="synthetic", scheduler="random", seed=1, batch_size=8, group_size=4, max_steps=3)
    start_run(small_pool, spec)
    return small_pool


@pytest.fixture
def dagster_home(tmp_path, monkeypatch):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


def pytest_configure(config):
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    # every lake a test writes is thrown away with its tmp_path: no fsync per write (about a tenth
    # of the suite's time; the processes a test starts inherit it). The default, fsync on, is
    # tested in test_lake.py; ENVSCHED_LAKE_FSYNC=1 make test runs the whole suite with it.
    os.environ.setdefault(SYNC_ENV, "0")


# Test layers: every test module belongs to one (`make test-unit`, ... ; `make test` runs all).
LAYERS = {
    "unit": (
        "test_scheduler",
        "test_lake",
        "test_synthetic",
        "test_simulated",
        "test_graph",
        "test_topology_llm",
        "test_shape",
        "test_neural",
        "test_settings",
        "test_levers",
        "test_passk",
    ),
    "steps": (
        "test_loop",
        "test_external",
        "test_failure_aware",
        "test_faults",
        "test_resume_edits",
        "test_cost_and_priors",
        "test_replay",
        "test_pools",
        "test_trainer",
        "test_yield",
        "test_explain",
        "test_select_lag",
        "test_state_keep",
        "test_remake",
        "test_sandbox_reach",
        "test_trust",
        "test_trackers",
        "test_lr_schedule",
        "test_update_settings",
        "test_evaluate",
        "test_early_stop",
        "test_sampler_correction",
    ),
    "dagster": ("test_dagster", "test_resident", "test_heldout"),
    "e2e": (
        "test_cli",
        "test_ui",
        "test_deploy",
        "test_cluster",
        "test_rollout_backend",
        "test_ranks",
        "test_trl",
        "test_s3_lake",
        "test_report",
        "test_compare",
        "test_partners",
        "test_sweep",
        "test_watching",
    ),
}


# The longest test files, longest first (seconds on 2 cores, `--durations`): `make test` hands whole
# files to its two workers in collection order, so these start first and the short files fill in
# at the end; collected alphabetically, the sweep and UI tests started last and left one worker
# idle while the other finished them.
SLOW_FIRST = (
    "test_resident",
    "test_sweep",
    "test_heldout",
    "test_ui",
    "test_cli",
    "test_neural",
    "test_pools",
    "test_trust",
    "test_trl",
    "test_s3_lake",
    "test_trainer",
    "test_deploy",
    "test_rollout_backend",
    "test_ranks",
    "test_partners",
    "test_cluster",
    "test_compare",
    "test_report",
    "test_shape",
    "test_remake",
)
assert set(SLOW_FIRST) <= {m for modules in LAYERS.values() for m in modules}, (
    "SLOW_FIRST names a module no layer has"
)


def _module(item) -> str:
    return item.module.__name__.rsplit(".", 1)[-1]


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = _module(item)
        if item.get_closest_marker("e2e"):
            continue
        for layer, modules in LAYERS.items():
            if module in modules:
                item.add_marker(getattr(pytest.mark, layer))
    rank = {name: k for k, name in enumerate(SLOW_FIRST)}
    # stable: a file's tests keep their order, and the files not named keep theirs, after these
    items.sort(key=lambda item: rank.get(_module(item), len(SLOW_FIRST)))
