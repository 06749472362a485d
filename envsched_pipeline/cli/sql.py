"""``envsched sql``: SQL over the lake's DuckDB views."""

from __future__ import annotations

import csv
import sys

import duckdb

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


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return "NULL" if v is None else str(v)


def run(args) -> int:
    if not args.query.strip().strip(";").strip():
        raise UsageError('the query is empty; e.g. envsched sql "select * from step_summary"')
    lake = lake_of(args).require()
    try:
        table = lake.sql(args.query)
    except duckdb.Error as exc:
        raise sql_error(exc) from exc
    print_table(table, args.format)
    return 0


def print_table(table, fmt: str = "table") -> None:
    """A query's result (a pyarrow table) as an aligned table, CSV or JSON lines."""
    rows = table.to_pylist()
    cols = table.column_names
    if fmt == "json":
        for r in rows:
            print(dumps(r))
    elif fmt == "csv":
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(cols)
        for r in rows:
            w.writerow([r[c] for c in cols])
    else:
        widths = [max(len(c), *(len(_cell(r[c])) for r in rows)) if rows else len(c) for c in cols]
        print(" | ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
        print("-+-".join("-" * w for w in widths))
        for r in rows:
            print(" | ".join(_cell(r[c]).ljust(w) for c, w in zip(cols, widths, strict=True)))
        print(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
