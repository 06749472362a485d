"""Shared bits of the asset modules."""

import sys

import dagster as dg
from pydantic import Field
from tqdm import tqdm

from envsched_pipeline.analysis.plots import embed
from envsched_pipeline.core.gates import halt_message, halted
from envsched_pipeline.lease import current, describe
from envsched_pipeline.run import load_run


class PoolSelection(dg.Config):
    pool: str = Field(
        default="", description="Pool name; empty: the pool of the lake's run (else synthetic)."
    )


def guard(context, lake) -> None:
    """Refuse a step run for a halted run, or one that the run's current driver did not request
    (``envsched train`` holds the lease: only its own runs may write)."""
    record = halted(lake)
    if record is not None:
        raise dg.Failure(halt_message(record))
    lease = current(lake)
    driver = (getattr(getattr(context, "run", None), "tags", None) or {}).get("envsched/driver", "")
    if lease is not None and driver != f"cli:{lease['id']}":
        raise dg.Failure(
            f"the run is being driven by {describe(lease)}; this run was requested by "
            f"{driver or 'someone else'}"
        )


def plot_md(context, label: str, make, *args, **kw) -> dict:
    """``{label: markdown with the plot inline}``; a plot that fails is a warning in the run's log and
    a note in the metadata, never a failed step (a Ctrl-C that lands in its query still stops it)."""
    try:
        return {label: dg.MetadataValue.md(embed(make(*args, **kw), label))}
    except Exception as exc:  # noqa: BLE001 - any plotting error must not fail the step
        if isinstance(exc, RuntimeError) and str(exc) == "Query interrupted":
            # Ctrl-C inside the plot's DuckDB query (DuckDB's form of it): the step stops, not just the plot
            raise KeyboardInterrupt from exc
        context.log.warning(f"plot {label} failed ({type(exc).__name__}: {exc}); the step goes on without it")
        return {f"{label}_error": f"{type(exc).__name__}: {exc}"[:300]}


def materialized(context, metadata: dict) -> dg.MaterializeResult:
    """The asset's result, its markdown (plots inline, tables, rendered rollouts) given to the
    materialization alone (``add_asset_metadata``): metadata returned with the result is stored
    in the step output's event as well, twice the bytes in the event log at every step."""
    heavy = {k: v for k, v in metadata.items() if isinstance(v, dg.MarkdownMetadataValue)}
    if heavy:
        context.add_asset_metadata(heavy)
    return dg.MaterializeResult(metadata={k: v for k, v in metadata.items() if k not in heavy})


def pool_name(config: PoolSelection, lake) -> str:
    run = load_run(lake)
    return config.pool or (run.pool if run else "synthetic")


def progress_logger(context, every: int = 10, stream=None):
    """A progress callback: a line every ``every`` percent in the run's log (visible in the Dagster
    UI) and, for whoever drives the job from a shell, on ``stream`` (stderr): a tqdm bar per stage
    on a terminal, the same lines as the log otherwise (a file or a CI log gets no carriage returns)."""
    stream = stream or sys.stderr
    bars_ok = stream.isatty()
    last: dict[str, int] = {}
    bars: dict[str, tqdm] = {}

    def cb(stage: str, done: int, total: int) -> None:
        if bars_ok:
            bar = bars.get(stage)
            if bar is None:
                bar = bars[stage] = tqdm(
                    total=total, desc=stage, unit="task", leave=False, mininterval=0.5, file=stream
                )
            bar.update(done - bar.n)
            if done >= total:
                bar.close()
        pct = int(100 * done / max(total, 1))
        if pct >= last.get(stage, -every) + every or done == total:
            last[stage] = pct
            context.log.info(f"{stage}: {done}/{total} ({pct}%)")
            if not bars_ok:
                print(f"{stage}: {done}/{total} ({pct}%)", file=stream, flush=True)

    return cb
