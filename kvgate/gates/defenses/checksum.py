"""`defenses.kv-checksum` (deployment): the KV checksum counts only where it is correct.

It counts only when on for every prefill AND decode node, on CUDA, with matching layouts; TP-unsafe in
0.5.21/0.5.22; 0.5.23 admits mismatched layouts unverified. An opt-in detection aid: off is reported
(info, "not counted") unless the caller requires it; on but ineffective is inconclusive (failed when
required); unknown is inconclusive.
"""

from __future__ import annotations

from collections.abc import Sequence

from packaging.version import Version

from kvgate.gates.defenses.common import GATE, DefenseInputs, not_counted, release_of
from kvgate.results.findings import Evidence, Finding, failed, inconclusive, info, passed

_CHECKSUM_FROM = Version("0.5.21")
_CHECKSUM_SAFE_FROM = Version("0.5.23")


def _checksum_value(n: DefenseInputs) -> object:
    """The flag as read; a release before the flag existed says so instead of a bare null."""
    rel = release_of(n)
    if n.kv_checksum is None and rel is not None and rel.base < _CHECKSUM_FROM:
        return f"no such flag in {n.version} (from 0.5.21)"
    return n.kv_checksum


def check_checksum(nodes: Sequence[DefenseInputs], required: bool) -> Finding:
    node = "deployment"
    pd = [n for n in nodes if n.role in ("prefill", "decode")]
    want = "true" if required else "true to count as a defense"
    ev = [Evidence(n.node, "disaggregation_enable_kv_checksum", _checksum_value(n), want) for n in pd]
    remedy = "--disaggregation-enable-kv-checksum on every prefill AND decode worker (sglang >= 0.5.21, CUDA)"
    if not any(n.role == "prefill" for n in pd) or not any(n.role == "decode" for n in pd):
        return inconclusive(GATE, "kv-checksum", node, "KV checksum needs prefill and decode nodes to judge", *ev)
    flags: list[bool | None] = []
    for n in pd:
        rel = release_of(n)
        if n.kv_checksum is None and rel is not None and rel.base < _CHECKSUM_FROM:
            flags.append(False)  # the flag does not exist before 0.5.21
        else:
            flags.append(n.kv_checksum)
    if None in flags:
        unknown = [n.node for n, f in zip(pd, flags, strict=True) if f is None]
        return inconclusive(GATE, "kv-checksum", node, f"KV checksum flag not reported by {', '.join(unknown)}", *ev)
    if not any(flags):
        if required:
            return failed(GATE, "kv-checksum", node, "KV checksum is off (required by the profile)", *ev, remedy=remedy)
        return info(GATE, "kv-checksum", node, "KV checksum off: optional detection, not counted as a defense", *ev)
    if not all(flags):
        off = [n.node for n, f in zip(pd, flags, strict=True) if not f]
        return not_counted(
            "kv-checksum",
            node,
            f"KV checksum on for some nodes only (off: {', '.join(off)}): it "
            "counts only when on for BOTH prefill and decode, so it is no defense",
            required,
            *ev,
            remedy=remedy,
        )
    devices = {n.node: n.device for n in pd}
    ev += [Evidence(k, "device", v, "cuda") for k, v in devices.items()]
    non_cuda = [k for k, v in devices.items() if v is not None and not v.lower().startswith("cuda")]
    if non_cuda:
        return not_counted(
            "kv-checksum",
            node,
            f"KV checksum needs CUDA (CUDA JIT kernel); not CUDA: {', '.join(non_cuda)}",
            required,
            *ev,
            remedy=remedy,
        )
    if any(v is None for v in devices.values()):
        return inconclusive(
            GATE, "kv-checksum", node, "KV checksum on, but the device is not reported: it needs CUDA", *ev
        )
    rels = [release_of(n) for n in pd]
    if any(r is None for r in rels):
        return inconclusive(GATE, "kv-checksum", node, "KV checksum on, but a node's version is unknown", *ev)
    low = min(r.base for r in rels if r is not None)
    ev += [Evidence(n.node, "tp_size", n.tp_size) for n in pd]
    layouts = {(n.tp_size, n.page_size, n.pp_size or 1) for n in pd}
    layout_known = all(n.tp_size is not None and n.page_size is not None for n in pd)
    if low < _CHECKSUM_SAFE_FROM:
        tps = [n.tp_size for n in pd]
        if any(t is None for t in tps):
            return inconclusive(
                GATE,
                "kv-checksum",
                node,
                f"KV checksum on in {low}: TP-unsafe in 0.5.21/0.5.22 and tp_size is not reported",
                *ev,
            )
        if any(t and t > 1 for t in tps):
            return not_counted(
                "kv-checksum",
                node,
                f"KV checksum on, but TP-unsafe in {low} (0.5.21/0.5.22): a "
                "mismatch is dropped rank-locally without all-reduce, which hangs TP",
                required,
                *ev,
                remedy="upgrade to 0.5.23 (all-reduced mismatch, layout signature) or run TP=1",
            )
        if not layout_known or len(layouts) > 1:
            return not_counted(
                "kv-checksum",
                node,
                f"KV checksum on in {low}: no layout check before 0.5.23, and "
                "prefill/decode layouts differ or are unknown (page size / PP): digests mismatch",
                required,
                *ev,
                remedy="match page size and PP, or upgrade to 0.5.23",
            )
        return passed(
            GATE,
            "kv-checksum",
            node,
            f"KV checksum on for prefill and decode (TP=1, equal layouts) in {low}"
            "; checks the transfer only, not every decode read; TP-unsafe in 0.5.21/0.5.22 if TP>1",
            *ev,
        )
    if not layout_known:
        return inconclusive(
            GATE,
            "kv-checksum",
            node,
            "KV checksum on, but layouts are not reported: 0.5.23 admits a "
            "mismatched layout unverified (one-time warning)",
            *ev,
        )
    if len(layouts) > 1:
        return not_counted(
            "kv-checksum",
            node,
            "KV checksum on, but prefill/decode layouts differ: 0.5.23 admits "
            "these transfers unverified (one-time warning)",
            required,
            *ev,
            remedy="use equal TP, PP and page size on prefill and decode",
        )
    return passed(
        GATE,
        "kv-checksum",
        node,
        f"KV checksum on for prefill and decode, equal layouts, {low}: counts "
        "(checks the transfer only, not every decode read)",
        *ev,
    )
