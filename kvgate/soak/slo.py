"""Service levels measured over a set of load requests (a slice, or the whole run), and judged against
the profile's stated ones. A level with nothing to measure (no answered request, no prefill rate) is
unmeasured, never met.

Time to first token and end to end grow with the prompt: a healthy 1M-token prefill alone takes far
longer than an interactive level. So these levels are judged per prompt-length bucket of the mix, each
bucket on its own percentiles, against the level plus the bucket's prefill allowance (Allowance):
what a request of that length may take for its share of the prefill. Inter-token latency, the error
rate and goodput are judged over every request (goodput with each request's own allowance)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from kvgate.soak.load import RequestRecord
from kvgate.soak.settings import BUCKETS, Slo
from kvgate.watch.latency import percentile

#: how each level is judged: "max" (measured must not exceed stated) or "min"
SENSE = {
    "ttft_p50_s": "max",
    "ttft_p99_s": "max",
    "itl_p99_s": "max",
    "e2e_p50_s": "max",
    "e2e_p99_s": "max",
    "error_rate": "max",
    "goodput": "min",
}
#: the levels that include the request's prefill: judged per bucket, each with its allowance
PER_BUCKET = ("ttft_p50_s", "ttft_p99_s", "e2e_p50_s", "e2e_p99_s")


def prefill_share(concurrency: int) -> int:
    """How many requests share the prefill at most: the load's in flight, and the slice's content check."""
    return concurrency + 1


@dataclass(frozen=True)
class Allowance:
    """What a request of a given length may take on top of a level: its share of the prefill.

    At most `share` requests (the soak's concurrency, plus the slice's content check) are in flight at
    once and share the prefill; a healthy deployment gives each at least 1/share of its speed, so a
    request of L tokens has its prefill done within share x L / tokens_per_s. tokens_per_s is the
    prefill speed of one request alone, stated in the profile (soak.prefill_tokens_per_s) or measured
    by the soak before its load (`source` says which); None: not known (`source` says why), and the
    per-bucket levels and goodput are unmeasured.
    """

    tokens_per_s: float | None
    share: int
    source: str

    def extra_s(self, length: int) -> float | None:
        return None if self.tokens_per_s is None else self.share * length / self.tokens_per_s

    def describe(self) -> str:
        if self.tokens_per_s is None:
            return f"no prefill rate to size the per-bucket latency levels: {self.source}"
        return (
            f"ttft/e2e levels per bucket + {self.share} x the bucket's tokens / {self.tokens_per_s:,.0f} tokens/s "
            f"of prefill ({self.source})"
        )

    def as_dict(self) -> dict[str, Any]:
        return {"tokens_per_s": _round(self.tokens_per_s), "share": self.share, "source": self.source}


@dataclass(frozen=True)
class BucketStats:
    """The prefill-including percentiles of one prompt-length bucket (its streamed, served requests)."""

    bucket: str
    length: int
    served: int
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    e2e_p50_s: float | None
    e2e_p99_s: float | None

    def as_dict(self) -> dict[str, Any]:
        return {f.name: _round(getattr(self, f.name)) for f in fields(self)}


@dataclass(frozen=True)
class Stats:
    """What a set of load requests measured (None: nothing to measure it on)."""

    requests: int
    cancelled: int
    served: int
    errors: int
    leaks: int
    seconds: float
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    itl_p99_s: float | None = None
    e2e_p50_s: float | None = None
    e2e_p99_s: float | None = None
    error_rate: float | None = None
    goodput: float | None = None
    requests_per_s: float = 0.0
    tokens_per_s: float = 0.0
    #: the per-bucket percentiles (the whole-set ones above are shown, never judged)
    buckets: tuple[BucketStats, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        out = {f.name: _round(getattr(self, f.name)) for f in fields(self)}
        out["buckets"] = [b.as_dict() for b in self.buckets]
        return out


@dataclass(frozen=True)
class Level:
    """One service level: measured against stated. A per-bucket level (`bucket` set) is stated as the
    profile's level plus the bucket's prefill allowance (`allowance_s`)."""

    name: str
    measured: float | None
    stated: float
    met: bool | None  # None: unmeasured
    bucket: str | None = None
    length: int | None = None
    allowance_s: float | None = None
    why: str | None = None  # why it is unmeasured

    def line(self) -> str:
        sense = "<=" if SENSE[self.name] == "max" else ">="
        got = "unmeasured" if self.measured is None else f"{self.measured:.4g}"
        name = self.name if self.bucket is None else f"{self.name}[{self.bucket}]"
        if self.allowance_s is None:
            return f"{name} {got} (stated {sense} {self.stated:g})"
        base = self.stated - self.allowance_s
        return (
            f"{name} {got} (stated {sense} {self.stated:.4g} = {base:g} + {self.allowance_s:.3g} s prefill allowance)"
        )

    def as_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "measured": _round(self.measured), "stated": _round(self.stated), "met": self.met}
        if self.bucket is not None:
            out |= {"bucket": self.bucket, "length": self.length, "allowance_s": _round(self.allowance_s)}
        if self.why is not None:
            out["why"] = self.why
        return out


def _round(v: Any) -> Any:
    return round(v, 6) if isinstance(v, float) else v


def _p(xs: list[float], q: float) -> float | None:
    return percentile(xs, q) if xs else None


def measure(records: Sequence[RequestRecord], seconds: float, slo: Slo, allowance: Allowance) -> Stats:
    """The levels over `records` (cancelled requests count in the load, never in the levels)."""
    judged = [r for r in records if not r.cancelled]
    # the levels are read on streamed requests only: one sent to be cancelled but answered first has
    # no first-token time (it still counts in the error rate)
    timed = [r for r in judged if r.streamed]
    served = [r for r in timed if r.served]
    ttft = [r.ttft_s for r in served if r.ttft_s is not None]
    itl = [x for r in served if (x := r.itl_s) is not None]
    e2e = [r.e2e_s for r in served]
    errors = sum(1 for r in judged if not r.served)
    goods = [_good(r, slo, allowance) for r in served]
    span = max(seconds, 1e-9)
    return Stats(
        requests=len(records),
        cancelled=len(records) - len(judged),
        served=sum(1 for r in judged if r.served),
        errors=errors,
        leaks=sum(len(r.leaks) for r in records),
        seconds=round(seconds, 3),
        ttft_p50_s=_p(ttft, 50),
        ttft_p99_s=_p(ttft, 99),
        itl_p99_s=_p(itl, 99),
        e2e_p50_s=_p(e2e, 50),
        e2e_p99_s=_p(e2e, 99),
        error_rate=errors / len(judged) if judged else None,
        goodput=None if not timed or None in goods else sum(1 for g in goods if g) / len(timed),
        requests_per_s=len(records) / span,
        tokens_per_s=sum(r.tokens for r in judged if r.served) / span,
        buckets=_buckets(served),
    )


def _buckets(served: list[RequestRecord]) -> tuple[BucketStats, ...]:
    order = {b: i for i, b in enumerate(BUCKETS)}
    out = []
    for bucket in sorted({r.bucket for r in served}, key=lambda b: order.get(b, len(order))):
        rs = [r for r in served if r.bucket == bucket]
        ttft = [r.ttft_s for r in rs if r.ttft_s is not None]
        e2e = [r.e2e_s for r in rs]
        out.append(
            BucketStats(
                bucket, max(r.length for r in rs), len(rs), _p(ttft, 50), _p(ttft, 99), _p(e2e, 50), _p(e2e, 99)
            )
        )
    return tuple(out)


def _good(r: RequestRecord, slo: Slo, allowance: Allowance) -> bool | None:
    """Served within every per-request bound the profile states (None: a bound has no prefill rate)."""
    itl = r.itl_s
    if slo.itl_p99_s is not None and itl is not None and itl > slo.itl_p99_s:
        return False
    if slo.ttft_p99_s is None and slo.e2e_p99_s is None:
        return True
    extra = allowance.extra_s(r.length)
    if extra is None:
        return None
    if slo.ttft_p99_s is not None and (r.ttft_s is None or r.ttft_s > slo.ttft_p99_s + extra):
        return False
    return slo.e2e_p99_s is None or r.e2e_s <= slo.e2e_p99_s + extra


def judge(stats: Stats, slo: Slo, allowance: Allowance) -> list[Level]:
    """Every stated level, measured against stated: the prefill-including ones once per bucket with
    answered requests (a bucket the set holds none of is not judged in it), the others once."""
    out: list[Level] = []
    for name, sense in SENSE.items():
        stated = getattr(slo, name)
        if stated is None:
            continue
        if name in PER_BUCKET:
            out += _per_bucket(name, stated, stats, allowance)
            continue
        got = getattr(stats, name)
        met = None if got is None else (got <= stated if sense == "max" else got >= stated)
        why = None
        if got is None:
            why = allowance.describe() if name == "goodput" and stats.served else "no answered load request"
        out.append(Level(name, got, stated, met, why=why))
    return out


def _per_bucket(name: str, stated: float, stats: Stats, allowance: Allowance) -> list[Level]:
    measured = [(b, v) for b in stats.buckets if (v := getattr(b, name)) is not None]
    if not measured:
        return [Level(name, None, stated, None, why="no answered load request")]
    if allowance.tokens_per_s is None:
        return [Level(name, None, stated, None, why=allowance.describe())]
    out = []
    for b, got in measured:
        extra = allowance.extra_s(b.length) or 0.0
        out.append(Level(name, got, stated + extra, got <= stated + extra, b.bucket, b.length, extra))
    return out
