"""What the probes cost the target: tokens sent, tokens it had to prefill, wall time."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kvgate.gates.probes.client import ProbeResult


@dataclass
class CostMeter:
    """Thread-safe counters. Prefill tokens: every accepted-length prompt the target answered with 200,
    or that was cancelled in flight, in full (an upper bound); rejections and hangs count nothing.
    A rejected-length prompt answered with 200 is counted apart (`probe_over_limit_served_tokens`): a
    leaky target claims those tokens but does not prefill them."""

    context: int | None = None
    tokens_sent: int = 0
    prefill_tokens: int = 0
    requests: int = 0
    over_limit_served: int = 0
    started: float = field(default_factory=time.monotonic)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, res: ProbeResult, *, accepted_length: bool) -> None:
        with self._lock:
            self.requests += 1
            self.tokens_sent += res.sent_tokens
            if res.served or res.cancelled:
                if accepted_length:
                    self.prefill_tokens += res.sent_tokens
                else:
                    self.over_limit_served += res.sent_tokens

    def charge_prefill(self, tokens: int) -> None:
        """Count a prompt the target prefilled (at least partly) without serving it, e.g. one aborted."""
        with self._lock:
            self.prefill_tokens += tokens

    def as_cost(self) -> dict[str, Any]:
        """Flat keys for the report's cost section."""
        out: dict[str, Any] = {
            "probe_requests": self.requests,
            "probe_tokens_sent": self.tokens_sent,
            "probe_prefill_tokens": self.prefill_tokens,
            "probe_over_limit_served_tokens": self.over_limit_served,
            "probe_wall_s": round(time.monotonic() - self.started, 3),
        }
        if self.context:
            out["probe_prefill_ratio_of_context"] = round(self.prefill_tokens / self.context, 4)
        return out
