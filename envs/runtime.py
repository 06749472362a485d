"""Executable environment runtimes: one interface for every pool.

    rt = make_runtime(spec)          # spec: {"kind": ..., "task": ..., "env": ...}
    first = rt.reset()               # {"observation": first user message, "tools": [OpenAI tool schemas]}
    obs = rt.step({"name", "arguments"})   # tool result text (errors are observations, not the end)
    nxt = rt.end_turn(answer)        # next user message (multi-turn pools) or None
    res = rt.finish(answer)          # {"reward", "checks": [{"item", "passed", "error"}], "error"}

These run *only inside the sandbox worker* (:mod:`envs.sandbox`): environment classes and verifier
functions come with data and are untrusted.
"""

from __future__ import annotations

import importlib
import json
import signal
from abc import ABC, abstractmethod
from contextlib import contextmanager
from typing import Any


class CheckTimeout(Exception):
    pass


_CODE_CACHE: dict[tuple[str, str], object] = {}


_TOOLS_CACHE: dict[str, list] = {}


def _parsed_tools(text: str) -> list:
    """Tool schemas of an environment row, decoded once per worker (read-only afterwards)."""
    tools = _TOOLS_CACHE.get(text)
    if tools is None:
        if len(_TOOLS_CACHE) > 5_000:
            _TOOLS_CACHE.clear()
        tools = _TOOLS_CACHE[text] = json.loads(text)
    return tools


def compiled(source: str, filename: str):
    """``compile`` with a per-process cache: a worker runs many episodes of the same environment
    class and checklist, and compiling their source dominated a synthetic episode. Only the code
    object is cached; every episode still executes it in a fresh namespace, so no state is shared."""
    key = (filename, source)
    code = _CODE_CACHE.get(key)
    if code is None:
        if len(_CODE_CACHE) > 20_000:
            _CODE_CACHE.clear()
        code = _CODE_CACHE[key] = compile(source, filename, "exec")
    return code


@contextmanager
def time_limit(seconds: float):
    """SIGALRM-based limit for one check or tool call (worker main thread only)."""
    if seconds is None or seconds <= 0:
        yield
        return

    def handler(signum, frame):
        raise CheckTimeout(f"exceeded {seconds:g}s")

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def to_text(value: Any, limit: int = 4000) -> str:
    if isinstance(value, str):
        s = value
    else:
        try:
            s = json.dumps(value, default=str, sort_keys=True)
        except (TypeError, ValueError):
            s = repr(value)
    return s if len(s) <= limit else s[: limit - 20] + "...(truncated)"


def call_parts(call: dict) -> tuple[str, dict | None, str | None]:
    """(name, arguments, error observation) of a tool call; arguments may arrive as a JSON string."""
    name = call.get("name")
    args = call.get("arguments") or {}
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return name, None, "Error: arguments are not valid JSON"
    if not isinstance(args, dict):
        return name, None, "Error: arguments must be a JSON object"
    return name, args, None


class Runtime(ABC):
    """Base class; subclasses implement the pool's semantics."""

    @abstractmethod
    def reset(self) -> dict:
        """Start the episode: {"observation": first user message, "tools": tool schemas}."""

    @abstractmethod
    def step(self, call: dict) -> str:
        """Execute one tool call; the observation text."""

    def end_turn(self, answer: str | None) -> str | None:
        return None  # single-turn by default

    @abstractmethod
    def finish(self, answer: str | None = None) -> dict:
        """Verify: {"reward", "checks", "error"}."""


# ---------------------------------------------------------------------------- EnvScaler semantics
class EnvScalerRuntime(Runtime):
    """The EnvScaler release's semantics (synthetic pool and imported EnvScaler files).

    Build the class named by the task from the env code; construct with ``cls(init_config)``
    (falling back to ``cls({})``, then ``cls()``) and set every init_config key on the instance;
    state = instance attributes without dunders; each ``check_func(final_state)`` runs with a
    global ``initial_state``; a non-bool result, an exception or a timeout counts 0;
    reward = round(passed / total, 4). An unknown tool is an error observation.
    """

    def __init__(self, spec: dict):
        self.task = spec["task"]
        self.env = spec["env"]
        self.check_timeout = float(spec.get("check_timeout", 5.0))
        self.call_timeout = float(spec.get("call_timeout", 5.0))
        self.instance = None
        self.initial_state: dict = {}
        self.tools = self.env.get("tools") or []
        if isinstance(self.tools, str):
            self.tools = _parsed_tools(self.tools)
        self.tool_names = {t.get("function", t).get("name") for t in self.tools}

    def _build(self):
        ns: dict = {"__name__": f"envsched_env_{self.env.get('env_id', 'x')}"}
        exec(compiled(self.env["code"], f"<env {self.env.get('env_id')}>"), ns)  # sandboxed worker
        name = self.task.get("class_name") or self.env.get("class_name")
        if name not in ns:
            raise LookupError(f"environment code defines no class {name!r}")
        cls = ns[name]
        config = self.task.get("init_state") or {}
        if isinstance(config, str):
            config = json.loads(config)
        inst = None
        for args in ((json.loads(json.dumps(config)),), ({},), ()):
            try:
                inst = cls(*args)
                break
            except TypeError:
                continue
        if inst is None:
            raise TypeError(f"cannot construct {name} with (init_config), ({{}}) or ()")
        for k, v in json.loads(json.dumps(config)).items():
            setattr(inst, k, v)
        return inst

    def state(self) -> dict:
        return {k: v for k, v in vars(self.instance).items() if not k.startswith("__")}

    def reset(self) -> dict:
        with time_limit(self.call_timeout):
            self.instance = self._build()
        self.initial_state = json.loads(json.dumps(self.state(), default=str))
        return {"observation": self.task.get("instruction", ""), "tools": self.tools}

    def step(self, call: dict) -> str:
        name, args, err = call_parts(call)
        if (
            name not in self.tool_names
            or name.startswith("_")
            or not callable(getattr(self.instance, name, None))
        ):
            return f"Error: unknown tool {name!r}"
        if err:
            return err
        try:
            with time_limit(self.call_timeout):
                out = getattr(self.instance, name)(**args)
        except CheckTimeout as exc:
            return f"Error: tool {name} timed out ({exc})"
        except Exception as exc:  # a tool's own error is an observation
            return f"Error: {type(exc).__name__}: {exc}"
        return to_text(out)

    def finish(self, answer: str | None = None) -> dict:
        checks = self.task.get("checks") or []
        if isinstance(checks, str):
            checks = json.loads(checks)
        if not checks:
            return {"reward": 0.0, "checks": [], "error": "task has an empty checklist"}
        final_state = json.loads(json.dumps(self.state(), default=str))
        results = []
        for c in checks:
            item = c.get("check_item", "")
            ns = {"initial_state": json.loads(json.dumps(self.initial_state))}
            passed, err = False, None
            try:
                with time_limit(self.check_timeout):
                    exec(compiled(c.get("check_func", ""), "<check>"), ns)
                    fn = ns.get("check_func")
                    if not callable(fn):
                        raise LookupError("no check_func defined")
                    out = fn(json.loads(json.dumps(final_state)))
                if isinstance(out, bool):
                    passed = out
                else:
                    err = f"non-bool result {type(out).__name__}"
            except CheckTimeout as exc:
                err = f"timeout: {exc}"
            except Exception as exc:
                err = f"{type(exc).__name__}: {exc}"
            results.append({"item": item, "passed": bool(passed), "error": err})
        reward = round(sum(r["passed"] for r in results) / len(results), 4)
        return {"reward": reward, "checks": results, "error": None}


RUNTIMES: dict[str, type[Runtime]] = {"envscaler": EnvScalerRuntime}


def register(kind: str):
    def deco(cls):
        RUNTIMES[kind] = cls
        return cls

    return deco


def make_runtime(spec: dict) -> Runtime:
    kind = spec.get("kind", "envscaler")
    if kind not in RUNTIMES:
        # runtimes of the package pools register on import

        importlib.import_module(f"envs.pools.{kind}")
    if kind not in RUNTIMES:
        raise LookupError(f"no runtime for pool kind {kind!r}")
    return RUNTIMES[kind](spec)


def run_actions(spec: dict, actions: list[dict], answer: str | None = None) -> dict:
    """Reset, run the actions in order (one turn per list for multi-turn pools), finish."""
    rt = make_runtime(spec)
    rt.reset()
    trace = []
    turns = actions if actions and isinstance(actions[0], list) else [actions]
    for j, turn in enumerate(turns):
        for a in turn:
            obs = rt.step(a)
            trace.append({"name": a.get("name"), "arguments": a.get("arguments"), "output": obs})
        if j < len(turns) - 1:
            rt.end_turn(None)
    res = rt.finish(answer)
    res["tool_calls"] = trace
    return res
