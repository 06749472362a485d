"""Six TF-IDF views of each task for within-environment similarity (docs/algorithm.md, the graph):
instruction text, check descriptions, check code tokens, initial state as path=value tokens, the
tools the task mentions, and the state keys its checks read."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

import numpy as np
import scipy.sparse as sp

from envsched_pipeline.graph.topology import SUBSCRIPT, instruction_operations, op_category

VIEWS = ("instruction", "check_text", "check_code", "init_state", "tools", "footprint")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|==|!=|<=|>=|[<>+\-*/%]|\bnot\b|\bin\b")
_PY_NOISE = {"def", "check_func", "final_state", "return", "initial_state", "get", "len"}


# ----------------------------------------------------------------------------- views
def _flatten(obj, prefix: str = "") -> Iterable[str]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, list):
        for v in obj[:20]:
            yield from _flatten(v, prefix + "[]")
    else:
        yield f"{prefix}={obj}"


def _path_token(tok: str) -> str:
    # path=value tokens keep the *shape* of the state: ids inside paths are collapsed
    return re.sub(r"[^A-Za-z=._\[\]]+", "#", tok)


def task_views(task: dict, tool_names: list[str]) -> dict[str, str]:
    """Six text views of one task (lake ``tasks`` row with json columns)."""
    checks = json.loads(task.get("checks") or "[]")
    init = json.loads(task.get("init_state") or "{}")
    instruction = task.get("instruction") or ""
    check_text = " ".join(str(c.get("check_item", "")) for c in checks)
    code = " ".join(str(c.get("check_func", "")) for c in checks)
    code_tokens = [t for t in _IDENT.findall(code) if t not in _PY_NOISE]
    haystack = instruction + " " + check_text + " " + code
    # tools the instruction asks for (by operation category) or names; never its gold actions
    ops = set(instruction_operations(instruction))
    tools = [t for t in tool_names if t in haystack or op_category(t) in ops]
    footprint = sorted({k for k in SUBSCRIPT.findall(code) if not re.search(r"\d", k)})
    return {
        "instruction": instruction,
        "check_text": check_text,
        "check_code": " ".join(code_tokens),
        "init_state": " ".join(_path_token(t) for t in _flatten(init)),
        "tools": " ".join(tools),
        "footprint": " ".join(footprint),
    }


def view_matrices(tasks: list[dict], tool_names_by_env: dict[str, list[str]]) -> dict[str, sp.csr_matrix]:
    """TF-IDF matrix (rows = tasks, L2-normalized) for each of the six views that has text."""
    from sklearn.feature_extraction.text import TfidfVectorizer  # slow to load; graph builds only

    views = [task_views(t, tool_names_by_env.get(t["env_id"], [])) for t in tasks]
    mats = {}
    for v in VIEWS:
        docs = [x[v] for x in views]
        if not any(d.strip() for d in docs):
            continue
        vec = TfidfVectorizer(
            token_pattern=r"[^\s]+", sublinear_tf=True, lowercase=True, min_df=1, dtype=np.float32
        )
        mats[v] = vec.fit_transform(docs).tocsr()
    return mats
