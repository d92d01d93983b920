"""The watcher's HTTP endpoint: /metrics (Prometheus), /healthz (its own liveness), /verdict (promotion).

GET /verdict answers 200 only when the last full gate passed (exit status 0) and is younger than the
stated maximum age, else 503; the body is JSON either way: `passed`, `reason`, `exit_status`, `age_s`,
`max_age_s` and the full report (`report`, the same document as `kvgate check --format json`). Argo
Rollouts' `web` metric reads `$.passed`; a Flagger webhook (which POSTs) advances on 2xx only, so
POST /verdict answers as GET does.

A server nobody can starve: one asyncio loop in a daemon thread holds every connection (a half-open one
costs a descriptor and a small buffer, never a thread), requests are parsed by h11 (httpx's own HTTP/1.1
parser), and each connection has deadlines: its request head within HEADER_DEADLINE_S, its body within
BODY_DEADLINE_S, its answer written within WRITE_DEADLINE_S. Heads over MAX_HEADER_BYTES and bodies
over MAX_POST are refused; past `max_connections` open connections a new one is closed at once. Each
connection carries one request (`Connection: close`). Routes run on a small thread pool, so a slow
route cannot stall the loop.
"""

from __future__ import annotations

import asyncio
import json
import resource
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import h11

from kvgate.output import sinks

#: the largest webhook payload read (Flagger's is a few hundred bytes)
MAX_POST = 64 << 10
#: the largest request head (request line and headers)
MAX_HEADER_BYTES = 16 << 10
#: a connection's request head must arrive within this (slowloris: a byte every few seconds)
HEADER_DEADLINE_S = 10.0
#: ... its body within this after the head
BODY_DEADLINE_S = 10.0
#: ... and the answer be taken by the client within this
WRITE_DEADLINE_S = 10.0
#: the most connections open at once (fewer where the descriptor limit leaves less: `connection_cap`)
MAX_CONNECTIONS = 1024
#: descriptors kept for everything else a watch opens (the fleet pass, the gate's clients, files)
FD_RESERVE = 256
#: threads answering routes
ROUTE_THREADS = 4


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: bytes


def json_answer(status: int, doc: Any) -> Answer:
    return Answer(status, "application/json", sinks.http_body(json.dumps(doc, indent=2, default=str) + "\n"))


def raise_fd_limit() -> int:
    """Raise this process's soft descriptor limit to its hard limit (at most 65,536); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return int(soft)


def connection_cap(fd_limit: int) -> int:
    """MAX_CONNECTIONS, or what the descriptor limit leaves after FD_RESERVE (at least 16)."""
    return max(16, min(MAX_CONNECTIONS, fd_limit - FD_RESERVE))


class _Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


class Endpoint:
    """The endpoint's server; `routes` maps a path to what answers it (GET, and POST for /verdict)."""

    def __init__(
        self,
        host: str,
        port: int,
        routes: dict[str, Callable[[], Answer]],
        *,
        max_connections: int | None = None,
        header_deadline_s: float = HEADER_DEADLINE_S,
        body_deadline_s: float = BODY_DEADLINE_S,
    ) -> None:
        self.routes = routes
        self.max_connections = max_connections or connection_cap(raise_fd_limit())
        self.header_deadline_s = header_deadline_s
        self.body_deadline_s = body_deadline_s
        self.active = 0  # connections open now (the loop thread's count)
        self.refused = 0  # connections closed at once for being over the cap
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # Bound here, so a port in use is an OSError to the caller (a usage error), not a dead thread.
        self.sock = socket.create_server((host, port), family=family, backlog=1024)
        self._loop = asyncio.new_event_loop()
        self._pool = ThreadPoolExecutor(ROUTE_THREADS, thread_name_prefix="kvgate-watch-route")
        self._stopped: asyncio.Event | None = None
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name="kvgate-watch-http", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.sock.getsockname()[:2]
        return str(host), int(port)

    def start(self) -> Endpoint:
        self.thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        if self.thread.is_alive() and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
            self.thread.join(timeout=5)
        else:
            self.sock.close()
        self._pool.shutdown(wait=False)

    # -- the loop thread ----------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stopped = asyncio.Event()
        server = await asyncio.start_server(self._connection, sock=self.sock, limit=MAX_HEADER_BYTES)
        self._ready.set()
        async with server:
            await self._stopped.wait()
            server.close()
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.active >= self.max_connections:
            self.refused += 1
            writer.transport.abort()  # refused fast: no read, no answer, the descriptor freed now
            return
        self.active += 1
        try:
            await self._exchange(reader, writer)
        except (asyncio.TimeoutError, ConnectionError, OSError, h11.ProtocolError):
            pass  # a client too slow, gone or broken: the connection ends, nothing else does
        finally:
            self.active -= 1
            writer.transport.abort()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        loop = asyncio.get_running_loop()
        try:
            request = await self._next(conn, reader, loop.time() + self.header_deadline_s)
            if not isinstance(request, h11.Request):
                return
            ans = await self._answer(conn, reader, request, loop.time() + self.body_deadline_s)
        except h11.RemoteProtocolError as exc:
            ans = json_answer(exc.error_status_hint, {"error": "malformed request"})
        except _Refused as exc:
            ans = json_answer(exc.status, {"error": exc.reason})
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):  # h11 lets a 4xx follow a broken request
            return
        headers = [
            ("Content-Type", ans.content_type),
            ("Content-Length", str(len(ans.body))),
            ("Connection", "close"),
        ]
        writer.write(conn.send(h11.Response(status_code=ans.status, headers=headers)) or b"")
        writer.write(conn.send(h11.Data(data=ans.body)) or b"")
        writer.write(conn.send(h11.EndOfMessage()) or b"")
        await asyncio.wait_for(writer.drain(), WRITE_DEADLINE_S)

    @staticmethod
    async def _next(conn: h11.Connection, reader: asyncio.StreamReader, deadline: float) -> Any:
        loop = asyncio.get_running_loop()
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            left = deadline - loop.time()
            if left <= 0:
                raise asyncio.TimeoutError
            conn.receive_data(await asyncio.wait_for(reader.read(8192), left))

    async def _answer(
        self, conn: h11.Connection, reader: asyncio.StreamReader, request: h11.Request, deadline: float
    ) -> Answer:
        method = request.method.decode("ascii", "replace")
        path = request.target.decode("ascii", "replace").split("?", 1)[0]
        if method == "POST":
            length = dict(request.headers).get(b"content-length", b"0")
            if length.isdigit() and int(length) > MAX_POST:
                raise _Refused(413, "payload too large")
            seen = 0
            while True:  # the payload (canary name, phase) does not change the verdict: read, counted, dropped
                event = await self._next(conn, reader, deadline)
                if isinstance(event, h11.Data):
                    seen += len(event.data)
                    if seen > MAX_POST:
                        raise _Refused(413, "payload too large")
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    break
            if path != "/verdict":
                raise _Refused(405, "only /verdict takes POST")
        elif method != "GET":
            raise _Refused(501, f"unsupported method {sinks.terminal(method[:16])}")
        route = self.routes.get(path)
        if route is None:
            return json_answer(404, {"error": f"no such path; try {sorted(self.routes)}"})
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, route)
        except Exception as exc:  # noqa: BLE001 - a broken route is a 500, never a 200
            return json_answer(500, {"error": f"{type(exc).__name__}: {exc}"})
