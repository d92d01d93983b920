"""The weight ESTIMATE against the published parameter counts of the shapes the test configs copy."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.plan.model import load_shape
from kvgate.plan.weights import estimate_weights_gib, parameter_count

CONFIGS = Path(__file__).resolve().parent / "model_configs"


@pytest.mark.parametrize(
    "config, published",
    [
        ("llama-gqa", 70.6e9),  # Llama 3 70B
        ("deepseek-v3-mla", 671e9),  # DeepSeek-V3 without its MTP module
    ],
)
def test_parameter_count_is_within_one_percent_of_the_published_size(config: str, published: float) -> None:
    linear, embed = parameter_count(load_shape(CONFIGS / f"{config}.json"))
    assert abs((linear + embed) / published - 1) < 0.01


def test_fp8_checkpoints_store_linear_layers_in_one_byte() -> None:
    shape = load_shape(CONFIGS / "deepseek-v3-mla.json")
    bf16, _ = estimate_weights_gib(shape, 8)
    fp8_shape = load_shape(CONFIGS / "deepseek-v3-mla.json").__class__(
        **{**shape.__dict__, "raw": {**(shape.raw or {}), "quantization_config": {"quant_method": "fp8"}}}
    )
    fp8, how = estimate_weights_gib(fp8_shape, 8)
    assert 0.5 < fp8 / bf16 < 0.52 and how.startswith("ESTIMATE") and "fp8" in how
