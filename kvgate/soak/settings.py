"""Settings of `kvgate soak`: the profile's `soak:` section (load shape, slices, SLOs), each key
overridable by a flag where the command has one."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from kvgate.errors import ProfileError

#: prompt-length buckets of the load mix (planned against the deployment's own limits, load.py)
SHORT, MEDIUM, LONG, NEAR_LIMIT = "short", "medium", "long", "near_limit"
BUCKETS = (SHORT, MEDIUM, LONG, NEAR_LIMIT)
DEFAULT_MIX = {SHORT: 0.6, MEDIUM: 0.25, LONG: 0.1, NEAR_LIMIT: 0.05}
#: the content checks a slice can run (content.py)
CANARY, ISOLATION, HANDOFF = "canary", "isolation", "handoff"
CHECKS = (CANARY, ISOLATION, HANDOFF)


@dataclass(frozen=True)
class Slo:
    """The stated service levels (`soak.slo:`), judged per slice and for the run. None: not judged.

    The time-to-first-token and end-to-end levels are what a request may take ON TOP of its share of
    the prefill: each prompt-length bucket of the mix is judged on its own percentiles against
    `level + concurrency x bucket length / prefill rate` (slo.Allowance), so a healthy deployment
    passes at any context while a request slower than its prefill share plus the level still fails.

    - ttft_p50_s / ttft_p99_s: time to the first streamed token, median and 99th percentile.
    - itl_p99_s: inter-token latency ((e2e - ttft) / (tokens - 1) per request), 99th percentile (flat:
      a token's gap does not grow with the prompt).
    - e2e_p50_s / e2e_p99_s: whole request, median and 99th percentile.
    - error_rate: the largest share of non-cancelled requests that may fail (HTTP error, abort, hang).
    - goodput: the smallest share of streamed requests (not those sent to be cancelled) that must be served within every
      per-request level (ttft_p99_s and e2e_p99_s plus the request's prefill allowance, itl_p99_s).
    """

    ttft_p50_s: float | None = 5.0
    ttft_p99_s: float | None = 20.0
    itl_p99_s: float | None = 2.0
    e2e_p50_s: float | None = 10.0
    e2e_p99_s: float | None = 60.0
    error_rate: float | None = 0.01
    goodput: float | None = 0.95

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class SoakSettings:
    """What the soak drives and how it judges. Every field is a profile key under `soak:`.

    - duration_s: how long the load runs; slice_s: the length of one judged timeslice.
    - concurrency: requests in flight at most (closed loop: each finished request starts the next).
    - rate_per_s: when set, an open loop: requests start at this rate (still at most `concurrency` in flight).
    - ramp_s: the load rises linearly from one request in flight (or a tenth of the rate) to the full
      level over this many seconds.
    - max_new_tokens: answer length of each load request (capped by the context).
    - mix: the share of each prompt-length bucket: short (one page), medium (an eighth of the longest
      accepted prompt), long (half of it), near_limit (the longest accepted prompt: near the context
      and the pool bound, whichever is smaller).
    - cancel_share: the share of requests dropped by the client `cancel_after_s` after they were sent
      (mid-prefill or mid-transfer for any prompt longer than a page).
    - checks: the content checks each slice runs at its end, under the load (canary, isolation, handoff).
    - pool_every_s: seconds between readings of every worker's KV pool use (/v1/loads).
    - prefill_tokens_per_s: the deployment's prefill speed for one request alone, which sizes each
      bucket's latency allowance (Slo); None: measured by the soak itself before the load (one request
      of the mix's longest bucket, alone: its length / its time to first token).
    - slo: the service levels (Slo).
    """

    duration_s: float = 300.0
    slice_s: float = 30.0
    concurrency: int = 8
    rate_per_s: float | None = None
    ramp_s: float = 30.0
    max_new_tokens: int = 32
    mix: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    cancel_share: float = 0.05
    cancel_after_s: float = 0.05
    checks: tuple[str, ...] = CHECKS
    pool_every_s: float = 5.0
    prefill_tokens_per_s: float | None = None
    slo: Slo = field(default_factory=Slo)

    @property
    def slices(self) -> int:
        return max(1, round(self.duration_s / self.slice_s))

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any] | None, source: str) -> SoakSettings:
        """Validate a `soak:` mapping; a bad key or value raises ProfileError(source, "soak.<key>", ...)."""
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in dict(mapping or {}).items():
            where = f"soak.{key}"
            if key not in known:
                raise ProfileError(source, where, "unknown key; expected one of " + ", ".join(sorted(known)))
            if key == "mix":
                values[key] = _mix(source, value)
            elif key == "checks":
                values[key] = _checks(source, value)
            elif key == "slo":
                values[key] = _slo(source, value)
            elif key in ("rate_per_s", "prefill_tokens_per_s") and value is None:
                values[key] = None
            else:
                values[key] = _number(source, where, value, integer=key in ("concurrency", "max_new_tokens"))
        settings = cls(**values)
        settings.check(source)
        return settings

    def with_flags(self, **flags: Any) -> SoakSettings:
        """The settings with every flag that was given (not None) in place."""
        return replace(self, **{k: v for k, v in flags.items() if v is not None})

    def check(self, source: str) -> None:
        """Raise ProfileError for a value out of range."""
        bounds: dict[str, tuple[float, float]] = {
            "duration_s": (1.0, 7 * 86400.0),
            "slice_s": (0.5, 86400.0),
            "concurrency": (1, 4096),
            "ramp_s": (0.0, 86400.0),
            "max_new_tokens": (1, 1 << 20),
            "cancel_share": (0.0, 0.9),
            "cancel_after_s": (0.001, 600.0),
            "pool_every_s": (0.2, 3600.0),
        }
        for key, (lo, hi) in bounds.items():
            v = getattr(self, key)
            if not lo <= v <= hi:
                raise ProfileError(source, f"soak.{key}", f"must be between {lo:g} and {hi:g}, got {v}")
        if self.rate_per_s is not None and not 0.01 <= self.rate_per_s <= 100_000:
            raise ProfileError(source, "soak.rate_per_s", f"must be between 0.01 and 100000, got {self.rate_per_s}")
        rate = self.prefill_tokens_per_s
        if rate is not None and not 1 <= rate <= 1e9:
            raise ProfileError(source, "soak.prefill_tokens_per_s", f"must be between 1 and 1e9, got {rate}")
        if self.slice_s > self.duration_s:
            raise ProfileError(source, "soak.slice_s", "must not exceed duration_s (no slice could end)")

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["mix"], out["checks"], out["slo"] = dict(self.mix), list(self.checks), self.slo.to_dict()
        return out


def _number(source: str, where: str, value: Any, *, integer: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProfileError(source, where, f"expected a number, got {value!r}")
    if integer and not isinstance(value, int):
        raise ProfileError(source, where, f"expected an integer, got {value!r}")
    return value


def _mix(source: str, value: Any) -> dict[str, float]:
    if not isinstance(value, Mapping) or not value:
        raise ProfileError(source, "soak.mix", f"expected a mapping of {', '.join(BUCKETS)} to shares, got {value!r}")
    mix: dict[str, float] = {}
    for k, v in value.items():
        if k not in BUCKETS:
            raise ProfileError(source, f"soak.mix.{k}", "unknown bucket; expected one of " + ", ".join(BUCKETS))
        share = _number(source, f"soak.mix.{k}", v, integer=False)
        if share < 0:
            raise ProfileError(source, f"soak.mix.{k}", f"must be at least 0, got {share}")
        mix[str(k)] = float(share)
    if sum(mix.values()) <= 0:
        raise ProfileError(source, "soak.mix", "the shares add up to 0: no request could be sent")
    return mix


def _checks(source: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or any(c not in CHECKS for c in value):
        raise ProfileError(source, "soak.checks", f"expected a list of {', '.join(CHECKS)}, got {value!r}")
    return tuple(dict.fromkeys(value))


def _slo(source: str, value: Any) -> Slo:
    if not isinstance(value, Mapping):
        raise ProfileError(source, "soak.slo", f"expected a mapping, got {value!r}")
    known = {f.name for f in fields(Slo)}
    values: dict[str, float | None] = {}
    for k, v in value.items():
        if k not in known:
            raise ProfileError(source, f"soak.slo.{k}", "unknown key; expected one of " + ", ".join(sorted(known)))
        if v is None:
            values[k] = None
            continue
        x = _number(source, f"soak.slo.{k}", v, integer=False)
        hi = 1.0 if k in ("error_rate", "goodput") else 86400.0
        if not 0 <= x <= hi:
            raise ProfileError(source, f"soak.slo.{k}", f"must be between 0 and {hi:g}, got {x}")
        values[k] = float(x)
    return Slo(**values)
