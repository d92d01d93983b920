"""Shared fixtures: a real loopback HTTP server that serves SGLang-shaped documents."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

import pytest


@dataclass
class Route:
    """What one path answers: a JSON document, or raw bytes with a status, or a delay first."""

    body: Any = None
    status: int = 200
    raw: bytes | None = None
    delay_s: float = 0.0


@dataclass
class PayloadServer:
    """A threaded HTTP server on 127.0.0.1; `routes` may be changed while it runs."""

    routes: dict[str, Route] = field(default_factory=dict)
    seen_headers: list[dict[str, str]] = field(default_factory=list)
    url: str = ""
    _server: ThreadingHTTPServer | None = None

    def start(self) -> "PayloadServer":
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                owner.seen_headers.append(dict(self.headers))
                route = owner.routes.get(self.path.split("?")[0])
                if route is None:
                    self.send_response(404)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(b'{"detail":"Not Found"}')
                    return
                if route.delay_s:
                    time.sleep(route.delay_s)
                data = route.raw if route.raw is not None else json.dumps(route.body).encode()
                try:
                    self.send_response(route.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()


@pytest.fixture
def payload_server() -> Iterator[Callable[..., PayloadServer]]:
    """Factory: `payload_server({"/server_info": Route(doc), ...})` -> a running server."""
    servers: list[PayloadServer] = []

    def make(routes: dict[str, Route] | None = None) -> PayloadServer:
        srv = PayloadServer(routes=dict(routes or {})).start()
        servers.append(srv)
        return srv

    yield make
    for s in servers:
        s.stop()


@pytest.fixture
def deployment() -> Iterator[Callable[..., Any]]:
    """Factory: `deployment(emulate=..., ...)` -> a started simulator deployment, stopped after the test."""
    from kvgate.sim.deploy import SimDeployment

    started: list[SimDeployment] = []

    def make(**kwargs: Any) -> SimDeployment:
        dep = SimDeployment(**kwargs).start()
        started.append(dep)
        return dep

    yield make
    for dep in started:
        dep.stop()
