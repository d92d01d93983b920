"""The watcher's HTTP endpoint: /metrics (Prometheus), /healthz (its own liveness), /verdict (promotion).

GET /verdict answers 200 only when the last full gate passed (exit status 0) and is younger than the
stated maximum age, else 503; the body is JSON either way: `passed`, `reason`, `exit_status`, `age_s`,
`max_age_s` and the full report (`report`, the same document as `kvgate check --format json`). Argo
Rollouts' `web` metric reads `$.passed`; a Flagger webhook (which POSTs) advances on 2xx only, so
POST /verdict answers as GET does.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kvgate.redact import redact

#: the largest webhook payload read (Flagger's is a few hundred bytes)
MAX_POST = 64 << 10


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: bytes


def json_answer(status: int, doc: Any) -> Answer:
    return Answer(status, "application/json", redact(json.dumps(doc, indent=2, default=str)).encode() + b"\n")


class Endpoint:
    """A threaded HTTP server in a daemon thread; `routes` maps a path to what answers it."""

    def __init__(self, host: str, port: int, routes: dict[str, Callable[[], Answer]]) -> None:
        self.routes = routes

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                route = routes.get(self.path.split("?", 1)[0])
                try:
                    ans = route() if route else json_answer(404, {"error": f"no such path; try {sorted(routes)}"})
                except Exception as exc:  # noqa: BLE001 - a broken route is a 500, never a 200
                    ans = json_answer(500, {"error": f"{type(exc).__name__}: {exc}"})
                self.send_response(ans.status)
                self.send_header("Content-Type", ans.content_type)
                self.send_header("Content-Length", str(len(ans.body)))
                self.end_headers()
                self.wfile.write(ans.body)

            def do_POST(self) -> None:  # noqa: N802 - Flagger's webhooks POST their payload
                length = self.headers.get("Content-Length", "0")
                n = int(length) if length.isdigit() else 0
                if n > MAX_POST:
                    self.send_error(413, "payload too large")
                    return
                self.rfile.read(n)  # the payload (canary name, phase) does not change the verdict
                if self.path.split("?", 1)[0] != "/verdict":
                    self.send_error(405, "only /verdict takes POST")
                    return
                self.do_GET()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet: scrapes are not news
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="kvgate-watch-http", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server.server_address[:2]
        return str(host), int(port)

    def start(self) -> Endpoint:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
