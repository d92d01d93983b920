"""Many small HTTP/1.1 GETs at once on one thread: the wire under the fleet reader (`fleetread`), which
`kvgate check` and `kvgate watch`'s metadata pass share.

One selector loop over non-blocking sockets, one small state machine per request (connect, TLS
handshake for https, send, read), every answer parsed and bounded as its bytes arrive. Not asyncio on
purpose: over 1,024 workers, asyncio's per-request machinery (a task, futures, a transport and a dozen
callbacks each) cost about twice the kernel's own work, and httpx before it five to forty times; the
pass must cost about one slow answer (bench/fleet_read.py prints it against a bare-socket floor).
Hostile peers are bounded as kvgate/reading/httpbounds.py bounds its client: every request its own deadline
(connect, handshake, send and every byte of the answer), the body `body_cap`, and a compressed answer
refused (identity is asked for: a compressed body could expand past any cap); also headers and
chunk-size lines (the answer's parser: kvgate/reading/http11.py). A redirect is an answer like any
other (its Location kept): the caller decides, and kvgate's callers never follow one.
"""

from __future__ import annotations

import errno
import heapq
import ipaddress
import selectors
import socket
import ssl as ssl_module
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from urllib.parse import urlsplit

from kvgate.reading.http11 import Answer, Failure, HttpProblem, Response

#: the most answer bytes granted at once over all requests: an answer whose head announces more than
#: SMALL_ANSWER (or none: then the whole cap) is read only once its bytes are granted, oldest first,
#: and waits unread (its clock stopped) until they are; a fleet of near-cap answers then holds about
#: this much, not width x the cap
INFLIGHT_BYTES = 192 << 20
#: answers this small are read without a grant (a healthy worker's are); heads are read in small steps
SMALL_ANSWER = 32 << 10
_HEAD_RECV = 16 << 10
_RECV = 256 << 10


_CONNECT, _HANDSHAKE, _SEND, _READ = range(4)


class _Request:
    """One GET's state machine over one non-blocking socket."""

    def __init__(
        self, index: int, url: str, path: str, headers: str, body_cap: int, end: float, cap_name: str = "cap"
    ) -> None:
        parts = urlsplit(url)
        self.index = index
        self.where = f"{url}{path}"
        self.https = parts.scheme == "https"
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if self.https else 80)
        self.out = (
            f"GET {parts.path.rstrip('/')}{path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            f"Accept: application/json\r\nAccept-Encoding: identity\r\nConnection: close\r\n{headers}\r\n"
        ).encode("latin-1")
        self.sent = 0
        self.response = Response(body_cap, cap_name)
        self.end = end
        self.window = 0.0  # seconds this request was given: min(timeout, what the deadline left)
        self.state = _CONNECT
        self.unsent = False  # counted among the requests not yet sent whole
        self.granted = 0  # answer bytes granted under the in-flight budget (answers over SMALL_ANSWER)
        self.small = False  # its answer is at most SMALL_ANSWER: read without a grant
        self.parked = False  # waiting for its grant, its socket unread
        self.left = 0.0  # parked: what was left of its window when it stopped
        self.tried = 0  # addresses of the host tried so far
        self.problem = "no address"  # why the last address did not connect
        self.sock: socket.socket | ssl_module.SSLSocket | None = None


def _numeric(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


Address = tuple[int, tuple]  # (family, sockaddr); the sockaddr's port is replaced by each URL's own


def _resolve(hosts: set[str], end: float) -> dict[str, list[Address] | str]:
    """host -> its addresses in the resolver's order, or why none; names are looked up in threads,
    within `end` (a lookup cannot be cancelled: one still hanging then is abandoned)."""
    out: dict[str, list[Address] | str] = {}
    names = [h for h in hosts if not _numeric(h)]
    for h in hosts - set(names):
        out[h] = [(socket.AF_INET6, (h, 0, 0, 0)) if ":" in h else (socket.AF_INET, (h, 0))]
    if not names:
        return out
    pool = ThreadPoolExecutor(max_workers=min(32, len(names)))
    futures = {pool.submit(socket.getaddrinfo, h, 0, type=socket.SOCK_STREAM): h for h in names}
    wait(futures, timeout=max(0.0, end - time.monotonic()))
    pool.shutdown(wait=False)  # a lookup still hanging is abandoned, not waited for
    for fut, h in futures.items():
        if not fut.done():
            out[h] = f"cannot resolve {h!r} in time"
        elif fut.exception() is not None or not fut.result():
            out[h] = f"cannot resolve {h!r}"
        else:
            out[h] = [(family, sockaddr) for family, _, _, _, sockaddr in fut.result()]
    return out


def get_each(
    gets: Sequence[tuple[str, str]],
    *,
    headers: str = "",
    timeout: float,
    deadline: float,
    width: int,
    body_cap: int,
    ssl_context: ssl_module.SSLContext | None = None,
    clock: Callable[[], float] = time.monotonic,
    on_answer: Callable[[int, Answer], None] | None = None,
    on_sent: Callable[[], None] | None = None,
    deadline_name: str = "the pass's deadline",
    cap_name: str = "cap",
    keep_bodies: bool = True,
    inflight_bytes: int = INFLIGHT_BYTES,
) -> list[Answer | Failure]:
    """GET each (base URL, path), up to `width` at once; one Answer or Failure per pair, in order.

    `on_answer(index, answer)` runs as each answer completes, while the others are still coming (a
    caller's parsing then overlaps the wait instead of following it); `on_sent()` runs once, when no
    request is left to start or send (work handed to another thread then does not slow the sending).

    Each request has `timeout` seconds from its start for everything; none starts or outlives `deadline`
    (on `clock`). `headers` are whole header lines (each ending in CRLF) sent with every request.
    Failures name `deadline_name` when the deadline, not the timeout, cut a request, and `cap_name`
    (e.g. "metadata cap") when a body is over `body_cap`.

    Memory: at most about `inflight_bytes` of answers are buffered at once (the oldest answer being
    read may pass it by one body cap, so some answer always completes); a request that would go past
    it waits, unread, within its own timeout. With `keep_bodies` False an answer handed to
    `on_answer` is returned without its body, so a fleet's bodies are not all held to the end.
    """
    reqs = [_Request(i, u, path, headers, body_cap, 0.0, cap_name) for i, (u, path) in enumerate(gets)]
    results: list[Answer | Failure | None] = [None] * len(reqs)
    addresses = _resolve({r.host for r in reqs}, deadline)
    if ssl_context is None and any(r.https for r in reqs):
        ssl_context = ssl_module.create_default_context()
    sel = selectors.DefaultSelector()
    timers: list[tuple[float, int]] = []
    waiting = list(reversed(reqs))
    active = 0
    unsent = 0  # requests started and not yet sent whole
    reserved = 0  # answer bytes granted to requests over SMALL_ANSWER, over all requests
    parked: deque[_Request] = deque()  # requests waiting for their grant, oldest first

    def need(r: _Request) -> int:
        """The bytes an answer whose head is in may take: its Content-Length, else the whole cap."""
        resp = r.response
        return resp.length if resp.length is not None else resp.cap

    def grantable(n: int) -> bool:
        return n <= SMALL_ANSWER or reserved == 0 or reserved + n <= inflight_bytes

    def grant(r: _Request, n: int) -> None:
        nonlocal reserved
        if n > SMALL_ANSWER:
            r.granted = n
            reserved += n

    def queued() -> bool:
        """Whether a request is still waiting for its grant (the finished ones leave the queue here)."""
        while parked and (not parked[0].parked or results[parked[0].index] is not None or parked[0].sock is None):
            parked.popleft()
        return bool(parked)

    def unpark(q: _Request) -> None:
        q.parked = False
        q.end = min(clock() + q.left, deadline)
        heapq.heappush(timers, (q.end, q.index))
        assert q.sock is not None
        sel.register(q.sock, selectors.EVENT_READ, q)

    def release(r: _Request) -> None:
        """The request's grant returns to the budget; waiting requests are granted, oldest first, while
        they fit (the oldest always, when nothing else is granted: some answer always completes)."""
        nonlocal reserved
        reserved -= r.granted
        r.granted = 0
        while queued():
            q = parked[0]
            n = need(q)
            if not grantable(n):
                break
            parked.popleft()
            grant(q, n)
            unpark(q)

    def finish(r: _Request, outcome: Answer | Failure) -> None:
        nonlocal active, unsent
        results[r.index] = outcome if keep_bodies or isinstance(outcome, Failure) else Answer(outcome.status, b"")
        r.response.release()  # the answer is out: its buffers go now
        if r.granted or parked:
            release(r)
        if r.unsent:
            r.unsent = False
            unsent -= 1
        if r.sock is not None:
            try:
                sel.unregister(r.sock)
            except (KeyError, ValueError):
                pass
            r.sock.close()
            r.sock = None
        active -= 1

    def fail(r: _Request, reason: str) -> None:
        finish(r, Failure(f"{r.where}: {reason}"))

    def start(r: _Request, now: float) -> None:
        nonlocal active, unsent
        active += 1
        r.end = min(now + timeout, deadline)
        r.window = r.end - now
        heapq.heappush(timers, (r.end, r.index))
        found = addresses[r.host]
        if isinstance(found, str):
            fail(r, f"unreachable: {found}")
            return
        r.unsent = True
        unsent += 1
        connect(r, found)

    def connect(r: _Request, found: list[Address]) -> None:
        """Connect to the request's next address; past the last, the request fails with the last error."""
        while r.tried < len(found):
            family, sockaddr = found[r.tried]
            r.tried += 1
            try:
                sock = socket.socket(family, socket.SOCK_STREAM)
            except OSError as exc:
                r.problem = type(exc).__name__
                continue
            sock.setblocking(False)
            code = sock.connect_ex((sockaddr[0], r.port, *sockaddr[2:]))
            if code not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN):
                r.problem = errno.errorcode.get(code, str(code))
                sock.close()
                continue
            r.sock = sock
            if not r.https and send_at_once(r, sock):
                sel.register(sock, selectors.EVENT_READ, r)
                return
            if r.sock is None:  # refused at once: the host's next address, if it has one
                continue
            sel.register(sock, selectors.EVENT_WRITE, r)
            return
        fail(r, f"unreachable: {r.problem}")

    def send_at_once(r: _Request, sock: socket.socket) -> bool:
        """Send the request now if the connection is already up (a near peer's usually is by the time
        connect returns): saves the wait for writability and a selector change per request. True when
        it was sent whole; False when the caller should wait for the connection (r.sock still set) or
        try the next address (r.sock cleared: the connection failed)."""
        try:
            r.sent = sock.send(r.out)
        except BlockingIOError:  # still connecting
            return False
        except OSError as exc:
            r.problem = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
            sock.close()
            r.sock = None
            return False
        r.state = _SEND
        if r.sent < len(r.out):
            return False
        sent_whole(r)
        return True

    def sent_whole(r: _Request) -> None:
        """The request is on the wire: from here only its answer is awaited."""
        nonlocal unsent
        r.state = _READ
        r.unsent = False
        unsent -= 1

    def step(r: _Request) -> None:
        sock = r.sock
        assert sock is not None
        try:
            if r.state == _CONNECT:
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:
                    r.problem = errno.errorcode.get(code, str(code))
                    sel.unregister(sock)
                    sock.close()
                    r.sock = None
                    found = addresses[r.host]
                    assert not isinstance(found, str)
                    connect(r, found)  # the host's next address, if it has one
                    return
                if r.https:
                    assert ssl_context is not None
                    sel.unregister(sock)
                    sock = r.sock = ssl_context.wrap_socket(sock, server_hostname=r.host, do_handshake_on_connect=False)
                    sel.register(sock, selectors.EVENT_WRITE, r)
                    r.state = _HANDSHAKE
                else:
                    r.state = _SEND
            if r.state == _HANDSHAKE:
                assert isinstance(sock, ssl_module.SSLSocket)
                sock.do_handshake()
                r.state = _SEND
            if r.state == _SEND:
                r.sent += sock.send(r.out[r.sent :])
                if r.sent < len(r.out):
                    sel.modify(sock, selectors.EVENT_WRITE, r)
                    return
                sent_whole(r)
                sel.modify(sock, selectors.EVENT_READ, r)
                return  # the answer is at least a round trip away
            while True:  # _READ: take everything the kernel (and TLS) has now, within the grant
                resp = r.response
                if resp.body_at >= 0 and not r.granted and not r.small:
                    n = need(r)
                    if n > SMALL_ANSWER and (queued() or not grantable(n)):  # wait unread, clock stopped
                        sel.unregister(sock)
                        r.parked = True
                        r.left = r.end - clock()
                        r.end = deadline
                        parked.append(r)
                        return
                    grant(r, n)
                    r.small = n <= SMALL_ANSWER
                data = sock.recv(_RECV if resp.body_at >= 0 else _HEAD_RECV)
                answer = resp.feed(data) if data else resp.eof()
                if answer is not None:
                    finish(r, answer)
                    if on_answer is not None:
                        on_answer(r.index, answer)
                    return
        except ssl_module.SSLWantReadError:
            sel.modify(sock, selectors.EVENT_READ, r)
        except ssl_module.SSLWantWriteError:
            sel.modify(sock, selectors.EVENT_WRITE, r)
        except BlockingIOError:
            want = selectors.EVENT_READ if r.state == _READ else selectors.EVENT_WRITE
            sel.modify(sock, want, r)
        except HttpProblem as exc:
            fail(r, str(exc))
        except ssl_module.SSLError as exc:
            fail(r, f"TLS: {exc.reason or type(exc).__name__}")
        except OSError as exc:
            fail(r, f"unreachable: {type(exc).__name__}")

    try:
        while waiting or active:
            now = clock()
            while waiting and active < width:
                r = waiting.pop()
                left = min(timeout, deadline - now)
                if left <= 0:
                    results[r.index] = Failure(f"{r.where}: not read: {deadline_name} passed before its turn")
                    continue
                start(r, now)
            while timers and (results[timers[0][1]] is not None or timers[0][0] <= now):
                _, i = heapq.heappop(timers)
                if results[i] is None:
                    r = reqs[i]
                    if r.end > now:  # its clock was stopped while it waited for the budget: re-armed
                        heapq.heappush(timers, (r.end, i))
                        continue
                    why = "timeout" if r.window >= timeout else deadline_name
                    fail(r, f"no whole answer within {r.window:.3g}s ({why})")
            if on_sent is not None and not waiting and not unsent:
                on_sent()
                on_sent = None
            if not active:
                continue
            wake = timers[0][0] - now if timers else None
            for key, _ in sel.select(wake):
                req = key.data
                if results[req.index] is None:
                    step(req)
    finally:
        for key in list(sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        sel.close()
    return [r if r is not None else Failure(f"{q.where}: not read") for r, q in zip(results, reqs, strict=True)]
