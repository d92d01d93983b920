"""An httpx client whose every answer ends within its timeout and is read only up to a size cap.

httpx's timeouts are per operation: a read timeout of 2 s bounds one `recv`, so a server that sends one
byte every 0.5 s holds a request open forever, and a 400 MB body is read whole. Here a request's timeout
(its `read` value, the one every caller sets) is the budget of the WHOLE exchange: connect, TLS, sending,
the headers and every byte of the body. Each socket operation waits at most what is left of it (a
network backend that clamps each wait), so a stalled or trickling server is cut at the deadline, not
one read later. The body is counted as it arrives; past the cap the exchange stops with `OverCap`.

A request may set its own cap with `extensions={BODY_CAP: n}`. Answers must not be compressed
(`Accept-Encoding: identity` is sent): a compressed answer could expand past any cap after counting,
so one is refused (`OverCap` naming the encoding) rather than decoded.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
import typing
from collections.abc import Iterable, Iterator

import httpcore
import httpx

MAX_JSON_DEPTH = 64
"""The deepest nesting of arrays and objects accepted in a JSON answer (SGLang's deepest is under 10)."""

BODY_CAP = "kvgate.body_cap"
"""Request extension: the most body bytes this request's answer may have."""

_local = threading.local()  # the deadline (time.monotonic()) of the exchange this thread is running


class OverCap(httpx.TransportError):
    """An answer larger than its cap (or compressed, so its size cannot be bounded): not read further."""

    def __init__(self, message: str, *, cap: int, request: httpx.Request | None = None) -> None:
        super().__init__(message, request=request)
        self.cap = cap


#: Up to this size an answer's brackets are counted (two passes in C) before its tree is walked; past it
#: the walk alone, whose cost is the document's containers, not its bytes (a 16 MiB answer is mostly strings).
_COUNT_UP_TO = 1 << 20


def parse_json(data: bytes | str, max_depth: int = MAX_JSON_DEPTH, **kwargs: typing.Any) -> typing.Any:
    """`json.loads` for a server's answer, with a nesting limit: deeper than `max_depth` (or so deep the
    decoder itself gives up) is a ValueError, as malformed JSON is, never a RecursionError later."""
    try:
        doc = json.loads(data, **kwargs)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {max_depth} levels") from None
    if len(data) <= _COUNT_UP_TO:
        opens = data.count(b"{") + data.count(b"[") if isinstance(data, bytes) else data.count("{") + data.count("[")
        if opens <= max_depth:  # no deeper than its brackets, counted in C: most answers end here
            return doc
    stack: list[tuple[typing.Any, int]] = [(doc, 1)]
    while stack:  # iterative: the check itself must not recurse
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: typing.Iterable[typing.Any] = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > max_depth:
            raise ValueError(f"JSON nested deeper than {max_depth} levels")
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return doc


def cap_text(n: int) -> str:
    """A byte count as people read it: 16 MiB, 512 KiB, 300 bytes."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n:,} bytes"


def _left(kind: type[Exception], timeout: float | None) -> float | None:
    """The wait allowed for one socket operation: its own timeout, cut to what the deadline leaves."""
    deadline: float | None = getattr(_local, "deadline", None)
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise kind(f"the answer's whole deadline ({_local.budget:g} s) passed")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    """A socket stream whose every wait ends by the running exchange's deadline."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(httpcore.ReadTimeout, timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(httpcore.WriteTimeout, timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, _left(httpcore.ConnectTimeout, timeout)))

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    """httpcore's own sync backend, its streams wrapped in `_Stream`."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        wait = _left(httpcore.ConnectTimeout, timeout)
        _local.connected = True
        return _Stream(self._inner.connect_tcp(host, port, wait, local_address, socket_options))

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None
    ) -> httpcore.NetworkStream:
        wait = _left(httpcore.ConnectTimeout, timeout)
        _local.connected = True
        return _Stream(self._inner.connect_unix_socket(path, wait, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _Deadline:
    """Sets this thread's deadline for the span of a `with` (nested spans keep the outer one's value)."""

    def __init__(self, deadline: float | None, budget: float | None) -> None:
        self.deadline, self.budget = deadline, budget

    def __enter__(self) -> None:
        self.saved = (getattr(_local, "deadline", None), getattr(_local, "budget", None))
        _local.deadline, _local.budget = self.deadline, self.budget

    def __exit__(self, *exc: object) -> None:
        _local.deadline, _local.budget = self.saved


class _CappedBody(httpx.SyncByteStream):
    """The answer's body, pulled under the exchange's deadline and counted against its cap."""

    def __init__(self, inner: httpx.SyncByteStream, request: httpx.Request, cap: int, deadline: _Deadline) -> None:
        self._inner, self._request, self._cap, self._deadline = inner, request, cap, deadline

    def __iter__(self) -> Iterator[bytes]:
        seen = 0
        chunks = iter(self._inner)
        while True:
            with self._deadline:
                chunk = next(chunks, None)
            if chunk is None:
                return
            seen += len(chunk)
            if seen > self._cap:
                raise OverCap(
                    f"the answer is larger than kvgate's {cap_text(self._cap)} cap (read {seen:,} bytes, then stopped)",
                    cap=self._cap,
                    request=self._request,
                )
            yield chunk

    def close(self) -> None:
        self._inner.close()


#: Most connections open at once; idle ones are all kept (see `_Pool`).
MAX_CONNECTIONS = 100
#: An idle connection is reused within this long, well inside the common server idle timeouts (uvicorn,
#: which SGLang serves with, closes one after 5 s: reusing one at that moment fails the request).
KEEPALIVE_EXPIRY_S = 2.0
#: Methods sent again, once, when the kept-alive connection they went out on turns out closed.
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS"})
#: How such a connection fails: the server's close crossed the request (reset, or EOF before any answer).
_CROSSED_CLOSE = (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)


class _Pool(httpcore.ConnectionPool):
    """httpcore's pool, but a connection it retires is closed while the pool's lock is still held.

    httpcore 1.0 retires connections (keep-alive expired, or more idle ones than it keeps) under its lock
    and closes them after releasing it. A connection it had just handed to another thread, still idle
    because that thread had not started on it, can thus be closed under that thread's request: the
    request fails with `ReadError: [Errno 9] Bad file descriptor`. Under load on a shared CI host that
    happened to a real pair's first `pool_limit` probe (nothing observed, exit 3). Closed under the lock,
    the connection is already closed when the other thread starts, which httpcore answers by taking
    another connection. Keeping every idle connection (max_keepalive = max_connections) also keeps its
    surplus rule, which counts all connections rather than the idle ones, from retiring busy pools' idle
    connections at all.
    """

    def _assign_requests_to_connections(self) -> list[httpcore.ConnectionInterface]:
        retired = super()._assign_requests_to_connections()
        for connection in retired:
            if not _close_if_unstarted(connection):
                self._connections.append(connection)  # still the pool's: it is returned to it when done
        return []


def _close_if_unstarted(connection: httpcore.ConnectionInterface) -> bool:
    """Close a retired connection unless a thread it was handed to has started on it; False if one has.

    The pool judges a connection idle (and expired) a moment before it closes it; a thread it was handed
    to earlier may set it active in that moment, outside the pool's lock, and start writing. The check and
    the close are one step under the connection's own state lock, the one its request start takes. Where
    httpcore's internals differ from 1.0's, the connection is closed as httpcore would."""
    inner = getattr(connection, "_connection", None)
    lock = getattr(inner, "_state_lock", None)
    if inner is None or lock is None or not hasattr(inner, "is_idle"):
        connection.close()  # plain socket closes: quick, and no other lock is taken
        return True
    with lock:
        if not (inner.is_idle() or inner.is_closed()):
            return False
        connection.close()
        return True


class BoundedTransport(httpx.BaseTransport):
    """HTTP/1.1 over httpcore with a whole-exchange deadline (the request's read timeout) and a body cap."""

    def __init__(self, verify: ssl.SSLContext, body_cap: int) -> None:
        self.body_cap = body_cap
        self._inner = httpx.HTTPTransport(verify=verify)
        # httpx builds its pool with httpcore's default backend; this one clamps every socket wait.
        self._inner._pool = _Pool(
            ssl_context=verify,
            max_connections=MAX_CONNECTIONS,
            max_keepalive_connections=MAX_CONNECTIONS,
            keepalive_expiry=KEEPALIVE_EXPIRY_S,
            network_backend=_Backend(),
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        budget = timeouts.get("read") if isinstance(timeouts, dict) else None
        deadline = _Deadline(None if budget is None else time.monotonic() + budget, budget)
        cap = request.extensions.get(BODY_CAP, self.body_cap)
        with deadline:
            resp = self._send(request)
        encoding = resp.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            resp.close()
            raise OverCap(
                f"the answer is compressed (Content-Encoding {encoding[:40]!r}) although kvgate asked for "
                f"identity: its size past the {cap_text(cap)} cap could not be bounded",
                cap=cap,
                request=request,
            )
        length = resp.headers.get("content-length", "")
        if length.strip().isdigit() and int(length) > cap:
            resp.close()
            raise OverCap(
                f"the answer announces {int(length):,} bytes, over kvgate's {cap_text(cap)} cap (not read)",
                cap=cap,
                request=request,
            )
        assert isinstance(resp.stream, httpx.SyncByteStream)
        return httpx.Response(
            status_code=resp.status_code,
            headers=resp.headers,
            stream=_CappedBody(resp.stream, request, cap, deadline),
            extensions=resp.extensions,
        )

    def _send(self, request: httpx.Request) -> httpx.Response:
        """One exchange; an idempotent request sent again once where a reused connection failed under it.

        A server may close an idle kept-alive connection at any moment (RFC 9112 9.3.1 lets the client
        retry an idempotent request then): when its close crosses the next request on that connection,
        the request meets a reset or EOF before any answer. It is sent again, once, under the same
        deadline. A request that opened its own connection and failed is not: that failure is the server's.
        """
        _local.connected = False
        try:
            return self._inner.handle_request(request)
        except _CROSSED_CLOSE:
            if request.method not in IDEMPOTENT or _local.connected:
                raise
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()


def bounded_client(
    *,
    timeout: float,
    body_cap: int,
    verify: ssl.SSLContext,
    headers: typing.Mapping[str, str] | None = None,
) -> httpx.Client:
    """An httpx client whose answers each end within their timeout and stop at `body_cap` bytes.

    It connects directly (no proxy from the environment): kvgate talks to the workers it was named.
    """
    return httpx.Client(
        timeout=httpx.Timeout(timeout),
        headers={**(headers or {}), "Accept-Encoding": "identity"},
        follow_redirects=False,
        transport=BoundedTransport(verify, body_cap),
    )
