"""Model shapes read from config.json the way SGLang's ModelConfig reads them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate.plan.model import Attention, PlanError, shape_from_config

CONFIGS = Path(__file__).resolve().parent / "model_configs"


def cfg(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def test_gqa_head_dim_defaults_to_hidden_over_heads() -> None:
    s = shape_from_config(cfg("llama-gqa"))
    assert (s.attention, s.head_dim, s.v_head_dim, s.num_kv_heads) == (Attention.MHA, 8192 // 64, 128, 8)
    no_kv = {k: v for k, v in cfg("llama-gqa").items() if k != "num_key_value_heads"}
    assert shape_from_config(no_kv).num_kv_heads == 64  # plain MHA: one KV head per attention head


def test_deepseek_v3_is_mla_and_becomes_dsa_only_with_index_topk() -> None:
    assert shape_from_config(cfg("deepseek-v3-mla")).attention is Attention.MLA
    assert (
        shape_from_config(cfg("deepseek-v3-mla") | {"index_topk": 2048, "index_head_dim": 128}).attention
        is Attention.DSA
    )
    dsa = shape_from_config(cfg("deepseek-v32-dsa"))
    assert (dsa.attention, dsa.kv_lora_rank, dsa.qk_rope_head_dim, dsa.index_head_dim) == (Attention.DSA, 512, 64, 128)


@pytest.mark.parametrize(
    "extra, needle",
    [
        ({"sliding_window": 4096}, "sliding_window"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
        ({"architectures": ["FalconForCausalLM"]}, "not supported"),
        ({"text_config": {}}, "multimodal"),
        ({"num_hidden_layers": "80"}, "num_hidden_layers"),
        ({"torch_dtype": "int8"}, "torch_dtype"),
        # SGLang itself refuses a quantization_config without quant_method or quant_algo.
        ({"quantization_config": {"kv_cache_quant_algo": "FP8"}}, "ModelOpt unknown"),
        ({"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}, "ModelOpt NVFP4"),
        ({"quantization_config": {"quant_method": "awq", "kv_cache_quant_algo": "FP8"}}, "states a KV cache scheme"),
        ({"quantization_config": "fp8"}, "must be a JSON object"),
    ],
)
def test_what_kvgate_does_not_model_is_refused_by_name(extra: dict, needle: str) -> None:
    with pytest.raises(PlanError, match=needle):
        shape_from_config(cfg("llama-gqa") | extra)


def test_mistral_style_null_sliding_window_is_a_plain_pool() -> None:
    assert shape_from_config(cfg("llama-gqa") | {"sliding_window": None}).attention is Attention.MHA


def test_a_modelopt_fp8_checkpoint_plans_the_fp8_pool_sglang_sizes(tmp_path: Path) -> None:
    """Issue 46's case: ModelOpt's export states the KV quantisation as a kv_cache_scheme; `kvgate plan` at
    --kv-cache-dtype auto sizes the FP8 pool (twice the BF16 one), as the release does (the release's own
    code decides it in tests/plan/test_sizing_vs_sglang.py)."""
    from typer.testing import CliRunner

    from kvgate.cli import app

    def plan(name: str, *extra: str) -> dict:
        args = ["plan", "--model-config", str(CONFIGS / f"{name}.json"), "--gpu-memory-gib", "139.5"]
        args += ["--tp", "8", "--mem-fraction-static", "0.85", "--page-size", "64", "--context-length", "131072"]
        args += ["--weights-gib", "9.5", "--release", "0.5.22", "--format", "json", *extra]
        res = CliRunner().invoke(app, args)
        assert res.exit_code in (0, 1), res.output
        return json.loads(res.stdout)

    def pool(doc: dict) -> int:
        return int(doc["target"]["prefill"]["max_total_num_tokens"])

    fp8, bf16 = plan("llama-gqa-modelopt-kv-scheme"), plan("llama-gqa")
    assert 2 * pool(bf16) - 64 <= pool(fp8) <= 2 * pool(bf16) + 64  # half the cell, page rounding aside
    assert "kv_cache_scheme (ModelOpt FP8)" in json.dumps(fp8)
    explicit = plan("llama-gqa-modelopt-kv-scheme", "--kv-cache-dtype", "bfloat16")
    assert pool(explicit) == pool(bf16)  # an explicit dtype wins over the checkpoint
