"""LLM topology extraction through any OpenAI-compatible chat-completions endpoint.

Our own prompt asks for the *identifier-free* abstract topology of a task (operation categories,
entity count, constraints exercised, check types) as JSON. Answers are validated; 429, 5xx,
timeouts, connection errors and malformed answers are retried with exponential backoff; requests
run with bounded concurrency; every answer is cached on disk keyed by (task content hash, model,
prompt hash), so an interrupted run resumes and a re-run costs no request. A task whose answer
never validates falls back to the offline extractor (counted in ``usage``).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from envsched_pipeline.graph.topology import offline_topology
from envsched_pipeline.lake import atomic_write_bytes

CATEGORIES = (
    "lookup",
    "eligibility_check",
    "relation_replacement",
    "dependent_state_validation",
    "create",
    "update",
    "delete",
    "transfer",
    "notify",
)

SYSTEM_PROMPT = """You describe the abstract structure of tool-use tasks for an RL scheduler.
Return ONLY a JSON object, no prose, with these keys:
  "operations": list of operation categories the task needs, in order, each one of:
     lookup, eligibility_check, relation_replacement, dependent_state_validation, create, update,
     delete, transfer, notify, other
  "entity_count": integer, how many distinct entities the task changes or checks
  "constraints": list of short snake_case names of constraints exercised
     (e.g. conditional_branch, reference_by_attribute, capacity_limit, dependent_state)
  "check_types": list, one per verifier check, each one of: equality, inequality,
     membership_present, membership_absent, relative_arithmetic, growth, any_match, unchanged, other
Never include tool names, field names, identifiers, numbers from the task or domain words."""

USER_TEMPLATE = """Task instruction:
{instruction}

Verifier checks (description and code):
{checks}

Tools available in the environment: {tools}"""

PROMPT_SHA = hashlib.sha256((SYSTEM_PROMPT + USER_TEMPLATE).encode()).hexdigest()[:12]
_SNAKE = re.compile(r"^[a-z][a-z_]{0,40}$")


class MalformedAnswer(ValueError):
    pass


def validate_topology(text: str) -> dict:
    """Parse and validate one answer; raises MalformedAnswer with the reason."""
    m = re.search(r"\{.*\}", text or "", re.S)
    if not m:
        raise MalformedAnswer("no JSON object in the answer")
    try:
        obj = json.loads(m.group(0))
    except json.JSONDecodeError as exc:
        raise MalformedAnswer(f"invalid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise MalformedAnswer("answer is not a JSON object")
    ops = obj.get("operations")
    if not isinstance(ops, list) or not ops or not all(isinstance(o, str) for o in ops):
        raise MalformedAnswer("'operations' must be a non-empty list of strings")
    ops = [o.strip().lower() for o in ops]
    ops = [o if o in CATEGORIES else "other" for o in ops]
    count = obj.get("entity_count")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise MalformedAnswer("'entity_count' must be a non-negative integer")
    out = {"operations": sorted(set(ops)), "operation_sequence": ops, "entity_count": count}
    for key in ("constraints", "check_types"):
        val = obj.get(key, [])
        if not isinstance(val, list) or not all(isinstance(v, str) for v in val):
            raise MalformedAnswer(f"'{key}' must be a list of strings")
        # identifier-free: keep snake_case words only
        out[key] = sorted(v.strip().lower() for v in val if _SNAKE.match(v.strip().lower()))
    out["n_checks"] = len(out["check_types"])
    return out


class LLMTopologyExtractor:
    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str = "none",
        cache_dir: Path | None = None,
        concurrency: int = 4,
        max_attempts: int = 5,
        timeout: float = 30.0,
        backoff: float = 0.5,
        tools_by_env: dict[str, list[str]] | None = None,
    ):
        from openai import OpenAI  # the client library loads slowly; only a run that asks an LLM needs it

        self.client = OpenAI(base_url=base_url, api_key=api_key or "none", max_retries=0, timeout=timeout)
        self.model = model
        self.name = f"llm:{model}"
        self.prompt_sha = PROMPT_SHA
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.concurrency = max(1, int(concurrency))
        self.max_attempts = max(1, int(max_attempts))
        self.backoff = backoff
        self.tools_by_env = tools_by_env or {}
        self._lock = threading.Lock()
        self.usage = {
            "requests": 0,
            "retries": 0,
            "cache_hits": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "fallbacks": 0,
            "errors": {},
        }

    # ------------------------------------------------------------------ cache
    def _key(self, task: dict) -> str:
        blob = f"{task.get('content_hash') or task['task_id']}|{self.model}|{self.prompt_sha}"
        return hashlib.sha256(blob.encode()).hexdigest()[:24]

    def _cache_path(self, task: dict) -> Path | None:
        if self.cache_dir is None:
            return None
        return self.cache_dir / f"{self._key(task)}.json"

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.usage[key] += n

    def _error(self, kind: str) -> None:
        with self._lock:
            self.usage["errors"][kind] = self.usage["errors"].get(kind, 0) + 1

    # ------------------------------------------------------------------ one task
    def _messages(self, task: dict) -> list[dict]:
        checks = json.loads(task.get("checks") or "[]")
        lines = [f"- {c.get('check_item', '')}\n{c.get('check_func', '')}" for c in checks]
        tools = ", ".join(self.tools_by_env.get(task.get("env_id", ""), [])) or "(not listed)"
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {
                "role": "user",
                "content": USER_TEMPLATE.format(
                    instruction=task.get("instruction", ""), checks="\n".join(lines), tools=tools
                ),
            },
        ]

    def extract_one(self, task: dict) -> dict:
        import openai  # loaded by the client already (``__init__``); its error classes

        path = self._cache_path(task)
        if path is not None and path.exists():
            try:
                self._count("cache_hits")
                return json.loads(path.read_text())["topology"]
            except (json.JSONDecodeError, KeyError):
                path.unlink(missing_ok=True)
        last = "unknown"
        for attempt in range(self.max_attempts):
            if attempt:
                self._count("retries")
                time.sleep(self.backoff * (2 ** (attempt - 1)) * (0.5 + random.random()))
            try:
                self._count("requests")
                resp = self.client.chat.completions.create(
                    model=self.model, messages=self._messages(task), temperature=0.0
                )
                if resp.usage is not None:
                    self._count("prompt_tokens", int(resp.usage.prompt_tokens or 0))
                    self._count("completion_tokens", int(resp.usage.completion_tokens or 0))
                topo = validate_topology(resp.choices[0].message.content or "")
            except openai.RateLimitError:
                last = "rate_limited"
            except openai.APITimeoutError:
                last = "timeout"
            except openai.APIConnectionError:
                last = "connection"
            except openai.APIStatusError as exc:
                last = f"http_{exc.status_code}"
                if exc.status_code < 500 and exc.status_code not in (408, 409, 429):
                    self._error(last)
                    break  # a 4xx other than these will not heal with a retry
            except MalformedAnswer:
                last = "malformed"
            else:
                if path is not None:
                    atomic_write_bytes(
                        path,
                        json.dumps(
                            {
                                "task_id": task["task_id"],
                                "model": self.model,
                                "prompt_sha": self.prompt_sha,
                                "topology": topo,
                            }
                        ).encode(),
                    )
                return topo
            self._error(last)
        self._count("fallbacks")
        return offline_topology(task)

    # ------------------------------------------------------------------ many
    def extract(
        self, tasks: list[dict], progress: Callable[[str, int, int], None] | None = None
    ) -> dict[str, dict]:
        out: dict[str, dict] = {}
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            futs = {pool.submit(self.extract_one, t): t["task_id"] for t in tasks}
            for done, fut in enumerate(as_completed(futs), start=1):
                out[futs[fut]] = fut.result()
                if progress:
                    progress("topologies", done, len(tasks))
        return out
