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
    ],
)
def test_what_kvgate_does_not_model_is_refused_by_name(extra: dict, needle: str) -> None:
    with pytest.raises(PlanError, match=needle):
        shape_from_config(cfg("llama-gqa") | extra)


def test_mistral_style_null_sliding_window_is_a_plain_pool() -> None:
    assert shape_from_config(cfg("llama-gqa") | {"sliding_window": None}).attention is Attention.MHA
