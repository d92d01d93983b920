"""Latency: is a long prompt measurably slower than a one-page prompt? (incident.md section 5, signal 3)

Samples are interleaved (short, long, short, ...) so drift hits both buckets alike, and every sample
carries a fresh sentinel so no prefix cache can serve it. Each sample asks for one new token: its
non-streaming latency is the time to first token (prefill, KV transfer, one decode step).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvgate.findings import Evidence, Finding, failed, inconclusive, passed
from kvgate.gates.probes.canary import Sender, Sent
from kvgate.gates.probes.plan import ACCEPT, LengthProbe, ProbeLimits
from kvgate.gates.probes.settings import ProbeSettings
from kvgate.gates.probes.stats import KsResult, ks_long_slower

GATE = "probes"
CHECK = "latency.prefill_scaling"


@dataclass(frozen=True)
class LatencyModel:
    """Median latencies of the two buckets, for estimating when a transfer is in flight."""

    short_tokens: int
    long_tokens: int
    short_s: float
    long_s: float

    def expected_s(self, tokens: int) -> float:
        """Linear interpolation (prefill time grows with length)."""
        if self.long_tokens == self.short_tokens:
            return self.long_s
        slope = max(0.0, (self.long_s - self.short_s) / (self.long_tokens - self.short_tokens))
        return self.short_s + slope * (tokens - self.short_tokens)


def long_length(limits: ProbeLimits, settings: ProbeSettings) -> int:
    """Length of a long latency sample: configured, or the latency budget spread over the samples."""
    if settings.latency_long_tokens is not None:
        want = settings.latency_long_tokens
    else:
        want = int(settings.latency_budget * limits.context / settings.latency_samples)
    return max(8 * limits.one_page, min(want, limits.longest_accepted))


@dataclass(frozen=True)
class LatencySamples:
    """What the latency probe measured."""

    short_tokens: int
    long_tokens: int
    short: tuple[float, ...]
    long: tuple[float, ...]
    failures: tuple[str, ...]

    def ks(self) -> KsResult | None:
        if len(self.short) < 3 or len(self.long) < 3:
            return None
        return ks_long_slower(self.short, self.long)

    def model(self, alpha: float) -> LatencyModel | None:
        """A latency model only when long prompts are significantly slower (otherwise the slope is noise)."""
        ks = self.ks()
        if ks is None or not ks.significant(alpha):
            return None
        return LatencyModel(self.short_tokens, self.long_tokens, ks.median_short, ks.median_long)


def collect_latency(sender: Sender, limits: ProbeLimits, settings: ProbeSettings) -> LatencySamples | None:
    """Interleave n one-page and n long samples (each with a fresh sentinel, one new token)."""
    n = settings.latency_samples
    short_p = LengthProbe("latency_short", limits.one_page, ACCEPT, "none", "one-page latency sample", 1)
    ll = min(long_length(limits, settings), limits.longest_accepted)
    long_p = LengthProbe("latency_long", ll, ACCEPT, "none", "long latency sample", 1)
    if ll <= short_p.length:
        return None
    short: list[float] = []
    long: list[float] = []
    bad: list[str] = []
    with sender.observer.step(f"latency: {n} x {short_p.length} vs {n} x {ll:,} tokens", total=2 * n) as h:
        for i in range(n):
            for p, bucket in ((short_p, short), (long_p, long)):
                rec = sender.one(p, f"latency{i:02d}")
                if rec.result.served:
                    bucket.append(rec.result.elapsed_s)
                else:
                    bad.append(f"{rec.label}: HTTP {rec.result.status} timed_out={rec.result.timed_out}")
                h.advance(1)
    return LatencySamples(short_p.length, ll, tuple(short), tuple(long), tuple(bad))


def latency_finding(
    samples: LatencySamples | None,
    settings: ProbeSettings,
    served_over_limit: list[Sent],
    plant: Sent | None,
    node: str,
) -> Finding:
    """Verdict of signal 3: KS over the buckets, and over-limit answers served faster than a real prefill.

    A rejected-length prompt answered with 200 in under half the time the at-limit plant (a real
    prefill of about the same length) took, or of what the latency model predicts, is `latency_too_fast`.
    """
    if samples is None:
        return inconclusive(GATE, CHECK, node, "no long length above one page fits the limits")
    ks = samples.ks()
    model = samples.model(settings.latency_alpha)
    ev: list[Evidence] = [
        Evidence(
            node,
            "latency.samples",
            {
                "short": len(samples.short),
                "long": len(samples.long),
                "short_tokens": samples.short_tokens,
                "long_tokens": samples.long_tokens,
            },
        )
    ]
    fast: list[str] = []
    for rec in served_over_limit:
        ref = None
        if plant is not None and plant.result.status == 200 and rec.probe.length >= plant.probe.length:
            ref = (plant.result.elapsed_s, f"the at-limit plant ({plant.probe.length:,} tokens) took")
        elif model is not None:
            ref = (model.expected_s(rec.probe.length), "a real prefill of that length should take about")
        if ref is not None and rec.result.elapsed_s < 0.5 * ref[0]:
            fast.append(
                f"{rec.label} answered 200 in {rec.result.elapsed_s * 1000:.1f} ms; {ref[1]} {ref[0] * 1000:.1f} ms"
            )
    if ks is not None:
        ev += [
            Evidence(node, "latency.median_s", {"short": round(ks.median_short, 4), "long": round(ks.median_long, 4)}),
            Evidence(
                node,
                "latency.ks",
                {"d_plus": round(ks.d_plus, 4), "p_value": ks.p_value},
                f"p < {settings.latency_alpha:g} (long slower than one-page)",
            ),
        ]
    if fast:
        ev.append(Evidence(node, "latency.served_too_fast", fast, "a rejected length is never served"))
        return failed(
            GATE,
            CHECK,
            node,
            f"latency_too_fast: {fast[0]}: served without its prefill "
            "(latency too good: read from another request's KV)",
            *ev,
            remedy="upgrade to SGLang 0.5.22+; rejected requests must be retired at admission",
        )
    if ks is None:
        return inconclusive(
            GATE,
            CHECK,
            node,
            f"too few answered latency samples ({len(samples.short)} short, "
            f"{len(samples.long)} long); failures: {list(samples.failures[:3])}",
            *ev,
        )
    how = (
        f"one-sided two-sample KS over {ks.n_short} one-page ({samples.short_tokens} tokens) and {ks.n_long} "
        f"long ({samples.long_tokens:,} tokens) samples: D+={ks.d_plus:.3f}, p={ks.p_value:.2g}, medians "
        f"{ks.median_short * 1000:.1f} ms vs {ks.median_long * 1000:.1f} ms"
    )
    if ks.significant(settings.latency_alpha):
        return passed(GATE, CHECK, node, f"long prompts are measurably slower ({how})", *ev)
    return inconclusive(
        GATE,
        CHECK,
        node,
        f"could not show that long prompts are slower than one-page prompts at "
        f"alpha={settings.latency_alpha:g} ({how}): at this length the prefill may be below the "
        "noise, or long prompts are served without a prefill; raise latency_long_tokens or "
        "latency_samples",
        *ev,
    )
