"""Which generated tokens numerical noise cannot flip: the margin rule shared by the isolation checks.

A greedy token is judged only where the reference answer's top-1 logprob beats its top-2 by at least
`margin` nats (SGLang: `return_logprob` + `top_logprobs_num: 2` -> `meta_info.output_top_logprobs`, per
output position a list of `[logprob, token_id, text]`, best first). Kernels that are not batch-invariant
move logits by round-off (far below a nat in bf16); they can swap two near-tied candidates, never a
token that leads by `margin`. Where every node reports `enable_deterministic_inference`, answers are
batch-invariant by construction and every position is judged (exact equality).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvgate.gates.probes.client import ProbeResult
from kvgate.reading.node import NodeReading

#: top logprobs asked per output position (top-1 and its runner-up)
TOP_N = 2


@dataclass(frozen=True)
class Scored:
    """One answer's token ids and, per position, whether the top-1 leads the top-2 by the margin."""

    ids: tuple[int, ...]
    confident: tuple[bool, ...]
    #: the answer carried usable top logprobs at all (False: a server that ignores return_logprob)
    scored: bool

    @property
    def judged(self) -> int:
        return sum(self.confident)

    def changed(self, other: Sequence[int]) -> list[int]:
        """Confident positions of this (reference) answer where `other` has another token or ended."""
        return [j for j, c in enumerate(self.confident) if c and (j >= len(other) or other[j] != self.ids[j])]

    def show(self, limit: int = 12) -> str:
        marks = ",".join(f"{t}{'' if c else '?'}" for t, c in zip(self.ids[:limit], self.confident, strict=False))
        return "ids " + marks + ("..." if len(self.ids) > limit else "") + " (? = below the margin)"


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _entry(e: Any) -> tuple[float, int] | None:
    """`[logprob, token_id, text]` -> (logprob, id), or None when malformed."""
    if isinstance(e, (list, tuple)) and len(e) >= 2:
        lp, tid = _num(e[0]), e[1]
        if lp is not None and isinstance(tid, int) and not isinstance(tid, bool):
            return lp, tid
    return None


def answer_ids(res: ProbeResult) -> tuple[int, ...] | None:
    """The generated ids: `output_ids`, else the ids of `meta_info.output_token_logprobs`."""
    ids = res.output_ids
    if ids is not None:
        return tuple(ids)
    tl = res.meta.get("output_token_logprobs")
    if isinstance(tl, list) and tl:
        got = [_entry(e) for e in tl]
        if all(g is not None for g in got):
            return tuple(g[1] for g in got if g is not None)
    return None


def tops_at(res: ProbeResult, j: int) -> list[tuple[float, int]]:
    """The top logprobs `(logprob, id)` of output position `j`, best first ([] when not reported)."""
    tops = res.meta.get("output_top_logprobs")
    cand = tops[j] if isinstance(tops, list) and j < len(tops) and isinstance(tops[j], list) else []
    return [e for e in (_entry(x) for x in cand[:TOP_N]) if e is not None]


def score(res: ProbeResult, margin: float, exact: bool = False) -> Scored | None:
    """The answer with its confident positions; None when it carries no ids (not served, or text only)."""
    ids = answer_ids(res)
    if ids is None:
        return None
    tops = res.meta.get("output_top_logprobs")
    tops = tops if isinstance(tops, list) else []
    flags: list[bool] = []
    usable = False
    for j, tok in enumerate(ids):
        cand = tops[j] if j < len(tops) and isinstance(tops[j], list) else []
        ranked = [e for e in (_entry(x) for x in cand[:TOP_N]) if e is not None]
        if len(ranked) == TOP_N:
            usable = True
        flags.append(exact or (len(ranked) == TOP_N and ranked[0][1] == tok and ranked[0][0] - ranked[1][0] >= margin))
    return Scored(ids, tuple(flags), usable or exact)


def deterministic(readings: Sequence[NodeReading]) -> bool:
    """Every worker reports `enable_deterministic_inference: true` in its server_info."""
    return bool(readings) and all(r.server_info.get("enable_deterministic_inference") is True for r in readings)
