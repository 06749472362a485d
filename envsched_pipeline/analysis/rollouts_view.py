"""What a rollout did, readable in a terminal or a Dagster materialization.

render(row, task)     one rollout: task, reward, the actions with their outputs, the checks
samples(rows)         the best, the worst and one zero-variance group of a step
"""

from __future__ import annotations

import json
import textwrap

from envsched_pipeline.rollouts import SPREAD_EPS


def _clip(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def render(row: dict, task: dict | None = None, width: int = 100) -> str:
    """Plain text, one rollout."""
    traj = row.get("trajectory") or ""
    try:
        traj = json.loads(traj) if isinstance(traj, str) and traj else (traj or {})
    except json.JSONDecodeError:
        traj = {"raw": traj}
    which = (
        f"held-out ({row['split']} environments)  task {row['task_id']}  sample {row['sample']}"
        if "split" in row
        else f"task {row['task_id']}  rollout {row['rollout']}"
    )
    lines = [
        f"step {row['step']}  {which}  environment {row['env_id']}",
        f"reward {row['reward']:.3f}"
        + (
            f"  (checks {row.get('checks_passed')}/{row.get('checks_total')})"
            if row.get("checks_total")
            else ""
        )
        + (
            f"  error: {row.get('error_class')} {row.get('error_message') or ''}".rstrip()
            if (row.get("error_class") or "none") != "none"
            else ""
        )
        + ("  [flagged: invented identifier]" if row.get("hack_flag") else ""),
    ]
    if task is not None:
        lines.append(
            "instruction: " + textwrap.shorten(task.get("instruction") or "", width * 3, placeholder="...")
        )
    engine = traj.get("engine", "?") if isinstance(traj, dict) else "?"
    if isinstance(traj, dict) and traj.get("mode") == "latent":
        lines.append("(simulated learner, latent mode: the checks are modelled, no actions were taken)")
    calls = traj.get("tool_calls", []) if isinstance(traj, dict) else []
    messages = traj.get("messages", []) if isinstance(traj, dict) else []
    if calls:
        lines.append(f"actions ({engine}):")
        for j, c in enumerate(calls, start=1):
            args = json.dumps(c.get("arguments"), default=str, sort_keys=True)
            lines.append(
                f"  {j:>2}. {c.get('name')}({_clip(args[1:-1] if args.startswith('{') else args, width - 20)})"
            )
            lines.append(f"      -> {_clip(c.get('output', ''), width - 10)}")
    elif messages:
        lines.append(f"conversation ({engine}):")
        for m in messages:
            lines.append(f"  [{m.get('role')}] {_clip(m.get('content', ''), width - 10)}")
    elif engine != "?" and not (isinstance(traj, dict) and traj.get("mode") == "latent"):
        lines.append(f"({engine}: no tool calls)")
    checks = traj.get("checks", []) if isinstance(traj, dict) else []
    if checks:
        lines.append("checks:")
        for c in checks:
            mark = "pass" if c.get("passed") else "FAIL"
            err = f"  ({c['error']})" if c.get("error") else ""
            lines.append(f"  [{mark}] {_clip(c.get('item', ''), width - 12)}{err}")
    return "\n".join(lines)


def samples(rows: list[dict]) -> dict[str, dict]:
    """The step's best and worst rollouts, and one rollout of a zero-variance group (if any)."""
    if not rows:
        return {}
    out = {
        "best": max(rows, key=lambda r: (r["reward"], -r["rollout"])),
        "worst": min(rows, key=lambda r: (r["reward"], r["rollout"])),
    }
    groups: dict[str, list[float]] = {}
    for r in rows:
        groups.setdefault(r["task_id"], []).append(r["reward"])
    flat = [t for t, v in sorted(groups.items()) if max(v) - min(v) <= SPREAD_EPS]
    if flat:
        out["zero-variance group"] = next(r for r in rows if r["task_id"] == flat[0])
    return out
