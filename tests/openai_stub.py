"""A real HTTP server on 127.0.0.1 speaking the OpenAI chat-completions API, for the topology tests.

It answers canned topologies (derived from keywords of the task in the prompt) and injects faults
from a script: ``429``, ``500``, ``slow`` (sleeps past the client's timeout), ``malformed`` (not
JSON), ``badschema`` (JSON without the required keys). Every request is recorded.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

KEYWORDS = [
    ("Retire", "delete"),
    ("Register a new", "create"),
    ("Move ", "update"),
    ("Hand ", "relation_replacement"),
    ("eligible", "eligibility_check"),
    ("Shift ", "transfer"),
    ("Apply a", "dependent_state_validation"),
    ("Send ", "notify"),
    ("named", "lookup"),
]


def canned_topology(prompt: str) -> dict:
    ops = [op for kw, op in KEYWORDS if kw in prompt] or ["other"]
    return {
        "operations": ops,
        "entity_count": 2,
        "constraints": ["conditional_branch"] if "otherwise" in prompt else [],
        "check_types": ["equality"],
    }


class StubOpenAI:
    def __init__(self, script: list[str] | None = None, slow_seconds: float = 3.0):
        self.script = list(script or [])
        self.slow_seconds = slow_seconds
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def _send(self, code: int, body: bytes, ctype="application/json", headers=None):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(body)
                except BrokenPipeError:
                    pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                req = json.loads(self.rfile.read(length) or b"{}")
                with stub.lock:
                    stub.requests.append(req)
                    action = stub.script.pop(0) if stub.script else "ok"
                if not self.path.endswith("/chat/completions"):
                    return self._send(404, b'{"error": {"message": "not found"}}')
                if action == "429":
                    return self._send(
                        429,
                        b'{"error": {"message": "rate limited", "type": "rate_limit"}}',
                        headers={"Retry-After": "0"},
                    )
                if action == "500":
                    return self._send(500, b'{"error": {"message": "boom", "type": "server_error"}}')
                if action == "slow":
                    time.sleep(stub.slow_seconds)
                prompt = " ".join(
                    m.get("content", "") for m in req.get("messages", []) if m.get("role") == "user"
                )
                if action == "malformed":
                    content = "Sure! Here is the topology: operations are lookup and update."
                elif action == "badschema":
                    content = json.dumps({"ops": ["lookup"]})
                else:
                    content = json.dumps(canned_topology(prompt))
                body = {
                    "id": "chatcmpl-stub",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": req.get("model", "stub"),
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": content},
                        }
                    ],
                    "usage": {
                        "prompt_tokens": len(prompt.split()),
                        "completion_tokens": len(content.split()),
                        "total_tokens": len(prompt.split()) + len(content.split()),
                    },
                }
                return self._send(200, json.dumps(body).encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
