"""Calibration: measure the deployment through the router before the timing probes size themselves.

Two numbers decide whether a timing effect is observable: the noise of one request (jitter of
one-page requests, end to end through HTTP, the router, the transfer and one decode step) and the
prefill time per token (requests of growing length until the extra time stands well clear of the
noise, that length measured once more after one-page requests to rule out a burst, or the longest
accepted prompt). The latency and abort probes size their lengths, sample counts and cancel points
from them (`latency.plan_latency`, `abort.plan_abort`), within a prefill budget of max(share of one
context-length prefill, `budget_floor_s` seconds of measured prefill up to FLOOR_CAP_TOKENS), so a
small context can afford enough tries and a 1M context stays cheap.

Every calibration request carries a fresh sentinel (no prefix cache can serve it) and asks for one
new token; the cost meter counts it like any probe.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from kvgate.gates.probes.canary import Sender
from kvgate.gates.probes.plan import ACCEPT, LengthProbe, ProbeLimits

#: One-page requests sent to measure the noise.
JITTER_SAMPLES = 10
#: Requests per length while growing (their median is the length's latency).
PER_LENGTH = 3
#: The first grown length is this many one-page prompts; each next one is GROWTH times longer.
FIRST_PAGES = 8
GROWTH = 4
#: Growth stops once the extra time over a one-page request reaches this many noise units (or the
#: longest accepted prompt): then the slope is measured far above the noise.
CLEAR_OF_NOISE = 8.0
#: The noise is never taken below this (a loopback round trip, a scheduler tick).
MIN_JITTER_S = 0.0005
#: The least extra time a timing probe aims for, however quiet the deployment looks.
MIN_EFFECT_S = 0.005
#: What the calibration itself may spend: this share of one context-length prefill, at least the floor.
CALIBRATION_SHARE = 0.02
CALIBRATION_FLOOR_TOKENS = 32_768
#: The floor (budget_floor_s of measured prefill) never exceeds this many tokens: a fast deployment
#: (or a slope measured low) must not turn a 1M context's budget from its share into the floor's.
FLOOR_CAP_TOKENS = 65_536
#: Where a timing probe's length is already the longest accepted prompt (a small context, against the
#: floor: the only way left to see more is more samples or tries), its room for what it plans (latency:
#: one more pass; abort: TRIES_PER_ATTEMPT tries per wanted cancel) may take its budget past
#: FLOOR_CAP_TOKENS up to this many tokens (32 prefills of an 8k context), spent only as tries miss.
#: The floor's 65,536 tokens held 8 full-context samples or 4 abort tries and no look again: a sim
#: 0.5.23 at `sim up` defaults on a loaded CI machine once drew medians of 15.9 vs 37.1 ms over its 8
#: latency samples, not significant at alpha, and was inconclusive.
ROOM_CAP_TOKENS = 262_144
#: The floor is also at least this many noise units (jitter_s) of measured prefill: a latency plan needs
#: 8-16 long samples each about 6 noise units clear of the one-page ones, and room for one pass with
#: longer samples. Without it a noisy deployment (a loaded CPU pair: 100 ms of jitter) got a budget of
#: 1 s of prefill, shrank its samples to about 1 noise unit and could only come out inconclusive.
FLOOR_NOISE_UNITS = 100


@dataclass(frozen=True)
class Calibration:
    """What the calibration measured (seconds are medians of end-to-end latencies through the router).

    `s_per_token` is None when no length up to the longest accepted prompt stood clear of the noise;
    `observable` says whether the longest length measured was clear of it.
    """

    one_page_tokens: int
    base_s: float
    jitter_s: float
    lengths: tuple[tuple[int, float], ...]  # (prompt tokens, median latency s), growing
    s_per_token: float | None
    observable: bool
    requests: int
    failures: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """Enough one-page answers to know the noise, and at least one grown length measured."""
        return self.base_s > 0 and bool(self.lengths)

    def _curve(self) -> list[tuple[int, float]]:
        """(tokens, extra seconds over a one-page request), made non-decreasing (noise can dip it)."""
        out = [(self.one_page_tokens, 0.0)]
        for n, t in self.lengths:
            out.append((n, max(out[-1][1], t - self.base_s)))
        return out

    def extra_s(self, tokens: int) -> float:
        """Extra latency of a `tokens`-long request over a one-page one: between measured lengths
        interpolated, beyond the last one at its average prefill time per token."""
        curve = self._curve()
        for (n0, e0), (n1, e1) in zip(curve, curve[1:], strict=False):
            if tokens <= n1:
                return e0 + (e1 - e0) * max(0, tokens - n0) / max(1, n1 - n0)
        return (self.s_per_token or 0.0) * max(0, tokens - self.one_page_tokens)

    def expected_s(self, tokens: int) -> float:
        """Expected latency of a `tokens`-long request (one new token)."""
        return self.base_s + self.extra_s(tokens)

    def tokens_for(self, seconds: float) -> int | None:
        """The shortest prompt whose measured extra latency reached `seconds` (a measured length, never
        an interpolation: the prefill curve may be convex, and a chord would promise too much); beyond
        the last measured length, extrapolated at its average time per token (conservative for a convex
        curve). None when the prefill time per token is unknown."""
        if not self.s_per_token:
            return None
        for n, e in self._curve()[1:]:
            if e >= seconds:
                return n
        return self.one_page_tokens + math.ceil(seconds / self.s_per_token)

    @property
    def tokens_per_s(self) -> float | None:
        return 1.0 / self.s_per_token if self.s_per_token else None

    def budget_tokens(self, share: float, context: int, floor_s: float) -> int:
        """Prefill tokens a timing probe may spend: max(share x context, floor), the floor being
        max(floor_s, FLOOR_NOISE_UNITS x jitter) of measured prefill, up to FLOOR_CAP_TOKENS."""
        by_share = int(share * context)
        floor_s = max(floor_s, FLOOR_NOISE_UNITS * self.jitter_s)
        if self.s_per_token:
            floor = int(floor_s / self.s_per_token)
        else:
            # No length stood CLEAR_OF_NOISE noise units clear: a token costs under CLEAR_OF_NOISE noise units
            # over the longest length measured, so FLOOR_NOISE_UNITS of them hold at least this many tokens.
            # (A floor of 0 left a loaded 8k sim 0.5.22 a 256-token abort victim, its 6 ms window under
            # 38 ms of noise: four tries missed, exit 3, where a measured calibration gets whole-context tries.)
            longest = max((n for n, _ in self.lengths), default=0)
            floor = int(FLOOR_NOISE_UNITS / CLEAR_OF_NOISE * longest)
        return max(by_share, min(floor, FLOOR_CAP_TOKENS))

    def as_evidence(self) -> dict[str, Any]:
        return {
            "one_page_tokens": self.one_page_tokens,
            "one_page_median_ms": round(self.base_s * 1000, 2),
            "jitter_ms": round(self.jitter_s * 1000, 2),
            "lengths_ms": {f"{n:,}": round(s * 1000, 2) for n, s in self.lengths},
            "prefill_us_per_token": round(self.s_per_token * 1e6, 3) if self.s_per_token else None,
            "prefill_tokens_per_s": round(self.tokens_per_s) if self.tokens_per_s else None,
            "observable": self.observable,
            "requests": self.requests,
        }


def calibration_budget(context: int) -> int:
    """Prefill tokens the calibration may spend (it stops far earlier on most deployments)."""
    return max(int(CALIBRATION_SHARE * context), CALIBRATION_FLOOR_TOKENS)


def jitter_of(latencies: list[float]) -> float:
    """Noise scale of one request: the 10-90 % spread as a normal sigma (robust to one outlier)."""
    xs = sorted(latencies)
    if len(xs) < 3:
        return MIN_JITTER_S
    lo = xs[max(0, round(0.1 * (len(xs) - 1)))]
    hi = xs[min(len(xs) - 1, round(0.9 * (len(xs) - 1)))]
    return max(MIN_JITTER_S, (hi - lo) / 2.563)


def _confirm(
    sender: Sender, short: LengthProbe, probe: LengthProbe, index: int, failures: list[str]
) -> tuple[float | None, int]:
    """Measure a length that first stood clear of the noise once more, each request after a one-page
    one: its extra time over those (None when too few answered), and the prompt tokens spent.

    A burst of contention (a neighbour's prefill on a shared CPU) lasts a few hundred ms: it once made
    three 128-token requests take 202 ms where they take 43 ms, a slope 20x too steep that sized the
    latency and abort probes too short to see anything (real 0.5.19 pair, clean-clone CI, 2026-12-03).
    Slow spikes only add time, so the lower of the two measurements is the one kept.
    """
    base: list[float] = []
    long: list[float] = []
    spent = 0
    with sender.observer.step(f"calibration: {probe.length:,} tokens again, after one-page requests"):
        for i in range(PER_LENGTH):
            for p, into in ((short, base), (probe, long)):
                rec = sender.one(p, f"cal-again{index}-{p.length}-{i}")
                spent += p.length
                if rec.result.served:
                    into.append(rec.result.elapsed_s)
                else:
                    failures.append(f"{rec.label}: HTTP {rec.result.status} timed_out={rec.result.timed_out}")
    if len(base) < 2 or len(long) < 2:
        return None, spent
    return statistics.median(long) - statistics.median(base), spent


def calibrate(sender: Sender, limits: ProbeLimits, budget_tokens: int) -> Calibration:
    """Measure the noise and the prefill time per token through the router (see the module docstring).

    Growing stops at the first length clear of the noise (confirmed by `_confirm` where the budget allows),
    at the longest accepted prompt, or before a length whose requests would take the calibration past
    `budget_tokens`.
    """
    page = limits.one_page
    short = LengthProbe("calibrate_one_page", page, ACCEPT, "none", "calibration: one-page latency", 1)
    failures: list[str] = []
    requests = 0
    base_samples: list[float] = []
    with sender.observer.step("calibration: noise of one-page requests", total=JITTER_SAMPLES) as h:
        for i in range(JITTER_SAMPLES):
            rec = sender.one(short, f"cal{i:02d}")
            requests += 1
            if rec.result.served:
                base_samples.append(rec.result.elapsed_s)
            else:
                failures.append(f"{rec.label}: HTTP {rec.result.status} timed_out={rec.result.timed_out}")
            h.advance(1)
    if len(base_samples) < JITTER_SAMPLES // 2:
        return Calibration(page, 0.0, MIN_JITTER_S, (), None, False, requests, tuple(failures))
    base = statistics.median(base_samples)
    jitter = jitter_of(base_samples)
    clear = max(CLEAR_OF_NOISE * jitter, 2 * MIN_EFFECT_S)
    lengths: list[tuple[int, float]] = []
    spent = 0
    length = min(FIRST_PAGES * page, limits.longest_accepted)
    while length > page:
        if lengths and spent + PER_LENGTH * length > budget_tokens:
            break
        probe = LengthProbe("calibrate_grow", length, ACCEPT, "none", "calibration: growing length", 1)
        times: list[float] = []
        with sender.observer.step(f"calibration: {PER_LENGTH} x {length:,} tokens"):
            # Every length gets PER_LENGTH requests: under load one request in three can be a scheduler
            # spike, and a length picked for one spike would leave the probes it sizes under the noise.
            for i in range(PER_LENGTH):
                rec = sender.one(probe, f"cal-grow{len(lengths)}-{i}")
                requests += 1
                spent += length
                if rec.result.served:
                    times.append(rec.result.elapsed_s)
                else:
                    failures.append(f"{rec.label}: HTTP {rec.result.status} timed_out={rec.result.timed_out}")
        if not times:
            break
        at = statistics.median(times)
        again_tokens = PER_LENGTH * (length + page)
        # The whole context (a small one) is confirmed even past the budget: it is the last length there is,
        # and a burst caught there once sized a loaded 8k sim's timing probes for 20x its prefill (8,185
        # tokens 170 ms against 12 ms at 2,048; latency and abort inconclusive, exit 3). At 1M growth
        # stops long before the longest prompt, so a large context's cost is unchanged.
        whole = length >= limits.longest_accepted and again_tokens <= CALIBRATION_FLOOR_TOKENS
        if at - base >= clear and (spent + again_tokens <= budget_tokens or whole):
            again, spent_again = _confirm(sender, short, probe, len(lengths), failures)
            requests += 2 * PER_LENGTH
            spent += spent_again
            if again is not None:
                at = min(at, base + again)
        lengths.append((length, at))
        if lengths[-1][1] - base >= clear or length >= limits.longest_accepted:
            break
        length = min(length * GROWTH, limits.longest_accepted)
    slope: float | None = None
    observable = False
    if lengths:
        n, t = lengths[-1]
        extra = t - base
        observable = extra >= clear
        # Below two noise units the slope is noise: say unknown rather than guess.
        if extra >= 2 * jitter and n > page:
            slope = extra / (n - page)
    return Calibration(page, base, jitter, tuple(lengths), slope, observable, requests, tuple(failures))
