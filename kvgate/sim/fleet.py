"""`python -m kvgate.sim fleet --spec FILE`: many metadata-only simulated workers in one process.

A full simulated worker (`worker.py`) is a process with numpy, FastAPI and a real KV pool; a fleet of
64 or 512 of them would cost minutes of CPU and gigabytes just to start. What fleet-level checks
need from a worker is its metadata surface and its health, so this host serves, for every worker of
the spec, on that worker's own port: `/server_info` (`/get_server_info`), `/model_info`
(`/get_model_info`), `/v1/models`, `/health`, `/health_generate` and (0.5.20+) `/ready`, with the
same documents as the full worker (`surface.py`). STUB for everything else: `/generate` and the
OpenAI routes answer 501, so a probe sent to a light fleet fails loudly instead of passing.

Simulator-only controls: `--metadata-delay-s` delays every metadata answer (a busy or distant
worker), and `POST /sim/health {"healthy": false}` on a worker's port makes its `/health` answer 503
from then on (to watch the router mark it failed).

The spec is JSON: `{"metadata_delay_s": 0.0, "workers": [{WorkerConfig fields: mode, port,
disaggregation_bootstrap_port, context_length, max_total_tokens, page_size, emulate, ...}]}`.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from kvgate.sim import surface
from kvgate.sim.config import WorkerConfig
from kvgate.sim.lifecycle import run_until_signalled
from kvgate.sim.releases import SimRelease, get_release

METADATA_PATHS = ("/server_info", "/get_server_info", "/model_info", "/get_model_info", "/v1/models")
MAX_HEADER_BYTES = 65536


@dataclass
class LightWorker:
    """One metadata-only worker: its config, release, sized pool and health switch."""

    cfg: WorkerConfig
    release: SimRelease
    started: float = field(default_factory=time.time)
    healthy: bool = True

    @property
    def pool_tokens(self) -> int:
        return surface.pool_capacity(self.cfg.max_total_tokens or WorkerConfig.DEFAULT_POOL, self.cfg.page_size)

    def answer(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        """(status, JSON document or None) for one request."""
        if method == "GET" and path in ("/server_info", "/get_server_info"):
            return 200, surface.server_info(self.cfg, self.release, pool_tokens=self.pool_tokens, started=self.started)
        if method == "GET" and path in ("/model_info", "/get_model_info"):
            return 200, surface.model_info(self.cfg, self.release)
        if method == "GET" and path == "/v1/models":
            return 200, surface.v1_models(self.cfg, self.started)
        if method == "GET" and path in ("/health", "/health_generate"):
            return (200, None) if self.healthy else (503, None)
        if method == "GET" and path == "/ready" and self.release.has_ready_endpoint:
            return (200, None) if self.healthy else (503, None)
        if method == "POST" and path == "/sim/health":
            self.healthy = bool(json.loads(body or b"{}").get("healthy", True))
            return 200, {"healthy": self.healthy}
        if path in ("/generate", "/v1/completions", "/v1/chat/completions"):
            return 501, {
                "object": "error",
                "code": 501,
                "type": "NotImplemented",
                "message": "kvgate sim fleet serves worker metadata only (STUB): no generation",
            }
        return 404, {"detail": "Not Found"}


def _reason(status: int) -> str:
    return {200: "OK", 404: "Not Found", 501: "Not Implemented", 503: "Service Unavailable"}.get(status, "Error")


def _encode(status: int, doc: Any) -> bytes:
    data = b"" if doc is None else json.dumps(doc).encode()
    head = f"HTTP/1.1 {status} {_reason(status)}\r\nContent-Type: application/json\r\n"
    return f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data


class _Connection:
    """One accepted connection: HTTP/1.1 with keep-alive, one request at a time (all the router and
    kvgate need).

    Bare non-blocking sockets on the event loop (add_reader), not asyncio's servers: one process answers
    for the whole fleet, and asyncio starts a task and a transport per accepted connection; at 1,024
    workers that host-side cost, not the client's, set what a fleet-sized bench measured
    (bench/fleet_read.py). The metadata answers, which never change for a worker, are encoded once.
    """

    def __init__(
        self, sock: socket.socket, worker: LightWorker, delay_s: float, cache: dict[tuple[str, str], bytes]
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.sock = sock
        self.fd = sock.fileno()
        self.worker = worker
        self.delay_s = delay_s
        self.cache = cache
        self.buf = bytearray()
        self.out = bytearray()
        self.busy = False  # a request is being answered (its delay running)
        self.closing = False  # close once `out` is sent
        self.closed = False
        self.loop.add_reader(self.fd, self._readable)

    def _readable(self) -> None:
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            self._close()
            return
        if not data:
            self._close()
            return
        self.buf += data
        if not self.busy:
            self._next()

    def _next(self) -> None:
        """Take the next whole request from the buffer and answer it (after the delay, for metadata)."""
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > MAX_HEADER_BYTES:
                self._close()
            return
        lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) < 2:
            self._close()
            return
        method, path = parts[0], parts[1].split("?")[0]
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        raw = headers.get("content-length", "0") or "0"
        length = int(raw) if raw.isdigit() else 0
        if len(self.buf) < end + 4 + length:
            return
        body = bytes(self.buf[end + 4 : end + 4 + length])
        del self.buf[: end + 4 + length]
        close = headers.get("connection", "").lower() == "close"
        self.busy = True
        if self.delay_s and path in METADATA_PATHS:
            self.loop.call_later(self.delay_s, self._answer, method, path, body, close)
        else:
            self._answer(method, path, body, close)

    def _answer(self, method: str, path: str, body: bytes, close: bool) -> None:
        self.busy = False
        if self.closed:
            return
        cacheable = method == "GET" and path in METADATA_PATHS
        out = self.cache.get((method, path)) if cacheable else None
        if out is None:
            out = _encode(*self.worker.answer(method, path, body))
            if cacheable:
                self.cache[(method, path)] = out
        self.out += out
        self.closing = close
        self._flush()
        if not close and not self.closed:
            self._next()

    def _flush(self) -> None:
        try:
            sent = self.sock.send(self.out)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._close()
            return
        del self.out[:sent]
        if self.out:
            self.loop.add_writer(self.fd, self._flush)
            return
        self.loop.remove_writer(self.fd)
        if self.closing:
            self._close()

    def _close(self) -> None:
        if not self.closed:
            self.closed = True
            self.loop.remove_reader(self.fd)
            self.loop.remove_writer(self.fd)
            self.sock.close()


async def serve(spec: dict[str, Any]) -> None:
    """Listen on every worker's port until cancelled."""
    delay = float(spec.get("metadata_delay_s", 0.0))
    loop = asyncio.get_running_loop()
    listeners: list[socket.socket] = []

    def accept(listener: socket.socket, worker: LightWorker, cache: dict[tuple[str, str], bytes]) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. out of descriptors: the client sees a refused or reset connection
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _Connection(sock, worker, delay, cache)

    try:
        for w in spec["workers"]:
            cfg = WorkerConfig(**w)
            worker = LightWorker(cfg, get_release(cfg.emulate, cfg.fixed_by))
            listener = socket.create_server((cfg.host, cfg.port), backlog=1024)
            listener.setblocking(False)
            listeners.append(listener)
            loop.add_reader(listener.fileno(), accept, listener, worker, {})
        await asyncio.Event().wait()
    finally:
        for listener in listeners:
            loop.remove_reader(listener.fileno())
            listener.close()


def main(argv: list[str]) -> None:
    """`fleet --spec FILE`: serve until SIGTERM/SIGINT."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m kvgate.sim fleet", description=__doc__)
    p.add_argument("--spec", required=True, help="JSON file: {metadata_delay_s, workers: [WorkerConfig fields]}")
    args = p.parse_args(argv)
    with open(args.spec, encoding="utf-8") as fh:
        spec = json.load(fh)

    run_until_signalled(serve(spec))
