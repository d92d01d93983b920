"""`python -m kvgate.sim fleet --spec FILE`: many metadata-only simulated workers in one process.

A full simulated worker (`worker.py`) is a process with torch, FastAPI and a real KV pool; a fleet of
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


async def _handle(
    worker: LightWorker, delay_s: float, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """HTTP/1.1 with keep-alive, one request at a time per connection (all the router and kvgate need)."""
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                return
            lines = head.decode("latin-1").split("\r\n")
            parts = lines[0].split(" ")
            if len(parts) < 2:
                return
            method, path = parts[0], parts[1].split("?")[0]
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
            length = int(headers.get("content-length", "0") or 0)
            body = await reader.readexactly(length) if length else b""
            if delay_s and path in METADATA_PATHS:
                await asyncio.sleep(delay_s)
            status, doc = worker.answer(method, path, body)
            data = b"" if doc is None else json.dumps(doc).encode()
            writer.write(
                f"HTTP/1.1 {status} {_reason(status)}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n\r\n".encode()
                + data
            )
            await writer.drain()
            if headers.get("connection", "").lower() == "close":
                return
    except (ConnectionError, asyncio.IncompleteReadError):
        return
    finally:
        writer.close()


async def serve(spec: dict[str, Any]) -> None:
    """Listen on every worker's port until cancelled."""
    delay = float(spec.get("metadata_delay_s", 0.0))
    servers = []
    for w in spec["workers"]:
        cfg = WorkerConfig(**w)
        worker = LightWorker(cfg, get_release(cfg.emulate, cfg.fixed_by))

        async def handler(r: asyncio.StreamReader, wr: asyncio.StreamWriter, _w: LightWorker = worker) -> None:
            await _handle(_w, delay, r, wr)

        servers.append(await asyncio.start_server(handler, cfg.host, cfg.port, limit=MAX_HEADER_BYTES, backlog=1024))
    try:
        await asyncio.Event().wait()
    finally:
        for s in servers:
            s.close()


def main(argv: list[str]) -> None:
    """`fleet --spec FILE`: serve until SIGTERM/SIGINT."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m kvgate.sim fleet", description=__doc__)
    p.add_argument("--spec", required=True, help="JSON file: {metadata_delay_s, workers: [WorkerConfig fields]}")
    args = p.parse_args(argv)
    with open(args.spec, encoding="utf-8") as fh:
        spec = json.load(fh)

    run_until_signalled(serve(spec))
