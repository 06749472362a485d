"""``envsched sql``: SQL over the lake's DuckDB views."""

from __future__ import annotations

import csv
import itertools
import sys

import duckdb
import pyarrow as pa

from envsched_pipeline.cli.common import HelpFormatter, UsageError, dumps, lake_of, sql_error


def add_parser(sub) -> None:
    s = sub.add_parser(
        "sql",
        help="run SQL over the lake's DuckDB views",
        formatter_class=HelpFormatter,
    )
    s.add_argument("query", help='e.g. "select * from step_summary"')
    s.add_argument("--format", choices=("table", "csv", "json"), default="table", help="output format")
    s.set_defaults(func=run)


TABLE_ROWS = 10_000  # rows the aligned table shows (every row is counted)


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return "NULL" if v is None else str(v)


def run(args) -> int:
    if not args.query.strip().strip(";").strip():
        raise UsageError('the query is empty; e.g. envsched sql "select * from step_summary"')
    lake = lake_of(args).require()
    try:
        print_table(lake.sql_batches(args.query), args.format)
    except duckdb.Error as exc:
        raise sql_error(exc) from exc
    return 0


def print_table(result, fmt: str = "table") -> None:
    """A query's result (a pyarrow table, or record batches as they are read) as an aligned table,
    CSV or JSON lines. CSV and JSON print every row as it comes; the table aligns and shows the
    first ``TABLE_ROWS`` rows and counts the rest (a result of millions of rows is for a file)."""
    if isinstance(result, pa.Table):  # no batches when empty: one empty batch still names the columns
        result = result.to_batches() or [pa.RecordBatch.from_pylist([], schema=result.schema)]
    batches = iter(result)
    first = next(batches, None)
    if first is None:  # a statement without a result
        return
    cols = first.schema.names
    batches = itertools.chain([first], batches)
    if fmt == "json":
        for batch in batches:
            for r in batch.to_pylist():
                print(dumps(r))
    elif fmt == "csv":
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(cols)
        for batch in batches:
            for r in batch.to_pylist():
                w.writerow([r[c] for c in cols])
    else:
        rows: list[dict] = []
        total = 0
        for batch in batches:  # the rows shown first, then the rest only counted
            total += batch.num_rows
            rows += batch.slice(0, TABLE_ROWS - len(rows)).to_pylist()
            if len(rows) == TABLE_ROWS:
                break
        widths = [max(len(c), *(len(_cell(r[c])) for r in rows)) if rows else len(c) for c in cols]
        print(" | ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
        print("-+-".join("-" * w for w in widths))
        for r in rows:
            print(" | ".join(_cell(r[c]).ljust(w) for c, w in zip(cols, widths, strict=True)))
        total += sum(batch.num_rows for batch in batches)
        shown = (
            ""
            if total == len(rows)
            else f"; the first {len(rows)} shown: `--format csv` or `json` prints them all"
        )
        print(f"({total} row{'s' if total != 1 else ''}{shown})")
