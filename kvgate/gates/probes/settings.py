"""Settings of the probe gates, validated from a profile's `probes:` mapping."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from kvgate.errors import ProfileError

# SGLang's SGLANG_DISAGGREGATION_WAITING_TIMEOUT / BOOTSTRAP_TIMEOUT default (sglang-surface.md section 3).
# A probe deadline at or above it cannot tell a hang from a slow error.
SGLANG_WAITING_TIMEOUT_S = 300.0
TOKENIZER_MODES = ("auto", "server", "bytes", "ids")


@dataclass(frozen=True)
class ProbeSettings:
    """What the probe gates do and how hard they try. Every field is a profile key under `probes:`.

    - deadline_s: seconds one probe may take before it is a `hang` (well under SGLang's 300 s timeout).
    - reject_within_s: a rejection slower than this (or than deadline_s if smaller) is `slow_rejection`
      (the contract says "promptly").
    - tenants: concurrent canary tenants after each plant (each with its own sentinel).
    - tenant_tokens: prompt length of one tenant; None = two KV pages, at least four sentinels.
    - max_new_tokens: generation length asked of canary and over-limit probes (capped so that
      prompt + max_new_tokens never exceeds the context, which SGLang's tokenizer would reject first).
    - latency_samples: samples per bucket (one-page and long prompts, interleaved) for the KS test;
      None = sized from the calibration (calibrate.py): enough for the measured effect at latency_alpha.
    - latency_long_tokens: length of a "long" latency sample; None = sized from the calibration: the
      length whose prefill stands clear of the measured noise (up to the longest accepted prompt).
    - latency_budget: share of one context-length prefill the long latency bucket may cost in total
      (or budget_floor_s of measured prefill, whichever is more).
    - latency_alpha: significance level of the one-sided two-sample KS test.
    - early_stop: stop after a confirmed leak (a foreign sentinel seen), or once the deployment stopped
      answering (accepted-length requests unanswered at their deadline), instead of running every probe.
    - abort_probe: run the abort-mid-transfer probe (gate 4, dynamic).
    - abort_attempts: in-flight cancellations wanted; tries go on at learned cancel points (a try
      whose request answered first does not count) until that many are observed or the budget is spent.
    - abort_tokens: prompt length of the request that is cancelled; None = sized from the calibration:
      long enough that its prefill window is well above the measured noise (up to the longest accepted).
    - abort_budget: share of one context-length prefill the abort probe may spend on victims and
      canaries in total (or budget_floor_s of measured prefill, whichever is more); tries stop when the
      next one would exceed it (the first always runs).
    - budget_floor_s: the seconds of measured prefill each timing probe (latency, abort) may spend
      whatever the context (at most 65,536 tokens), so a small context affords enough tries while a
      1M context pays its share.
    - abort_canaries: canary requests sent right after each cancellation.
    - isolation_probe: run the greedy-replay isolation check (model-agnostic; isolation.py).
    - isolation_new_tokens: answer length of each replay (short: fewer steps for round-off to matter).
    - isolation_tenants: requests of other traffic before each replay.
    - load_probe: run the isolation-under-load check (under_load.py).
    - load_concurrency: requests per concurrent wave at most (distinct prompts and control copies); the
      workers' reported running-request limit lowers it.
    - load_waves: concurrent waves of the load check.
    - load_new_tokens: answer length of each load request (short: the check's cost stays small).
    - load_min_positions: confident positions the load check must compare to pass; while fewer, and
      nothing else showed, it sends more waves (up to four times load_waves, 16 at most), then says
      inconclusive.
    - handoff_probe: run the handoff check (prefill is the oracle; handoff.py).
    - handoff_new_tokens: answer length of each handoff prompt (confident positions early and late in it
      are replayed; a longer answer offers a model that is seldom confident more of them).
    - handoff_long_tokens: length of the handoff's near-limit prompt; None = the longest accepted prompt
      less the answer, sent where that is at most 65,536 tokens (beyond, it and its replay would cost two
      such prefills without a prefix cache, so it is not sent unless asked).
    - handoff_min_positions: confident positions the handoff check must compare to judge.
    - logprob_margin: nats by which a solo answer's top-1 logprob must beat its top-2 for that token
      to be judged by the isolation checks (margin.py); numerical noise cannot flip such a token.
    - tokenizer: how sentinel text becomes input_ids. "auto": the workers' /v1/tokenize and
      /v1/detokenize if they round-trip, else the simulator's byte-level tokenizer when the target is
      the kvgate simulator, else sentinels in token space (as "ids"). "server": /v1/tokenize only (else
      canaries are inconclusive). "bytes": ids are UTF-8 bytes plus `byte_offset` (the kvgate
      simulator's tokenizer). "ids": token space, no tokenizer anywhere: sentinels planted as id
      sequences (bytes plus `byte_offset`) and searched in the answers' `output_ids`.
    - byte_offset: id of byte 0 in "bytes" and "ids" modes.
    """

    deadline_s: float = 30.0
    reject_within_s: float = 10.0
    tenants: int = 32
    tenant_tokens: int | None = None
    max_new_tokens: int = 48
    latency_samples: int | None = None
    latency_long_tokens: int | None = None
    latency_budget: float = 0.03
    latency_alpha: float = 0.01
    early_stop: bool = True
    abort_probe: bool = True
    abort_attempts: int = 1
    abort_tokens: int | None = None
    abort_canaries: int = 8
    abort_budget: float = 0.05
    budget_floor_s: float = 1.0
    isolation_probe: bool = True
    isolation_new_tokens: int = 8
    isolation_tenants: int = 8
    load_probe: bool = True
    load_concurrency: int = 20
    load_waves: int = 2
    load_new_tokens: int = 4
    load_min_positions: int = 10
    handoff_probe: bool = True
    handoff_new_tokens: int = 32
    handoff_long_tokens: int | None = None
    handoff_min_positions: int = 3
    logprob_margin: float = 2.0
    tokenizer: str = "auto"
    byte_offset: int = 0

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any] | None, source: str) -> ProbeSettings:
        """Validate a `probes:` mapping; any bad key raises ProfileError(source, key, problem)."""
        mapping = dict(mapping or {})
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in mapping.items():
            if key not in known:
                raise ProfileError(source, f"probes.{key}", "unknown key; expected one of " + ", ".join(known))
            values[key] = _coerce(source, key, value)
        settings = cls(**values)
        settings._check(source)
        return settings

    def _check(self, source: str) -> None:
        def bad(key: str, problem: str) -> None:
            raise ProfileError(source, f"probes.{key}", problem)

        if not 0 < self.deadline_s < SGLANG_WAITING_TIMEOUT_S:
            bad("deadline_s", f"must be > 0 and below SGLang's {SGLANG_WAITING_TIMEOUT_S:g} s waiting timeout")
        if not self.reject_within_s > 0:
            bad("reject_within_s", "must be > 0")
        for key, lo, hi in (
            ("tenants", 1, 1024),
            ("max_new_tokens", 1, 8192),
            ("abort_attempts", 1, 20),
            ("abort_canaries", 1, 256),
            ("isolation_new_tokens", 1, 256),
            ("isolation_tenants", 1, 256),
            ("load_concurrency", 4, 256),
            ("load_waves", 1, 16),
            ("load_new_tokens", 1, 64),
            ("load_min_positions", 1, 10000),
            ("handoff_new_tokens", 2, 64),
            ("handoff_min_positions", 1, 64),
            ("byte_offset", 0, 1 << 30),
        ):
            v = getattr(self, key)
            if not lo <= v <= hi:
                bad(key, f"must be between {lo} and {hi}, got {v}")
        if self.latency_samples is not None and not 3 <= self.latency_samples <= 1000:
            bad("latency_samples", f"must be between 3 and 1000 or null, got {self.latency_samples}")
        if not 0 <= self.budget_floor_s <= 600:
            bad("budget_floor_s", "must be >= 0 and <= 600 (seconds of measured prefill)")
        for key in ("tenant_tokens", "latency_long_tokens", "abort_tokens", "handoff_long_tokens"):
            v = getattr(self, key)
            if v is not None and v < 1:
                bad(key, f"must be a positive integer or null, got {v}")
        if not 0 < self.abort_budget <= 10:
            bad("abort_budget", "must be > 0 and <= 10 (a multiple of one context-length prefill)")
        if not 0 < self.latency_budget <= 1:
            bad("latency_budget", "must be > 0 and <= 1 (a share of one context-length prefill)")
        if not 0 < self.latency_alpha < 0.5:
            bad("latency_alpha", "must be > 0 and < 0.5")
        if not 0 < self.logprob_margin <= 50:
            bad("logprob_margin", "must be > 0 and <= 50 (nats)")
        if self.tokenizer not in TOKENIZER_MODES:
            bad("tokenizer", "must be one of " + ", ".join(TOKENIZER_MODES))

    @property
    def reject_limit_s(self) -> float:
        """The effective "promptly" of a rejection."""
        return min(self.reject_within_s, self.deadline_s)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


_INT_OR_NONE = {"tenant_tokens", "latency_long_tokens", "abort_tokens", "latency_samples", "handoff_long_tokens"}
_BOOL = {"early_stop", "abort_probe", "isolation_probe", "load_probe", "handoff_probe"}
_FLOAT = {
    "logprob_margin",
    "deadline_s",
    "reject_within_s",
    "latency_budget",
    "latency_alpha",
    "abort_budget",
    "budget_floor_s",
}
_STR = {"tokenizer"}


def _coerce(source: str, key: str, value: Any) -> Any:
    where = f"probes.{key}"
    if key in _BOOL:
        if not isinstance(value, bool):
            raise ProfileError(source, where, f"expected true or false, got {value!r}")
        return value
    if key in _STR:
        if not isinstance(value, str):
            raise ProfileError(source, where, f"expected a string, got {value!r}")
        return value
    if key in _FLOAT:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProfileError(source, where, f"expected a number, got {value!r}")
        return float(value)
    if value is None and key in _INT_OR_NONE:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProfileError(source, where, f"expected an integer, got {value!r}")
    return value
