"""`fleet.pair-consistency`: prefill and decode that exchange KV must agree on what makes KV transferable.

A request can go to any prefill and any decode behind one router, so every prefill must be able to
hand its KV to every decode. Compared here, each side's value named on a mismatch:
- the model: the architectures `/model_info` reports, and the model path's last component (the same
  checkpoint may sit under different folders on different hosts, so the folders are not compared);
- the transfer backend, as SGLang resolves it (`mooncake_tcp` is mooncake with TCP forced);
- the KV cache dtype, where both sides name one: `auto` resolves to a dtype the server does not
  report (the model's, or a model family's default), so a side that says `auto` is not compared;
  `bf16` and `bfloat16` are one dtype. SGLang's own bootstrap refuses a pair whose strings differ
  (`disaggregation/common/conn.py`), so a mismatch is a pair that cannot move KV at all.
The page size and the context are the other two facts a pair must share; `fleet.page-size-consistency`
and `fleet.context-consistency` compare them over every PD worker, prefill and decode alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvgate.reading.node import DECODE, PREFILL, NodeReading
from kvgate.results.findings import Evidence, Finding, failed, passed

GATE = "fleet"
CHECK = "pair-consistency"
DEPLOYMENT = "deployment"
_DTYPE_ALIASES = {"bfloat16": "bf16"}


def _model(r: NodeReading) -> str | None:
    if not r.model_path:
        return None
    return r.model_path.rstrip("/").rsplit("/", 1)[-1] or None


def _architectures(r: NodeReading) -> str | None:
    return ",".join(r.architectures) if r.architectures else None


def _backend(r: NodeReading) -> str | None:
    if not r.transfer_backend:
        return None
    b = r.transfer_backend.strip().lower()
    return "mooncake" if b == "mooncake_tcp" else b


def _kv_dtype(r: NodeReading) -> str | None:
    value = r.server_info.get("kv_cache_dtype")
    if not isinstance(value, str) or value.strip().lower() in ("", "auto"):
        return None
    v = value.strip().lower()
    return _DTYPE_ALIASES.get(v, v)


#: (fact, what it is read from, how to read it, the remedy)
FACTS: tuple[tuple[str, str, Callable[[NodeReading], str | None], str], ...] = (
    (
        "architectures",
        "/model_info architectures",
        _architectures,
        "serve the same model on every prefill and decode",
    ),
    ("model", "model_path (last component)", _model, "serve the same model on every prefill and decode"),
    (
        "transfer backend",
        "disaggregation_transfer_backend",
        _backend,
        "give every prefill and decode the same --disaggregation-transfer-backend",
    ),
    ("KV cache dtype", "kv_cache_dtype", _kv_dtype, "give every prefill and decode the same --kv-cache-dtype"),
)


def _sides(nodes: Sequence[NodeReading], value: Callable[[NodeReading], str | None]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in nodes:
        v = value(r)
        if v is not None:
            out.setdefault(v, []).append(r.node)
    return out


def _named(side: dict[str, list[str]]) -> str:
    return "; ".join(f"{v!r} ({', '.join(nodes)})" for v, nodes in sorted(side.items()))


def pair_consistency(readings: Sequence[NodeReading]) -> list[Finding]:
    """One failure per fact the prefills and decodes do not all share; one pass when they share all."""
    prefills = [r for r in readings if r.spec.role == PREFILL]
    decodes = [r for r in readings if r.spec.role == DECODE]
    if not prefills or not decodes:
        return []
    out: list[Finding] = []
    agreed: list[str] = []
    for fact, field, value, remedy in FACTS:
        p, d = _sides(prefills, value), _sides(decodes, value)
        values = set(p) | set(d)
        if len(values) < 2:
            if p and d:
                agreed.append(f"{fact} {next(iter(values))}")
            continue
        node = next((n for v, nodes in sorted(d.items()) for n in nodes if v not in p), None) or next(
            n for v, nodes in sorted(p.items()) for n in nodes
        )
        out.append(
            failed(
                GATE,
                CHECK,
                node,
                f"prefill and decode disagree on the {fact}: prefill {_named(p) or 'unknown'}, decode "
                f"{_named(d) or 'unknown'}; KV one side writes cannot be read by the other",
                Evidence(DEPLOYMENT, f"prefill {field}", {v: n for v, n in sorted(p.items())}, "one value"),
                Evidence(DEPLOYMENT, f"decode {field}", {v: n for v, n in sorted(d.items())}, "the prefill's"),
                remedy=remedy,
            )
        )
    if not out and agreed:
        out.append(
            passed(
                GATE,
                CHECK,
                DEPLOYMENT,
                f"{len(prefills)} prefill(s) and {len(decodes)} decode(s) agree: {', '.join(agreed)}",
            )
        )
    return out
