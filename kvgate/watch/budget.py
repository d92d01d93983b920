"""The probe traffic budget: requests and prefill tokens over any sliding minute, never exceeded.

A probe is charged before it is sent (its full prompt length: an upper bound on the prefill it
causes); one the budget cannot afford is not sent. The peak over every minute actually used is
measured, so the metrics show the budget held rather than assert it.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

WINDOW_S = 60.0


def every_for_share(requests_per_min: int, interval_s: float, share: float, requests: int) -> int:
    """Intervals between occasions of `requests` requests each (an isolation burst, a handoff round) so
    that they take at most `share` of the request budget; 0: never, the budget is smaller than one."""
    if requests_per_min < requests:
        return 0
    per_min = share * requests_per_min / requests
    return max(1, math.ceil(WINDOW_S / (interval_s * per_min)))


@dataclass
class TrafficBudget:
    """Thread-safe sliding-window budget (0 = nothing may be sent)."""

    requests_per_min: int
    prefill_tokens_per_min: int
    clock: Callable[[], float] = time.monotonic
    requests_total: int = 0
    prefill_tokens_total: int = 0
    refused_total: int = 0
    peak_requests: int = 0
    peak_tokens: int = 0
    _events: deque[tuple[float, int]] = field(default_factory=deque, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _window(self, now: float) -> tuple[int, int]:
        while self._events and self._events[0][0] <= now - WINDOW_S:
            self._events.popleft()
        return len(self._events), sum(t for _, t in self._events)

    def affords(self, tokens: int) -> bool:
        """Whether a probe of `tokens` prompt tokens fits the window now (nothing is charged)."""
        with self._lock:
            n, used = self._window(self.clock())
            return n + 1 <= self.requests_per_min and used + tokens <= self.prefill_tokens_per_min

    def try_spend(self, tokens: int) -> bool:
        """Charge one request of `tokens` prompt tokens if the window has room; False (and counted) if not."""
        with self._lock:
            now = self.clock()
            n, used = self._window(now)
            if n + 1 > self.requests_per_min or used + tokens > self.prefill_tokens_per_min:
                self.refused_total += 1
                return False
            self._events.append((now, tokens))
            self.requests_total += 1
            self.prefill_tokens_total += tokens
            self.peak_requests = max(self.peak_requests, n + 1)
            self.peak_tokens = max(self.peak_tokens, used + tokens)
            return True

    def try_spend_all(self, tokens: list[int]) -> bool:
        """Charge a burst of requests (one per entry) only if the window has room for all of them."""
        with self._lock:
            now = self.clock()
            n, used = self._window(now)
            if n + len(tokens) > self.requests_per_min or used + sum(tokens) > self.prefill_tokens_per_min:
                self.refused_total += 1
                return False
            self._events.extend((now, t) for t in tokens)
            self.requests_total += len(tokens)
            self.prefill_tokens_total += sum(tokens)
            self.peak_requests = max(self.peak_requests, n + len(tokens))
            self.peak_tokens = max(self.peak_tokens, used + sum(tokens))
            return True

    def per_interval(self, interval_s: float) -> int:
        """Requests one interval may plan: the minute's share, at least one when any is allowed."""
        if self.requests_per_min <= 0:
            return 0
        return max(1, int(self.requests_per_min * interval_s / WINDOW_S))
