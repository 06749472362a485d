"""Shared bits of the asset modules."""

import dagster as dg
from pydantic import Field

from envsched_pipeline.service import load_run


class PoolSelection(dg.Config):
    pool: str = Field(default="", description="Pool name; empty: the pool of the lake's run (else synthetic).")


def pool_name(config: PoolSelection, lake) -> str:
    run = load_run(lake)
    return config.pool or (run.pool if run else "synthetic")


def progress_logger(context, every: int = 10):
    """A progress callback that logs every ``every`` percent to the run's log."""
    last = {}

    def cb(stage: str, done: int, total: int) -> None:
        pct = int(100 * done / max(total, 1))
        if pct >= last.get(stage, -every) + every or done == total:
            last[stage] = pct
            context.log.info(f"{stage}: {done}/{total} ({pct}%)")

    return cb
