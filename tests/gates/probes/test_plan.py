"""Exact probe lengths from readings."""

from __future__ import annotations

from kvgate.gates.probes.plan import ACCEPT, REJECT, ProbeLimits, limits_from_readings, plan_length_probes
from kvgate.reading.node import NodeSpec, parse_node
from tests.assets.sglang_payloads import max_req_input_len, model_info, server_info, v1_models


def _reading(role: str, context: int, pool: int, url: str, page: int = 64):
    info = server_info(mode=role, context=context, pool=pool, page_size=page)
    return parse_node(NodeSpec(role, url), "/server_info", info, v1_models(context), model_info())


def test_incident_numbers() -> None:
    lim = ProbeLimits(
        context=1_048_576, max_req_input_len=max_req_input_len(1_048_576, 681_280), page_size=64, pool=681_280
    )
    plan = {p.name: p for p in plan_length_probes(lim, 48)}
    assert plan["longest_accepted"].length == 681_273 and plan["longest_accepted"].expect == ACCEPT
    assert plan["pool_limit"].length == 681_274 and plan["pool_limit"].expect == REJECT
    assert plan["context_limit"].length == 1_048_576
    assert plan["beyond_context"].length > 1_048_576
    band = plan["reject_band_middle"]
    assert 681_274 < band.length < 1_048_576 and band.length + band.max_new_tokens <= 1_048_576
    # cheapest first: tokenizer rejections, abort path, then the one long accepted prefill
    assert [p.name for p in plan.values()][-1] == "longest_accepted"


def test_prompt_plus_generation_never_exceeds_context() -> None:
    lim = ProbeLimits(context=4096, max_req_input_len=max_req_input_len(4096, 1 << 20), page_size=16, pool=1 << 20)
    for p in plan_length_probes(lim, 48):
        if p.length < lim.context:
            assert p.length + p.max_new_tokens <= lim.context, p
    # pool above context: the reject band is SGLang's last 6 tokens below the context
    names = [p.name for p in plan_length_probes(lim, 48)]
    assert "pool_limit" in names


def test_most_restrictive_limit_across_nodes() -> None:
    readings = [
        _reading("prefill", 1_048_576, 681_280, "http://p"),
        _reading("decode", 1_048_576, 2_000_000, "http://d"),
    ]
    lim, problems = limits_from_readings(readings)
    assert not problems and lim is not None
    assert lim.max_req_input_len == max_req_input_len(1_048_576, 681_280)
    assert lim.context == 1_048_576 and lim.page_size == 64 and lim.pool == 681_280


def test_missing_limits_are_reported() -> None:
    info = server_info(context=4096, pool=8192)
    del info["max_req_input_len"]
    r = parse_node(NodeSpec("prefill", "http://p"), "/server_info", info, v1_models(4096), model_info())
    lim, problems = limits_from_readings([r])
    assert lim is None and "max_req_input_len" in problems[0]
