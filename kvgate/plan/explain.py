"""Explain a running worker's pool/context failure (gate 1) with `kvgate plan`'s knobs.

The worker's own settings (server_info: TP, DP attention, PP, page size, memory fraction, KV dtype, cap;
memory_usage.weight) and the model config give the plan; the free GPU memory before the weights load,
which no endpoint reports, comes from the profile's `deployment.gpu_memory_gib` or is CALIBRATED: the
value for which the plan reproduces the pool the worker really sized. A plan that does not reproduce
the observed pool explains nothing and says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvgate.errors import KvgateError
from kvgate.plan.knobs import knobs
from kvgate.plan.model import ModelShape
from kvgate.plan.planner import DEFAULT_RELEASE, PlanInputs, plan_worker
from kvgate.plan.sizing import GIB
from kvgate.plan.verdict import knob_remedy
from kvgate.reading.node import NodeReading, SizingSettings
from kvgate.upstream.releases import RELEASES


@dataclass(frozen=True)
class Explanation:
    """The knobs for one node, or why there are none."""

    remedy: str | None
    notes: tuple[tuple[str, Any, str], ...]  # (field, value, how it was obtained)


def explain(
    reading: NodeReading,
    settings: SizingSettings,
    shape: ModelShape,
    context: int,
    headroom: float,
    observed_pool: int,
    deployment: Mapping[str, Any] | None = None,
) -> Explanation:
    """Plan the node as it runs; when the plan reproduces `observed_pool`, its knobs are the remedy."""
    dep = dict(deployment or {})
    tp = reading.tp_size or dep.get("tp")
    frac = settings.mem_fraction_static or dep.get("mem_fraction_static")
    weights = settings.weight_gib if settings.weight_gib is not None else dep.get("weights_gib")
    if tp is None or frac is None or weights is None:
        missing = [
            n
            for n, v in (("tp_size", tp), ("mem_fraction_static", frac), ("memory_usage.weight", weights))
            if v is None
        ]
        return Explanation(None, (("plan", None, f"not planned: the node does not report {', '.join(missing)}"),))
    attention_dp = (
        bool(settings.enable_dp_attention)
        if settings.enable_dp_attention is not None
        else bool(dep.get("attention_dp", False))
    )
    dp = reading.dp_size or dep.get("dp", 1)
    pp = settings.pp_size or dep.get("pp", 1)
    page = reading.page_size or dep.get("page_size", 1)
    release = reading.version if reading.version in RELEASES else dep.get("release", DEFAULT_RELEASE)
    base = dict(
        shape=shape,
        gpus_per_worker=tp * pp * (1 if attention_dp else dp),
        tp=tp,
        dp=dp,
        attention_dp=attention_dp,
        pp=pp,
        mem_fraction_static=frac,
        context_length=context,
        kv_cache_dtype=settings.kv_cache_dtype or dep.get("kv_cache_dtype", "auto"),
        page_size=page,
        headroom=headroom,
        weights_gib=weights,
        max_total_tokens=settings.max_total_tokens,
        release=release,
        gpu_sm=dep.get("gpu_sm", 90),
    )
    notes: list[tuple[str, Any, str]] = [
        (
            "plan release",
            release,
            "the node's version" if reading.version in RELEASES else "not a planned release; planned as " + release,
        )
    ]
    try:
        if dep.get("gpu_memory_gib") is not None:
            gpu = float(dep["gpu_memory_gib"])
            notes.append(("plan gpu_memory_gib", gpu, "profile deployment.gpu_memory_gib"))
        else:
            probe = plan_worker(PlanInputs(gpu_memory_gib=weights + 1.0, **base))
            cell = min(s.cell.total for s in probe.stages)
            # pool = (pre x f - weights) x 2^30 // cell, rounded to pages: take the middle of that page.
            gpu = ((observed_pool + page / 2) * cell / GIB + weights) / frac
            notes.append(
                (
                    "plan gpu_memory_gib",
                    round(gpu, 3),
                    "CALIBRATED: the free memory for which the plan reproduces the observed pool",
                )
            )
        plan = plan_worker(PlanInputs(gpu_memory_gib=gpu, **base))
    except KvgateError as exc:
        return Explanation(None, (*notes, ("plan", None, f"not planned: {exc}")))
    notes.append(("plan max_total_num_tokens", plan.pool, f"observed {observed_pool:,}"))
    if plan.pool != observed_pool:
        return Explanation(
            None,
            (
                *notes,
                (
                    "plan",
                    None,
                    "the plan does not reproduce the observed pool (settings the planner does not model); no knobs",
                ),
            ),
        )
    return Explanation(knob_remedy(knobs(plan)), tuple(notes))
