"""The profile's `soak:` section (settings.py) and the service levels (slo.py): validated, defaults
stated, measured against stated, and nothing unmeasured ever read as met."""

from __future__ import annotations

import pytest

from kvgate.errors import ProfileError
from kvgate.soak.load import RequestRecord
from kvgate.soak.pool import usage_of
from kvgate.soak.settings import DEFAULT_MIX, Slo, SoakSettings
from kvgate.soak.slo import judge, measure


def rec(
    i: int, *, served: bool = True, ttft: float = 0.1, e2e: float = 0.5, tokens: int = 9, **kw: object
) -> RequestRecord:
    args: dict[str, object] = {
        "cancelled": False,
        "status": 200 if served else 500,
        "error": None if served else "HTTP 500",
    }
    args.update(kw)
    return RequestRecord(
        i, 0, "short", 16, f"<KVG{i}>", i * 0.1, served=served, ttft_s=ttft, e2e_s=e2e, tokens=tokens, **args
    )  # type: ignore[arg-type]


def test_defaults_and_a_valid_section() -> None:
    s = SoakSettings.from_mapping(None, "p.yaml")
    assert (s.duration_s, s.slice_s, s.concurrency, s.slices) == (300.0, 30.0, 8, 10)
    assert dict(s.mix) == DEFAULT_MIX and s.checks == ("canary", "isolation", "handoff")
    s = SoakSettings.from_mapping(
        {"duration_s": 60, "slice_s": 15, "rate_per_s": 4, "mix": {"short": 1}, "slo": {"goodput": None}}, "p.yaml"
    )
    assert s.slices == 4 and s.rate_per_s == 4 and dict(s.mix) == {"short": 1.0} and s.slo.goodput is None


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"duraton_s": 5}, "soak.duraton_s"),
        ({"concurrency": 1.5}, "soak.concurrency"),
        ({"slice_s": 60, "duration_s": 30}, "soak.slice_s"),
        ({"mix": {"huge": 1}}, "soak.mix.huge"),
        ({"mix": {"short": 0}}, "soak.mix"),
        ({"checks": ["canary", "vibes"]}, "soak.checks"),
        ({"slo": {"goodput": 1.5}}, "soak.slo.goodput"),
        ({"slo": {"ttft_p99": 3}}, "soak.slo.ttft_p99"),
        ({"cancel_share": True}, "soak.cancel_share"),
    ],
)
def test_a_bad_key_or_value_names_the_file_and_the_key(section: dict[str, object], key: str) -> None:
    with pytest.raises(ProfileError) as e:
        SoakSettings.from_mapping(section, "p.yaml")
    assert "p.yaml" in str(e.value) and key in str(e.value)


def test_levels_measured_against_stated() -> None:
    slo = Slo(ttft_p99_s=1.0, e2e_p99_s=2.0, error_rate=0.2, goodput=0.5)
    recs = [rec(i) for i in range(8)] + [rec(8, served=False), rec(9, ttft=3.0), rec(10, cancelled=True, served=False)]
    st = measure(recs, 2.0, slo)
    assert (st.requests, st.cancelled, st.served, st.errors) == (11, 1, 9, 1)
    assert st.error_rate == pytest.approx(0.1) and st.goodput == pytest.approx(0.8)  # the slow ttft is not good
    levels = {lv.name: lv for lv in judge(st, slo)}
    assert levels["error_rate"].met and levels["goodput"].met
    assert levels["ttft_p99_s"].met is False and "stated <= 1" in levels["ttft_p99_s"].line()
    assert levels["itl_p99_s"].measured == pytest.approx(0.05)  # (0.5 - 0.1) / 8


def test_a_request_sent_to_be_cancelled_but_answered_first_is_load_not_a_level() -> None:
    """It went plain (no first-token time): it counts in the load and the error rate, not in goodput."""
    recs = [rec(i) for i in range(19)] + [rec(19, ttft=None, streamed=False)]
    st = measure(recs, 1.0, Slo())
    assert st.served == 20 and st.error_rate == 0 and st.goodput == 1.0


def test_nothing_answered_is_unmeasured_never_met() -> None:
    st = measure([rec(1, served=False)], 1.0, Slo())
    levels = {lv.name: lv for lv in judge(st, Slo())}
    assert levels["ttft_p99_s"].met is None and levels["error_rate"].met is False
    assert all(lv.met is None for lv in judge(measure([], 1.0, Slo()), Slo()))


def test_pool_use_from_v1_loads() -> None:
    doc = {
        "loads": [
            {"num_used_tokens": 50, "max_total_num_tokens": 100},
            {"num_used_tokens": 0, "max_total_num_tokens": 100},
        ]
    }
    assert usage_of(doc) == 0.25
    assert usage_of({"loads": [{"token_usage": 0.4}]}) == 0.4
    assert usage_of({"loads": []}) is None and usage_of({"loads": [{"num_used_tokens": "x"}]}) is None
    assert usage_of("<html>") is None
