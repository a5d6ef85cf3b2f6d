"""A fake LangSmith endpoint: takes the tracer's uploads so a test can see what a traced run sent."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any, ClassVar


class FakeLangSmith(BaseHTTPRequestHandler):
    """Takes LangSmith's uploads (``posts``: the request bodies) and answers its info request."""

    posts: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        self.posts.append(self.rfile.read(int(self.headers.get("content-length", 0))))
        self._json({})

    def do_GET(self) -> None:
        self._json({"batch_ingest_config": {}, "instance_flags": {}})

    def _json(self, body: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(body).encode())

    def log_message(self, *args: Any) -> None:
        pass
