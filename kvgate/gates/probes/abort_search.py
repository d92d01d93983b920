"""Where the abort probe cancels next (`CancelPoints`), and what one try showed about where its victim was
(`classify`): the search half of `abort.py`, which sizes the tries and runs them.

The victim's clock starts when its request goes out (after its ids are built: a server tokenizer may
answer that late, `Sender.one`'s `on_send`), and each cancel point is measured on that clock, so what an
answer says (its end-to-end time) and where the cancel was are on one scale.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvgate.gates.probes.client import ProbeResult

#: What one try showed about where the victim was when the cancel came (`classify`).
CANCELLED = "cancelled"  # aborted while the decode waited for its KV: the try counts
EARLY = "early"  # the cancel found no request to abort: the decode did not hold it yet
HANDSHAKE = "handshake"  # aborted in the decode's prealloc queue: no page was handed to the prefill yet
LATE = "late"  # its KV had arrived (the running batch took the abort, or it answered before the cancel)
UNKNOWN = "unknown"  # no answer that says (a timeout, a transport failure, an unrelated error)
KIND_WORDS = {
    CANCELLED: "aborted in flight",
    EARLY: "too early: the decode did not hold it yet",
    HANDSHAKE: "too early: aborted in the handshake, before its transfer",
    LATE: "too late: its KV had arrived",
    UNKNOWN: "no answer that says where it was",
}
#: Below this share of the tail (or MIN_GAP_S) the bracket around the in-flight window is noise, and
#: the search reopens (or the victim is lengthened: `narrow`).
GAP_OF_TAIL = 0.25
MIN_GAP_S = 0.0002
#: A bracket narrower than this many tails (the noise of one request's timing) with no cancel in flight
#: and one seen too late: the window is narrower than the noise, and a longer victim is what helps
#: (`narrow`). Bisecting on to the reopening gap above spent every try of a held-out real pair's budget.
WIDEN_GAP_OF_TAIL = 1.0
#: Tries, every one too early, after which the cancels (each later than the last, up to the answers) are
#: taken to never reach the request.
MIN_BISECTIONS = 3


def _van_der_corput(k: int) -> float:
    """0.5, 0.25, 0.75, 0.125, 0.625, ...: each next point splits the largest gap left."""
    x, denom, k = 0.0, 1.0, k + 1
    while k:
        denom *= 2
        x += (k % 2) / denom
        k //= 2
    return x


def classify(result: ProbeResult, at: float, tail: float) -> str:
    """Where the victim was when it was cancelled at `at` (on its own clock), from its own answer
    (SGLang 0.5.19-0.5.23):

    - an error answer after the cancel naming the abort: "Decode transfer failed ... Aborted by AbortReq."
      (the transfer queue: CANCELLED), but "Decode handshake failed ... Aborted by AbortReq." is the
      prealloc queue, before any page was handed to the prefill (HANDSHAKE: nothing was in flight); an
      abort answer earlier than the cancel is not ours (UNKNOWN);
    - HTTP 200 with finish_reason abort ("Abort in running batch", "Abort in waiting queue"): its KV had
      arrived (LATE);
    - a normal 200 within `tail` of the cancel: it was answering already (LATE); later than that: the
      cancel found no request to abort, so the decode did not hold it yet (EARLY);
    - the client's own disconnect (no decode URL) counts as CANCELLED, unacknowledged.
    """
    if result.transport_error is not None or result.timed_out:
        return UNKNOWN
    if result.cancelled:
        return CANCELLED
    if result.status == 200 and result.finish_abort is not None:
        return LATE
    if result.served:
        return LATE if result.elapsed_s <= at + tail else EARLY
    # The cancel's clock starts as the victim goes out, its own clock a moment later (more on a busy
    # machine): an abort answer up to `tail` before `at` on its own clock still came after the cancel.
    if result.status is not None and result.elapsed_s >= at - tail and "abort" in result.raw.lower():
        return HANDSHAKE if "handshake failed" in result.raw.lower() else CANCELLED
    return UNKNOWN


@dataclass
class CancelPoints:
    """Where to cancel next: a bisection over the time the victim really spends in flight, from what
    each try observed. The first cancel is the calibrated guess; after it, the bracket is (latest EARLY
    cancel, earliest LATE cancel or answer), and each next cancel splits it. An answer bounds the window
    from above however long the deployment takes end to end (its decode, a slow transfer, a model the
    calibration's one-token requests do not show), so the search covers the time the request actually
    spent in flight, not only the calibrated prefill window. Where the bracket closes with no cancel in
    flight (`narrow`), the window is narrower than the noise: the probe lengthens its victim where the
    budget allows (`widened`), else the search reopens across everything observed."""

    first: float
    floor: float
    tail: float
    early: list[float] = field(default_factory=list)
    late: list[float] = field(default_factory=list)
    answered: list[float] = field(default_factory=list)  # end-to-end seconds of answers: KV arrived before
    hits: list[float] = field(default_factory=list)
    reopened: int = 0
    #: Where nothing LATE or answered bounds the bracket yet: its upper end (set by `widened`).
    ceiling: float | None = None

    @classmethod
    def start(cls, lead_s: float, window_s: float) -> CancelPoints:
        """The first cancel: the middle of the calibrated prefill window `window_s`, which starts about
        `lead_s` in (the rest of a one-page request's time comes after its KV arrived). Aimed at the middle
        of [lead, expected - lead] instead, the first cancel came after the KV in 4 of 5 runs of a loaded
        sim 0.5.23 and of a 1M sim 0.5.22 (a running-batch abort, which no longer counts)."""
        floor = max(0.001, 0.5 * lead_s)
        first = max(0.001, lead_s) + max(0.0005, window_s / 2)
        return cls(first=first, floor=floor, tail=lead_s)

    def _min_gap(self) -> float:
        return max(MIN_GAP_S, GAP_OF_TAIL * self.tail)

    def bracket(self) -> tuple[float, float]:
        """(lo, hi): the cancel is best placed after lo (an EARLY cancel) and before hi (a LATE one, or an
        answer less its tail)."""
        lo = max([self.floor, *self.early])
        ends = [*self.late, *(a - self.tail for a in self.answered)]
        if ends:
            hi = min(ends)
        elif self.ceiling is not None:
            hi = max(self.ceiling, 2 * lo)
        else:
            hi = max(2 * lo, 2 * self.first)
        return lo, hi

    def narrow(self) -> bool:
        """No cancel in flight yet, a cancel seen too late, and the bracket closed: the in-flight window
        is narrower than what separates the tries (the noise, the floor), or the tries contradict each
        other. Either way a longer window is what helps."""
        if self.hits or not self.late:
            return False
        lo, hi = self.bracket()
        return hi - lo < max(self._min_gap(), WIDEN_GAP_OF_TAIL * self.tail)

    def widened(self, extra_s: float) -> None:
        """The victim was lengthened, so its KV arrives about `extra_s` later (its prefill is longer): what
        was too late or answered may now be in flight and is forgotten; what was too early (the decode did
        not hold it yet, which does not depend on its length) still bounds the search from below."""
        _, hi = self.bracket()
        self.late.clear()
        self.answered.clear()
        self.ceiling = hi + max(extra_s, self._min_gap())

    def next(self) -> float:
        if self.hits:
            return self.hits[-1]  # a cancel there was in flight: cancel there again
        if not (self.early or self.late or self.answered or self.ceiling):
            return round(self.first, 4)
        lo, hi = self.bracket()
        if hi - lo >= self._min_gap():
            return round((lo + hi) / 2, 4)
        # The bracket closed on noise (an EARLY cancel after a LATE one, or answers sooner than the tail):
        # forget the bracket and draw the next points across the whole time observed (up to the latest
        # answer), each splitting the largest gap left.
        self.early.clear()
        self.late.clear()
        span = max(self.answered) if self.answered else max(2 * self.first, self.ceiling or 0.0)
        span = max(span, self.floor + self._min_gap())
        at = self.floor + _van_der_corput(self.reopened) * (span - self.floor)
        self.reopened += 1
        return round(at, 4)

    def learn(self, at: float, kind: str, victim: ProbeResult | None) -> None:
        """Record what the try cancelled at `at` showed (`classify`)."""
        if victim is not None and victim.served:
            self.answered.append(victim.elapsed_s)
        if kind == CANCELLED:
            self.hits.append(at)
        elif kind in (EARLY, HANDSHAKE):
            self.early.append(at)
        elif kind == LATE:
            self.late.append(min(at, victim.elapsed_s) if victim is not None else at)
