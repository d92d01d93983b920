"""The scheduled content probes: accepted-length prompts through the router, within the budget.

Each probe is a dense sentinel prompt (a fresh sentinel, so no prefix cache can serve it), one-page
and long in turn, asking for a short answer. Its duration feeds the latency signal (latency.py); its
answer is scanned for foreign sentinels (this watch's recent probes, whole delimited sentinels of any
earlier kvgate run). Lengths come from the last full gate's readings (kvgate.gates.probes.plan); a
long probe the budget cannot afford in a minute is shortened to what it can, never sent over it.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

from kvgate.gates.probes.canary import Sent
from kvgate.gates.probes.plan import ACCEPT, LengthProbe, ProbeLimits, max_new_tokens_for
from kvgate.gates.probes.sentinels import Sentinel, owners
from kvgate.gates.probes.settings import ProbeSettings
from kvgate.watch.budget import TrafficBudget
from kvgate.watch.latency import LONG, ONE_PAGE
from kvgate.watch.route import ProbeRoute

#: why a scheduled probe was not sent (`kvgate_probe_skipped_total`'s reasons)
OVER_BUDGET = "over budget"
SKIP_REASONS = (OVER_BUDGET,)

#: the long bucket without a calibration of the watch's own: a 32nd of the context, at least 8 pages
#: (probes.latency_long_tokens sets it; the budget and the longest accepted prompt cap it)
LONG_SHARE = 1 / 32

#: answer length: long enough to carry a whole sentinel, short enough to keep decode out of the timing
ANSWER_TOKENS = 24
#: sentinels of this watch's recent probes kept for attributing a sighting (older ones are still
#: caught as whole delimited sentinels of an unknown earlier request)
BOOK = 64


def long_length(limits: ProbeLimits, settings: ProbeSettings) -> int:
    """Length of the long bucket's prompt: configured, else LONG_SHARE of the context."""
    want = (
        settings.latency_long_tokens if settings.latency_long_tokens is not None else int(limits.context * LONG_SHARE)
    )
    return max(8 * limits.one_page, min(want, limits.longest_accepted))


@dataclass(frozen=True)
class ProbeOutcome:
    """One scheduled probe: its bucket, whether it was sent and served, its duration, any leak seen."""

    bucket: str
    length: int
    sent: bool
    served: bool
    seconds: float | None
    leaks: tuple[str, ...] = ()
    problem: str | None = None


class ScheduledProbes:
    """Plans and sends one probe at a time; thread-safe enough for one caller (the watch loop)."""

    def __init__(self, route: ProbeRoute, budget: TrafficBudget) -> None:
        self.route = route
        self.limits = limits = route.limits
        self.settings = settings = route.settings
        self.budget = budget
        self.one_page = limits.one_page
        # The runbook's long bucket: at least 8 pages; at most what half a minute's token budget allows.
        affordable = budget.prefill_tokens_per_min // 2
        self.long = min(long_length(limits, settings), affordable, limits.longest_accepted)
        self.enabled = self.long >= 8 * limits.one_page and budget.prefill_tokens_per_min >= self.one_page
        self._book: deque[Sentinel] = deque(maxlen=BOOK)
        self._turn = 0
        self._lock = threading.Lock()

    @property
    def why_disabled(self) -> str:
        return (
            f"the budget affords a long probe of {self.long:,} tokens, under 8 pages ({8 * self.one_page:,}): "
            "raise watch.prefill_tokens_per_min"
        )

    def next_bucket(self) -> tuple[str, int]:
        with self._lock:
            self._turn += 1
            return (ONE_PAGE, self.one_page) if self._turn % 2 else (LONG, self.long)

    def send(self) -> ProbeOutcome:
        """Send the next probe if the budget affords it now."""
        bucket, length = self.next_bucket()
        if not self.budget.try_spend(length):
            return ProbeOutcome(bucket, length, False, False, None, problem=OVER_BUDGET)
        probe = LengthProbe(
            f"watch_{bucket}",
            length,
            ACCEPT,
            "none",
            f"scheduled {bucket} probe",
            max_new_tokens_for(self.limits, length, ANSWER_TOKENS),
        )
        sender = self.route.sender(book=self._book)
        rec: Sent = sender.one(probe, "watch")
        self._book.append(rec.sentinel)
        res = rec.result
        seen = tuple(owners(sender.sightings([rec])))
        if not res.served:
            why = res.transport_error or f"HTTP {res.status}" + (" (timed out)" if res.timed_out else "")
            return ProbeOutcome(bucket, length, True, False, None, seen, problem=why)
        return ProbeOutcome(bucket, length, True, True, res.elapsed_s, seen)
