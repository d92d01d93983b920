"""The plan: from a model config and the hardware, the KV pool SGLang will size, and whether it holds
context x headroom (incident.md section 1: a 1,048,576-token context on a 681,280-token pool).

Data flow: PlanInputs -> WorkerPlan (every intermediate number with its formula's inputs) -> knobs
(knobs.py: what each single setting would need to be) -> findings and report (verdict.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvgate.plan import sizing
from kvgate.plan.model import ModelShape, PlanError
from kvgate.plan.weights import estimate_weights_gib
from kvgate.upstream.admission import max_req_input_len

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
    for name, value in (
        ("--tp", inp.tp),
        ("--dp", inp.dp),
        ("--pp", inp.pp),
        ("--page-size", inp.page_size),
        ("--gpus-per-worker", inp.gpus_per_worker),
        ("--context-length", inp.context_length),
    ):
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
        raise PlanError(
            f"--gpus-per-worker {inp.gpus_per_worker} does not match the layout: tp {inp.tp} x pp "
            f"{inp.pp}{'' if inp.attention_dp else f' x dp {inp.dp}'} = {expected} GPUs"
        )
    if inp.shape.num_attention_heads % inp.attn_tp:
        raise PlanError(f"{inp.shape.num_attention_heads} attention heads do not split over attention-TP {inp.attn_tp}")
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
        return max_req_input_len(self.inputs.context_length, self.pool)


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
        Step(
            "attn_tp_size",
            inp.attn_tp,
            f"tp {inp.tp} / dp {inp.dp}" if inp.attention_dp else f"tp {inp.tp} (no DP attention)",
        ),
        Step("weights_gib_per_gpu", round(weights, 3), source),
        Step("pre_model_load_gib", inp.gpu_memory_gib, "--gpu-memory-gib: free per GPU before the weights load"),
        Step("post_load_gib", round(post, 3), f"{inp.gpu_memory_gib} - weights {weights:.3f}"),
        Step(
            "kv_budget_bytes",
            avail,
            f"int((post_load {post:.3f} - pre {inp.gpu_memory_gib} x (1 - mem_fraction_static "
            f"{inp.mem_fraction_static})) x 2^30)",
        ),
    ]
    for i, s in enumerate(stages):
        tag = f"[pp{i}]" if inp.pp > 1 else ""
        steps.append(Step(f"cell_size_bytes{tag}", s.cell.total, s.cell.formula))
        steps.append(
            Step(
                f"tokens{tag}",
                s.tokens,
                f"kv_budget {avail:,} // cell {s.cell.total:,} rounded down to page_size {inp.page_size}",
            )
        )
    if inp.pp > 1:
        steps.append(
            Step(
                "tokens_pp_min",
                uncapped,
                f"minimum over {inp.pp} pipeline stages (worst: layers {worst.layers[0]}-{worst.layers[1] - 1})",
            )
        )
    if inp.max_total_tokens is not None:
        steps.append(
            Step(
                "max_total_tokens_cap",
                inp.max_total_tokens,
                f"--max-total-tokens: min({uncapped:,}, cap) rounded down to page_size {inp.page_size}",
            )
        )
    steps.append(
        Step("max_total_num_tokens", pool, "per DP rank" if inp.attention_dp and inp.dp > 1 else "the worker's pool")
    )
    if inp.attention_dp and inp.dp > 1:
        steps.append(Step("dp_ranks", inp.dp, f"{inp.dp} pools of {pool:,} tokens; one request lives on one rank"))
    steps.append(
        Step(
            "max_req_input_len",
            max_req_input_len(inp.context_length, pool),
            f"min(context {inp.context_length:,} - 1, pool {pool:,} - 1) - 5",
        )
    )
    steps.append(
        Step("required_pool", inp.required, f"ceil(context {inp.context_length:,} x headroom {inp.headroom:g})")
    )
    error = _startup_error(inp, post, rest, pool)
    if error:
        steps.append(Step("starts", False, error))
    return WorkerPlan(inp, kv, weights, source, post, avail, tuple(stages), pool, uncapped, tuple(steps), error)


def _startup_error(inp: PlanInputs, post: float, rest: float, pool: int) -> str | None:
    """What stops the worker before it serves: SGLang refuses to start rather than size an empty pool."""
    if post <= 0:
        return (
            f"the weights alone ({inp.gpu_memory_gib - post:.3f} GiB) exceed the {inp.gpu_memory_gib} GiB free per GPU"
        )
    if rest <= 0:
        minimum = 1 - post / inp.gpu_memory_gib
        return (
            "SGLang refuses to start: loaded weights leave no GPU memory for the KV cache under "
            f"--mem-fraction-static={inp.mem_fraction_static} (minimum viable 1 - available/pre = {minimum:.4f})"
        )
    if pool <= 0:
        return "SGLang refuses to start: Not enough memory (max_total_num_tokens <= 0)"
    return None
