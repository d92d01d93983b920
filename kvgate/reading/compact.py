"""Keep the facts the gates judge, not whole documents: a worker's answers made small as they arrive.

A metadata answer may be 16 MiB (the cap), and the router chooses how many workers there are; kept
whole, a fleet of near-cap answers held gigabytes to the end of the run. The fleet reader parses each
answer and at once keeps only this compact form:

- server_info: every key a gate or `parse_node` reads, each value kept when it is small (else a
  digest of it); the other keys in sorted order while they fit the document's budget (each value
  small, or its digest), and whatever is left folded into one digest entry. Every flag still counts
  for what a watch compares (a changed large value changes its digest), none costs more than a line;
- `internal_states`: per DP rank only what is read (the pool, the live role, the env vars, the running
  limit, the weights' size, the scheduler's start time), at most MAX_RANKS_KEPT ranks; the number sent
  is kept (RANK_COUNT);
- `/v1/models` and `/model_info`: the context, the served model's name and the architectures.

A healthy SGLang worker's answer (about 10-100 KB) is kept as it is: nothing it says is digested.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

#: the most one kept value may take (its JSON size, about); a larger one is kept as its digest
VALUE_CAP = 4 << 10
#: the most the keys no gate reads may take in one server_info; past it they fold into one digest
DOC_BUDGET = 64 << 10
#: the most of those keys kept one by one
MAX_KEYS = 1024
#: the most DP ranks kept per worker (a real worker has at most a few hundred)
MAX_RANKS_KEPT = 256
#: where the compact form keeps how many `internal_states` entries the server sent
RANK_COUNT = "kvgate:internal_states entries"
#: where the keys folded into one digest are
REST = "kvgate:the remaining keys"

#: server_info keys a gate or the parser reads (node.parse_node, sizing_settings, gates/)
READ_KEYS = frozenset(
    {
        "max_total_num_tokens",
        "kv_pool_tokens",
        "context_length",
        "enable_dp_attention",
        "version",
        "max_req_input_len",
        "page_size",
        "disaggregation_mode",
        "disaggregation_transfer_backend",
        "disaggregation_bootstrap_port",
        "disaggregation_enable_kv_checksum",
        "kv_canary",
        "tp_size",
        "dp_size",
        "pp_size",
        "allow_auto_truncate",
        "model_path",
        "port",
        "startup_time",
        "kv_cache_dtype",
        "enable_deterministic_inference",
        "kvgate_simulator",
        "max_running_requests",
        "device",
        "mem_fraction_static",
        "max_total_tokens",
    }
)
_RANK_KEYS = ("disaggregation_mode", "env_vars", "effective_max_running_requests_per_dp", "startup_time")
_MEMORY_KEYS = ("token_capacity", "weight")


def _size(value: Any, limit: int) -> int:
    """The JSON size of `value`, counted only up to `limit` (past it: limit + 1), without building it."""
    total = 0
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v) + 2
        elif isinstance(v, dict):
            total += 2
            for k, item in v.items():
                total += len(str(k)) + 4
                stack.append(item)
        elif isinstance(v, list):
            total += 2 + len(v)
            stack.extend(v)
        else:
            total += 24
        if total > limit:
            return limit + 1
    return total


def digest(value: Any) -> str:
    """A stable short stand-in for a large value: equal values, equal digests. SHA-256, truncated: x86 and
    ARM servers hash it in hardware, so a near-cap answer costs less than with blake2b."""
    data = (
        value.encode("utf-8", "surrogatepass") if isinstance(value, str) else json.dumps(value, sort_keys=True).encode()
    )
    return f"kvgate:digest {hashlib.sha256(data).hexdigest()[:32]} ({len(data):,} bytes)"


def small(value: Any, cap: int = VALUE_CAP) -> Any:
    """The value when it is small, else its digest."""
    if isinstance(value, str):  # most values: sized here as `_size` would, without its walk
        return value if len(value) + 2 <= cap else digest(value)
    if value is None or isinstance(value, (int, float)):  # `_size` counts any of these 24
        return value if 24 <= cap else digest(value)
    return value if _size(value, cap) <= cap else digest(value)


def _rank(state: Any) -> Any:
    if not isinstance(state, dict):
        return small(state, 256)
    out: dict[str, Any] = {k: small(state[k]) for k in _RANK_KEYS if k in state}
    mem = state.get("memory_usage")
    if isinstance(mem, dict):
        out["memory_usage"] = {k: small(mem[k], 256) for k in _MEMORY_KEYS if k in mem}
    elif "memory_usage" in state:
        out["memory_usage"] = small(mem, 256)
    return out


def compact_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """server_info as the gates need it (see the module doc)."""
    out: dict[str, Any] = {}
    rest: list[tuple[str, Any]] = []
    budget = DOC_BUDGET
    for key in sorted(info, key=str):
        value = info[key]
        if key == "internal_states":
            continue
        if key in READ_KEYS:
            out[key] = small(value, 1024)
        elif key in (RANK_COUNT, REST):
            continue  # our own names: a server cannot supply them
        elif rest or len(out) >= MAX_KEYS or budget <= 0:
            rest.append((key, value))
        else:
            kept = small(value)
            budget -= _size(kept, VALUE_CAP) + len(key)
            out[key] = kept
    if rest:
        out[REST] = digest([list(kv) for kv in rest]).replace("kvgate:digest", f"kvgate:digest of {len(rest)} keys")
    states = info.get("internal_states")
    if isinstance(states, list):
        out["internal_states"] = [_rank(s) for s in states[:MAX_RANKS_KEPT]]
        out[RANK_COUNT] = len(states)
    elif "internal_states" in info:
        out["internal_states"] = small(states, 256)
    return out


def compact_models(models: Any) -> Any:
    """`/v1/models`: the first card's `max_model_len` and `id` (what the parser reads), or a malformed stand-in."""
    if models is None:
        return None
    data = models.get("data") if isinstance(models, dict) else None
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        return {"data": None}
    card = data[0]
    return {"data": [{k: small(card[k], 256) for k in ("id", "max_model_len") if k in card}]}


def compact_model_info(model_info: Any) -> Any:
    """`/model_info`: the architectures (the only key read), when they are a small list."""
    if not isinstance(model_info, dict):
        return None if model_info is None else {}
    arch = model_info.get("architectures")
    return {"architectures": small(arch)} if "architectures" in model_info else {}


__all__ = ["RANK_COUNT", "REST", "compact_info", "compact_model_info", "compact_models", "digest", "small"]
