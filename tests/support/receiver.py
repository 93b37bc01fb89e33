"""A real HTTP server standing in for a commit-status API (GitHub's or GitLab's)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """Records every POST (headers, JSON body, path) and answers with the next status of
    `answers` (the last one repeats; 201 by default)."""

    def __init__(self, answers: tuple[int, ...] = (201,)) -> None:
        self.calls: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.paths: list[str] = []
        self.answers = list(answers)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers.get("content-length", 0))
                outer.calls.append((dict(self.headers), json.loads(self.rfile.read(n))))
                outer.paths.append(self.path)
                status = outer.answers.pop(0) if len(outer.answers) > 1 else outer.answers[0]
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def settled(
        self, n: int = 1, timeout_s: float = 30.0, quiet_s: float = 2.0
    ) -> list[tuple[dict[str, str], dict[str, Any]]]:
        """The calls once at least `n` came (or `timeout_s` passed) and `quiet_s` more went
        by: what "sent once" is checked on (a repeat would come within that spell)."""
        deadline = time.monotonic() + timeout_s
        while len(self.calls) < n and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(quiet_s)
        return list(self.calls)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
