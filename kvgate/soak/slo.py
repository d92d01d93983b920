"""Service levels measured over a set of load requests (a slice, or the whole run), and judged against
the profile's stated ones. A level with nothing to measure (no answered request) is unmeasured, never met."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from kvgate.soak.load import RequestRecord
from kvgate.soak.settings import Slo
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

    def as_dict(self) -> dict[str, Any]:
        return {f.name: _round(getattr(self, f.name)) for f in fields(self)}


@dataclass(frozen=True)
class Level:
    """One service level: measured against stated."""

    name: str
    measured: float | None
    stated: float
    met: bool | None  # None: unmeasured

    def line(self) -> str:
        sense = "<=" if SENSE[self.name] == "max" else ">="
        got = "unmeasured" if self.measured is None else f"{self.measured:.4g}"
        return f"{self.name} {got} (stated {sense} {self.stated:g})"

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "measured": _round(self.measured), "stated": self.stated, "met": self.met}


def _round(v: Any) -> Any:
    return round(v, 6) if isinstance(v, float) else v


def _p(xs: list[float], q: float) -> float | None:
    return percentile(xs, q) if xs else None


def measure(records: Sequence[RequestRecord], seconds: float, slo: Slo) -> Stats:
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
    good = sum(1 for r in served if _good(r, slo))
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
        goodput=good / len(timed) if timed else None,
        requests_per_s=len(records) / span,
        tokens_per_s=sum(r.tokens for r in judged if r.served) / span,
    )


def _good(r: RequestRecord, slo: Slo) -> bool:
    """Served within every per-request bound the profile states."""
    if slo.ttft_p99_s is not None and (r.ttft_s is None or r.ttft_s > slo.ttft_p99_s):
        return False
    itl = r.itl_s
    if slo.itl_p99_s is not None and itl is not None and itl > slo.itl_p99_s:
        return False
    return slo.e2e_p99_s is None or r.e2e_s <= slo.e2e_p99_s


def judge(stats: Stats, slo: Slo) -> list[Level]:
    """Every stated level, measured against stated."""
    out: list[Level] = []
    for name, sense in SENSE.items():
        stated = getattr(slo, name)
        if stated is None:
            continue
        got = getattr(stats, name)
        met = None if got is None else (got <= stated if sense == "max" else got >= stated)
        out.append(Level(name, got, stated, met))
    return out
