"""SGLang's own KV-pool arithmetic, written out for the releases kvgate plans (0.5.19-0.5.23).

Each function names the release code it follows (paths under `sglang/srt/` of the wheel). The test
tests/plan/test_sizing_vs_sglang.py executes those release functions on CPU with the same inputs and
requires these numbers to be equal, so a drift in a new release shows up as a failing test, not as a
wrong plan.

The path modelled is the one SGLang takes for a plain MHA/GQA, MLA or DSA model: no speculative
decoding, no HiSparse/HiCache, no decode context parallelism, no post-capture resizing (off by
default in every release: `SGLANG_ENABLE_POST_CAPTURE_KV_SIZING`), no multimodal reservation.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version

from kvgate.plan.model import Attention, ModelShape, PlanError
from kvgate.upstream.releases import RELEASES

# --kv-cache-dtype values the planner models, and the bytes of one element of each.
# fp8_e5m2 is left out: SGLang refuses it on CPU, so no release's code could confirm its sizing here.
KV_DTYPE_BYTES = {"bfloat16": 2, "bf16": 2, "fp8_e4m3": 1}
KV_DTYPE_CHOICES = ("auto", "bfloat16", "fp8_e4m3")
# DSATokenToKVPool (mem_cache/memory_pool.py): FP8 blocks of 128 with a 4-byte scale, uint8 indexer
# keys, rope always stored in bf16.
DSA_QUANT_BLOCK = 128
DSA_ROPE_BYTES = 2
DSA_INDEX_ELEMENT_BYTES = 1
GIB = 1 << 30


@dataclass(frozen=True)
class KvDtype:
    """The KV element type SGLang resolves `--kv-cache-dtype` to, and why."""

    name: str
    bytes: int
    reason: str


def resolve_kv_dtype(shape: ModelShape, requested: str, gpu_sm: int) -> KvDtype:
    """`--kv-cache-dtype` as the release resolves it.

    `auto` on a DSA model: `_dsa_kv_cache_dtype_default` / `_deepseek_family_overrides`
    (arg_groups/) pick fp8_e4m3 on SM >= 10 and bfloat16 below. Otherwise `auto` is FP8 when the
    checkpoint's quant config asks for an FP8 KV cache (`model.checkpoint_kv_fp8`: ModelOpt's two
    forms, compressed-tensors, fp8), else the model dtype (mem_cache/kv_cache_dtype.py
    `configure_kv_cache_dtype`). An explicit dtype wins over the checkpoint.
    """
    if requested not in KV_DTYPE_CHOICES and requested != "bf16":
        raise PlanError(
            f"--kv-cache-dtype {requested}: kvgate plan models {', '.join(KV_DTYPE_CHOICES)} "
            "(FP4, MXFP8 and fp8_e5m2 pools are not modelled)"
        )
    if shape.attention is Attention.DSA:
        if requested == "auto":
            name = "fp8_e4m3" if gpu_sm >= 100 else "bfloat16"
            return KvDtype(name, KV_DTYPE_BYTES[name], f"auto on a DSA model at SM{gpu_sm}")
        name = "bfloat16" if requested == "bf16" else requested
        return KvDtype(name, KV_DTYPE_BYTES[name], "as given")
    if requested == "auto":
        if shape.kv_cache_quant_fp8:
            return KvDtype("fp8_e4m3", 1, f"auto: the checkpoint's {shape.kv_cache_quant_source} asks for FP8")
        return KvDtype("model dtype", shape.dtype_bytes, "auto: the model dtype")
    return KvDtype(requested, KV_DTYPE_BYTES[requested], "as given")


def kv_heads_per_rank(shape: ModelShape, attn_tp: int) -> int:
    """ModelConfig.get_num_kv_heads(attn_tp_size): KV heads one attention-TP rank holds (at least 1)."""
    return max(1, shape.num_kv_heads // attn_tp)


def dsa_fp8_scaled_layout(shape: ModelShape, gpu_sm: int) -> bool:
    """Whether DSA's FP8 KV uses the scaled layout, with SGLang's default DSA backends on CUDA.

    `_dsa_split_backend_resolution` (arg_groups/overrides.py) picks trtllm for FP8 on SM >= 10
    (GLM DSA on SM12x: flashinfer_sparse_mla) and flashmla_kv below; calculate_mla_kv_cache_dim
    keeps the raw latent+rope layout for trtllm only. Explicit --dsa-*-backend flags are not modelled.
    """
    glm_sm12 = shape.architecture == "GlmMoeDsaForCausalLM" and gpu_sm // 10 == 12
    return gpu_sm < 100 or glm_sm12


def mla_kv_cache_dim(shape: ModelShape, kv: KvDtype, gpu_sm: int) -> int:
    """calculate_mla_kv_cache_dim (mem_cache/kv_cache_configurator.py) with the default DSA backends.

    DSA with FP8 KV in the scaled layout stores the latent in FP8 blocks of 128 with a 4-byte scale
    each and the rope part in bf16.
    """
    dim = shape.kv_lora_rank + shape.qk_rope_head_dim
    if shape.attention is Attention.DSA and kv.name == "fp8_e4m3" and dsa_fp8_scaled_layout(shape, gpu_sm):
        return shape.kv_lora_rank + shape.kv_lora_rank // DSA_QUANT_BLOCK * 4 + shape.qk_rope_head_dim * DSA_ROPE_BYTES
    return dim


def dsa_indexer_bytes_per_layer(shape: ModelShape, release: str) -> int:
    """DefaultPoolConfigurator._compute_dsa_indexer_cell_size, per layer: index keys plus scales.

    From 0.5.22 the bytes are divided (rounded up) by the config's `index_kpool`.
    """
    per_token = shape.index_head_dim + shape.index_head_dim // DSA_QUANT_BLOCK * 4
    if Version(release) >= Version("0.5.22"):
        per_token = -(-per_token // shape.index_kpool)
    return per_token * DSA_INDEX_ELEMENT_BYTES


@dataclass(frozen=True)
class CellSize:
    """Bytes one token takes in one rank's KV pool, and the terms it is made of."""

    total: int
    kv_bytes: int
    indexer_bytes: int
    formula: str


def indexer_layers(shape: ModelShape, start: int, end: int, release: str) -> int:
    """Layers of the stage [start, end) that hold DSA indexer keys (_compute_dsa_indexer_cell_size).

    Up to 0.5.21 `_should_elide_dsa_index_k` is false under PD (disaggregation mode prefill/decode), so
    every layer holds them; from 0.5.22 (CUDA) layers that reuse the previous top-k hold none, PD too.
    """
    if Version(release) < Version("0.5.22"):
        return end - start
    return sum(not shape.indexer_skips[i] for i in range(start, end))


def cell_size(
    shape: ModelShape, kv: KvDtype, attn_tp: int, layer_range: tuple[int, int], release: str, gpu_sm: int
) -> CellSize:
    """DefaultPoolConfigurator._compute_cell_size (model_executor/pool_configurator.py) for the PD roles."""
    layers = layer_range[1] - layer_range[0]
    if shape.attention is Attention.MHA:
        n = kv_heads_per_rank(shape, attn_tp)
        total = n * shape.kv_per_head_dim * layers * kv.bytes
        return CellSize(
            total,
            total,
            0,
            f"kv_heads/rank {n} x (head_dim {shape.head_dim} + v_head_dim "
            f"{shape.v_head_dim}) x layers {layers} x {kv.bytes} B",
        )
    dim = mla_kv_cache_dim(shape, kv, gpu_sm)
    kv_part = dim * layers * kv.bytes
    formula = f"MLA dim {dim} x layers {layers} x {kv.bytes} B (not divided by TP)"
    if shape.attention is Attention.MLA:
        return CellSize(kv_part, kv_part, 0, formula)
    per_layer = dsa_indexer_bytes_per_layer(shape, release)
    n_index = indexer_layers(shape, *layer_range, release)
    indexer = per_layer * n_index
    return CellSize(
        kv_part + indexer, kv_part, indexer, f"{formula} + indexer {per_layer} B x {n_index} indexer layers"
    )


def rest_gib(pre_load_gib: float, post_load_gib: float, mem_fraction_static: float) -> float:
    """KVCacheConfigurator._profile_available_bytes, in GiB: free memory after the weights minus the slack
    `pre x (1 - mem_fraction_static)` left for activations and CUDA graphs (no multimodal reservation).

    The same float operations as the release, in the same order, so the int() truncation agrees.
    """
    slack_gb = pre_load_gib * (1 - mem_fraction_static)
    return post_load_gib - slack_gb - 0


def available_bytes(rest: float) -> int:
    """The KV budget in bytes: `int(rest_memory * (1 << 30))` (SGLang raises instead when rest <= 0)."""
    return int(rest * GIB) if rest > 0 else 0


def tokens_from_bytes(budget: int, cell: int, page_size: int) -> int:
    """DefaultPoolConfigurator.calculate_pool_sizes: whole tokens, rounded down to whole pages."""
    return budget // cell // page_size * page_size


def apply_cap(tokens: int, max_total_tokens: int | None, page_size: int) -> int:
    """config_from_budget + _apply_token_constraints: the --max-total-tokens cap, re-rounded to pages."""
    if max_total_tokens is None or max_total_tokens >= tokens:
        return tokens
    return max_total_tokens // page_size * page_size


def pp_layer_ranges(num_layers: int, pp_size: int) -> list[tuple[int, int]]:
    """sglang.srt.distributed.utils.get_pp_indices for every stage (no SGLANG_PP_LAYER_PARTITION):
    the last `num_layers % pp_size` stages hold one extra layer."""
    base, remainder = divmod(num_layers, pp_size)
    ranges = []
    for rank in range(pp_size):
        if rank >= pp_size - remainder:
            start = rank * (base + 1) - (pp_size - remainder)
            ranges.append((start, start + base + 1))
        else:
            ranges.append((rank * base, rank * base + base))
    return ranges


def check_release(release: str) -> str:
    """A release the planner knows (the ones whose sizing code the test executes)."""
    if release not in RELEASES:
        raise PlanError(f"--release {release}: kvgate plan models SGLang {', '.join(RELEASES)}")
    return release
