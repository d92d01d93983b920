"""Exact probe lengths from what the workers report (gate 1's readings).

SGLang's bounds (sglang-surface.md section 2, `kvgate.upstream.admission`): the tokenizer rejects len >= context
with a 400; the scheduler rejects len >= max_req_input_len through `set_finish_with_abort`, the path
that leaked (incident.md section 2). So the longest accepted prompt is min(max_req_input_len, context) - 1,
the first rejected length of the pool bound is max_req_input_len and that of the context bound is the
context itself. Across nodes the most restrictive value of each limit applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvgate.reading.node import PREFILL, NodeReading
from kvgate.upstream.admission import AdmissionLimits

ACCEPT = "accept"
REJECT = "reject"
#: The probes that take the scheduler's abort path when the contract holds: the first rejected length
#: of the pool bound and one in the middle of the reject band.
ABORT_PATH_PROBES = ("pool_limit", "reject_band_middle")


@dataclass(frozen=True, kw_only=True)
class ProbeLimits(AdmissionLimits):
    """The deployment-wide limits the probes aim at: the most restrictive context, max_req_input_len
    and prefill pool over every node, plus the page size."""

    page_size: int
    # Every node's own context, max_req_input_len and pool: a rejection may name any of them (through
    # the router, real SGLang's decode refuses with its own limit, computed from its own pool).
    named_limits: frozenset[int] = frozenset()

    @property
    def one_page(self) -> int:
        """A one-page prompt (at least 16 tokens so a sentinel fits)."""
        return max(self.page_size, 16)


@dataclass(frozen=True)
class LengthProbe:
    """One exact-length contract probe."""

    name: str
    length: int
    expect: str  # ACCEPT or REJECT
    bound: str  # "pool" | "context" | "none"
    why: str
    max_new_tokens: int

    @property
    def label(self) -> str:
        return f"{self.name} ({self.length:,} tokens)"


def limits_from_readings(readings: Sequence[NodeReading]) -> tuple[ProbeLimits | None, list[str]]:
    """The most restrictive limits over every node, or None with the reasons it cannot be planned."""
    problems: list[str] = []
    contexts = [r.context_length for r in readings]
    mrils = [r.max_req_input_len for r in readings]
    if not readings:
        return None, ["no worker readings: give --prefill-url and --decode-url"]
    for r in readings:
        if r.context_length is None:
            problems.append(f"{r.node}: effective context length unknown (/v1/models max_model_len)")
        if r.max_req_input_len is None:
            problems.append(f"{r.node}: max_req_input_len unknown (server_info)")
    if problems:
        return None, problems
    pages = [r.page_size for r in readings if r.page_size]
    pools = [r.max_total_num_tokens for r in readings if r.role == PREFILL and r.max_total_num_tokens]
    limits = ProbeLimits(
        context=min(c for c in contexts if c is not None),
        max_req_input_len=min(m for m in mrils if m is not None),
        page_size=max(pages) if pages else 1,
        pool=min(pools) if pools else None,
        named_limits=frozenset(
            n for r in readings for n in (r.context_length, r.max_req_input_len, r.max_total_num_tokens) if n
        ),
    )
    if limits.longest_accepted < 1:
        return None, [f"no prompt length is accepted (max_req_input_len {limits.max_req_input_len})"]
    return limits, []


def max_new_tokens_for(limits: ProbeLimits, length: int, wanted: int) -> int:
    """max_new_tokens for a prompt of `length` tokens: `wanted`, capped so prompt + answer fit the context."""
    # SGLang's tokenizer rejects len + max_new_tokens > context (check 1b) before the scheduler
    # sees the request, which would hide the abort path; keep the sum within the context.
    return max(1, min(wanted, limits.context - length))


def plan_length_probes(limits: ProbeLimits, max_new_tokens: int) -> list[LengthProbe]:
    """The exact-length probes, cheapest first: tokenizer rejections, then the abort path, then the plant."""
    c, m = limits.context, limits.max_req_input_len
    out = [
        LengthProbe(
            "beyond_context",
            c + limits.page_size,
            REJECT,
            "context",
            "beyond the context: the tokenizer must reject it",
            max_new_tokens_for(limits, c, max_new_tokens),
        ),
        LengthProbe(
            "context_limit",
            c,
            REJECT,
            "context",
            "first rejected length of the context bound (SGLang rejects len >= context)",
            max_new_tokens_for(limits, c, max_new_tokens),
        ),
    ]
    band = limits.reject_band
    if band is not None:
        out.append(
            LengthProbe(
                "pool_limit",
                m,
                REJECT,
                "pool",
                "first rejected length of the pool bound (max_req_input_len): the abort path",
                max_new_tokens_for(limits, m, max_new_tokens),
            )
        )
        lo, hi = band
        # Inside the band, far enough from the context that a full answer fits (prompt + max_new_tokens).
        mid = min((lo + hi + 1) // 2, c - max_new_tokens)
        if mid > lo:
            out.append(
                LengthProbe(
                    "reject_band_middle",
                    mid,
                    REJECT,
                    "pool",
                    f"inside the reject band [{lo:,}, {hi:,}] that passes the tokenizer",
                    max_new_tokens_for(limits, mid, max_new_tokens),
                )
            )
    a = limits.longest_accepted
    out.append(
        LengthProbe(
            "longest_accepted",
            a,
            ACCEPT,
            "none",
            "largest accepted prompt (max_req_input_len - 1); it is also the canary plant",
            max_new_tokens_for(limits, a, max_new_tokens),
        )
    )
    return out
