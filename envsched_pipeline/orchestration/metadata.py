"""Helpers that turn results into Dagster-friendly metadata (kept free of Dagster imports)."""

from __future__ import annotations

import math


def md_table(
    rows: list[dict], columns: list[str] | None = None, floatfmt: str = ".4g", limit: int = 30
) -> str:
    if not rows:
        return "_(no rows)_"
    columns = columns or list(rows[0])

    def fmt(v):
        if isinstance(v, float):
            return "nan" if math.isnan(v) else format(v, floatfmt)
        s = str(v)
        return s if len(s) <= 60 else s[:57] + "..."

    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows[:limit]:
        out.append("| " + " | ".join(fmt(r.get(c, "")).replace("|", "/") for c in columns) + " |")
    if len(rows) > limit:
        out.append(f"\n_{len(rows) - limit} more rows: query them with `envsched sql`_")
    return "\n".join(out)


def scalar_metadata(d: dict) -> dict:
    """Keep JSON scalars, drop NaN (Dagster metadata rejects it)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, bool):
            out[k] = v
        elif isinstance(v, (int, float)):
            if not (isinstance(v, float) and math.isnan(v)):
                out[k] = float(v) if isinstance(v, float) else int(v)
        elif isinstance(v, str):
            out[k] = v
    return out
