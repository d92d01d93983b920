"""The single knobs: what each setting, changed alone, would need to be for the pool to hold
context x headroom, each found by re-planning (planner.plan_worker), or why no value does."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from kvgate.plan.model import Attention, PlanError
from kvgate.plan.planner import MAX_MEM_FRACTION, MAX_PP, TP_CANDIDATES, PlanInputs, WorkerPlan, plan_worker

T = TypeVar("T")


@dataclass(frozen=True)
class Knob:
    """One setting changed alone: the value that makes the pool hold context x headroom, or why none does."""

    name: str
    current: object
    needed: object | None  # None: impossible
    pool_at_needed: int | None
    note: str

    @property
    def possible(self) -> bool:
        return self.needed is not None


def _pool(inp: PlanInputs) -> int:
    """The pool of a variant; -1 when SGLang would refuse the variant or not start with it."""
    try:
        p = plan_worker(inp)
    except PlanError:
        return -1
    return -1 if p.startup_error else p.pool


def _gives(setting: str, pool: int) -> str:
    """`even 0.99 gives 948,992 tokens`, or `with even 0.99 the worker would not start`."""
    return f"with {setting} the worker would not start" if pool < 0 else f"{setting} gives {pool:,} tokens"


def _scaled_weights(inp: PlanInputs, gpus_before: int, gpus_after: int) -> float | None:
    """A given weight figure spread over more GPUs (even split assumed); None keeps the estimate."""
    return None if inp.weights_gib is None else inp.weights_gib * gpus_before / gpus_after


def _first(candidates: list[PlanInputs], value: Callable[[PlanInputs], T]) -> tuple[T, int] | None:
    """The first candidate whose pool holds what is required: its `value` and that pool."""
    for c in candidates:
        pool = _pool(c)
        if pool >= c.required:
            return value(c), pool
    return None


def knobs(plan: WorkerPlan) -> list[Knob]:
    """Every single knob, each changed alone from the planned worker."""
    inp = plan.inputs
    out: list[Knob] = []

    # mem fraction: the pool grows monotonically with it; binary search in thousandths.
    lo, hi = round(inp.mem_fraction_static * 1000), round(MAX_MEM_FRACTION * 1000)
    if _pool(replace(inp, mem_fraction_static=hi / 1000)) >= inp.required:
        while lo < hi:
            mid = (lo + hi) // 2
            if _pool(replace(inp, mem_fraction_static=mid / 1000)) >= inp.required:
                hi = mid
            else:
                lo = mid + 1
        f = hi / 1000
        out.append(
            Knob(
                "--mem-fraction-static",
                inp.mem_fraction_static,
                f,
                _pool(replace(inp, mem_fraction_static=f)),
                "less slack is left for activations and CUDA graphs; check the worker still starts",
            )
        )
    else:
        top = _pool(replace(inp, mem_fraction_static=MAX_MEM_FRACTION))
        out.append(
            Knob(
                "--mem-fraction-static",
                inp.mem_fraction_static,
                None,
                None,
                f"impossible: {_gives(f'even {MAX_MEM_FRACTION}', top)}",
            )
        )

    # TP: more GPUs per worker at the same PP; KV heads (MHA) and weights spread further.
    gpus = inp.tp * inp.pp
    tps = [t for t in TP_CANDIDATES if t > inp.tp and (not inp.attention_dp or t % inp.dp == 0)]
    cands = [
        replace(
            inp,
            tp=t,
            gpus_per_worker=inp.gpus_per_worker * t // inp.tp,
            weights_gib=_scaled_weights(inp, gpus, t * inp.pp),
        )
        for t in tps
    ]
    hit = _first(cands, lambda c: c.tp)
    note = f"{inp.gpus_per_worker * hit[0] // inp.tp if hit else 0} GPUs per worker; weights assumed to split evenly"
    if inp.shape.attention is not Attention.MHA:
        note += "; MLA/DSA cells do not shrink with TP, only the weights do"
    out.append(
        Knob(
            "--tp",
            inp.tp,
            hit[0] if hit else None,
            hit[1] if hit else None,
            note if hit else f"impossible up to tp {TP_CANDIDATES[-1]} (heads must split evenly)",
        )
    )

    # KV dtype: FP8 halves a bf16 cell (DSA keeps its scales and bf16 rope part).
    if plan.kv.bytes > 1:
        c = replace(inp, kv_cache_dtype="fp8_e4m3")
        pool = _pool(c)
        out.append(
            Knob(
                "--kv-cache-dtype",
                plan.kv.name,
                "fp8_e4m3" if pool >= inp.required else None,
                pool if pool >= inp.required else None,
                "FP8 KV cache; check the attention backend supports it for this model"
                if pool >= inp.required
                else f"impossible: {_gives('fp8_e4m3', pool)}",
            )
        )
    else:
        out.append(
            Knob(
                "--kv-cache-dtype",
                plan.kv.name,
                None,
                None,
                "impossible: already 1 byte per element (FP4 pools are not modelled)",
            )
        )

    # Context length: the longest context this pool holds with the headroom.
    ctx = int(plan.pool / inp.headroom)
    while ctx > 0 and math.ceil(ctx * inp.headroom) > plan.pool:
        ctx -= 1
    usable = ctx > 0 and plan.startup_error is None
    out.append(
        Knob(
            "--context-length",
            inp.context_length,
            ctx if usable else None,
            plan.pool if usable else None,
            "advertise this context instead (longer prompts then get an explicit 400)"
            if usable
            else "impossible: the worker holds no pool to fit a context to",
        )
    )

    # Page size: rounding loses less than one page, so only page size 1 can help, and only at the edge.
    if inp.page_size > 1:
        pool = _pool(replace(inp, page_size=1))
        out.append(
            Knob(
                "--page-size",
                inp.page_size,
                1 if pool >= inp.required else None,
                pool if pool >= inp.required else None,
                "the attention backend may force its own page size"
                if pool >= inp.required
                else f"impossible: page rounding costs under {inp.page_size} tokens; {_gives('page 1', pool)}",
            )
        )
    else:
        out.append(Knob("--page-size", inp.page_size, None, None, "impossible: already 1 (no rounding loss)"))

    # GPUs per worker through pipeline stages at the same TP: fewer layers and weights per GPU.
    pps = [p for p in range(inp.pp + 1, MAX_PP + 1) if p <= inp.shape.num_hidden_layers]
    cands = [
        replace(
            inp,
            pp=p,
            gpus_per_worker=inp.gpus_per_worker * p // inp.pp,
            weights_gib=_scaled_weights(inp, gpus, inp.tp * p),
        )
        for p in pps
    ]
    hit = _first(cands, lambda c: c.gpus_per_worker)
    out.append(
        Knob(
            "--gpus-per-worker",
            inp.gpus_per_worker,
            hit[0] if hit else None,
            hit[1] if hit else None,
            f"as pipeline stages (--pp {hit[0] // (inp.gpus_per_worker // inp.pp)}) at tp {inp.tp}; "
            "weights assumed to split evenly"
            if hit
            else f"impossible up to pp {MAX_PP} at tp {inp.tp}",
        )
    )

    if inp.max_total_tokens is not None and inp.max_total_tokens < inp.required:
        cap = -(-inp.required // inp.page_size) * inp.page_size
        pool = _pool(replace(inp, max_total_tokens=cap))
        fits = pool >= inp.required
        out.append(
            Knob(
                "--max-total-tokens",
                inp.max_total_tokens,
                cap if fits else None,
                pool if fits else None,
                "raise the cap (or drop it): memory allows it"
                if fits
                else f"impossible alone: without the cap the pool is {plan.uncapped_pool:,}",
            )
        )
    return out
