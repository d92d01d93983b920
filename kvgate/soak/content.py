"""The content checks a soak interleaves: at the end of every slice, under the load, the gate's own
handoff check (kvgate.gates.probes.handoff) and the watch's golden-set burst (kvgate.watch.isolation);
the canary (every load request's answer searched for other requests' sentinels) is judged from the
slice's load records (slo.py). Nothing here re-implements a check: it calls them and keeps what they
judged, when they ran and how long they took.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from kvgate.gates.probes.handoff import run_handoff
from kvgate.results.findings import Finding, Outcome
from kvgate.soak.settings import HANDOFF, ISOLATION
from kvgate.watch import isolation
from kvgate.watch.budget import TrafficBudget
from kvgate.watch.route import ProbeRoute

#: the golden set's own budget: the soak is load by design, the watch's traffic limit does not apply
_UNLIMITED = TrafficBudget(requests_per_min=1_000_000, prefill_tokens_per_min=1 << 40)


@dataclass(frozen=True)
class ContentResult:
    """One content check of one slice: what it judged, when (seconds since the run began), how long."""

    check: str
    outcome: Outcome
    summary: str
    at_s: float
    seconds: float
    finding: Finding | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "check": self.check,
            "outcome": self.outcome.value,
            "summary": self.summary,
            "at_s": round(self.at_s, 3),
            "seconds": round(self.seconds, 3),
        }


class ContentChecks:
    """The handoff check and the golden-set burst, run once per slice (one caller: the soak loop)."""

    def __init__(self, route: ProbeRoute, checks: tuple[str, ...], t0: float) -> None:
        self.route = route
        self.checks = checks
        self.t0 = t0
        self.iso: isolation.IsolationWatch | None = None
        self.iso_note: str | None = None

    def prepare(self) -> str | None:
        """Record the golden set alone, before any load (None when recorded or not asked, else why not)."""
        if ISOLATION not in self.checks:
            return None
        iso = isolation.IsolationWatch(self.route, _UNLIMITED)
        why = iso.record()
        if why is None:
            self.iso = iso
        self.iso_note = why
        return why

    def run(self, slice_index: int) -> list[ContentResult]:
        out: list[ContentResult] = []
        if ISOLATION in self.checks:
            out.append(self._isolation())
        if HANDOFF in self.checks:
            out.append(self._handoff(slice_index))
        return out

    def _isolation(self) -> ContentResult:
        t = time.monotonic()
        at = t - self.t0
        if self.iso is None:
            why = self.iso_note or "no golden set"
            return ContentResult(ISOLATION, Outcome.INCONCLUSIVE, f"golden set not recorded: {why}", at, 0.0)
        res = self.iso.burst()
        took = time.monotonic() - t
        if res.violations:
            f = isolation.finding(res, len(self.iso.golden))
            return ContentResult(ISOLATION, Outcome.FAILED, f.summary, at, took, f)
        if not res.judged:
            n = len(self.iso.golden)
            what = (
                "was answered"
                if res.unanswered == n
                else f"that was answered holds a confident position ({res.unanswered} unanswered)"
            )
            return ContentResult(
                ISOLATION, Outcome.INCONCLUSIVE, f"none of the {n} golden prompts sent together {what}", at, took
            )
        return ContentResult(
            ISOLATION,
            Outcome.PASSED,
            f"{len(self.iso.golden)} golden prompts sent together under the load kept all {res.judged} "
            f"confident tokens" + (f" ({res.unanswered} unanswered, not judged)" if res.unanswered else ""),
            at,
            took,
        )

    def _handoff(self, slice_index: int) -> ContentResult:
        t = time.monotonic()
        f, _samples = run_handoff(
            self.route.sender(), self.route.limits, self.route.settings, f"soak slice {slice_index + 1}"
        )
        return ContentResult(HANDOFF, f.outcome, f.summary, t - self.t0, time.monotonic() - t, f)
