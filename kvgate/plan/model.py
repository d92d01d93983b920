"""A model's KV-relevant shape, read from its Hugging Face config.json the way SGLang reads it.

Mirrors `sglang/srt/configs/model_config.py` (`ModelConfig`) of 0.5.19-0.5.23 for the architectures
kvgate can plan: the head dimensions, the KV head count, MLA's latent sizes and DSA's indexer. What
SGLang sizes differently (sliding-window hybrids, Mamba/linear attention, DeepSeek V4 compression,
MiniMax sparse, multimodal wrappers) is refused with a `PlanError` naming why, never approximated.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from kvgate.errors import UsageError


class PlanError(UsageError):
    """A plan that cannot be computed from what was given (exit 2), e.g. an unsupported architecture."""


class Attention(str, Enum):
    """How SGLang lays out one token's KV."""

    MHA = "mha"  # multi-head / grouped-query: K and V per KV head
    MLA = "mla"  # multi-head latent: one compressed latent plus the rope part, shared by all heads
    DSA = "dsa"  # MLA plus the DeepSeek sparse-attention indexer's keys (V3.2 family)


# The architectures kvgate plans: each has a config in tests/plan/model_configs/ that the releases' own
# sizing code is run on. MLA ones are in SGLang's "special judge for MLA architecture" (ModelConfig).
MLA_ARCHS = frozenset({"DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"})
# `is_deepseek_dsa` (configs/model_config.py): one of these architectures AND `index_topk` set.
DSA_ARCHS = MLA_ARCHS
# Plain GQA/MHA decoders whose whole KV is one `MHATokenToKVPool` (no sliding-window or linear layers).
MHA_ARCHS = frozenset({"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"})
# SGLang's `_get_and_verify_dtype` serves a float32 checkpoint in float16: every planned dtype is 2 bytes.
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 2, "half": 2, "bf16": 2, "fp16": 2}

# Keys whose presence means SGLang would not use the plain pool the planner models.
_UNSUPPORTED_KEYS = {
    "compress_ratios": "DeepSeek V4 compressed attention",
    "sparse_attention_config": "MiniMax sparse attention",
    "linear_attn_config": "linear attention layers",
    "mamba_d_state": "Mamba state layers",
    "learnable_sink": "learnable DSA attention sinks",
}


@dataclass(frozen=True)
class ModelShape:
    """The fields SGLang's pool sizing reads from a model config (ModelConfig's names)."""

    architecture: str
    attention: Attention
    num_hidden_layers: int
    num_attention_heads: int
    num_kv_heads: int  # total, before TP (get_total_num_kv_heads)
    head_dim: int
    v_head_dim: int
    dtype_bytes: int  # the model dtype SGLang serves (bf16/fp16: 2)
    max_position_embeddings: int | None
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    index_head_dim: int = 0
    index_kpool: int = 1
    kv_cache_quant_fp8: bool = False  # the checkpoint's quantization_config asks for an FP8 KV cache
    # DSA: per layer, whether it reuses the previous layer's top-k (SGLang's dsa_layer_skips_topk).
    indexer_skips: tuple[bool, ...] = ()
    raw: Mapping[str, Any] | None = None  # the config, for the weight estimate

    @property
    def kv_per_head_dim(self) -> int:
        """MHA: K plus V width per head (head_dim + v_head_dim)."""
        return self.head_dim + self.v_head_dim


def _int(cfg: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PlanError(f"{where}: '{key}' must be a non-negative integer, got {value!r}")
    return value


def shape_from_config(cfg: Mapping[str, Any], where: str = "model config") -> ModelShape:
    """The shape SGLang derives from `cfg` (a parsed config.json); PlanError when not plannable."""
    if not isinstance(cfg, Mapping):
        raise PlanError(f"{where}: expected a JSON object, got {type(cfg).__name__}")
    archs = cfg.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise PlanError(f"{where}: 'architectures' must be a non-empty list of names")
    arch = archs[0]
    if "text_config" in cfg:
        raise PlanError(f"{where}: multimodal wrapper configs (text_config) are not supported by kvgate plan")
    for key, what in _UNSUPPORTED_KEYS.items():
        if cfg.get(key):
            raise PlanError(f"{where}: '{key}' is set ({what}); kvgate plan does not model that pool")
    kinds = cfg.get("layer_types") or []
    if any(k not in ("full_attention", "attention") for k in kinds):
        raise PlanError(
            f"{where}: 'layer_types' names {sorted(set(kinds))} (hybrid sliding-window or linear "
            "attention); kvgate plan does not model that pool"
        )
    if cfg.get("sliding_window") not in (None, 0) and cfg.get("use_sliding_window", True):
        raise PlanError(f"{where}: 'sliding_window' is set (hybrid SWA pool); kvgate plan does not model that pool")
    if arch not in MLA_ARCHS and arch not in MHA_ARCHS:
        known = ", ".join(sorted(MHA_ARCHS | MLA_ARCHS))
        raise PlanError(f"{where}: architecture {arch} is not supported by kvgate plan (supported: {known})")
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    if dtype not in _DTYPE_BYTES:
        raise PlanError(f"{where}: torch_dtype {dtype!r} is not planned (bfloat16, float16, float32)")
    layers = _int(cfg, "num_hidden_layers", where)
    heads = _int(cfg, "num_attention_heads", where)
    if layers == 0 or heads == 0:
        raise PlanError(f"{where}: num_hidden_layers and num_attention_heads must be positive")
    mpe = cfg.get("max_position_embeddings")
    quant = cfg.get("quantization_config") or {}
    kv_fp8 = isinstance(quant, Mapping) and str(quant.get("kv_cache_quant_algo") or "").upper() == "FP8"
    common: dict[str, Any] = dict(
        architecture=arch,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        dtype_bytes=_DTYPE_BYTES[dtype],
        max_position_embeddings=mpe if isinstance(mpe, int) else None,
        kv_cache_quant_fp8=kv_fp8,
        raw=dict(cfg),
    )
    if arch in MLA_ARCHS:
        kv_lora_rank = _int(cfg, "kv_lora_rank", where)
        rope = _int(cfg, "qk_rope_head_dim", where)
        is_dsa = arch in DSA_ARCHS and cfg.get("index_topk") is not None
        if arch in ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM") and not is_dsa:
            raise PlanError(f"{where}: {arch} without 'index_topk' is not a configuration kvgate plans")
        return ModelShape(
            attention=Attention.DSA if is_dsa else Attention.MLA,
            num_kv_heads=_int(cfg, "num_key_value_heads", where, heads),
            head_dim=256,  # SGLang's MLA placeholder; MLA sizing reads kv_lora_rank + qk_rope_head_dim
            v_head_dim=_int(cfg, "v_head_dim", where),
            kv_lora_rank=kv_lora_rank,
            qk_rope_head_dim=rope,
            index_head_dim=_int(cfg, "index_head_dim", where) if is_dsa else 0,
            index_kpool=_int(cfg, "index_kpool", where, 1) if is_dsa else 1,
            indexer_skips=dsa_indexer_skips(cfg, layers) if is_dsa else (),
            **common,
        )
    head_dim = cfg.get("head_dim") or _int(cfg, "hidden_size", where) // heads
    v_head_dim = cfg.get("v_head_dim") or head_dim
    kv_heads = cfg.get("num_key_value_heads")
    return ModelShape(
        attention=Attention.MHA,
        num_kv_heads=kv_heads if isinstance(kv_heads, int) and kv_heads > 0 else heads,
        head_dim=int(head_dim),
        v_head_dim=int(v_head_dim),
        **common,
    )


def dsa_indexer_skips(cfg: Mapping[str, Any], layers: int) -> tuple[bool, ...]:
    """Per layer, whether SGLang's `dsa_layer_skips_topk` (configs/model_config.py, 0.5.20-0.5.23) says it
    reuses the previous layer's top-k, on the config object transformers builds.

    transformers' GlmMoeDsaConfig (5.12/5.19) fills `indexer_types` itself when the file has none: from
    `index_topk_pattern`, else from `index_topk_freq` with `index_skip_topk_offset` defaulting to 2.
    """
    types = cfg.get("indexer_types")
    if types is None and cfg.get("model_type") == "glm_moe_dsa":
        pattern = cfg.get("index_topk_pattern")
        if pattern is not None:
            types = [{"F": "full", "S": "shared"}[c] for c in pattern] if isinstance(pattern, str) else list(pattern)
        else:
            freq, offset = max(cfg.get("index_topk_freq", 1) or 1, 1), cfg.get("index_skip_topk_offset", 2)
            types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(layers)]
    if types is not None:
        return tuple(0 <= i < len(types) and types[i] == "shared" for i in range(layers))
    cli = cfg.get("cli_factor") or 1
    if cli > 1:
        return tuple(i % cli != 0 for i in range(layers))
    pattern = cfg.get("index_topk_pattern")
    if pattern is not None:
        return tuple(i < len(pattern) and pattern[i] == "S" for i in range(layers))
    freq = cfg.get("index_topk_freq") or 1
    offset = cfg.get("index_skip_topk_offset")
    if offset is not None:
        return tuple(max(i - offset + 1, 0) % freq != 0 for i in range(layers))
    return tuple(max(i - 1, 0) % freq != 0 for i in range(layers))


def load_shape(path: Path) -> ModelShape:
    """Read `path` (a config.json, or a directory holding one)."""
    file = path / "config.json" if path.is_dir() else path
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PlanError(f"--model-config {file}: cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise PlanError(f"--model-config {file}: not valid JSON: {exc}") from None
    return shape_from_config(doc, str(file))
