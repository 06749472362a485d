"""What the neural policy sees, as integer features (no torch here).

The policy reads only what a real agent is given: the instruction text, the environment's tool
schemas and the tool outputs it gets back. Words are hashed into a fixed vocabulary (so unseen
environments' words need no vocabulary rebuild); values that look like identifiers, numbers or
quoted names are embedded by *shape*, not by their text, so the policy learns to copy them by
position and context instead of memorising them.

Candidates are the values an argument can take: every instruction token and the leaf values of
recent tool outputs. An argument is a pointer to one candidate.
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass, field
from functools import lru_cache

VOCAB = 8192  # hashed word buckets
PAD, STOP = 0, 1  # reserved ids
SHAPES = ("pad", "word", "ident", "number", "quoted", "other")
SHAPE = {name: j for j, name in enumerate(SHAPES)}
MAX_INSTRUCTION = 64
MAX_OBS_VALUES = 24  # leaf values kept per tool output
MAX_OBS_WORDS = 24  # words of a tool output summarised for the recurrent state

_TOKEN = re.compile(r"'[^']*'|\"[^\"]*\"|[^\s]+")
_WORD = re.compile(r"[a-z]+")


@lru_cache(maxsize=262_144)
def word_id(text: str) -> int:
    """Hashed vocabulary id (>= 2) of a lowercased word."""
    return 2 + zlib.crc32(text.lower().encode()) % (VOCAB - 2)


def shape_of(text: str, quoted: bool = False) -> str:
    if quoted:
        return "quoted"
    if re.fullmatch(r"-?\d+(\.\d+)?", text):
        return "number"
    if re.fullmatch(r"[A-Za-z]+", text):
        return "word"
    if re.fullmatch(r"[A-Za-z0-9_\-]+", text) and re.search(r"\d|_|-", text):
        return "ident"
    return "other"


def token_ids(text: str, shape: str) -> int:
    """Embedding id: the word itself for plain words; the shape for values (copied, not read)."""
    if shape == "word":
        return word_id(text)
    return word_id(f"<{shape}>")


@lru_cache(maxsize=65_536)
def name_words(name: str) -> list[int]:
    """Hashed ids of the parts of a snake_case / camelCase name."""
    parts = re.findall(r"[a-z]+", re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower())
    return [word_id(p) for p in parts] or [word_id(name.lower())]


@dataclass(frozen=True)
class Candidate:
    text: str  # the value as the tool call passes it (before type conversion)
    word: int  # embedding id (shape token for values)
    shape: int
    source: int  # 0 = instruction, k >= 1 = output of the k-th action (1-based)
    key: int = PAD  # hashed key under which an output value appeared (instruction: previous word)
    position: int = 0  # instruction position (outputs: 0)


@dataclass
class Tool:
    name: str
    words: list[int]
    params: list[tuple[str, list[int], str]]  # (name, hashed name words, json type)


@dataclass
class EpisodeText:
    """The instruction as tokens + candidates, and the environment's tools."""

    tokens: list[int]
    shapes: list[int]
    candidates: list[Candidate]
    tools: list[Tool]
    n_instruction: int = 0
    outputs: list[list[int]] = field(default_factory=list)  # summarised output words per action


def instruction_candidates(instruction: str) -> tuple[list[int], list[int], list[Candidate]]:
    """Tokens, shape ids and candidates of an instruction: fresh lists (an episode appends to its
    own), the parse itself cached (every rollout of a group and every revisit reads the same text;
    candidates are never mutated)."""
    tokens, shapes, cands = _parse_instruction(instruction or "")
    return list(tokens), list(shapes), list(cands)


@lru_cache(maxsize=16_384)
def _parse_instruction(instruction: str) -> tuple[tuple[int, ...], tuple[int, ...], tuple[Candidate, ...]]:
    tokens, shapes, cands = [], [], []
    prev = PAD
    for j, m in enumerate(_TOKEN.finditer(instruction)):
        if j >= MAX_INSTRUCTION:
            break
        raw = m.group(0)
        quoted = raw[:1] in "'\"" and raw[-1:] == raw[:1] and len(raw) >= 2
        text = raw[1:-1] if quoted else raw.rstrip(".,;:!?")
        shape = shape_of(text, quoted)
        tid = token_ids(text, shape)
        tokens.append(tid)
        shapes.append(SHAPE[shape])
        cands.append(Candidate(text=text, word=tid, shape=SHAPE[shape], source=0, key=prev, position=j))
        prev = word_id(text) if shape == "word" else tid
    return tuple(tokens), tuple(shapes), tuple(cands)


def parse_tools(tools: list[dict]) -> list[Tool]:
    out = []
    for t in tools:
        fn = t.get("function", t)
        props = (fn.get("parameters") or {}).get("properties") or {}
        required = (fn.get("parameters") or {}).get("required") or []
        params = [(p, name_words(p), str((props.get(p) or {}).get("type", "string"))) for p in required]
        out.append(Tool(name=fn.get("name", ""), words=name_words(fn.get("name", "")), params=params))
    return out


def episode_text(instruction: str, tools: list[dict] | list[Tool]) -> EpisodeText:
    """``tools``: the schemas the environment returned at reset, or already parsed :class:`Tool` s."""
    tokens, shapes, cands = instruction_candidates(instruction)
    parsed = tools if tools and isinstance(tools[0], Tool) else parse_tools(tools)
    return EpisodeText(tokens=tokens, shapes=shapes, candidates=cands, tools=parsed, n_instruction=len(cands))


def _leaves(obj, key: str = "", out: list | None = None) -> list[tuple[str, object]]:
    out = [] if out is None else out
    if len(out) >= MAX_OBS_VALUES:
        return out
    if isinstance(obj, dict):
        for k, v in obj.items():
            _leaves(v, str(k), out)
    elif isinstance(obj, list):
        for v in obj:
            _leaves(v, key or "item", out)
    elif obj is not None and not isinstance(obj, bool):
        out.append((key or "value", obj))
    return out


def read_output(text: str, action: int) -> tuple[list[Candidate], list[int]]:
    """Candidates (leaf values) and summary words of one tool output. ``action`` is 1-based."""
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        obj = None
    cands = []
    if obj is not None and not isinstance(obj, (str, int, float)):
        for key, value in _leaves(obj):
            s = str(value)
            shape = shape_of(s)
            cands.append(
                Candidate(
                    text=s, word=token_ids(s, shape), shape=SHAPE[shape], source=action, key=word_id(key)
                )
            )
    words = []
    lowered = (text or "").lower()
    if lowered.startswith("error"):
        words.append(word_id("<error>"))
    if isinstance(obj, dict):  # booleans are the part of an output a branch depends on
        for k, v in obj.items():
            if isinstance(v, bool):
                words.append(word_id(f"{k}={'true' if v else 'false'}"))
    elif isinstance(obj, list):
        words.append(word_id("<list>" if obj else "<empty-list>"))
    words += [word_id(w) for w in _WORD.findall(lowered)[:MAX_OBS_WORDS]]
    return cands, words[:MAX_OBS_WORDS] or [word_id("<empty>")]


def convert(value: str, json_type: str):
    """A candidate's text as the argument type the schema asks for."""
    if json_type == "integer":
        try:
            return int(float(value))
        except ValueError:
            return value
    if json_type == "number":
        try:
            return float(value)
        except ValueError:
            return value
    return value
