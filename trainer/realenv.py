"""The simulated learner in real-environment mode (docs/algorithm.md §8).

The learner's per-task success probability p_i decides, per gold action, whether the action is
kept (probability p_i) or corrupted (dropped, given a wrong argument, or replaced by a wrong tool);
the real runtime executes the result in the sandbox and the real verifier scores it. For
reasoning-gym the "action" is the answer: right with probability p_i, else wrong.
"""

from __future__ import annotations

import json

import numpy as np

from envsched_pipeline.errors import StepError


def _perturb(value, rng: np.random.Generator):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + int(rng.integers(1, 5))
    if isinstance(value, float):
        return value * 1.5 + 1.0
    if isinstance(value, str):
        return value[::-1] + "x" if value else "x"
    if isinstance(value, list):
        return value[:-1] if value else ["x"]
    return value


def corrupt_turn(
    actions: list[dict], p: float, rng: np.random.Generator, tool_names: list[str]
) -> list[dict]:
    out = []
    for a in actions:
        if rng.random() < p:
            out.append(a)
            continue
        kind = rng.random()
        if kind < 0.4:
            continue  # dropped
        if kind < 0.8 and a.get("arguments"):
            args = dict(a["arguments"])
            k = list(args)[int(rng.integers(0, len(args)))]
            args[k] = _perturb(args[k], rng)
            out.append({"name": a["name"], "arguments": args})
        else:
            others = [t for t in tool_names if t != a["name"]]
            name = others[int(rng.integers(0, len(others)))] if others else a["name"] + "_x"
            out.append({"name": name, "arguments": a.get("arguments") or {}})
    return out


def corrupt(gold, p: float, rng: np.random.Generator, tool_names: list[str]):
    """Corrupt a gold action list (or a list of turns, for multi-turn pools)."""
    if gold and isinstance(gold[0], list):
        return [corrupt_turn(turn, p, rng, tool_names) for turn in gold]
    return corrupt_turn(gold or [], p, rng, tool_names)


def tool_names_of(env_row: dict) -> list[str]:
    try:
        return [t.get("function", t).get("name") for t in json.loads(env_row.get("tools") or "[]")]
    except (json.JSONDecodeError, AttributeError):
        return []


def episode_rows(lake, pool: str, task_ids: list[str]) -> tuple[dict[str, dict], dict[str, dict]]:
    """The lake rows a step's episodes need: task rows of ``task_ids`` and every environment row."""

    wanted = set(task_ids)
    tasks = {r["task_id"]: r for r in lake.read("tasks", pool=pool).to_pylist() if r["task_id"] in wanted}
    missing = [t for t in task_ids if t not in tasks]
    if missing:
        raise StepError(f"manifest tasks not in pool {pool}: {missing[:3]}")
    envs = {r["env_id"]: r for r in lake.read("environments", pool=pool).to_pylist()}
    return tasks, envs


def every_environment(lake, pool: str) -> dict[str, dict]:
    """Environment rows by id: the pool's and its evaluation-only ones (``eval_environments``)."""
    return {
        r["env_id"]: r
        for table in ("environments", "eval_environments")
        for r in lake.read(table, pool=pool).to_pylist()
    }
