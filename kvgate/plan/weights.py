"""An ESTIMATE of the weight bytes one GPU holds, from a model config, when the operator has no measurement.

SGLang does not size the pool from this: it measures free memory after loading (sizing.py). The
estimate counts the parameters of the linear layers, embeddings and experts and divides them evenly
over the tensor- and pipeline-parallel GPUs; it ignores replicated norms, buffers and the uneven
split of embeddings across pipeline stages. `--weights-gib` (a measured value, e.g. the `weight`
figure of a running worker's `memory_usage`) always wins over it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvgate.plan.model import Attention, ModelShape

GIB = 1 << 30


def _get(cfg: Mapping[str, Any], *keys: str, default: int = 0) -> int:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return default


def parameter_count(shape: ModelShape) -> tuple[int, int]:
    """(parameters stored at the checkpoint's linear-layer precision, parameters stored in the model dtype)."""
    cfg = shape.raw or {}
    hidden = _get(cfg, "hidden_size")
    vocab = _get(cfg, "vocab_size")
    heads = shape.num_attention_heads
    layers = shape.num_hidden_layers
    embed = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    if shape.attention is Attention.MHA:
        attn = hidden * heads * shape.head_dim * 2 + hidden * shape.num_kv_heads * (shape.head_dim + shape.v_head_dim)
    else:
        nope = _get(cfg, "qk_nope_head_dim")
        rope = shape.qk_rope_head_dim
        q_lora = _get(cfg, "q_lora_rank")
        q = hidden * q_lora + q_lora * heads * (nope + rope) if q_lora else hidden * heads * (nope + rope)
        attn = (
            q
            + hidden * (shape.kv_lora_rank + rope)
            + shape.kv_lora_rank * heads * (nope + shape.v_head_dim)
            + heads * shape.v_head_dim * hidden
        )
        if shape.attention is Attention.DSA:
            index_heads = _get(cfg, "index_n_heads")
            attn += (q_lora or hidden) * index_heads * shape.index_head_dim + hidden * shape.index_head_dim
    dense_ffn = 3 * hidden * _get(cfg, "intermediate_size")
    experts = _get(cfg, "n_routed_experts", "num_experts", "num_local_experts")
    if experts:
        moe_inter = _get(cfg, "moe_intermediate_size", default=_get(cfg, "intermediate_size"))
        shared = _get(cfg, "n_shared_experts") * moe_inter + _get(cfg, "shared_expert_intermediate_size")
        moe_ffn = 3 * hidden * (experts * moe_inter + shared) + hidden * experts
        dense_layers = min(_get(cfg, "first_k_dense_replace"), layers)
        ffn = dense_layers * dense_ffn + (layers - dense_layers) * moe_ffn
    else:
        ffn = layers * dense_ffn
    return layers * attn + ffn, embed


def estimate_weights_gib(shape: ModelShape, gpus: int) -> tuple[float, str]:
    """Estimated weight GiB per GPU over `gpus` GPUs (TP x PP), and how it was reached."""
    linear, embed = parameter_count(shape)
    quant = (shape.raw or {}).get("quantization_config") or {}
    method = str(quant.get("quant_method") or "").lower() if isinstance(quant, Mapping) else ""
    linear_bytes = 1 if method in ("fp8", "fbgemm_fp8", "w8a8_fp8", "compressed-tensors") else shape.dtype_bytes
    total = linear * linear_bytes + embed * shape.dtype_bytes
    per_gpu = total / gpus / GIB
    how = (
        f"ESTIMATE from the config: {linear + embed:,} parameters ({linear_bytes} B linear"
        f"{', ' + method if method else ''}, {shape.dtype_bytes} B embeddings) / {gpus} GPUs; "
        "pass --weights-gib with a measured value"
    )
    return per_gpu, how
