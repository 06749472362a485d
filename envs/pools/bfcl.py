"""BFCL multi-turn pool (bfcl-eval package): base, miss_func, miss_param, long_context (800 tasks).

Environments are the executable API classes (a task's environment is the class most of its
ground-truth calls belong to). The verifier is the package's official multi-turn checker (state
checker + response checker per turn). The checker caches class instances in a module global keyed
by model name: every rollout gets a unique model name and its cache entries are removed after.
``dense`` adds a partial-credit reward: mean of (official pass, fraction of ground-truth calls made).
"""

from __future__ import annotations

import ast
import copy
import importlib
import json
import uuid
from functools import lru_cache
from pathlib import Path

from envs.registry import PoolData
from envs.runtime import Runtime, call_parts, register, time_limit, to_text

CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
MISSED_TURN_MESSAGE = "I have added new functions you can use: {names}. Please continue with the task."


def _root() -> Path:
    import bfcl_eval  # optional pool package, installed --no-deps; loaded when this pool is used

    return Path(bfcl_eval.__file__).parent


@lru_cache(maxsize=1)
def _func_docs() -> dict[str, list[dict]]:
    from bfcl_eval.constants.executable_backend_config import (  # optional package
        MULTI_TURN_FUNC_DOC_FILE_MAPPING,  # optional package
    )

    out = {}
    for cls, fname in MULTI_TURN_FUNC_DOC_FILE_MAPPING.items():
        path = _root() / "data" / "multi_turn_func_doc" / fname
        if path.exists():
            out[cls] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def _openai_tool(doc: dict) -> dict:
    def fix(schema):
        if isinstance(schema, dict):
            schema = {k: fix(v) for k, v in schema.items()}
            if schema.get("type") == "dict":
                schema["type"] = "object"
            if schema.get("type") == "float":
                schema["type"] = "number"
            if schema.get("type") == "tuple":
                schema["type"] = "array"
            if schema.get("type") == "any":
                schema.pop("type")
        elif isinstance(schema, list):
            return [fix(v) for v in schema]
        return schema

    return {
        "type": "function",
        "function": {
            "name": doc["name"],
            "description": doc.get("description", ""),
            "parameters": fix(doc.get("parameters", {"type": "object", "properties": {}})),
        },
    }


def parse_call(text: str) -> dict:
    """``"mv(source='a', destination='b')"`` -> {"name": "mv", "arguments": {...}}."""
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call):
        raise ValueError(f"not a call: {text}")
    name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
    args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
    if node.args:  # positional arguments: map onto the doc's parameter order
        params = []
        for docs in _func_docs().values():
            for d in docs:
                if d["name"] == name:
                    params = list(d.get("parameters", {}).get("properties", {}))
        for p, v in zip(params, node.args, strict=False):
            args[p] = ast.literal_eval(v)
    return {"name": name, "arguments": args}


def format_call(call: dict) -> str:
    args = ",".join(f"{k}={v!r}" for k, v in (call.get("arguments") or {}).items())
    return f"{call['name']}({args})"


def _entries(category: str) -> tuple[list[dict], dict[str, list]]:
    data = [
        json.loads(x)
        for x in (_root() / "data" / f"BFCL_v4_{category}.json").read_text().splitlines()
        if x.strip()
    ]
    gt = {}
    for x in (_root() / "data" / "possible_answer" / f"BFCL_v4_{category}.json").read_text().splitlines():
        if x.strip():
            r = json.loads(x)
            gt[r["id"]] = r["ground_truth"]
    return data, gt


def _primary_class(entry: dict, ground_truth: list[list[str]]) -> str:
    docs = _func_docs()
    counts = {c: 0 for c in entry["involved_classes"]}
    for turn in ground_truth:
        for call in turn:
            name = call.split("(")[0]
            for c in counts:
                if any(d["name"] == name for d in docs.get(c, [])):
                    counts[c] += 1
    return max(counts, key=lambda c: (counts[c], c == entry["involved_classes"][0]))


def load(name: str = "bfcl", categories: tuple[str, ...] = CATEGORIES) -> PoolData:
    tasks, envs = [], {}
    for cat in categories:
        data, gt = _entries(cat)
        for e in data:
            truth = gt[e["id"]]
            env_id = _primary_class(e, truth)
            first = " ".join(m["content"] for m in e["question"][0] if m.get("role") == "user")
            gold = [[parse_call(c) for c in turn] for turn in truth]
            tasks.append(
                {
                    "pool": name,
                    "task_id": e["id"],
                    "env_id": env_id,
                    "content_hash": f"bfcl:{e['id']}",
                    "instruction": first,
                    "init_state": json.dumps(e["initial_config"], sort_keys=True),
                    "checks": json.dumps(
                        [
                            {
                                "check_item": f"turn {j}: state and responses match the ground truth",
                                "check_func": "; ".join(turn),
                            }
                            for j, turn in enumerate(truth)
                        ]
                    ),
                    "gold": json.dumps(gold),
                    "class_name": ",".join(e["involved_classes"]),
                    "entry": json.dumps(e),
                    "ground_truth": json.dumps(truth),
                }
            )
            envs.setdefault(env_id, None)
    docs = _func_docs()
    env_rows = [
        {
            "pool": name,
            "env_id": c,
            "summary": f"BFCL executable API class {c}",
            "introduction": (docs.get(c, [{}])[0].get("description", "")[:300]),
            "rules": "",
            "tools": json.dumps([_openai_tool(d) for d in docs.get(c, [])]),
            "class_name": c,
            "code": "",
            "code_sha": "",
        }
        for c in sorted(envs)
    ]
    return PoolData(name=name, environments=env_rows, tasks=tasks)


# imported by a sandbox worker before it forks a process per environment (envs/sandbox.py)
PRELOAD = (
    "bfcl_eval.constants.executable_backend_config",
    "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker",
    "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils",
)


@register("bfcl")
class BFCLRuntime(Runtime):
    def __init__(self, spec: dict):
        self.task = spec["task"]
        self.entry = json.loads(self.task["entry"])
        self.truth = json.loads(self.task["ground_truth"])
        self.dense = bool(spec.get("dense", False))
        self.call_timeout = float(spec.get("call_timeout", 5.0))
        self.check_timeout = max(30.0, float(spec.get("check_timeout", 5.0)))
        self.turn = 0
        self.calls: list[list[str]] = [[]]
        self.instances: dict[str, object] = {}
        self.methods: dict[str, object] = {}

    def _tools_for_turn(self) -> list[dict]:
        missed = self.entry.get("missed_function", {}) or {}
        hidden = {f for t, names in missed.items() if int(t) > self.turn for f in names}
        excluded = {f.split(".")[-1] for f in self.entry.get("excluded_function", []) or []}
        docs = _func_docs()
        out = []
        for c in self.entry["involved_classes"]:
            for d in docs.get(c, []):
                if d["name"] not in hidden and d["name"] not in excluded:
                    out.append(_openai_tool(d))
        return out

    def reset(self) -> dict:

        from bfcl_eval.constants.executable_backend_config import (  # optional
            CLASS_FILE_PATH_MAPPING,
            STATELESS_CLASSES,
        )

        long_context = "long_context" in self.entry["id"]
        for c in self.entry["involved_classes"]:
            inst = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[c]), c)()
            if c not in STATELESS_CLASSES:
                inst._load_scenario(
                    copy.deepcopy(self.entry["initial_config"].get(c, {})), long_context=long_context
                )
            self.instances[c] = inst
            for m in dir(inst):
                if not m.startswith("_") and callable(getattr(inst, m)):
                    self.methods[m] = getattr(inst, m)
        return {"observation": self._question(0), "tools": self._tools_for_turn()}

    def _question(self, turn: int) -> str:
        msgs = self.entry["question"][turn] if turn < len(self.entry["question"]) else []
        text = " ".join(m["content"] for m in msgs if m.get("role") == "user")
        if not text:
            names = (self.entry.get("missed_function", {}) or {}).get(str(turn), [])
            text = MISSED_TURN_MESSAGE.format(names=", ".join(names)) if names else "Please continue."
        return text

    def step(self, call: dict) -> str:
        name, args, err = call_parts(call)
        if err:
            return err
        allowed = {t["function"]["name"] for t in self._tools_for_turn()}
        if name not in allowed or name not in self.methods:
            return f"Error: unknown tool {name!r}"
        self.calls[self.turn].append(format_call({"name": name, "arguments": args}))
        try:
            with time_limit(self.call_timeout):
                return to_text(self.methods[name](**args))
        except Exception as exc:
            return f"Error: {type(exc).__name__}: {exc}"

    def end_turn(self, answer: str | None) -> str | None:
        if self.turn + 1 >= len(self.truth):
            return None
        self.turn += 1
        self.calls.append([])
        return self._question(self.turn)

    def finish(self, answer: str | None = None) -> dict:
        from bfcl_eval.eval_checker.multi_turn_eval import (  # optional package
            multi_turn_checker as checker_mod,  # optional package
        )
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils  # optional package

        while len(self.calls) < len(self.truth):  # turns the policy never reached
            self.calls.append([])
        decoded = [[[c] for c in turn] for turn in self.calls[: len(self.truth)]]
        model_name = f"envsched_{uuid.uuid4().hex[:12]}"
        err = None
        try:
            with time_limit(self.check_timeout):
                res = checker_mod.multi_turn_checker(
                    decoded, self.truth, self.entry, self.entry["id"].rsplit("_", 1)[0], model_name
                )
            valid = bool(res.get("valid"))
            if not valid:
                err = None  # a failed check is a task outcome, not an error
        except Exception as exc:
            valid, err = False, f"{type(exc).__name__}: {exc}"
        finally:
            for k in [k for k in vars(multi_turn_utils) if model_name in k]:
                delattr(multi_turn_utils, k)
        made = [c for turn in self.calls for c in turn]
        want = [c for turn in self.truth for c in turn]
        norm = lambda c: c.replace(" ", "").replace('"', "'")  # noqa: E731
        made_n = [norm(c) for c in made]
        hit = sum(1 for c in want if norm(c) in made_n)
        call_match = hit / len(want) if want else 1.0
        reward = (0.5 * float(valid) + 0.5 * call_match) if self.dense else float(valid)
        checks = [
            {"item": "official multi-turn checker", "passed": valid, "error": err},
            {
                "item": f"ground-truth calls made ({hit}/{len(want)})",
                "passed": call_match >= 1.0,
                "error": None,
            },
        ]
        return {"reward": round(reward, 4), "checks": checks, "error": err}
