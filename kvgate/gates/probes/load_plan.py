"""Isolation under load, its planning: how many prompts a wave holds, how long they are, and the prompts.

The wave size comes from the running-request limit the workers report (never above it), at most
`probes.load_concurrency`; the lengths are fixed and small whatever the page. Each distinct prompt is one
line of its own (a distinct first character, random text) repeated. Sent and judged by under_load.py;
the watch's isolation probe (kvgate/watch/isolation.py) draws its prompts the same way.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from kvgate.gates.probes.canary import Sender
from kvgate.gates.probes.plan import ProbeLimits, max_new_tokens_for
from kvgate.gates.probes.settings import ProbeSettings
from kvgate.reading.node import NodeReading

SHORT_TOKENS, LONG_TOKENS = 32, 256
#: the first character of each distinct prompt's line (distinct lines, distinct first tokens on most models)
FIRST_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


@dataclass(frozen=True)
class Prompt:
    label: str
    ids: list[int]
    max_new_tokens: int


@dataclass(frozen=True)
class Plan:
    """Sizes of one run: prompts per wave and their lengths."""

    short: int
    long: int
    copies: int
    waves: int
    short_len: int
    long_len: int
    limit: int | None  # the running-request limit read from the workers (None: not reported)

    @property
    def per_wave(self) -> int:
        return self.short + self.long + self.copies

    @property
    def prefill_tokens(self) -> int:
        """Tokens prefilled at most: every prompt alone, twice where its first answer held no confident
        token, then every wave."""
        distinct = self.short * self.short_len + self.long * self.long_len
        return 2 * (distinct + self.short_len) + self.waves * (distinct + self.copies * self.short_len)

    def as_evidence(self) -> dict[str, int | None]:
        return {
            "distinct_short": self.short,
            "distinct_long": self.long,
            "control_copies": self.copies,
            "waves": self.waves,
            "per_wave": self.per_wave,
            "short_tokens": self.short_len,
            "long_tokens": self.long_len,
            "running_request_limit": self.limit,
            "prefill_tokens": self.prefill_tokens,
        }


def running_limit(readings: Sequence[NodeReading]) -> int | None:
    """The smallest running-request limit a worker reports: `max_running_requests`, else its ranks'
    `effective_max_running_requests_per_dp` (sglang-surface.md); None when none reports one."""
    found: list[int] = []
    for r in readings:
        v = r.server_info.get("max_running_requests")
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            found.append(v)
            continue
        states = r.server_info.get("internal_states")
        per = [
            s.get("effective_max_running_requests_per_dp")
            for s in (states if isinstance(states, list) else [])
            if isinstance(s, dict)
        ]
        per_ok = [p for p in per if isinstance(p, int) and not isinstance(p, bool) and p > 0]
        if per_ok:
            found.append(min(per_ok))
    return min(found) if found else None


def plan_load(limits: ProbeLimits, settings: ProbeSettings, readings: Sequence[NodeReading]) -> Plan:
    """Wave size from the deployment's running-request limit, capped by `load_concurrency`."""
    limit = running_limit(readings)
    total = settings.load_concurrency if limit is None else min(settings.load_concurrency, limit)
    total = max(total, 4)
    copies = 4 if total >= 12 else 2
    long = total // 5
    short = total - copies - long
    # Fixed and small whatever the page: at a 1M context the whole check costs ~0.006 of one
    # context-length prefill (bench/probe_cost.py).
    short_len = min(SHORT_TOKENS, limits.longest_accepted)
    long_len = min(LONG_TOKENS, limits.longest_accepted)
    return Plan(short, long, copies, settings.load_waves, short_len, long_len, limit)


def load_prompt(sender: Sender, label: str, first: str, length: int, new_tokens: int, limits: ProbeLimits) -> Prompt:
    """A prompt of exactly `length` ids: one line of its own (a distinct first character, random text)
    repeated. Distinct lines give distinct answers on any model, and distinct first tokens on most."""
    line = f"{first}{secrets.token_hex(6)} under load\n"
    unit = sender.codec.encode(line)
    ids = (unit * (length // max(len(unit), 1) + 1))[:length]
    return Prompt(label, ids, max_new_tokens_for(limits, length, new_tokens))
