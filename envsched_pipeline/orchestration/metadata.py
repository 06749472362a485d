"""Helpers that turn results into Dagster-friendly metadata (kept free of Dagster imports)."""

from __future__ import annotations

import json
import math


def md_table(
    rows: list[dict],
    columns: list[str] | None = None,
    floatfmt: str = ".4g",
    limit: int = 30,
    width: int = 60,
) -> str:
    if not rows:
        return "_(no rows)_"
    columns = columns or list(rows[0])

    def fmt(v):
        if isinstance(v, float):
            return "nan" if math.isnan(v) else format(v, floatfmt)
        s = str(v)
        return s if len(s) <= width else s[: width - 3] + "..."

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


def reason_in_words(row: dict) -> str:
    """A pick's reason record as a sentence a person reads."""
    try:
        r = json.loads(row.get("reason") or "{}")
    except (TypeError, json.JSONDecodeError):
        return str(row.get("reason", ""))
    half = r.get("half", row.get("half", ""))

    def num(key, fmt=".3f"):
        v = r.get(key)
        return "?" if v is None else format(v, fmt)

    if half == "cold":
        return "cold start: spread over environments, most different from the tasks already in the batch"
    if half in ("coverage", "exploit"):
        own = r.get("own_var")
        basis = (
            (f"own variance {own:.3f}" if own is not None else "never tried")
            + f", prior {num('prior_var')} from {r.get('n_within', 0)} within / {r.get('n_cross', 0)} cross neighbours"
        )
        parts = [f"predicted variance {num('pred_var')} ({basis})"]
        if (r.get("exposure_discount") or 1) < 0.999:
            parts.append(f"exposure discount x{num('exposure_discount', '.2f')}")
        if (r.get("decline_factor") or 1) < 0.999:
            parts.append(f"variance declining x{num('decline_factor', '.2f')}")
        if (r.get("hack_factor") or 1) < 0.999:
            parts.append(f"hack suspicion x{num('hack_factor', '.2f')}")
        if r.get("similarity_penalty"):
            parts.append(f"similarity to the batch -{num('similarity_penalty', '.2f')}")
        lead = (
            "coverage: an under-observed environment's least-tried task"
            if half == "coverage"
            else "exploit: among the highest predicted informativeness"
        )
        return lead + "; " + "; ".join(parts)
    if half == "random":
        return f"uniform draw from {r.get('uniform_of', '?')} tasks"
    extra = ", ".join(
        f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items() if k != "half"
    )
    return f"{half}: {extra}" if extra else str(half)


def picks_table(rows: list[dict], limit: int = 64) -> str:
    """A manifest as a markdown table with the reason in words."""
    return md_table(
        [
            {
                "slot": r["slot"],
                "task": r["task_id"],
                "environment": r["env_id"],
                "half": r["half"],
                "predicted variance": r["pred_var"],
                "score": r["score"],
                "why": reason_in_words(r),
            }
            for r in rows
        ],
        limit=limit,
        width=160,
    )


def near_misses_table(misses: list[dict]) -> str:
    """The highest-scored tasks a manifest left out, and what kept each out."""
    if not misses:
        return "None: step 0 (the cold start) scores no task, and other schedulers leave none explained."
    return md_table(
        [
            {
                "task": m["task_id"],
                "environment": m["env_id"],
                "score": m["score"],
                "rank": m["score_rank"],
                "kept out by": m["why"],
            }
            for m in misses
        ],
        limit=len(misses),
        width=200,
    )
