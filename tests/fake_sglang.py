"""A stand-in for `python -m sglang.launch_server`, so that scripts/gpu-tau2.sh's start path is tested.

`fake_sglang.py -m sglang.launch_server --port N ...` writes what it was started with (its flags,
pid, process group, start time) to `$FAKE_SGLANG_RECORD/N.json`, then serves on 127.0.0.1:N:
`GET /health`, `GET /v1/models`, and `POST /v1/chat/completions` answering "Done." — or, to a
request with a JSON schema (a verifier's), a verdict accepting every step. With
`FAKE_SGLANG_DIE=N` the server on port N exits at once instead, as one that runs out of memory.
Standard library only: it must start in a blink.
"""

from __future__ import annotations

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Handler(BaseHTTPRequestHandler):
    model = "fake"  # the served model's name: set on the subclass `main` makes

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the script keeps the server's log, and it need not hold every request."""

    def _send(self, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send({})
        elif self.path == "/v1/models":
            self._send({"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "fake"}]})
        else:
            self.send_error(404)

    def do_POST(self) -> None:
        if self.path != "/v1/chat/completions":
            self.send_error(404)
            return
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        content = "Done."
        response_format = request.get("response_format") or {}
        if response_format.get("type") == "json_schema":
            properties = response_format["json_schema"]["schema"]["properties"]
            verdict: dict[str, Any] = {key: None for key in properties}
            verdict.update(reason="fine", accepted_steps=properties["accepted_steps"]["maximum"])
            content = json.dumps(verdict)
        self._send(
            {
                "id": "fake-1",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": request.get("model", self.model),
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105},
            }
        )


def main(argv: list[str]) -> int:
    flags = argv[2:]  # after `-m sglang.launch_server`
    port = int(flags[flags.index("--port") + 1])
    handler = type("Served", (Handler,), {"model": flags[flags.index("--model-path") + 1]})
    record = {"flags": flags, "pid": os.getpid(), "pgid": os.getpgid(0), "started": time.monotonic()}
    with open(os.path.join(os.environ["FAKE_SGLANG_RECORD"], f"{port}.json"), "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    if os.environ.get("FAKE_SGLANG_DIE") == str(port):
        print("fake sglang: CUDA out of memory", file=sys.stderr)
        return 1
    ThreadingHTTPServer(("127.0.0.1", port), handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
