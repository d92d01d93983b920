"""Hostile HTTP servers on loopback sockets: they answer whatever bytes a test scripts, at its pace.

`ScriptedServer` hands each connection's parsed request (method, path, headers, body) to a script that
writes raw bytes to the socket: a body dripped one byte at a time, a huge body, an endless line, an
SSE stream of any frames, a cut connection. `MutatingProxy` forwards to a real upstream (the
simulator's router) and lets a test replace chosen answers.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body or b"null")


Script = Callable[[Request, socket.socket], None]


def _read_request(conn: socket.socket) -> Request | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    want = int(headers.get("content-length", "0"))
    while len(body) < want:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return Request(method, path, headers, body)


@dataclass
class ScriptedServer:
    """One thread per connection; `script` (changeable while it runs) writes the answer."""

    script: Script
    url: str = ""
    requests: list[Request] = field(default_factory=list)
    _sock: socket.socket | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> ScriptedServer:
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def _accept(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            req = _read_request(conn)
            if req is not None:
                self.requests.append(req)
                self.script(req, conn)
        except OSError:
            pass  # the client went away: what these servers are for
        finally:
            conn.close()

    def stop(self) -> None:
        self._stop.set()
        if self._sock is not None:
            self._sock.close()


def head(status: int = 200, ctype: str = "application/json", length: int | None = None, extra: str = "") -> bytes:
    """A response head; no Content-Length means the body ends when the connection closes."""
    lines = [f"HTTP/1.1 {status} X", f"Content-Type: {ctype}", "Connection: close"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if extra:
        lines.append(extra)
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def drip(body: bytes, every_s: float, stop: threading.Event | None = None) -> Script:
    """The whole body announced, then sent one byte every `every_s` seconds."""

    def script(req: Request, conn: socket.socket) -> None:
        conn.sendall(head(length=len(body)))
        for b in body:
            if stop is not None and stop.is_set():
                return
            conn.sendall(bytes([b]))
            time.sleep(every_s)

    return script


def sse_bytes(frames: list[Any]) -> bytes:
    """`data: <json>` frames (a `bytes` item is sent as it is), as SGLang streams them."""
    out = b""
    for f in frames:
        out += f if isinstance(f, bytes) else b"data: " + json.dumps(f).encode() + b"\n\n"
    return out


def sse(payload: bytes | Callable[[Request], bytes], status: int = 200) -> Script:
    """An event stream of these bytes (or of what the request makes them), then the connection closes."""

    def script(req: Request, conn: socket.socket) -> None:
        data = payload(req) if callable(payload) else payload
        conn.sendall(head(status, "text/event-stream") + data)

    return script


class MutatingProxy:
    """Forwards every request to `upstream`; `mutate(request)` may answer instead (bytes after the head)."""

    def __init__(self, upstream: str, mutate: Callable[[Request], bytes | None]) -> None:
        self.upstream = upstream.rstrip("/")
        self.mutate = mutate
        self.mutated: list[Request] = []
        self.server = ScriptedServer(self._script)

    def start(self) -> MutatingProxy:
        self.server.start()
        return self

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self) -> None:
        self.server.stop()

    def _script(self, req: Request, conn: socket.socket) -> None:
        answer = self.mutate(req)
        if answer is not None:
            self.mutated.append(req)
            conn.sendall(answer)
            return
        headers = {k: v for k, v in req.headers.items() if k not in ("host", "content-length", "connection")}
        with (
            httpx.Client(timeout=httpx.Timeout(120.0)) as http,
            http.stream(req.method, self.upstream + req.path, content=req.body, headers=headers) as resp,
        ):
            ctype = resp.headers.get("content-type", "application/json")
            conn.sendall(head(resp.status_code, ctype))
            for chunk in resp.iter_raw():
                conn.sendall(chunk)
