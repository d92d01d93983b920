"""Runs INSIDE the interpreter that has the target sglang (TEST CODE, no sglang import): the in-memory
links between the probe's prefill and decode ranks (ProbeWire, ProbeSocket) and decode's page pool
(ProbeKVPool), each counting or logging what passed so that a scenario waits on events, never on time.
"""

from __future__ import annotations

import queue as _queue
import threading
import time
from typing import Any

HOLD_BOUND_S = 3600.0  # decode's deferred-release timeout here: never reached, `expire_holds` ends a hold
STAGE_BOUND_S = 120.0  # outer safety net for any one awaited step (each takes milliseconds when staged)
SETTLE_ROUNDS = 50  # scheduler rounds `settle` allows before the threads are called restless
PAGES = 4  # per request; the pool has exactly one request's worth, so a freed page is reused at once
PAGE_BYTES = 16
PREFILL_EP = ("10.255.0.1", 17100)
DECODE_EPS = (("10.255.0.2", 17200), ("10.255.0.3", 17201))


class ProbeSocketClosed(Exception):
    """Raised into a real sglang thread loop to end it when a scenario is over (test code)."""


class NotStaged(Exception):
    """A step the scenario waits for did not happen within its outer bound: the race was not staged
    (no verdict; the scenario is staged again)."""


class ProbeSocket:
    """TEST CODE: the receiving end of a ZMQ socket (or the transfer worker's queue), fed by ProbeWire.

    It counts what was sent, taken and handled: the consumer thread has handled an item when it comes
    back for the next one, so `wait_idle` returns once everything sent so far has been handled."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.q: _queue.Queue[Any] = _queue.Queue()
        self.cond = threading.Condition()
        self.sent = self.taken = self.handled = 0

    def _take(self) -> Any:
        with self.cond:
            self.handled = self.taken
            self.cond.notify_all()
        item = self.q.get()
        with self.cond:
            self.taken += 1
        if item is None:
            raise ProbeSocketClosed(self.name)
        return item

    def recv_multipart(self) -> list[bytes]:
        return list(self._take())

    def get(self) -> Any:  # as the transfer worker's queue
        return self._take()

    def put(self, item: Any) -> None:
        with self.cond:
            self.sent += 1
        self.q.put(item)

    def close(self) -> None:
        self.q.put(None)  # not counted: it ends the consumer

    def idle(self) -> bool:
        with self.cond:
            return self.handled >= self.sent

    def wait_idle(self, what: str) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: self.handled >= self.sent, STAGE_BOUND_S):
                raise NotStaged(
                    f"{self.name} did not finish handling {what} within {STAGE_BOUND_S:g} s "
                    f"(sent {self.sent}, taken {self.taken}, handled {self.handled})"
                )


class ProbeWire:
    """TEST CODE: routes frames between the in-process prefill and decode sockets and logs them.

    `hold(pred)` keeps back frames matching pred (a slow link) until `deliver_held()`.
    """

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.routes: dict[tuple[str, int], ProbeSocket] = {}
        self.log: list[dict[str, Any]] = []
        self.held: list[tuple[ProbeSocket, list[bytes]]] = []
        self.hold_pred: Any = None
        self.lock = threading.Lock()

    def route(self, ep: tuple[str, int], sock: ProbeSocket) -> None:
        self.routes[ep] = sock

    def send(self, endpoint: str, frames: list[bytes], src: str) -> None:
        host, port = endpoint.rsplit("//", 1)[-1].rsplit(":", 1)
        dst = (host.strip("[]"), int(port))
        frames = [bytes(f) for f in frames]
        with self.lock:
            held = self.hold_pred is not None and self.hold_pred(frames)
            self.log.append(
                {
                    "t": round(time.monotonic() - self.t0, 3),
                    "src": src,
                    "dst": f"{dst[0]}:{dst[1]}",
                    "frames": [f.decode("ascii", "replace")[:24] for f in frames],
                    "held": held,
                }
            )
            sock = self.routes.get(dst)
            if sock is None:
                return  # nobody listens there: the frame is lost, as on a real network
            if held:
                self.held.append((sock, frames))
            else:
                sock.put(frames)

    def deliver_held(self) -> int:
        with self.lock:
            held, self.held, self.hold_pred = self.held, [], None
        for sock, frames in held:
            sock.put(frames)
        return len(held)

    def frames(self, kind: bytes) -> list[dict[str, Any]]:
        return [e for e in self.log if e["frames"] and e["frames"][0] == kind.decode()]


class ProbeKVPool:
    """TEST CODE: decode's KV pages (bytes per page) and allocator, with a timed event log."""

    def __init__(self, t0: float, pages: int) -> None:
        import numpy as np

        self.t0 = t0
        self.data = np.zeros((pages, PAGE_BYTES), dtype=np.uint8)
        self.free = list(range(pages))
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def _ev(self, kind: str, who: str, pages: list[int]) -> None:
        self.events.append({"t": round(time.monotonic() - self.t0, 3), "event": kind, "req": who, "pages": pages})

    def alloc(self, n: int, who: str) -> list[int] | None:
        with self.lock:
            if len(self.free) < n:
                return None
            got, self.free = self.free[:n], self.free[n:]
            self._ev("alloc", who, got)
            return got

    def release(self, pages: list[int], who: str) -> None:
        with self.lock:
            self.free.extend(pages)
            self._ev("free", who, list(pages))

    def write(self, pages: list[int], value: int, who: str, kind: str = "write") -> None:
        with self.lock:
            for p in pages:
                self.data[p, :] = value
            self._ev(kind, who, list(pages))

    def first(self, kind: str, who: str) -> dict[str, Any] | None:
        return next((e for e in self.events if e["event"] == kind and e["req"] == who), None)
