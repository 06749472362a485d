"""Pick traces of benchmark runs: one row per (step, pick), what the scheduler predicted beside what
the group then showed, written as Parquet and read with DuckDB.

    TraceWriter(path, scheduler, seed).add(step, picks, rewards) ... .close()
    summarize_traces(paths)   spread share per quarter of the run, by the task's previous group and by half
    window_concentration(path, n_envs)   informative groups of the most-served environment per window
    trace_tables(summary)     the same as Markdown tables

``envsched bench scheduler --trace DIR`` writes ``DIR/<scheduler>-s<seed>.parquet`` for every run;
``envsched bench trace DIR/*.parquet`` prints the summary. Any other question is one SQL query away,
with the files as the view ``picks``::

    envsched bench trace traces/*.parquet --sql "SELECT half, avg(informative::DOUBLE) FROM picks GROUP BY 1"
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from envsched_pipeline.rollouts import flat_kinds, informative

# column -> what it holds (docs/algorithm.md §9, "Pick traces")
COLUMNS = {
    "scheduler": "scheduler name (variants included)",
    "seed": "run seed",
    "step": "training step",
    "slot": "position of the pick in the step's batch",
    "task_id": "task picked",
    "env_id": "its environment",
    "half": "cold | coverage | exploit | random | <baseline name>",
    "score": "the scheduler's score for the task at this step",
    "pred_u": "informativeness u the score is built on (envsched) or the scheduler's own estimate (NULL: none)",
    "pred_spread": "predicted chance of a group with spread (NULL where the scheduler has none)",
    "pred_success": "predicted success rate m_hat (envsched; NULL for other schedulers)",
    "group_mean": "the group's mean reward",
    "group_var": "the group's reward variance",
    "informative": "the group had spread (GRPO learns from it)",
    "flat_kind": "'' for a group with spread, else solved | failed | partial (all at one partial credit)",
}


def _num(x) -> float | None:
    """A prediction as a float, or None (NULL in SQL) where the scheduler has none."""
    return None if x is None or not np.isfinite(float(x)) else float(x)


class TraceWriter:
    """Collects a run's picks step by step and writes them as one Parquet file on ``close``
    (written to a temporary name first, so a killed run leaves no half-written trace)."""

    def __init__(self, path: str | Path, scheduler: str, seed: int):
        self.path = Path(path)
        self.scheduler, self.seed = scheduler, int(seed)
        self.cols: dict[str, list] = {c: [] for c in COLUMNS}

    def add(self, step: int, picks: list, rewards: np.ndarray) -> None:
        r = np.asarray(rewards, dtype=float)
        if len(picks) != len(r):
            raise ValueError(f"trace step {step}: {len(picks)} picks but {len(r)} reward groups")
        inf, kinds = informative(r), flat_kinds(r)
        for slot, (p, g, spread, kind) in enumerate(zip(picks, r, inf, kinds, strict=True)):
            row = {
                "scheduler": self.scheduler,
                "seed": self.seed,
                "step": int(step),
                "slot": slot,
                "task_id": p.task_id,
                "env_id": p.env_id,
                "half": p.half,
                "score": _num(p.score),
                "pred_u": _num(p.pred_var),
                "pred_spread": _num(p.p_nonzero),
                "pred_success": _num((p.reason or {}).get("pred_success")),
                "group_mean": float(g.mean()),
                "group_var": float(g.var()),
                "informative": bool(spread),
                "flat_kind": kind,
            }
            for c, v in row.items():
                self.cols[c].append(v)

    def close(self) -> Path:
        import pyarrow as pa  # only a traced run needs pyarrow
        import pyarrow.parquet as pq  # (with pyarrow above)

        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        pq.write_table(pa.table(self.cols), tmp)
        os.replace(tmp, self.path)
        return self.path


_SUMMARY = """
WITH t AS (
    SELECT *,
        LAG(informative) OVER w AS prev_informative,
        LAG(flat_kind) OVER w AS prev_kind,
        step - LAG(step) OVER w AS age,
        LEAST(3, CAST(FLOOR(4.0 * step / (MAX(step) OVER (PARTITION BY scheduler, seed) + 1)) AS INTEGER))
            AS quarter
    FROM picks
    WINDOW w AS (PARTITION BY scheduler, seed, task_id ORDER BY step)
)
SELECT scheduler, quarter, {key} AS what, count(*) AS picks, avg(informative::DOUBLE) AS spread,
    median(age) AS median_age
FROM t GROUP BY ALL ORDER BY scheduler, quarter, what
"""
_PREVIOUS = (
    "CASE WHEN prev_informative IS NULL THEN 'first look' WHEN prev_informative THEN 'spread' "
    "ELSE 'flat, ' || prev_kind END"
)


@contextmanager
def _picks(paths: list[str | Path]):
    """A DuckDB connection with the trace files as the view ``picks`` (FileNotFoundError naming
    every missing file first)."""
    import duckdb  # only reading traces needs DuckDB here

    files = [str(p) for p in paths]
    missing = [f for f in files if not Path(f).is_file()]
    if not files or missing:
        raise FileNotFoundError(f"trace file(s) not found: {', '.join(missing) or '(none given)'}")
    con = duckdb.connect()
    try:
        listed = ", ".join("'" + f.replace("'", "''") + "'" for f in files)  # a view takes no parameters
        con.execute(f"CREATE VIEW picks AS SELECT * FROM read_parquet([{listed}])")
        yield con
    finally:
        con.close()


def _rows(cur) -> list[dict]:
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]


def summarize_traces(paths: list[str | Path]) -> dict:
    """Spread share of the picks per scheduler and quarter of the run, grouped by what the task's
    previous group in the same run showed (``by_previous``: first look | spread | flat, solved |
    flat, failed | flat, partial) and by half (``by_half``). Seeds are pooled."""
    with _picks(paths) as con:
        return {
            name: _rows(con.execute(_SUMMARY.format(key=key)))
            for name, key in (("by_previous", _PREVIOUS), ("by_half", "half"))
        }


def query_traces(paths: list[str | Path], query: str):
    """Run ``query`` with the trace files as the view ``picks``; returns a pyarrow table."""
    with _picks(paths) as con:
        return con.sql(query).to_arrow_table()


def known_informative(paths: list[str | Path], steps: list[int], window: int = 10) -> list[dict]:
    """How many tasks a scheduler knew to be informative at each of ``steps``: tasks whose latest
    group before that step, picked within the last ``window`` steps, had spread (per scheduler,
    mean over seeds). Next to the batch size it says whether the scheduler could have filled a batch
    from tasks it had just seen with spread."""
    with _picks(paths) as con:
        cur = con.execute(
            """
            WITH probe AS (SELECT unnest($steps) AS t),
            latest AS (
                SELECT scheduler, seed, probe.t, task_id, arg_max(informative, step) AS spread, max(step) AS last
                FROM picks, probe WHERE step < probe.t GROUP BY ALL
            )
            SELECT scheduler, t AS step, count(*) FILTER (WHERE spread AND last >= t - $window)
                / count(DISTINCT seed) AS tasks
            FROM latest GROUP BY ALL ORDER BY scheduler, step
            """,
            {"steps": [int(x) for x in steps], "window": int(window)},
        )
        return _rows(cur)


def window_concentration(path: str | Path, n_envs: int, window: int = 3) -> dict:
    """How evenly one run's informative groups spread over environments, ``window`` steps at a time
    (what the useful-breadth quota, docs/algorithm.md §6, acts on): ``by_window`` = the groups with
    spread of the environment that held the most in each window (by the window's last step),
    ``most_served`` = their mean, ``above_twice_fair`` = the share of all informative groups above
    twice an environment's fair share (the window's informative groups over ``n_envs``)."""
    with _picks([path]) as con:
        rows = con.execute(
            "SELECT step, env_id, sum(informative::INTEGER) AS n FROM picks GROUP BY ALL ORDER BY ALL"
        ).fetchall()
    steps = max(r[0] for r in rows) + 1 if rows else 0
    if steps < window:
        raise ValueError(f"{path}: {steps} step(s) traced, fewer than the window ({window})")
    envs = {e: j for j, e in enumerate(sorted({r[1] for r in rows}))}
    inf = np.zeros((steps, max(n_envs, len(envs))))
    for step, env, n in rows:
        inf[step, envs[env]] += n
    win = sum(inf[j : steps - window + 1 + j] for j in range(window))
    fair = win.sum(axis=1, keepdims=True) / n_envs
    return {
        "by_window": win.max(axis=1),
        "most_served": float(win.max(axis=1).mean()),
        "above_twice_fair": float(np.clip(win - 2 * fair, 0, None).sum() / max(win.sum(), 1.0)),
    }


def trace_tables(summary: dict) -> str:
    """The summary as two Markdown tables (picks, spread share, median steps since the previous
    group of the same task)."""
    lines = []
    for name, title in (("by_previous", "previous group of the task"), ("by_half", "half")):
        lines += [
            "",
            f"| scheduler | quarter | {title} | picks | spread share | median steps since previous |",
            "|---|---|---|---|---|---|",
        ]
        for r in summary[name]:
            age = "-" if r["median_age"] is None else f"{r['median_age']:.0f}"
            lines.append(
                f"| {r['scheduler']} | {r['quarter'] + 1} | {r['what']} | {r['picks']} | "
                f"{r['spread']:.3f} | {age} |"
            )
    return "\n".join(lines[1:])
