"""The plan: from a model config and the hardware, the KV pool SGLang will size, and whether it holds
context x headroom (incident.md section 1: a 1,048,576-token context on a 681,280-token pool).

Data flow: PlanInputs -> WorkerPlan (every intermediate number with its formula's inputs) -> knobs
(what each single setting would need to be) -> findings -> report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from kvgate.plan import sizing
from kvgate.plan.model import Attention, ModelShape, PlanError
from kvgate.plan.weights import estimate_weights_gib

DEFAULT_RELEASE = "0.5.23"
DEFAULT_HEADROOM = 1.25
DEFAULT_GPU_SM = 90
MAX_MEM_FRACTION = 0.99
TP_CANDIDATES = (1, 2, 4, 8, 16, 32, 64)
MAX_PP = 16


@dataclass(frozen=True)
class PlanInputs:
    """One worker shape (a prefill or a decode worker) and the bar its pool must clear."""

    shape: ModelShape
    gpu_memory_gib: float  # free memory per GPU before the weights load (SGLang's pre_model_load_memory)
    gpus_per_worker: int
    tp: int
    mem_fraction_static: float
    context_length: int
    dp: int = 1
    attention_dp: bool = False
    pp: int = 1
    kv_cache_dtype: str = "auto"
    page_size: int = 1
    headroom: float = DEFAULT_HEADROOM
    weights_gib: float | None = None  # measured weights per GPU; None: estimated from the config
    max_total_tokens: int | None = None
    release: str = DEFAULT_RELEASE
    gpu_sm: int = DEFAULT_GPU_SM

    @property
    def attn_tp(self) -> int:
        """Attention-TP width: tp // dp with DP attention, else tp (runtime_context.derive_attn_tp_size)."""
        return self.tp // self.dp if self.attention_dp else self.tp

    @property
    def required(self) -> int:
        return math.ceil(self.context_length * self.headroom)


def validate(inp: PlanInputs) -> None:
    """Refuse shapes SGLang would refuse or kvgate does not model (PlanError, exit 2)."""
    sizing.check_release(inp.release)
    for name, value in (("--tp", inp.tp), ("--dp", inp.dp), ("--pp", inp.pp), ("--page-size", inp.page_size),
                        ("--gpus-per-worker", inp.gpus_per_worker), ("--context-length", inp.context_length)):
        if value < 1:
            raise PlanError(f"{name} must be >= 1, got {value}")
    if not 0 < inp.mem_fraction_static < 1:
        raise PlanError(f"--mem-fraction-static must be in (0, 1), got {inp.mem_fraction_static}")
    if inp.gpu_memory_gib <= 0:
        raise PlanError(f"--gpu-memory-gib must be > 0, got {inp.gpu_memory_gib}")
    if inp.attention_dp and inp.tp % inp.dp:
        raise PlanError(f"--attention-dp needs --tp divisible by --dp (tp {inp.tp}, dp {inp.dp})")
    replicas = 1 if inp.attention_dp else inp.dp
    expected = inp.tp * inp.pp * replicas
    if inp.gpus_per_worker != expected:
        raise PlanError(f"--gpus-per-worker {inp.gpus_per_worker} does not match the layout: tp {inp.tp} x pp "
                        f"{inp.pp}{'' if inp.attention_dp else f' x dp {inp.dp}'} = {expected} GPUs")
    if inp.shape.num_attention_heads % inp.attn_tp:
        raise PlanError(f"{inp.shape.num_attention_heads} attention heads do not split over attention-TP "
                        f"{inp.attn_tp}")
    if inp.pp > inp.shape.num_hidden_layers:
        raise PlanError(f"--pp {inp.pp} exceeds the model's {inp.shape.num_hidden_layers} layers")


@dataclass(frozen=True)
class Step:
    """One intermediate number and the inputs of the formula that gave it."""

    name: str
    value: object
    formula: str


@dataclass(frozen=True)
class StagePlan:
    """One pipeline stage: its layers, its cell size and its token count."""

    layers: tuple[int, int]
    cell: sizing.CellSize
    tokens: int


@dataclass(frozen=True)
class WorkerPlan:
    """What SGLang would size for one worker, with every step that led there."""

    inputs: PlanInputs
    kv: sizing.KvDtype
    weights_gib: float
    weights_source: str
    post_load_gib: float
    available_bytes: int
    stages: tuple[StagePlan, ...]
    pool: int  # max_total_num_tokens per (DP) rank, after the cap, page rounding and the PP minimum
    uncapped_pool: int
    steps: tuple[Step, ...]
    startup_error: str | None = None  # set when SGLang would refuse to start with these settings

    @property
    def fits(self) -> bool:
        return self.startup_error is None and self.pool >= self.inputs.required

    @property
    def max_req_input_len(self) -> int:
        return sizing.max_req_input_len(self.inputs.context_length, self.pool)


def plan_worker(inp: PlanInputs) -> WorkerPlan:
    """Size the pool the way `inp.release` does (sizing.py) and record every step."""
    validate(inp)
    shape = inp.shape
    kv = sizing.resolve_kv_dtype(shape, inp.kv_cache_dtype, inp.gpu_sm)
    gpus_sharing_weights = inp.tp * inp.pp
    if inp.weights_gib is not None:
        weights, source = inp.weights_gib, "--weights-gib (given)"
    else:
        weights, source = estimate_weights_gib(shape, gpus_sharing_weights)
    post = inp.gpu_memory_gib - weights
    rest = sizing.rest_gib(inp.gpu_memory_gib, post, inp.mem_fraction_static)
    avail = sizing.available_bytes(rest)
    stages = []
    for start, end in sizing.pp_layer_ranges(shape.num_hidden_layers, inp.pp):
        cell = sizing.cell_size(shape, kv, inp.attn_tp, (start, end), inp.release, inp.gpu_sm)
        stages.append(StagePlan((start, end), cell, sizing.tokens_from_bytes(avail, cell.total, inp.page_size)))
    uncapped = min(s.tokens for s in stages)
    pool = sizing.apply_cap(uncapped, inp.max_total_tokens, inp.page_size)
    worst = min(stages, key=lambda s: s.tokens)
    steps = [
        Step("release", inp.release, "SGLang release whose sizing code is followed"),
        Step("kv_cache_dtype", kv.name, f"{inp.kv_cache_dtype} -> {kv.name} ({kv.bytes} B/element; {kv.reason})"),
        Step("attention", shape.attention.value, f"{shape.architecture}"),
        Step("attn_tp_size", inp.attn_tp,
             f"tp {inp.tp} / dp {inp.dp}" if inp.attention_dp else f"tp {inp.tp} (no DP attention)"),
        Step("weights_gib_per_gpu", round(weights, 3), source),
        Step("pre_model_load_gib", inp.gpu_memory_gib, "--gpu-memory-gib: free per GPU before the weights load"),
        Step("post_load_gib", round(post, 3), f"{inp.gpu_memory_gib} - weights {weights:.3f}"),
        Step("kv_budget_bytes", avail,
             f"int((post_load {post:.3f} - pre {inp.gpu_memory_gib} x (1 - mem_fraction_static "
             f"{inp.mem_fraction_static})) x 2^30)"),
    ]
    for i, s in enumerate(stages):
        tag = f"[pp{i}]" if inp.pp > 1 else ""
        steps.append(Step(f"cell_size_bytes{tag}", s.cell.total, s.cell.formula))
        steps.append(Step(f"tokens{tag}", s.tokens,
                          f"kv_budget {avail:,} // cell {s.cell.total:,} rounded down to page_size {inp.page_size}"))
    if inp.pp > 1:
        steps.append(Step("tokens_pp_min", uncapped, f"minimum over {inp.pp} pipeline stages (worst: layers "
                                                     f"{worst.layers[0]}-{worst.layers[1] - 1})"))
    if inp.max_total_tokens is not None:
        steps.append(Step("max_total_tokens_cap", inp.max_total_tokens,
                          f"--max-total-tokens: min({uncapped:,}, cap) rounded down to page_size {inp.page_size}"))
    steps.append(Step("max_total_num_tokens", pool,
                      "per DP rank" if inp.attention_dp and inp.dp > 1 else "the worker's pool"))
    if inp.attention_dp and inp.dp > 1:
        steps.append(Step("dp_ranks", inp.dp, f"{inp.dp} pools of {pool:,} tokens; one request lives on one rank"))
    steps.append(Step("max_req_input_len", sizing.max_req_input_len(inp.context_length, pool),
                      f"min(context {inp.context_length:,} - 1, pool {pool:,} - 1) - 5"))
    steps.append(Step("required_pool", inp.required, f"ceil(context {inp.context_length:,} x headroom {inp.headroom:g})"))
    error = _startup_error(inp, post, rest, pool)
    if error:
        steps.append(Step("starts", False, error))
    return WorkerPlan(inp, kv, weights, source, post, avail, tuple(stages), pool, uncapped, tuple(steps), error)


def _startup_error(inp: PlanInputs, post: float, rest: float, pool: int) -> str | None:
    """What stops the worker before it serves: SGLang refuses to start rather than size an empty pool."""
    if post <= 0:
        return f"the weights alone ({inp.gpu_memory_gib - post:.3f} GiB) exceed the {inp.gpu_memory_gib} GiB free per GPU"
    if rest <= 0:
        minimum = 1 - post / inp.gpu_memory_gib
        return ("SGLang refuses to start: loaded weights leave no GPU memory for the KV cache under "
                f"--mem-fraction-static={inp.mem_fraction_static} (minimum viable 1 - available/pre = {minimum:.4f})")
    if pool <= 0:
        return "SGLang refuses to start: Not enough memory (max_total_num_tokens <= 0)"
    return None


# --- knobs: what each single setting would need to be -----------------------------------------


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


def _gives(pool: int) -> str:
    return "the worker would not start" if pool < 0 else f"{pool:,} tokens"


def _scaled_weights(inp: PlanInputs, gpus_before: int, gpus_after: int) -> float | None:
    """A given weight figure spread over more GPUs (even split assumed); None keeps the estimate."""
    return None if inp.weights_gib is None else inp.weights_gib * gpus_before / gpus_after


def _first(candidates: list[PlanInputs], value: Callable[[PlanInputs], object]) -> tuple[object, int] | None:
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
        out.append(Knob("--mem-fraction-static", inp.mem_fraction_static, f,
                        _pool(replace(inp, mem_fraction_static=f)),
                        "less slack is left for activations and CUDA graphs; check the worker still starts"))
    else:
        top = _pool(replace(inp, mem_fraction_static=MAX_MEM_FRACTION))
        out.append(Knob("--mem-fraction-static", inp.mem_fraction_static, None, None,
                        f"impossible: even {MAX_MEM_FRACTION} gives {_gives(top)}"))

    # TP: more GPUs per worker at the same PP; KV heads (MHA) and weights spread further.
    gpus = inp.tp * inp.pp
    tps = [t for t in TP_CANDIDATES if t > inp.tp and (not inp.attention_dp or t % inp.dp == 0)]
    cands = [replace(inp, tp=t, gpus_per_worker=inp.gpus_per_worker * t // inp.tp,
                     weights_gib=_scaled_weights(inp, gpus, t * inp.pp)) for t in tps]
    hit = _first(cands, lambda c: c.tp)
    note = (f"{inp.gpus_per_worker * hit[0] // inp.tp if hit else 0} GPUs per worker; weights assumed to split evenly" + (
        "; MLA/DSA cells do not shrink with TP, only the weights do" if inp.shape.attention is not Attention.MHA else ""))
    out.append(Knob("--tp", inp.tp, hit[0] if hit else None, hit[1] if hit else None,
                    note if hit else f"impossible up to tp {TP_CANDIDATES[-1]} (heads must split evenly)"))

    # KV dtype: FP8 halves a bf16 cell (DSA keeps its scales and bf16 rope part).
    if plan.kv.bytes > 1:
        c = replace(inp, kv_cache_dtype="fp8_e4m3")
        pool = _pool(c)
        out.append(Knob("--kv-cache-dtype", plan.kv.name, "fp8_e4m3" if pool >= inp.required else None,
                        pool if pool >= inp.required else None,
                        "FP8 KV cache; check the attention backend supports it for this model"
                        if pool >= inp.required else f"impossible: fp8_e4m3 gives {_gives(pool)}"))
    else:
        out.append(Knob("--kv-cache-dtype", plan.kv.name, None, None,
                        "impossible: already 1 byte per element (FP4 pools are not modelled)"))

    # Context length: the longest context this pool holds with the headroom.
    ctx = int(plan.pool / inp.headroom)
    while ctx > 0 and math.ceil(ctx * inp.headroom) > plan.pool:
        ctx -= 1
    usable = ctx > 0 and plan.startup_error is None
    out.append(Knob("--context-length", inp.context_length, ctx if usable else None, plan.pool if usable else None,
                    "advertise this context instead (longer prompts then get an explicit 400)"
                    if usable else "impossible: the worker holds no pool to fit a context to"))

    # Page size: rounding loses less than one page, so only page size 1 can help, and only at the edge.
    if inp.page_size > 1:
        pool = _pool(replace(inp, page_size=1))
        out.append(Knob("--page-size", inp.page_size, 1 if pool >= inp.required else None,
                        pool if pool >= inp.required else None,
                        "the attention backend may force its own page size" if pool >= inp.required
                        else f"impossible: page rounding costs under {inp.page_size} tokens; page 1 gives {_gives(pool)}"))
    else:
        out.append(Knob("--page-size", inp.page_size, None, None, "impossible: already 1 (no rounding loss)"))

    # GPUs per worker through pipeline stages at the same TP: fewer layers and weights per GPU.
    pps = [p for p in range(inp.pp + 1, MAX_PP + 1) if p <= inp.shape.num_hidden_layers]
    cands = [replace(inp, pp=p, gpus_per_worker=inp.gpus_per_worker * p // inp.pp,
                     weights_gib=_scaled_weights(inp, gpus, inp.tp * p)) for p in pps]
    hit = _first(cands, lambda c: c.gpus_per_worker)
    out.append(Knob("--gpus-per-worker", inp.gpus_per_worker, hit[0] if hit else None, hit[1] if hit else None,
                    f"as pipeline stages (--pp {hit[0] // (inp.gpus_per_worker // inp.pp)}) at tp {inp.tp}; "
                    "weights assumed to split evenly" if hit else f"impossible up to pp {MAX_PP} at tp {inp.tp}"))

    if inp.max_total_tokens is not None and inp.max_total_tokens < inp.required:
        cap = -(-inp.required // inp.page_size) * inp.page_size
        pool = _pool(replace(inp, max_total_tokens=cap))
        fits = pool >= inp.required
        out.append(Knob("--max-total-tokens", inp.max_total_tokens, cap if fits else None, pool if fits else None,
                        "raise the cap (or drop it): memory allows it" if fits
                        else f"impossible alone: without the cap the pool is {plan.uncapped_pool:,}"))
    return out
