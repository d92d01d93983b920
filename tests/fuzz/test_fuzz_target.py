"""Fuzz the target parser and gate 1 over broken server_info and /v1/models documents (no sockets).

Invariants: parsing and judging never raise; when a field gate 1 needs is dropped, nulled, retyped,
negative, zero or nested wrong, gate 1 fails (never an all-pass).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from kvgate.gates.pool_context import check_node
from kvgate.reading.node import NodeSpec, parse_node
from kvgate.results.findings import Outcome
from tests.assets import sglang_payloads as P
from tests.fuzz.mutations import BREAKING, KINDS, NEEDED_INFO, NEEDED_MODELS, label, mutate, paths

INFO = P.server_info("0.5.23", mode="prefill", pool=2_040_000, rank_pools=[2_040_000, 2_040_000])
MODELS = P.v1_models()
MODEL_INFO = P.model_info("0.5.23", "prefill")
DOCS = {"server_info": (INFO, NEEDED_INFO), "/v1/models": (MODELS, NEEDED_MODELS)}


def _gate1(info: Any, models: Any) -> list[Any]:
    reading = parse_node(NodeSpec("prefill", "http://p", 0), "/server_info", info, models, MODEL_INFO)
    return check_node(reading, "prefill", None, 1.25)


def test_baseline_passes_so_the_property_is_not_vacuous() -> None:
    findings = _gate1(INFO, MODELS)
    assert findings and all(f.outcome is Outcome.PASSED for f in findings), [f.summary for f in findings]


@st.composite
def mutation(draw: Callable[..., Any]) -> tuple[str, tuple[Any, ...], str]:
    which = draw(st.sampled_from(sorted(DOCS)))
    doc, needed = DOCS[which]
    # Half the draws aim at a needed field, the rest anywhere in the document.
    path = draw(st.one_of(st.sampled_from(sorted(needed, key=str)), st.sampled_from(list(paths(doc)))))
    return which, path, draw(st.sampled_from(KINDS))


@given(mutation())
@example(("server_info", ("max_req_input_len",), "zero"))  # was read as a valid bound: largest accepted -1
@example(("server_info", ("dp_size",), "drop"))
@example(("server_info", ("internal_states", 0), "retype_list"))
def test_broken_needed_field_never_passes_gate_1(
    count: Callable[[], None], m: tuple[str, tuple[Any, ...], str]
) -> None:
    count()
    which, path, kind = m
    doc, needed = DOCS[which]
    broken = mutate(doc, path, kind)
    info, models = (broken, MODELS) if which == "server_info" else (INFO, broken)
    findings = _gate1(info, models)  # must not raise
    if kind in BREAKING and path in needed:
        failed = [f for f in findings if f.outcome is Outcome.FAILED]
        assert failed, f"{which} {label(path)} {kind}: gate 1 passed: {[f.summary for f in findings]}"


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids, max_size=6),
        max_leaves=30,
    ),
    st.recursive(
        st.none() | st.integers() | st.text(max_size=10),
        lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
        max_leaves=10,
    ),
)
def test_arbitrary_documents_never_crash_and_never_pass(count: Callable[[], None], info: Any, models: Any) -> None:
    count()
    if not isinstance(info, dict):
        return  # the client refuses a non-object before parsing (test_fuzz_cli covers it end to end)
    findings = _gate1(info, models)
    assert any(f.outcome is Outcome.FAILED for f in findings)
