"""Several schedulers against one baseline over seeds (``envsched compare --runs A... --runs B...
--against R...``): the paper's ablation table on a user's own runs.

Each row is one scheduler's runs judged against the baseline's runs of the same seeds, exactly as
:func:`envsched_pipeline.analysis.seeds.compare_seeds` judges one (the mean paired difference by its
spread over seeds). Beside the rows, for each held-out benchmark, which row has the best mean
held-out and whether its lead over the next best is resolved: the two rows' runs paired by seed and
judged the same way (a lead that the runs' luck could reverse reads "no clear difference"). Each
row's interval is its own, with no correction for the number of rows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from envsched_pipeline.analysis.compare import HEADLINES, relation
from envsched_pipeline.analysis.plots import rows_plot
from envsched_pipeline.analysis.seeds import (
    compare_seeds,
    mark,
    markdown_table,
    write_comparison,
    write_page,
)
from envsched_pipeline.errors import ConfigError
from envsched_pipeline.lake import Lake, json_safe


def compare_rows(
    groups: Sequence[Sequence[Lake]], against: Sequence[Lake], effect: float | None = None
) -> dict:
    """Each group of ``groups`` (one scheduler's runs, one per seed) against ``against``; the rows,
    and per held-out benchmark the row with the best mean and its lead over the next best judged
    over the seeds both rows ran. Raises :class:`ConfigError` naming the group and lake at fault."""
    if len(groups) < 2:
        raise ConfigError("--runs: an ablation table needs two groups of runs at least (repeat --runs)")
    rows, names = [], {}
    for i, group in enumerate(groups, start=1):
        try:
            row = compare_seeds(group, against, effect=effect)
        except ConfigError as exc:
            raise ConfigError(f"--runs (group {i}): {exc}") from exc
        name = row["runs"]["name"]
        if name in names:
            raise ConfigError(
                f"--runs (group {i}): {name} again (group {names[name]} holds its runs); each --runs names "
                "another scheduler's runs"
            )
        names[name] = i
        rows.append(row)
    leaders = []
    heads: dict[tuple[int, int], dict | None] = {}  # (best row, runner-up row) -> their runs compared
    benches = sorted({v["key"] for r in rows for v in r["verdicts"] if v["kind"] == "heldout"})
    for bench in benches:
        have = [(r, _verdict(r, bench)) for r in rows if _verdict(r, bench)]
        if len(have) < 2:
            continue
        ranked = sorted(have, key=lambda rv: rv[1]["run"], reverse=True)
        (best, bv), (second, sv) = ranked[0], ranked[1]
        pair = (rows.index(best), rows.index(second))
        if pair not in heads:  # one comparison per pair of rows, whichever benchmarks it leads on
            heads[pair] = _head_to_head(groups[pair[0]], groups[pair[1]])
        lead = _lead(heads[pair], bench)
        leaders.append(
            {
                "benchmark": bench,
                "best": best["runs"]["name"],
                "best_mean": bv["run"],
                "runner_up": second["runs"]["name"],
                "runner_up_mean": sv["run"],
                "lead": lead,
                "text": _lead_text(bench, best["runs"]["name"], bv, second["runs"]["name"], sv, lead),
            }
        )
    return {
        "against": rows[0]["against"],
        "setup": rows[0]["setup"],
        "rows": rows,
        "leaders": leaders,
    }


def _verdict(row: dict, key: str) -> dict | None:
    return next((v for v in row["verdicts"] if v["key"] == key), None)


def _head_to_head(best: Sequence[Lake], second: Sequence[Lake]) -> dict | None:
    """The best row's runs against the runner-up's, paired by seed: None when they share fewer
    than two seeds."""
    try:
        return compare_seeds(best, second)
    except ConfigError:  # fewer than two shared seeds: the lead cannot be judged over seeds
        return None


def _lead(res: dict | None, bench: str) -> dict | None:
    """The head-to-head comparison's verdict on ``bench`` (None without one)."""
    v = None if res is None else _verdict(res, bench)
    return None if v is None else {k: v[k] for k in ("n", "mean", "se", "ci", "better", "above", "seeds")}


def _lead_text(bench: str, best: str, bv: dict, second: str, sv: dict, lead: dict | None) -> str:
    text = (
        f"Best mean {bench}: {best} ({bv['run']:.4f} over its {bv['n']} seeds), then {second} "
        f"({sv['run']:.4f} over {sv['n']})"
    )
    if lead is None:
        return text + "; the two share fewer than two seeds, so the lead is not judged over seeds."
    return text + (
        f"; paired by seed, {best} minus {second} {lead['mean']:+.4f} ± {lead['se']:.4f} over {lead['n']} seeds "
        f"(95% t interval [{lead['ci'][0]:+.4f}, {lead['ci'][1]:+.4f}]): "
        f"{relation(lead['better'], second, ('above', 'below'))}."
    )


def table_cells(result: dict) -> tuple[list[str], list[list[str]]]:
    """The ablation table: one row per scheduler; per-step metrics as a ratio to the baseline with
    the seeds better, held-out as the mean paired difference ± its s.e. over seeds (seeds above), and
    each held-out benchmark's mean with the best marked."""
    rows = result["rows"]
    benches = sorted({v["key"] for r in rows for v in r["verdicts"] if v["kind"] == "heldout"})
    other = result["against"]["name"]
    head = ["scheduler", "seeds"]
    head += [f"{label.lower()} (x {other})" for _, label, _ in HEADLINES]
    head += [f"Δ {b} vs {other}" for b in benches] + [f"mean {b}" for b in benches]
    best = {x["benchmark"]: x["best"] for x in result["leaders"]}
    out = []
    for r in rows:
        name = r["runs"]["name"]
        cells = [name, str(len(r["pairs"]))]
        for key, _, _ in HEADLINES:
            v = _verdict(r, key)
            cells.append("—" if v is None else f"{v['ratio']:.2f} ({v['wins']}/{v['n']}) {mark(v['better'])}")
        for b in benches:
            v = _verdict(r, b)
            cells.append(
                "—"
                if v is None
                else f"{v['mean']:+.4f} ± {v['se']:.4f} ({v['above']}/{v['n']}) {mark(v['better'])}"
            )
        for b in benches:
            v = _verdict(r, b)
            cells.append("—" if v is None else f"{v['run']:.4f}" + (" (best)" if best.get(b) == name else ""))
        out.append(cells)
    return head, out


def table_markdown(result: dict) -> list[str]:
    """:func:`table_cells` as markdown rows."""
    return markdown_table(*table_cells(result))


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "row"


def write_rows(result: dict, out_dir) -> Path:
    """``index.html`` (the table, the plot inline, the leaders, a link to each row's own page),
    ``ablation.md``, ``rows.png``, ``summary.json``, and each row's comparison page in a folder of
    its own; the page's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(json_safe(result), indent=2) + "\n")
    png = out / "rows.png"
    rows_plot(result, png)
    links = []
    for r in result["rows"]:
        folder = _slug(r["runs"]["name"])
        write_comparison(r, out / folder)
        links.append((f"{r['runs']['name']}: its comparison, seed by seed", f"{folder}/index.html"))
    setup, other = result["setup"], result["against"]["name"]
    title = f"{len(result['rows'])} schedulers against {other}, paired by seed"
    intro = (
        f"Pool {setup['pool']}, policy {setup['policy']}, B = {setup['batch_size']}, G = {setup['group_size']}. "
        f"Each row: that scheduler's runs against {other}'s of the same seeds (✔ better, ✘ worse, · no clear "
        "difference by the 95% t interval over seeds; each row's interval is its own; held-out at each pair's "
        "last common evaluation)."
    )
    items = [x["text"] for x in result["leaders"]]
    return write_page(
        out / "ablation.md",
        title,
        intro,
        table_cells(result),
        png,
        "each row's mean difference",
        items,
        links,
    )
