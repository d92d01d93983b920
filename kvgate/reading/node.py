"""What a worker says about itself, read field by field: the node a flag names (`NodeSpec`), every
field kvgate relies on (`NodeReading`, `parse_node`), tolerant of the 0.5.19-0.5.23 shapes
(sglang-surface.md section 1). A missing or malformed field becomes a `FieldProblem`, never a guess.
Pure functions over parsed JSON, so every shape is testable without a server.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvgate.errors import TransportError
from kvgate.output.redact import clip
from kvgate.reading.compact import RANK_COUNT
from kvgate.reading.httpbounds import parse_json

PREFILL = "prefill"
DECODE = "decode"
ROUTER = "router"

# Pool capacity keys in the order we trust them. SGLang's `max_total_tokens` is the operator's cap
# flag (often null), not the pool the engine sized, so it is deliberately not on this list.
POOL_KEYS = ("max_total_num_tokens", "kv_pool_tokens")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys repeat is ambiguous (which value does the engine mean?): refuse it."""
    out = dict(pairs)  # built in C: a fleet's documents are thousands of objects
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {key!r}")
            seen.add(key)
    return out


def decode_answer(url: str, status: int, body: bytes, location: str | None, *, missing_ok: bool) -> Any | None:
    """The JSON document of one metadata answer, judged the same way whichever reader fetched it:
    404 is None when `missing_ok`; a refusal, an error status, a redirect (never followed: kvgate reads
    the worker it was pointed at) or malformed JSON (a repeated key included) is a TransportError."""
    if status == 404 and missing_ok:
        return None

    def text(n: int) -> str:
        return clip(body.decode("utf-8", "replace"), n)

    if status in (401, 403):
        raise TransportError(url, f"HTTP {status}: authentication refused (check --token-env)")
    if status >= 400:
        raise TransportError(url, f"HTTP {status}: {text(200)!r}")
    if not 200 <= status < 300:
        raise TransportError(
            url, f"HTTP {status} (redirect to {location or '?'!r}, not followed): point kvgate at the worker itself"
        )
    try:
        return parse_json(body, object_pairs_hook=_unique_keys)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise TransportError(url, f"malformed JSON ({exc}): {text(120)!r}") from None


@dataclass(frozen=True)
class NodeSpec:
    """A worker (or router) as the operator named it on the command line."""

    role: str
    url: str
    index: int = 0

    @property
    def label(self) -> str:
        return f"{self.role}[{self.index}] {self.url}"


#: The largest count kvgate takes from a worker (tokens, lengths, sizes): 2**32 tokens of KV is
#: terabytes per rank, past any pool SGLang sizes; a larger value is a broken or hostile server.
SANE_MAX = 2**32
#: Ranks and parallel sizes: a worker with more DP/TP ranks than this is not one SGLang server.
SANE_RANKS = 2**16
SANE_PORT = 65_535


@dataclass(frozen=True)
class FieldProblem:
    """A field that was missing or malformed where kvgate needed it."""

    field: str
    problem: str
    # True when the value was there but is not a sane JSON integer (a float such as 1e308, a bool,
    # a string, a negative or an absurd number): `pool-context.number` names each as an error.
    number: bool = False


@dataclass(frozen=True)
class RankReading:
    """What one DP rank's scheduler reports in `internal_states[i]`."""

    dp_rank: int
    token_capacity: int | None
    disaggregation_mode: str | None
    env_vars: Mapping[str, str] | None


@dataclass(frozen=True)
class NodeReading:
    """Everything gate decisions need from one worker, read once."""

    spec: NodeSpec
    info_path: str
    version: str | None
    context_length: int | None
    context_source: str | None
    context_length_flag: int | None
    max_total_num_tokens: int | None
    pool_key: str | None
    max_req_input_len: int | None
    page_size: int | None
    disaggregation_mode: str | None
    live_disaggregation_mode: str | None
    transfer_backend: str | None
    bootstrap_port: int | None
    kv_checksum: bool | None
    kv_canary: str | None
    tp_size: int | None
    dp_size: int | None
    allow_auto_truncate: bool | None
    model_path: str | None
    architectures: tuple[str, ...] | None
    ranks: tuple[RankReading, ...]
    problems: tuple[FieldProblem, ...] = ()
    server_info: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # `enable_dp_attention`: with it, dp_size attention-DP groups split tp_size GPUs.
    dp_attention: bool | None = None
    # How many `internal_states` entries the server sent (one per DP rank, malformed ones included).
    rank_entries: int = 0
    # The name the worker serves its model under (/v1/models data[0].id; None: not said).
    served_model: str | None = None

    @property
    def node(self) -> str:
        return self.spec.label

    @property
    def role(self) -> str:
        """The role the node itself reports: the live role (0.5.22+) wins over the launch argument."""
        return self.live_disaggregation_mode or self.disaggregation_mode or "unknown"

    @property
    def env_vars(self) -> Mapping[str, str] | None:
        """Env vars the server exposes (only with SGLANG_EXPOSE_OWN_ENV_VARS=1), from rank 0."""
        for rank in self.ranks:
            if rank.env_vars is not None:
                return rank.env_vars
        return None

    def problem(self, name: str) -> FieldProblem | None:
        for p in self.problems:
            if p.field == name:
                return p
        return None


# ---------------------------------------------------------------------------------------------
# Field extraction. Pure functions over parsed JSON, so every shape is testable without a server.


class _Reader:
    def __init__(self) -> None:
        self.problems: list[FieldProblem] = []

    def note(self, name: str, problem: str) -> None:
        self.problems.append(FieldProblem(name, problem))

    def _value(self, obj: Mapping[str, Any], key: str, name: str, *, required: bool, nullable: bool) -> Any:
        """The value of `key`, or None (noting a problem when it had to be there and be non-null)."""
        if key not in obj:
            if required:
                self.note(name, "missing")
            return None
        value = obj[key]
        if value is None and not nullable:
            self.note(name, "null")
        return value

    def int_field(
        self,
        obj: Mapping[str, Any],
        key: str,
        name: str,
        *,
        required: bool,
        nullable: bool = False,
        minimum: int = 0,
        maximum: int = SANE_MAX,
    ) -> int | None:
        """A JSON integer in [minimum, maximum]. Never coerced: a float (even 8192.0, or 1e308, which
        `float.is_integer` calls whole), a bool or a string is malformed, as is a value out of range."""
        value = self._value(obj, key, name, required=required, nullable=nullable)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.problems.append(FieldProblem(name, f"malformed: {value!r} is not a JSON integer", number=True))
            return None
        if not minimum <= value <= maximum:
            bound = f"< {minimum}" if value < minimum else f"> {maximum:,} (absurd)"
            self.problems.append(FieldProblem(name, f"malformed: {value} {bound}", number=True))
            return None
        return value

    def str_field(self, obj: Mapping[str, Any], key: str, name: str, *, required: bool) -> str | None:
        # A required string that is null (e.g. "version": null) is as unknown as a missing one.
        value = self._value(obj, key, name, required=required, nullable=not required)
        if value is None:
            return None
        if not isinstance(value, str):
            self.note(name, f"malformed: {value!r} is not a string")
            return None
        return value

    def bool_field(self, obj: Mapping[str, Any], key: str, name: str) -> bool | None:
        if key not in obj:
            return None
        value = obj[key]
        if isinstance(value, bool):
            return value
        if value is None:
            return None
        self.note(name, f"malformed: {value!r} is not a boolean")
        return None


def _context_from_models(r: _Reader, models: Any) -> int | None:
    if models is None:
        r.note("/v1/models", "endpoint missing (404)")
        return None
    data = models.get("data") if isinstance(models, dict) else None
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        r.note("/v1/models data[0]", "missing or malformed")
        return None
    return r.int_field(data[0], "max_model_len", "/v1/models data[0].max_model_len", required=True, minimum=1)


def parse_node(spec: NodeSpec, info_path: str, info: Mapping[str, Any], models: Any, model_info: Any) -> NodeReading:
    """Extract a NodeReading from the raw JSON documents of one worker."""
    r = _Reader()
    pool: int | None = None
    pool_key: str | None = None
    for key in POOL_KEYS:
        if key in info:
            pool_key = key
            pool = r.int_field(info, key, key, required=True, minimum=1)
            break
    if pool_key is None:
        r.note("max_total_num_tokens", "missing (no KV pool capacity key: " + ", ".join(POOL_KEYS) + ")")

    context = _context_from_models(r, models)
    context_flag = r.int_field(info, "context_length", "context_length", required=False, nullable=True, minimum=1)
    context_source = "/v1/models max_model_len" if context is not None else None

    ranks: list[RankReading] = []
    states = info.get("internal_states")
    if isinstance(states, list) and states and _rank_entries(info, states) > len(states):
        r.note(
            "internal_states",
            f"{_rank_entries(info, states):,} entries, more DP ranks than kvgate reads ({len(states)}): "
            "not one SGLang server",
        )
    if not isinstance(states, list) or not states:
        r.note("internal_states", "missing or empty: per-DP-rank capacities cannot be checked")
    else:
        for i, state in enumerate(states):
            if not isinstance(state, dict):
                r.note(f"internal_states[{i}]", "malformed: not an object")
                continue
            mem = state.get("memory_usage")
            cap: int | None = None
            if not isinstance(mem, dict):
                r.note(f"internal_states[{i}].memory_usage", "missing or malformed")
            else:
                cap = r.int_field(
                    mem, "token_capacity", f"internal_states[{i}].memory_usage.token_capacity", required=True, minimum=1
                )
            live = state.get("disaggregation_mode")
            env = state.get("env_vars")
            ranks.append(
                RankReading(
                    dp_rank=i,
                    token_capacity=cap,
                    disaggregation_mode=live if isinstance(live, str) else None,
                    env_vars={str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else None,
                )
            )

    lives = {rk.disaggregation_mode for rk in ranks if rk.disaggregation_mode}
    live_mode = lives.pop() if len(lives) == 1 else None
    if len(lives) > 1:
        r.note("internal_states[*].disaggregation_mode", f"ranks disagree: {sorted(lives)}")

    dp_attention = r.bool_field(info, "enable_dp_attention", "enable_dp_attention")
    architectures: tuple[str, ...] | None = None
    if isinstance(model_info, dict) and isinstance(model_info.get("architectures"), list):
        architectures = tuple(str(a) for a in model_info["architectures"])

    return NodeReading(
        spec=spec,
        info_path=info_path,
        version=r.str_field(info, "version", "version", required=True),
        context_length=context,
        context_source=context_source,
        context_length_flag=context_flag,
        max_total_num_tokens=pool,
        pool_key=pool_key,
        max_req_input_len=r.int_field(info, "max_req_input_len", "max_req_input_len", required=True, minimum=1),
        page_size=r.int_field(info, "page_size", "page_size", required=False, nullable=True, minimum=1),
        disaggregation_mode=r.str_field(info, "disaggregation_mode", "disaggregation_mode", required=True),
        live_disaggregation_mode=live_mode,
        transfer_backend=r.str_field(
            info, "disaggregation_transfer_backend", "disaggregation_transfer_backend", required=False
        ),
        bootstrap_port=r.int_field(
            info,
            "disaggregation_bootstrap_port",
            "disaggregation_bootstrap_port",
            required=False,
            nullable=True,
            maximum=SANE_PORT,
        ),
        kv_checksum=r.bool_field(info, "disaggregation_enable_kv_checksum", "disaggregation_enable_kv_checksum"),
        kv_canary=r.str_field(info, "kv_canary", "kv_canary", required=False),
        tp_size=r.int_field(info, "tp_size", "tp_size", required=False, minimum=1, maximum=SANE_RANKS),
        dp_size=r.int_field(info, "dp_size", "dp_size", required=False, minimum=1, maximum=SANE_RANKS),
        allow_auto_truncate=r.bool_field(info, "allow_auto_truncate", "allow_auto_truncate"),
        model_path=r.str_field(info, "model_path", "model_path", required=False),
        architectures=architectures,
        ranks=tuple(ranks),
        problems=tuple(r.problems),
        server_info=dict(info),
        dp_attention=dp_attention,
        rank_entries=_rank_entries(info, states),
        served_model=_served_model(models),
    )


def _served_model(models: Any) -> str | None:
    """/v1/models' first card's `id` (what the second look and the watch compare), when it is a string."""
    data = models.get("data") if isinstance(models, dict) else None
    card = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
    return card["id"] if isinstance(card.get("id"), str) else None


def _rank_entries(info: Mapping[str, Any], states: Any) -> int:
    """How many `internal_states` entries the server sent (the compact form keeps the count, not them all)."""
    if not isinstance(states, list):
        return 0
    sent = info.get(RANK_COUNT)
    return sent if isinstance(sent, int) and not isinstance(sent, bool) and sent > len(states) else len(states)


@dataclass(frozen=True)
class SizingSettings:
    """The settings a worker's KV pool was sized with, as its server_info reports them (None: not reported).

    Read only to explain a pool/context failure with `kvgate plan`'s knobs; no verdict rests on them.
    """

    pp_size: int | None
    enable_dp_attention: bool | None
    mem_fraction_static: float | None
    kv_cache_dtype: str | None
    max_total_tokens: int | None  # the operator's --max-total-tokens cap (usually null)
    weight_gib: float | None  # internal_states[0].memory_usage.weight: weights per GPU, measured


def sizing_settings(reading: NodeReading) -> SizingSettings:
    """Extract SizingSettings from a reading's server_info (tolerant: a malformed field is None)."""
    info = reading.server_info
    r = _Reader()
    frac = info.get("mem_fraction_static")
    weight = None
    states = info.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        mem = states[0].get("memory_usage")
        w = mem.get("weight") if isinstance(mem, dict) else None
        if isinstance(w, (int, float)) and not isinstance(w, bool):
            weight = float(w)
    return SizingSettings(
        pp_size=r.int_field(info, "pp_size", "pp_size", required=False, minimum=1),
        enable_dp_attention=r.bool_field(info, "enable_dp_attention", "enable_dp_attention"),
        mem_fraction_static=float(frac) if isinstance(frac, (int, float)) and not isinstance(frac, bool) else None,
        kv_cache_dtype=r.str_field(info, "kv_cache_dtype", "kv_cache_dtype", required=False),
        max_total_tokens=r.int_field(
            info, "max_total_tokens", "max_total_tokens", required=False, nullable=True, minimum=1
        ),
        weight_gib=weight,
    )
