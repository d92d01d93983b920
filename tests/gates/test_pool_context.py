"""Gate 1's arithmetic on SGLang's limits."""

from __future__ import annotations

from kvgate.gates.pool_context import check_node
from kvgate.reading.node import NodeSpec, parse_node
from kvgate.results.findings import Finding, Outcome
from tests.assets import sglang_payloads as P


def _findings(pool: int, context: int, headroom: float, mri: int | None = None) -> dict[str, Finding]:
    doc = P.server_info(pool=pool, context=context)
    if mri is not None:
        doc["max_req_input_len"] = mri
    r = parse_node(NodeSpec("decode", "http://d", 0), "/server_info", doc, P.v1_models(context), None)
    object.__setattr__(r, "disaggregation_mode", "decode")
    object.__setattr__(r, "live_disaggregation_mode", "decode")
    return {f.check: f for f in check_node(r, "decode", None, headroom)}


def _outcomes(pool: int, context: int, headroom: float, mri: int | None = None) -> dict[str, Outcome]:
    return {check: f.outcome for check, f in _findings(pool, context, headroom, mri).items()}


def test_headroom_boundary() -> None:
    assert _outcomes(1_250_000, 1_000_000, 1.25)["headroom"] is Outcome.PASSED
    assert _outcomes(1_249_999, 1_000_000, 1.25)["headroom"] is Outcome.FAILED


def test_admission_bound_looser_than_the_pool_fails() -> None:
    assert _outcomes(681_280, 1_048_576, 1.0, mri=1_048_570)["admission-limit"] is Outcome.FAILED
    assert _outcomes(681_280, 1_048_576, 1.0)["admission-limit"] is Outcome.PASSED


def test_a_bound_above_the_context_names_the_tokenizers_longest_prompt() -> None:
    """max_req_input_len 5,000 on a 4,096 context: the tokenizer rejects N >= 4,096 first, so the
    longest accepted prompt is 4,095, not 4,999, and no length takes the abort path."""
    f = _findings(8192, 4096, 1.0, mri=5000)["admission-limit"]
    ev = {e.field: e.value for e in f.evidence}
    assert f.outcome is Outcome.FAILED
    assert ev["largest_accepted_prompt"] == 4095 and ev["reject_band"] is None


def test_a_rank_without_memory_usage_fails_closed() -> None:
    doc = P.server_info("0.5.23", pool=2_040_000, rank_pools=[2_040_000, 2_040_000])
    del doc["internal_states"][1]["memory_usage"]
    r = parse_node(NodeSpec("prefill", "http://p", 0), "/server_info", doc, P.v1_models(), None)
    field = [f for f in check_node(r, "prefill", None, 1.25) if f.check == "field"]
    assert [f.outcome for f in field] == [Outcome.FAILED]
    assert "internal_states[1].memory_usage" in field[0].summary


def _dp(doc: dict) -> tuple[Outcome, str]:
    r = parse_node(NodeSpec("prefill", "http://p", 0), "/server_info", doc, P.v1_models(), None)
    (f,) = [f for f in check_node(r, "prefill", None, 1.25) if f.check == "dp-ranks"]
    return f.outcome, f.summary


def test_issue_route_4_dp_size_4_with_one_rank_listed_fails_closed() -> None:
    doc = P.server_info("0.5.23", pool=2_040_000)
    doc["dp_size"] = 4  # the server says four DP ranks but lists one
    outcome, summary = _dp(doc)
    assert outcome is Outcome.FAILED and "dp_size 4" in summary and "1 rank" in summary


def test_every_rank_listed_passes_and_a_missing_dp_size_fails_closed() -> None:
    doc = P.server_info("0.5.23", pool=2_040_000, rank_pools=[2_040_000] * 4)
    assert _dp(doc)[0] is Outcome.PASSED
    doc.pop("dp_size")
    assert _dp(doc)[0] is Outcome.FAILED


def test_a_malformed_rank_entry_still_counts_as_listed_but_fails_on_its_field() -> None:
    doc = P.server_info("0.5.23", pool=2_040_000, rank_pools=[2_040_000] * 2)
    doc["internal_states"][1] = "garbage"
    r = parse_node(NodeSpec("prefill", "http://p", 0), "/server_info", doc, P.v1_models(), None)
    checks = {f.check: f.outcome for f in check_node(r, "prefill", None, 1.25)}
    assert checks["dp-ranks"] is Outcome.PASSED and checks["field"] is Outcome.FAILED


def test_attention_dp_layout_that_does_not_divide_tp_fails() -> None:
    doc = P.server_info("0.5.23", pool=2_040_000, rank_pools=[2_040_000] * 3, tp_size=8)
    doc["enable_dp_attention"] = True
    outcome, summary = _dp(doc)
    assert outcome is Outcome.FAILED and "tp_size 8" in summary
    doc["enable_dp_attention"] = False
    assert _dp(doc)[0] is Outcome.PASSED
