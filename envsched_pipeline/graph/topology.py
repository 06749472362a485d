"""Abstract task topologies for cross-environment similarity (docs/algorithm.md, the graph): what a
task does with tool names, field names and identifiers removed. The offline extractor here uses
only what an LLM extractor is given (instruction, tool schemas, checks as text): never the gold
actions, which on the synthetic pool are the generator's answer key."""

from __future__ import annotations

import json
import re

import numpy as np
import scipy.sparse as sp

SUBSCRIPT = re.compile(r"\[\s*\"([^\"]+)\"\s*\]")  # state keys read by check code

# Tool-name verbs -> abstract operation categories (identifier-free).
OP_VERBS = [
    ("eligibility_check", ("eligib", "can_", "validate", "verify", "check_")),
    (
        "relation_replacement",
        ("assign", "release", "reassign", "swap", "replace", "link", "unlink", "transfer_owner"),
    ),
    ("transfer", ("transfer", "move_", "shift")),
    ("notify", ("notify", "send", "message", "email", "alert")),
    ("create", ("create", "add_", "register", "book_", "new_", "insert")),
    ("delete", ("delete", "remove", "cancel", "retire", "drop")),
    ("dependent_state_validation", ("charge", "pay", "refund", "fee", "balance", "debit", "credit")),
    ("update", ("update", "set_", "modify", "change", "edit", "rename")),
    ("lookup", ("get_", "list_", "find", "search", "lookup", "query", "read")),
]
CHECK_TYPES = [
    ("membership_absent", re.compile(r"\bnot in\b")),
    ("membership_present", re.compile(r"(?<!not )\bin final_state")),
    ("relative_arithmetic", re.compile(r"initial_state[^\n]*[+\-]\s*\d")),
    ("growth", re.compile(r"len\(.*\)\s*>\s*len\(")),
    ("any_match", re.compile(r"\bany\(")),
    ("unchanged", re.compile(r"==\s*initial_state\[[^\n]*\]\s*$", re.M)),
    ("inequality", re.compile(r"!=")),
    ("equality", re.compile(r"==\s*[\"'\d]")),
]


def op_category(tool_name: str) -> str | None:
    """Abstract operation category of a tool *name* (used by the simulator's ground truth, which may
    read gold actions; the scheduler's topologies below never do)."""
    n = tool_name.lower()
    for cat, verbs in OP_VERBS:
        if any(v in n for v in verbs):
            return cat
    return None


# Instruction phrasing -> operation categories: common English verbs of service requests, the way
# an LLM extractor reads an instruction. Checked per sentence, in order (a sentence may name several).
INSTRUCTION_OPS = [
    ("lookup", re.compile(r"\bnamed\b|\bfind\b|\blook up\b|\bsearch\b|\bwhich\b")),
    ("eligibility_check", re.compile(r"\beligib|\ballowed\b|\bpermitted\b|\bqualif|\bif\b.*\bcan\b")),
    (
        "relation_replacement",
        re.compile(r"\bhand\b.*\bover\b|\bassign|\bgive\b|\bswap\b|\breplace\b|\bhand over\b"),
    ),
    ("transfer", re.compile(r"\bshift\b|\bmove\b.*\bfrom\b.*\bto\b|\btransfer\b")),
    ("notify", re.compile(r"\bsend\b|\bnotify\b|\bnote\b|\bmessage\b|\bemail\b|\btell\b|\binform\b")),
    ("create", re.compile(r"\bregister\b|\bcreate\b|\bnew\b|\badd\b|\bopen a\b")),
    ("delete", re.compile(r"\bdelete\b|\bremove\b|\bretire\b|\bcancel\b|\bdrop\b|\bdiscard\b")),
    (
        "dependent_state_validation",
        re.compile(r"\bfee\b|_fee\b|\bcharge\b|\bpay\b|\brefund\b|\bbalance\b|\bdeposit\b"),
    ),
    ("update", re.compile(r"\bmove\b|\bchange\b|\bset\b|\bupdate\b|\brename\b|\bedit\b|\bmodify\b")),
]
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def instruction_operations(instruction: str) -> list[str]:
    """Operation categories named by each sentence of the instruction, in order."""
    ops: list[str] = []
    for sentence in _SENTENCE.split((instruction or "").lower()):
        found = [cat for cat, pat in INSTRUCTION_OPS if pat.search(sentence)]
        if "transfer" in found and "update" in found:
            found.remove("update")  # "move N from A to B" is a transfer, not an edit
        ops += found
    return ops


def offline_topology(task: dict) -> dict:
    """Identifier-free abstract topology of a task from its instruction and checks (no LLM).

    Same schema as the LLM extractor: operation categories, entity count, constraints, check types.
    It reads only what an LLM extractor is given; never the gold actions (on the synthetic pool
    they are the generator's answer key).
    """
    checks = json.loads(task.get("checks") or "[]")
    instruction = (task.get("instruction") or "").lower()
    ops = instruction_operations(instruction)
    code = "\n".join(str(c.get("check_func", "")) for c in checks)
    ids = set()
    for k in SUBSCRIPT.findall(code):
        if re.search(r"\d", k):
            ids.add(k)
    constraints = []
    if re.search(r"\bif\b.*\b(otherwise|else)\b", instruction):
        constraints.append("conditional_branch")
    if re.search(r"\bnamed\b|\bcalled\b.*\bfind\b", instruction) or "lookup" in ops:
        constraints.append("reference_by_attribute")
    if "consistent" in instruction or "reflect" in instruction:
        constraints.append("dependent_state")
    check_types = []
    for c in checks:
        f = str(c.get("check_func", ""))
        for name, pat in CHECK_TYPES:
            if pat.search(f):
                check_types.append(name)
                break
        else:
            check_types.append("other")
    return {
        "operations": sorted(set(ops)),
        "operation_sequence": ops,
        "entity_count": len(ids),
        "constraints": sorted(set(constraints)),
        "check_types": sorted(check_types),
        "n_checks": len(checks),
    }


def topology_text(topo: dict) -> str:
    """Tokens for the cross-environment TF-IDF: categories, bigrams of the operation sequence,
    entity-count bucket, constraints and check types (counts repeated)."""
    ops = topo.get("operations", [])
    seq = topo.get("operation_sequence", ops)
    toks = [f"op_{o}" for o in ops]
    toks += [f"seq_{a}__{b}" for a, b in zip(seq, seq[1:], strict=False)]
    toks.append(f"entities_{min(int(topo.get('entity_count', 0)), 6)}")
    toks += [f"constraint_{c}" for c in topo.get("constraints", [])]
    toks += [f"check_{c}" for c in topo.get("check_types", [])]
    return " ".join(toks)


def topology_matrix(topo_docs: list[str]) -> sp.csr_matrix | None:
    if not any(d.strip() for d in topo_docs):
        return None
    from sklearn.feature_extraction.text import TfidfVectorizer  # slow to load; graph builds only

    vec = TfidfVectorizer(token_pattern=r"[^\s]+", sublinear_tf=True, lowercase=False, dtype=np.float32)
    return vec.fit_transform(topo_docs).tocsr()
