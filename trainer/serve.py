"""A small OpenAI-compatible server for a local Qwen3 checkpoint (or the tiny random-init one).

    python -m trainer.serve --port 8000 [--model-path DIR] [--model-name NAME]

``POST /v1/chat/completions`` (messages, tools, max_tokens, temperature, seed) renders the
conversation with Qwen3's chat template (tools in the system turn, tool results as
``<tool_response>`` user turns), generates with transformers, and returns the assistant message
with parsed ``tool_calls``; ``GET /v1/models`` lists the model. It exists so that the ``openai``
policy (rollouts from any OpenAI-compatible server: vLLM, SGLang, TGI) is tested end to end on a
CPU against a real HTTP server, and to serve a checkpoint of a run for evaluation.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from trainer import chat
from trainer.engines import HFEngine
from trainer.model import load_policy, qwen3_tokenizer


def render_conversation(messages: list[dict], tools: list[dict] | None) -> str:
    """OpenAI chat messages -> Qwen3 prompt text ending with the assistant header."""
    system = next(
        (m.get("content") or "" for m in messages if m.get("role") == "system"), chat.DEFAULT_SYSTEM
    )
    text = chat.render_system(tools or [], system)
    for m in messages:
        role, content = m.get("role"), m.get("content") or ""
        if role == "user":
            text += chat.render_user(content)
        elif role == "tool":
            text += chat.render_tool_results([content])
        elif role == "assistant":
            calls = [
                {
                    "name": c["function"]["name"],
                    "arguments": json.loads(c["function"].get("arguments") or "{}"),
                }
                for c in m.get("tool_calls") or []
            ]
            text += chat.assistant_header() + chat.render_assistant(content, calls) + chat.IM_END + "\n"
    return text + chat.assistant_header()


class Model:
    def __init__(self, model_path: str | None, name: str, seed: int = 0):
        self.tok = qwen3_tokenizer()
        self.model = load_policy(model_path, seed=seed)
        self.engine = HFEngine(self.model, self.tok)
        self.name = name
        self.lock = threading.Lock()

    def complete(self, body: dict) -> dict:
        prompt = render_conversation(body.get("messages") or [], body.get("tools"))
        ids = self.tok.encode(prompt, add_special_tokens=False)
        max_new = int(body.get("max_tokens") or body.get("max_completion_tokens") or 128)
        with self.lock:
            if body.get("seed") is not None:
                torch.manual_seed(int(body["seed"]))
            out = self.engine.generate([ids], max_new, float(body.get("temperature", 1.0)))[0]
        text = self.tok.decode(out, skip_special_tokens=False)
        parsed = chat.parse_assistant(text)
        calls = [
            {
                "id": f"call_{uuid.uuid4().hex[:12]}",
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c.get("arguments", {}))},
            }
            for c in parsed.tool_calls
        ]
        message = {"role": "assistant", "content": parsed.content}
        if calls:
            message["tool_calls"] = calls
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:16]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.name,
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {
                "prompt_tokens": len(ids),
                "completion_tokens": len(out),
                "total_tokens": len(ids) + len(out),
            },
        }


def make_server(model: Model, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 - http.server's naming
            if self.path.rstrip("/").endswith("/models"):
                self._send(200, {"object": "list", "data": [{"id": model.name, "object": "model"}]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self):  # noqa: N802
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            except json.JSONDecodeError as exc:
                self._send(400, {"error": {"message": f"invalid JSON: {exc}"}})
                return
            try:
                self._send(200, model.complete(body))
            except Exception as exc:  # noqa: BLE001 - an error answer, never a dead server
                self._send(500, {"error": {"message": f"{type(exc).__name__}: {exc}"}})

        def log_message(self, *args):  # quiet
            pass

    return ThreadingHTTPServer((host, port), Handler)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.serve", description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument(
        "--model-path", default=None, help="local Qwen3 checkpoint (default: the tiny random-init one)"
    )
    ap.add_argument("--model-name", default="tiny")
    args = ap.parse_args(argv)
    server = make_server(Model(args.model_path, args.model_name), args.host, args.port)
    print(f"serving {args.model_name} on http://{args.host}:{server.server_address[1]}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
