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
    kv_cache_quant_fp8: bool = False  # the checkpoint's quantization config asks for an FP8 KV cache
    kv_cache_quant_source: str = ""  # where it says so (for the plan's reason), or why it does not
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


def _scheme_is_fp8(scheme: Mapping[str, Any], static_tensor: bool) -> bool:
    """A `kv_cache_scheme` of 8-bit floats (compressed-tensors also wants static symmetric per-tensor)."""
    fp8 = scheme.get("type") == "float" and scheme.get("num_bits") == 8
    if static_tensor:
        fp8 = fp8 and scheme.get("strategy") == "tensor" and bool(scheme.get("symmetric", True))
        fp8 = fp8 and not scheme.get("dynamic", False)
    return fp8


def checkpoint_kv_fp8(
    cfg: Mapping[str, Any], where: str, hf_quant_config: Mapping[str, Any] | None = None
) -> tuple[bool, str]:
    """Whether `--kv-cache-dtype auto` gives an FP8 pool for this checkpoint, as 0.5.19-0.5.23 decide it.

    SGLang's `configure_kv_cache_dtype` (mem_cache/kv_cache_dtype.py) makes `auto` FP8 when the model's
    quant config object has `kv_cache_quant_algo` FP8; each quant config class derives that from the
    checkpoint its own way (ModelConfig reads `quantization_config`, else `compression_config`, else a
    ModelOpt `hf_quant_config.json` beside config.json):
    ModelOpt FP8 (`ModelOptFp8Config.from_config`, quant_method `modelopt` or none): the flat form's
    `kv_cache_scheme` {type: float, num_bits: 8} (a scheme decides alone when it is there), else its
    `kv_cache_quant_algo`; the nested form's `quantization.kv_cache_quant_algo`. compressed-tensors
    (`CompressedTensorsConfig.kv_cache_quant_algo`): a static symmetric per-tensor 8-bit float
    `kv_cache_scheme`. FP8 (`Fp8Config.from_config`): `kv_cache_quant_algo`. Another method that states
    a KV scheme is refused (not approximated); one that states none leaves the model dtype.
    """
    quant = cfg.get("quantization_config")
    key = "quantization_config"
    if quant is None and cfg.get("compression_config") is not None:
        quant, key = cfg.get("compression_config"), "compression_config"
    if quant is None and hf_quant_config is not None:
        quant, key = hf_quant_config, "hf_quant_config.json"
    if quant is None:
        return False, "no quantization config"
    if not isinstance(quant, Mapping):
        raise PlanError(f"{where}: '{key}' must be a JSON object")
    method = quant.get("quant_method")
    method = method.lower() if isinstance(method, str) else method
    if method is None or method == "modelopt":
        flat = quant.get("quant_algo") is not None
        section = quant if flat else quant.get("quantization")
        if not isinstance(section, Mapping) or str(section.get("quant_algo")).upper() != "FP8":
            algo = section.get("quant_algo") if isinstance(section, Mapping) else None
            raise PlanError(
                f"{where}: {key} is a ModelOpt {algo or 'unknown'} checkpoint; kvgate plan models ModelOpt FP8 "
                "(its KV pool is not approximated)"
            )
        scheme = section.get("kv_cache_scheme") if flat else None
        if isinstance(scheme, Mapping):
            return _scheme_is_fp8(scheme, False), f"{key}.kv_cache_scheme (ModelOpt FP8)"
        algo = str(section.get("kv_cache_quant_algo") or "").upper()
        where_algo = f"{key}{'' if flat else '.quantization'}.kv_cache_quant_algo (ModelOpt FP8)"
        return algo == "FP8", where_algo
    if method == "compressed-tensors":
        scheme = quant.get("kv_cache_scheme")
        fp8 = isinstance(scheme, Mapping) and _scheme_is_fp8(scheme, True)
        return fp8, f"{key}.kv_cache_scheme (compressed-tensors)"
    if method == "fp8":
        return str(quant.get("kv_cache_quant_algo") or "").upper() == "FP8", f"{key}.kv_cache_quant_algo (fp8)"
    if "kv_cache_scheme" in quant or "kv_cache_quant_algo" in quant:
        raise PlanError(
            f"{where}: {key} of quant_method {method!r} states a KV cache scheme; kvgate plan models the KV "
            "dtype of ModelOpt FP8, compressed-tensors and fp8 checkpoints"
        )
    return False, f"{key} ({method}) states no KV cache scheme"


def shape_from_config(
    cfg: Mapping[str, Any], where: str = "model config", hf_quant_config: Mapping[str, Any] | None = None
) -> ModelShape:
    """The shape SGLang derives from `cfg` (a parsed config.json, and the `hf_quant_config.json` beside
    it if any); PlanError when not plannable."""
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
    kv_fp8, kv_source = checkpoint_kv_fp8(cfg, where, hf_quant_config)
    common: dict[str, Any] = dict(
        architecture=arch,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        dtype_bytes=_DTYPE_BYTES[dtype],
        max_position_embeddings=mpe if isinstance(mpe, int) else None,
        kv_cache_quant_fp8=kv_fp8,
        kv_cache_quant_source=kv_source,
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
    """Read `path` (a config.json, or a directory holding one and maybe ModelOpt's hf_quant_config.json)."""
    file = path / "config.json" if path.is_dir() else path
    doc = _read_json(file)
    extra = file.parent / "hf_quant_config.json"
    return shape_from_config(doc, str(file), _read_json(extra) if extra.is_file() else None)


def _read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PlanError(f"--model-config {file}: cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise PlanError(f"--model-config {file}: not valid JSON: {exc}") from None
