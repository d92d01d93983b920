"""Unit level of issue 29's gate half: the rules behind fleet.router-identity, fleet.pair-consistency,
pool-context.context-sources and pool-context.number, over real SGLang-shaped documents
(tests/assets). The end-to-end cases, over real sockets, are tests/hostile/test_fleet_story.py."""

from __future__ import annotations

from typing import Any

import pytest

from kvgate.gates.fleet import router_identity
from kvgate.gates.pair import pair_consistency
from kvgate.gates.pool_context import context_sources
from kvgate.reading.discovery import parse_workers
from kvgate.reading.node import NodeReading, NodeSpec, parse_node
from kvgate.results.findings import Outcome
from tests.assets import router_payloads as R
from tests.assets import sglang_payloads as P

BIG = 2_040_000


def reading(role: str, url: str = "http://w:30000", *, context: int = 1_048_576, **info_kw: Any) -> NodeReading:
    extra = {k: info_kw.pop(k) for k in list(info_kw) if k in ("model_path", "kv_cache_dtype")}
    info = P.server_info("0.5.22", mode=role, context=context, **info_kw)
    info.update(extra)
    return parse_node(NodeSpec(role, url, 0), "/server_info", info, P.v1_models(context), P.model_info("0.5.22", role))


# --- the router's entries -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, url, problem",
    [
        ({"dp_base_url": "http://b:1", "dp_rank": 0, "dp_size": 1}, "http://a:1@0", "dp_base_url names http://b:1"),
        ({"dp_base_url": "http://a:1", "dp_rank": 1, "dp_size": 2}, "http://a:1@0", "but dp_rank is 1"),
        ({"dp_base_url": "http://a:1", "dp_rank": 0.0, "dp_size": 2}, "http://a:1@0", "dp_rank is 0.0, not a JSON"),
        ({"dp_base_url": "http://a:1", "dp_rank": 2, "dp_size": 2}, "http://a:1@2", "rank 2 is not one of dp_size 2"),
        ({"dp_size": True}, "http://a:1", "dp_size is True"),
        ({"dp_base_url": 7}, "http://a:1", "dp_base_url is 7, not a URL"),
        ({"bootstrap_port": 70_000}, "http://a:1", "bootstrap_port is 70000, outside"),
        ({"dp_rank": -1}, "http://a:1", "dp_rank is -1, outside"),
    ],
)
def test_an_entry_whose_fields_name_another_worker_or_rank_carries_the_problem(
    extra: dict[str, Any], url: str, problem: str
) -> None:
    [w] = parse_workers("http://router", R.smg_workers(R.smg_entry(url, "prefill", **extra))).workers
    assert any(problem in p for p in w.problems), w.problems
    assert w.base_url == url.split("@")[0]  # the URL gated is the one the entry routes to


def test_a_real_dp_aware_entry_has_no_problem() -> None:
    """What smg 1.13.0 --dp-aware lists (tests/commands/test_fleet_cli.py observes it)."""
    doc = R.smg_workers(
        *(R.smg_entry(f"http://a:1@{k}", "decode", dp_base_url="http://a:1", dp_rank=k, dp_size=2) for k in (0, 1))
    )
    listing = parse_workers("http://router", doc)
    assert [w.problems for w in listing.workers] == [(), ()] and listing.duplicates() == []


def test_duplicates_are_found_under_any_spelling() -> None:
    doc = R.smg_workers(
        R.smg_entry("http://a:1", "decode"), R.smg_entry("http://A:1/", "decode"), R.smg_entry("http://b:1", "decode")
    )
    [(url, rank, urls)] = parse_workers("http://router", doc).duplicates()
    assert url == "http://a:1" and rank is None and urls == ["http://a:1", "http://A:1/"]


def test_identity_compares_the_routed_ranks_with_the_ranks_read() -> None:
    r = reading("prefill", "http://a:1", pool=BIG, rank_pools=[BIG, BIG, BIG])
    entries = [
        R.smg_entry(f"http://a:1@{k}", "prefill", dp_base_url="http://a:1", dp_rank=k, dp_size=3) for k in (0, 1)
    ]
    labels = {"http://a:1": r.node}
    [f] = router_identity(parse_workers("http://router", R.smg_workers(*entries)), [r], labels)
    assert f.outcome is Outcome.INCONCLUSIVE and f.blocking and "rank(s) [2] the router does not list" in f.summary
    entries.append(R.smg_entry("http://a:1@2", "prefill", dp_base_url="http://a:1", dp_rank=2, dp_size=3))
    [ok] = router_identity(parse_workers("http://router", R.smg_workers(*entries)), [r], labels)
    assert ok.outcome is Outcome.PASSED


# --- the pair -------------------------------------------------------------------------------------


def test_a_pair_of_one_model_and_backend_passes() -> None:
    [f] = pair_consistency([reading("prefill", pool=BIG), reading("decode", pool=BIG)])
    assert f.outcome is Outcome.PASSED and "transfer backend mooncake" in f.summary


@pytest.mark.parametrize(
    "p_kw, d_kw, fact",
    [
        ({"backend": "mooncake"}, {"backend": "nixl"}, "transfer backend"),
        ({"model_path": "org/A"}, {"model_path": "org/B"}, "model"),
        ({"kv_cache_dtype": "fp8_e4m3"}, {"kv_cache_dtype": "bf16"}, "KV cache dtype"),
    ],
)
def test_a_pair_that_cannot_move_kv_fails_naming_each_side(
    p_kw: dict[str, Any], d_kw: dict[str, Any], fact: str
) -> None:
    out = pair_consistency([reading("prefill", pool=BIG, **p_kw), reading("decode", pool=BIG, **d_kw)])
    [f] = [f for f in out if f.outcome is Outcome.FAILED]
    assert f"disagree on the {fact}" in f.summary
    for v in (*p_kw.values(), *d_kw.values()):
        assert str(v).rsplit("/", 1)[-1] in f.summary


@pytest.mark.parametrize("p_dtype, d_dtype", [("auto", "fp8_e4m3"), ("bfloat16", "bf16"), (None, "fp8_e5m2")])
def test_kv_dtypes_that_may_be_one_are_not_compared(p_dtype: str | None, d_dtype: str) -> None:
    p_kw = {} if p_dtype is None else {"kv_cache_dtype": p_dtype}
    out = pair_consistency([reading("prefill", pool=BIG, **p_kw), reading("decode", pool=BIG, kv_cache_dtype=d_dtype)])
    assert {f.outcome for f in out} == {Outcome.PASSED}


# --- the context, read twice ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "flag, pool, outcome, blocking",
    [
        (None, BIG, Outcome.PASSED, False),
        (1_048_576, BIG, Outcome.PASSED, False),
        (524_288, BIG, Outcome.INCONCLUSIVE, False),  # two answers, one verdict: doubt, strict blocks
        (524_288, 1_000_000, Outcome.INCONCLUSIVE, True),  # the pool holds one answer only
    ],
)
def test_the_flag_and_max_model_len_must_agree(flag: int | None, pool: int, outcome: Outcome, blocking: bool) -> None:
    r = reading("decode", pool=pool, context_flag=flag)
    [f] = context_sources(r, [pool], 1.25)
    assert f.outcome is outcome and f.blocking is blocking


def test_a_scheduler_bound_below_the_context_counts_only_where_the_verdict_differs() -> None:
    info = P.server_info("0.5.22", mode="decode", context=1_048_576, pool=BIG)
    info["max_req_input_len"] -= 100  # a pool the scheduler counts smaller: one verdict still
    r = parse_node(NodeSpec("decode", "http://w:1", 0), "/server_info", info, P.v1_models(), P.model_info())
    [f] = context_sources(r, [BIG], 1.25)
    assert f.outcome is Outcome.PASSED


# --- numbers --------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [1e308, 8192.0, True, "8192", -1, 2**40, None])
def test_a_count_that_is_not_a_sane_json_integer_is_a_number_problem(value: object) -> None:
    info = P.server_info("0.5.22", mode="decode", pool=BIG)
    info["max_total_num_tokens"] = value
    r = parse_node(NodeSpec("decode", "http://w:1", 0), "/server_info", info, P.v1_models(), P.model_info())
    [p] = [p for p in r.problems if p.field == "max_total_num_tokens"]
    assert r.max_total_num_tokens is None
    assert p.number is (value is not None)  # null is a missing value, not a malformed one
