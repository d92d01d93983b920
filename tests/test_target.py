"""Field extraction across the 0.5.19-0.5.23 server_info shapes."""

from __future__ import annotations

import pytest

from kvgate.target import NodeSpec, parse_node
from tests.assets import sglang_payloads as P

SPEC = NodeSpec("prefill", "http://p", 0)


@pytest.mark.parametrize("version", ["0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"])
def test_every_release_shape_parses(version: str) -> None:
    r = parse_node(SPEC, "/server_info", P.server_info(version, pool=2_040_000), P.v1_models(), P.model_info(version))
    assert r.problems == ()
    assert r.version == version
    assert r.context_length == 1_048_576 and r.context_length_flag is None
    assert r.max_total_num_tokens == 2_040_000 and r.pool_key == "max_total_num_tokens"
    assert r.max_req_input_len == 1_048_570
    assert r.role == "prefill" and r.transfer_backend == "mooncake"
    assert r.kv_checksum is (None if version in ("0.5.19", "0.5.20") else False)
    assert r.architectures == ("GlmMoeDsaForCausalLM",)
    assert [rk.token_capacity for rk in r.ranks] == [2_040_000]


def test_live_role_from_internal_states_wins() -> None:
    doc = P.server_info("0.5.23", mode="prefill")
    for s in doc["internal_states"]:
        s["disaggregation_mode"] = "decode"  # after /pd_role_switch
    r = parse_node(SPEC, "/server_info", doc, P.v1_models(), None)
    assert r.disaggregation_mode == "prefill" and r.role == "decode"


@pytest.mark.parametrize("bad", ["681280", -5, True, 3.5, None])
def test_malformed_pool_is_a_problem_not_a_guess(bad: object) -> None:
    doc = P.server_info()
    doc["max_total_num_tokens"] = bad
    r = parse_node(SPEC, "/server_info", doc, P.v1_models(), None)
    assert r.max_total_num_tokens is None
    assert r.problem("max_total_num_tokens") is not None


def test_operator_cap_is_not_read_as_the_pool() -> None:
    doc = P.server_info(drop=("max_total_num_tokens",))
    doc["max_total_tokens"] = 5_000_000  # the operator's flag, not the sized pool
    r = parse_node(SPEC, "/server_info", doc, P.v1_models(), None)
    assert r.max_total_num_tokens is None and r.problem("max_total_num_tokens") is not None


def test_missing_models_endpoint_and_internal_states() -> None:
    doc = P.server_info(drop=("internal_states",), context_flag=1_048_576)
    r = parse_node(SPEC, "/server_info", doc, None, None)
    assert r.context_length is None and r.context_length_flag == 1_048_576
    assert {p.field for p in r.problems} == {"/v1/models", "internal_states"}


def test_env_vars_are_read_when_exposed() -> None:
    env = {"SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE": "1"}
    r = parse_node(SPEC, "/server_info", P.server_info(env_vars=env), P.v1_models(), None)
    assert r.env_vars == env


def test_null_required_strings_are_problems() -> None:
    doc = P.server_info()
    doc["version"] = None
    r = parse_node(SPEC, "/server_info", doc, P.v1_models(), None)
    assert r.version is None and r.problem("version") is not None
