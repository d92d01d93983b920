"""The bounded client's connection pool under threads: a connection retired while another thread holds it.

The race is staged by events, not by timing: one thread is paused after the pool handed it an idle
connection; that connection then counts as expired and a second request retires it. httpcore 1.0 closes
retired connections after releasing its lock, so the first thread could start on the connection before
the close landed and fail with EBADF. kvgate's pool closes them under the lock; the first thread then
finds the connection closed and takes another one. Every wait has a safety deadline naming what it
awaited.
"""

from __future__ import annotations

import http.server
import socket
import ssl
import struct
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpcore
import httpx
import pytest

from kvgate.reading import httpbounds
from kvgate.reading.httpbounds import bounded_client
from tests.assets.loopback import LoopbackServer

SAFETY_S = 30.0  # outer net only: each staged step takes milliseconds


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so connections are pooled and reused
    barrier: threading.Barrier | None = None  # when set, each answer waits until all parties arrived

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.barrier is not None:
            self.barrier.wait()
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(autouse=True)
def _no_expiry_by_wall_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep-alive expiry (2 s idle) is the pool's one way to retire a connection by wall time: on a loaded
    host a stall between two steps retired the connection a test was about (the 30 idle connections test
    found fewer, run beside other tests). Here connections expire only where a test says so: each outcome
    is its staging's."""
    monkeypatch.setattr(httpbounds, "KEEPALIVE_EXPIRY_S", 3600.0)


@pytest.fixture
def url() -> Iterator[str]:
    srv = LoopbackServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/generate"
    finally:
        srv.shutdown()
        srv.server_close()


def _wait(event: threading.Event, what: str) -> None:
    if not event.wait(SAFETY_S):
        raise AssertionError(f"staging: {what} did not happen within {SAFETY_S:g} s")


def _post_in_thread(client: httpx.Client, url: str) -> tuple[threading.Thread, dict[str, Any]]:
    """POST from a thread of its own, started; the dict gets the status, or the error by name."""
    first: dict[str, Any] = {}

    def send() -> None:
        try:
            first["status"] = client.post(url, content=b"{}").status_code
        except Exception as exc:  # noqa: BLE001 (the caller's assertion names it)
            first["error"] = f"{type(exc).__name__}: {exc}"

    t = threading.Thread(target=send, daemon=True)
    t.start()
    return t, first


def test_a_connection_retired_while_a_thread_holds_it_is_never_closed_under_its_request(url: str) -> None:
    client = bounded_client(timeout=SAFETY_S, body_cap=1 << 20, verify=ssl.create_default_context())
    pool = client._transport._inner._pool  # type: ignore[attr-defined]
    assert client.post(url, content=b"{}").status_code == 200  # one idle connection, X
    [x] = pool.connections
    expired = threading.Event()  # once set, X counts as keep-alive expired
    x_has_expired = x.has_expired
    x.has_expired = lambda: expired.is_set() or x_has_expired()

    handed = threading.Event()  # the first thread holds X and has not started on it
    resume = threading.Event()
    started = threading.Event()  # the first thread set X active (past httpcore's idle check)
    x_handle = x.handle_request

    def hold_then_handle(request: httpcore.Request) -> httpcore.Response:
        if not handed.is_set():
            handed.set()
            _wait(resume, "the second request's retiring of X")
        started.set()
        return x_handle(request)

    x.handle_request = hold_then_handle

    # Where httpcore closes retired connections after its lock: hold that close until the first thread
    # has started on X, the interleaving that failed with EBADF. kvgate's pool passes nothing here.
    close_after_lock = pool._close_connections
    late_closes: list[object] = []

    def hold_late_close(closing: list[Any]) -> None:
        if x in closing:
            late_closes.append(x)
            resume.set()
            _wait(started, "the first thread starting on X")
        close_after_lock(closing)

    pool._close_connections = hold_late_close

    t, first = _post_in_thread(client, url)
    _wait(handed, "the pool handing X to the first thread")
    expired.set()
    second = client.post(url, content=b"{}")  # its pool pass retires X
    resume.set()
    t.join(SAFETY_S)
    assert not t.is_alive(), "the first request did not end"
    assert second.status_code == 200
    assert first == {"status": 200}, first
    assert late_closes == [], "a retired connection was closed after the pool's lock was released"
    assert x.is_closed()
    client.close()


def test_a_connection_started_between_the_pools_idle_check_and_its_close_is_left_to_its_request(url: str) -> None:
    """The other interleaving (a held-out real pair lost a tenant request to EBADF under CI load): the
    pool judges X idle and expired, then, before it closes X, the thread X was handed to sets X active
    (outside the pool's lock) and starts writing. X is closed only if nobody started on it: here it is
    left to its request, which completes, and returned to the pool."""
    client = bounded_client(timeout=SAFETY_S, body_cap=1 << 20, verify=ssl.create_default_context())
    pool = client._transport._inner._pool  # type: ignore[attr-defined]
    assert client.post(url, content=b"{}").status_code == 200  # one idle connection, X
    [x] = pool.connections
    inner = x._connection
    handed = threading.Event()  # the first thread holds X and has not started on it
    judged = threading.Event()  # the second request's pool pass found X expired
    active = threading.Event()  # the first thread set X active and is about to write
    decided = threading.Event()  # the second request's pool pass is over (X closed or not)

    x_has_expired = x.has_expired

    def expired_once_handed() -> bool:
        if handed.is_set() and not judged.is_set():
            judged.set()
            _wait(active, "the first thread setting X active")
            return True
        return bool(x_has_expired())

    x.has_expired = expired_once_handed
    x_handle = x.handle_request

    def hold_then_handle(request: httpcore.Request) -> httpcore.Response:
        if not handed.is_set():
            handed.set()
            _wait(judged, "the second request judging X expired")
        return x_handle(request)

    x.handle_request = hold_then_handle
    send_headers = inner._send_request_headers

    def headers_after_the_decision(**kw: Any) -> None:
        if not active.is_set():
            active.set()
            _wait(decided, "the second request's pool pass")
        send_headers(**kw)

    inner._send_request_headers = headers_after_the_decision
    close_connections = pool._close_connections

    def mark_decided(closing: list[Any]) -> None:
        close_connections(closing)
        if active.is_set():
            decided.set()

    pool._close_connections = mark_decided

    t, first = _post_in_thread(client, url)
    second = client.post(url, content=b"{}")  # its pool pass judges X expired while the first starts on X
    t.join(SAFETY_S)
    assert not t.is_alive(), "the first request did not end"
    assert judged.is_set() and decided.is_set(), "the staging did not take place"
    assert second.status_code == 200
    assert first == {"status": 200}, first
    assert x in pool.connections and x.is_idle(), [repr(c) for c in pool.connections]
    client.close()


def test_idle_connections_are_kept_however_many_are_open(url: str) -> None:
    """httpcore's surplus rule counts every connection, not the idle ones: with more than its
    max_keepalive open, it retired idle connections other threads had just been handed. 30 requests
    held in flight together (each answered once all 30 arrived) leave 30 idle connections, none retired."""
    n = 30
    _Handler.barrier = threading.Barrier(n, timeout=SAFETY_S)
    try:
        client = bounded_client(timeout=SAFETY_S, body_cap=1 << 20, verify=ssl.create_default_context())
        with ThreadPoolExecutor(n) as pool:
            codes = list(pool.map(lambda _: client.post(url, content=b"{}").status_code, range(n)))
        assert codes == [200] * n
        conns = client._transport._inner._pool.connections  # type: ignore[attr-defined]
        assert len(conns) == n and all(c.is_idle() for c in conns), [repr(c) for c in conns]
        client.close()
    finally:
        _Handler.barrier = None


class _Closer:
    """Keep-alive answers on loopback, except that chosen requests are cut: the server reads the request,
    then closes the connection without a byte of answer (`reset`: an RST, else a plain FIN).
    `cut(connection_no, request_no)` picks them, both counted from 0; `seen` lists each request's pair."""

    def __init__(self, cut: Any, how: str) -> None:
        self.cut, self.how = cut, how
        self.seen: list[tuple[int, int]] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/server_info"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        for conn_no in range(1_000):
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn, conn_no), daemon=True).start()

    def _serve(self, conn: socket.socket, conn_no: int) -> None:
        conn.settimeout(SAFETY_S)
        data = b""
        with conn:
            for req_no in range(1_000):
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, data = data.partition(b"\r\n\r\n")
                length = next(
                    (int(ln.split(b":")[1]) for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")),
                    0,
                )
                while len(data) < length:
                    data += conn.recv(65536)
                data = data[length:]
                self.seen.append((conn_no, req_no))
                if self.cut(conn_no, req_no):
                    if self.how == "reset":
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("how", ["reset", "eof"])
def test_a_get_whose_kept_alive_connection_was_closed_under_it_is_sent_again_once(how: str) -> None:
    """The server closes connection 0 as the second request arrives on it (the close of an idle
    connection crossing its reuse): the GET goes again on a new connection and is answered."""
    server = _Closer(lambda conn_no, req_no: (conn_no, req_no) == (0, 1), how)
    client = bounded_client(timeout=SAFETY_S, body_cap=1 << 20, verify=ssl.create_default_context())
    try:
        assert client.get(server.url).status_code == 200
        assert client.get(server.url).status_code == 200
        assert server.seen == [(0, 0), (0, 1), (1, 0)]
    finally:
        client.close()
        server.close()


@pytest.mark.parametrize("how", ["reset", "eof"])
def test_a_post_on_a_closed_connection_is_not_sent_again(how: str) -> None:
    """A POST (a probe's /generate) is not idempotent: the server may have acted on it. It fails."""
    server = _Closer(lambda conn_no, req_no: (conn_no, req_no) == (0, 1), how)
    client = bounded_client(timeout=SAFETY_S, body_cap=1 << 20, verify=ssl.create_default_context())
    try:
        assert client.post(server.url, content=b"{}").status_code == 200
        with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
            client.post(server.url, content=b"{}")
        assert server.seen == [(0, 0), (0, 1)]
    finally:
        client.close()
        server.close()


def test_a_get_cut_on_its_own_new_connection_is_the_servers_failure_and_not_repeated() -> None:
    """Only a reused connection is forgiven: a server that cuts every request is asked once per GET."""
    server = _Closer(lambda conn_no, req_no: True, "reset")
    client = bounded_client(timeout=SAFETY_S, body_cap=1 << 20, verify=ssl.create_default_context())
    try:
        with pytest.raises(httpx.ReadError):
            client.get(server.url)
        assert server.seen == [(0, 0)]
    finally:
        client.close()
        server.close()
