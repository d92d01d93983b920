"""SGLang's admission limits (kvgate.upstream.admission), the one model every layer uses."""

from __future__ import annotations

from kvgate.upstream.admission import AdmissionLimits, max_req_input_len


def test_incident_limits() -> None:
    lim = AdmissionLimits.of(1_048_576, 681_280, 681_274)
    assert lim.expected_max_req_input_len == max_req_input_len(1_048_576, 681_280) == 681_274
    assert lim.longest_accepted == 681_273
    assert lim.reject_band == (681_274, 1_048_575)
    assert lim.over_pool_band == (681_281, 1_048_576)


def test_even_a_big_pool_leaves_a_six_token_abort_band() -> None:
    lim = AdmissionLimits.of(1_048_576, 2_040_000, 1_048_570)
    assert lim.over_pool_band is None
    assert lim.reject_band == (1_048_570, 1_048_575)


def test_an_unreported_bound_is_sglangs_formula() -> None:
    assert AdmissionLimits.of(4096, 1024).max_req_input_len == 1018
    assert AdmissionLimits.of(4096, 1024) == AdmissionLimits.of(4096, 1024, 1018)


def test_a_bound_above_the_context_accepts_only_what_the_tokenizer_accepts() -> None:
    """A worker reporting max_req_input_len >= context (a build whose bound does not follow SGLang's
    formula): its tokenizer still rejects N >= context, so the longest accepted prompt is context - 1,
    not max_req_input_len - 1, and no length takes the abort path."""
    lim = AdmissionLimits.of(4096, 8192, 5000)
    assert lim.longest_accepted == 4095
    assert lim.reject_band is None
    assert lim.expected_max_req_input_len == 4090
    # at the context exactly: the context bound alone applies as well
    assert AdmissionLimits.of(4096, 8192, 4096).longest_accepted == 4095
    assert AdmissionLimits.of(4096, 8192, 4095).reject_band == (4095, 4095)


def test_an_unknown_pool_leaves_only_what_depends_on_it_unknown() -> None:
    lim = AdmissionLimits(context=8192, max_req_input_len=8000)
    assert lim.expected_max_req_input_len is None and lim.over_pool_band is None
    assert lim.longest_accepted == 7999 and lim.reject_band == (8000, 8191)
