"""Settings of `kvgate watch`: the profile's `watch:` section, each key overridable by a flag."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from kvgate.defaults import DEFAULT_CONCURRENCY
from kvgate.errors import ProfileError


@dataclass(frozen=True)
class WatchSettings:
    """What the watcher does and what it may cost. Every field is a profile key under `watch:`.

    - interval_s: seconds between metadata passes (router listing + every worker's server_info).
    - requests_per_min / prefill_tokens_per_min: the probe traffic budget over any sliding minute
      (prefill tokens: the prompt length of every probe sent, counted before it is sent).
    - regate_every_s: a full gate runs at least this often even when nothing changed.
    - max_age_s: /verdict answers 200 only for a passed verdict younger than this.
    - latency_window: samples kept per prompt-length bucket (older ones drop out).
    - latency_min_samples: samples each bucket needs before the latency-too-good alert can fire.
    - pass_concurrency: workers whose server_info is read at once in the metadata pass.
    """

    interval_s: float = 30.0
    requests_per_min: int = 6
    prefill_tokens_per_min: int = 32768
    regate_every_s: float = 3600.0
    max_age_s: float = 7200.0
    latency_window: int = 200
    latency_min_samples: int = 10
    pass_concurrency: int = DEFAULT_CONCURRENCY

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any] | None, source: str) -> WatchSettings:
        """Validate a `watch:` mapping; a bad key or value raises ProfileError(source, "watch.<key>", ...)."""
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in dict(mapping or {}).items():
            if key not in known:
                raise ProfileError(source, f"watch.{key}", "unknown key; expected one of " + ", ".join(known))
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ProfileError(source, f"watch.{key}", f"expected a number, got {value!r}")
            if known[key].type == "int" and not isinstance(value, int):
                raise ProfileError(source, f"watch.{key}", f"expected an integer, got {value!r}")
            values[key] = value
        settings = cls(**values)
        settings.check(source)
        return settings

    def check(self, source: str) -> None:
        """Raise ProfileError for a value out of range."""
        bounds: dict[str, tuple[float, float]] = {
            "interval_s": (1.0, 86400.0),
            "requests_per_min": (0, 6000),
            "prefill_tokens_per_min": (0, 1 << 40),
            "regate_every_s": (1.0, 7 * 86400.0),
            "max_age_s": (1.0, 30 * 86400.0),
            "latency_window": (10, 100_000),
            "latency_min_samples": (3, 100_000),
            "pass_concurrency": (1, 16384),
        }
        for key, (lo, hi) in bounds.items():
            v = getattr(self, key)
            if not lo <= v <= hi:
                raise ProfileError(source, f"watch.{key}", f"must be between {lo:g} and {hi:g}, got {v}")
        if self.latency_min_samples > self.latency_window:
            raise ProfileError(source, "watch.latency_min_samples", "must not exceed latency_window")
        if self.max_age_s < self.interval_s:
            raise ProfileError(source, "watch.max_age_s", "must be at least interval_s (no verdict could be fresh)")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
