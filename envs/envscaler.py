"""Import EnvScaler-format files (the paper's data): a scenario list + an env-metadata dict.

Accepted shapes:
* env metadata: a dict keyed by env_id (or a list of records with ``env_id``); per environment
  ``env_class_code``/``code``, ``env_class_name``/``class_name``, ``tools`` (a list, or a JSON
  string), and optional ``env_summary``/``summary``, ``env_introduction``/``introduction``,
  ``env_rules``/``rules``.
* scenarios: a list (or a dict keyed by task id) of records with ``env_id``, ``task``/``instruction``,
  ``init_config`` (dict), ``checklist_with_func`` (list of ``{check_item, check_func}``), optional
  ``task_id``/``id``, ``env_class_name``, ``gold_actions``.

Malformed input raises :class:`PoolFormatError` naming the file and the record/field; nothing is
written. Environments whose class cannot be built and tasks with an empty checklist are *reported*
(and skipped at run time with an error rollout), never a crash.
"""

from __future__ import annotations

import json
from pathlib import Path

from tqdm import tqdm

from envs.registry import PoolData, envscaler_rows
from envs.sandbox import SandboxPool


class PoolFormatError(ValueError):
    pass


def _load_json(path: Path):
    if not path.exists():
        raise PoolFormatError(f"{path}: no such file")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise PoolFormatError(
            f"{path}: invalid JSON at line {exc.lineno} column {exc.colno} ({exc.msg})"
        ) from exc
    except UnicodeDecodeError as exc:
        raise PoolFormatError(f"{path}: not UTF-8 text ({exc})") from exc


def _pick(rec: dict, *names, default=None):
    for n in names:
        if n in rec and rec[n] is not None:
            return rec[n]
    return default


def _text_field(rec: dict, where: str, names: tuple[str, ...], what: str = "") -> str:
    """The first of ``names`` the record gives, which must be a non-empty string; the error says
    whether the field is missing or holds something else."""
    value = _pick(rec, *names)
    label = f"field {names[0]!r}" + (f" ({what})" if what else "")
    if value is None:
        raise PoolFormatError(f"{where}: missing {label}")
    if not isinstance(value, str) or not value.strip():
        shown = type(value).__name__ if not isinstance(value, str) else "an empty string"
        raise PoolFormatError(f"{where}: {label} must be a non-empty string, got {shown}")
    return value


def parse_env_metadata(path: Path) -> list[dict]:
    data = _load_json(path)
    if isinstance(data, dict):
        items = [(k, v) for k, v in data.items()]
    elif isinstance(data, list):
        items = [(r.get("env_id") if isinstance(r, dict) else None, r) for r in data]
    else:
        raise PoolFormatError(f"{path}: expected a dict keyed by env_id or a list of environments")
    envs = []
    for pos, (env_id, rec) in enumerate(items):
        where = f"{path}: environment {env_id!r}" if env_id else f"{path}: environment #{pos}"
        if not isinstance(rec, dict):
            raise PoolFormatError(f"{where}: expected an object, got {type(rec).__name__}")
        if env_id is None:
            raise PoolFormatError(f"{where}: missing field 'env_id'")
        if not isinstance(env_id, str) or not env_id.strip():
            raise PoolFormatError(f"{where}: field 'env_id' must be a non-empty string")
        code = _text_field(
            rec, where, ("env_class_code", "code", "class_code"), "the environment's Python class source"
        )
        name = _text_field(rec, where, ("env_class_name", "class_name"))
        tools = _pick(rec, "tools", default=[])
        if isinstance(tools, str):
            try:
                tools = json.loads(tools)
            except json.JSONDecodeError as exc:
                raise PoolFormatError(
                    f"{where}: field 'tools' is a string but not valid JSON ({exc.msg})"
                ) from exc
        if not isinstance(tools, list):
            raise PoolFormatError(f"{where}: field 'tools' must be a list (or a JSON string of one)")
        norm = []
        for j, t in enumerate(tools):
            if not isinstance(t, dict):
                raise PoolFormatError(f"{where}: tools[{j}] must be an object")
            fn = t.get("function", t)
            if not isinstance(fn.get("name"), str):
                raise PoolFormatError(f"{where}: tools[{j}] has no 'name'")
            norm.append(t if "function" in t else {"type": "function", "function": t})
        envs.append(
            {
                "env_id": env_id,
                "class_name": name,
                "code": code,
                "tools": norm,
                "summary": str(_pick(rec, "env_summary", "summary", default="")),
                "introduction": str(_pick(rec, "env_introduction", "introduction", default="")),
                "rules_text": str(_pick(rec, "env_rules", "rules", default="")),
            }
        )
    if not envs:
        raise PoolFormatError(f"{path}: no environments")
    return envs


def parse_scenarios(path: Path, env_ids: set[str], env_class: dict[str, str]) -> list[dict]:
    data = _load_json(path)
    if isinstance(data, dict):
        records = [
            dict(v, task_id=v.get("task_id", k)) if isinstance(v, dict) else v for k, v in data.items()
        ]
    elif isinstance(data, list):
        records = data
    else:
        raise PoolFormatError(f"{path}: expected a list of scenarios")
    out, seen = [], set()
    for j, rec in enumerate(records):
        where = f"{path}: record {j}"
        if not isinstance(rec, dict):
            raise PoolFormatError(f"{where}: expected an object, got {type(rec).__name__}")
        env_id = _text_field(rec, where, ("env_id",))
        if env_id not in env_ids:
            raise PoolFormatError(f"{where}: env_id {env_id!r} is not in the environment metadata")
        instr = _text_field(rec, where, ("task", "instruction", "query"), "the instruction text")
        init = rec.get("init_config", {})
        if not isinstance(init, dict):
            raise PoolFormatError(f"{where}: field 'init_config' must be an object")
        checks = rec.get("checklist_with_func")
        if checks is None:
            raise PoolFormatError(f"{where}: missing field 'checklist_with_func'")
        if not isinstance(checks, list):
            raise PoolFormatError(f"{where}: field 'checklist_with_func' must be a list")
        norm = []
        for k, c in enumerate(checks):
            if not isinstance(c, dict) or not isinstance(c.get("check_func"), str):
                raise PoolFormatError(f"{where}: checklist_with_func[{k}] needs a string 'check_func'")
            norm.append({"check_item": str(c.get("check_item", "")), "check_func": c["check_func"]})
        tid = str(_pick(rec, "task_id", "id", default=f"{env_id}-{j:05d}"))
        if tid in seen:
            raise PoolFormatError(f"{where}: duplicate task id {tid!r}")
        seen.add(tid)
        gold = rec.get("gold_actions")
        if gold is not None and not isinstance(gold, list):
            raise PoolFormatError(f"{where}: field 'gold_actions' must be a list")
        out.append(
            {
                "task_id": tid,
                "env_id": env_id,
                "task": instr,
                "init_config": init,
                "checklist_with_func": norm,
                "gold_actions": gold,
                "env_class_name": rec.get("env_class_name") or env_class[env_id],
            }
        )
    if not out:
        raise PoolFormatError(f"{path}: no scenarios")
    return out


def load_envscaler(scenarios: str | Path, env_metadata: str | Path, name: str) -> PoolData:
    envs = parse_env_metadata(Path(env_metadata))
    tasks = parse_scenarios(
        Path(scenarios), {e["env_id"] for e in envs}, {e["env_id"]: e["class_name"] for e in envs}
    )
    env_rows, task_rows = envscaler_rows(name, envs, tasks)
    return PoolData(name=name, environments=env_rows, tasks=task_rows)


def validate_buildable(data: PoolData, pool=None) -> dict:
    """Build every environment once (with its first task's config) inside the sandbox, and list
    empty checklists. Returns a report; nothing here raises for a broken environment."""

    first_task: dict[str, dict] = {}
    empty = []
    for t in data.tasks:
        first_task.setdefault(t["env_id"], t)
        if not json.loads(t["checks"] or "[]"):
            empty.append(t["task_id"])
    envs = {e["env_id"]: e for e in data.environments}
    jobs = [({"kind": "envscaler", "env": envs[e], "task": t}, []) for e, t in first_task.items()]

    own = pool is None
    pool = pool or SandboxPool(workers=2)
    bar = tqdm(
        total=len(jobs), desc="building environments", unit="env", leave=False, disable=None
    )  # None: no bar off a terminal
    try:
        results = pool.map_episodes(jobs, progress=lambda done, total: bar.update(done - bar.n))
    finally:
        bar.close()
        if own:
            pool.close()
    broken = {}
    for (spec, _), r in zip(jobs, results, strict=True):
        if r.get("error_class") in ("env_crash", "timeout"):
            broken[spec["env"]["env_id"]] = r.get("error")
    return {
        "environments": len(envs),
        "tasks": len(data.tasks),
        "broken_environments": broken,
        "empty_checklists": empty,
    }
