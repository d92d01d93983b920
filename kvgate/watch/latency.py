"""Signal 3 over time (incident.md section 5): the watcher's own probes' prefill durations by
prompt-length bucket, and an alert when long prompts come back as fast as one-page prompts.

Each sample is a non-streaming request for one new token carrying a fresh sentinel (no prefix cache
can serve it), so its duration is the time to the first token: prefill, KV transfer, one decode step.
The alert fires when the 5th percentile of the long bucket falls to the one-page level (the one-page
bucket's median): a long prompt answered as fast as a one-page prompt had no real prefill behind it.
Too few samples in either bucket is "unknown", never "ok".
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

ONE_PAGE = "one_page"
LONG = "long"
BUCKETS = (ONE_PAGE, LONG)

#: alert states, as the gauge reports them
UNKNOWN, OK, ALERT = -1, 0, 1


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks."""
    xs = sorted(values)
    if not xs:
        raise ValueError("no values")
    k = (len(xs) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


@dataclass(frozen=True)
class LatencyState:
    """The signal now: state (UNKNOWN/OK/ALERT), the statistics it rests on, and why."""

    state: int
    long_p5_s: float | None
    one_page_median_s: float | None
    samples: dict[str, int]
    reason: str


class LatencySignal:
    """Bounded windows of durations per bucket (memory stays flat however long it runs)."""

    def __init__(self, window: int, min_samples: int) -> None:
        self.min_samples = min_samples
        self._samples: dict[str, deque[float]] = {b: deque(maxlen=window) for b in BUCKETS}
        self._lock = threading.Lock()

    def record(self, bucket: str, seconds: float) -> None:
        with self._lock:
            self._samples[bucket].append(seconds)

    def state(self) -> LatencyState:
        with self._lock:
            short = list(self._samples[ONE_PAGE])
            long = list(self._samples[LONG])
        counts = {ONE_PAGE: len(short), LONG: len(long)}
        if len(short) < self.min_samples or len(long) < self.min_samples:
            return LatencyState(
                UNKNOWN,
                None,
                None,
                counts,
                f"too few samples ({len(short)} one-page, {len(long)} long; {self.min_samples} each needed)",
            )
        p5, med = percentile(long, 5), percentile(short, 50)
        if p5 <= med:
            return LatencyState(
                ALERT,
                p5,
                med,
                counts,
                f"latency too good: the long bucket's p5 {p5 * 1000:.1f} ms is at the one-page level "
                f"(median {med * 1000:.1f} ms): long prompts answered without their prefill",
            )
        return LatencyState(
            OK, p5, med, counts, f"long p5 {p5 * 1000:.1f} ms above the one-page median {med * 1000:.1f} ms"
        )
