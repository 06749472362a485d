"""Qwen3 chat format with tools: rendering and parsing (no torch).

Rendering follows Qwen3's template: a system turn listing the tools inside ``<tools></tools>``,
assistant turns that may hold ``<think>...</think>`` and ``<tool_call>{"name", "arguments"}</tool_call>``
blocks, and tool results returned inside a user turn as ``<tool_response>...</tool_response>``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

# Qwen3's special tokens, in id order from 151643 (the Qwen BPE has 151,643 mergeable tokens).
QWEN3_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
QWEN3_SPECIAL_START = 151643

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)
DEFAULT_SYSTEM = (
    "You are an agent operating a stateful service through tools. Use the tools to complete the "
    "user's request exactly, then reply with a short final answer and no tool call."
)


def render_system(tools: list[dict], system: str = DEFAULT_SYSTEM) -> str:
    body = system
    if tools:
        body += (
            "\n\n"
            + TOOLS_PREAMBLE
            + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
            + TOOLS_POSTAMBLE
        )
    return f"{IM_START}system\n{body}{IM_END}\n"


def render_user(content: str) -> str:
    return f"{IM_START}user\n{content}{IM_END}\n"


def render_tool_results(results: list[str]) -> str:
    inner = "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)
    return f"{IM_START}user\n{inner}{IM_END}\n"


def assistant_header() -> str:
    return f"{IM_START}assistant\n"


def render_assistant(content: str, tool_calls: list[dict] | None = None, think: str | None = None) -> str:
    parts = []
    if think is not None:
        parts.append(f"{THINK_OPEN}\n{think}\n{THINK_CLOSE}\n\n")
    parts.append(content)
    for c in tool_calls or []:
        parts.append(
            f"\n{TOOL_CALL_OPEN}\n{json.dumps({'name': c['name'], 'arguments': c.get('arguments', {})})}\n{TOOL_CALL_CLOSE}"
        )
    return "".join(parts)


@dataclass
class Parsed:
    think: str | None = None
    content: str = ""
    tool_calls: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


_CALL = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)(?:" + re.escape(TOOL_CALL_CLOSE) + r"|$)", re.S)


def parse_assistant(text: str) -> Parsed:
    """Split one assistant message into think / content / tool calls; malformed calls are
    reported in ``errors`` (they become error observations, not crashes)."""
    text = text.replace(IM_END, "").replace(ENDOFTEXT, "")
    out = Parsed()
    if THINK_OPEN in text:
        head, _, rest = text.partition(THINK_OPEN)
        think, closed, tail = rest.partition(THINK_CLOSE)
        out.think = think.strip()
        text = head + (tail if closed else "")
        if not closed:
            out.errors.append("unterminated <think> block")
    for m in _CALL.finditer(text):
        raw = m.group(1).strip()
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            out.errors.append(f"tool call is not valid JSON ({exc.msg})")
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            out.errors.append("tool call needs a string 'name'")
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                out.errors.append(f"arguments of {obj['name']} are not a JSON object")
                continue
        if not isinstance(args, dict):
            out.errors.append(f"arguments of {obj['name']} are not a JSON object")
            continue
        out.tool_calls.append({"name": obj["name"], "arguments": args})
    out.content = _CALL.sub("", text).strip()
    return out
