"""The profile's `soak:` section (settings.py) and the service levels (slo.py): validated, defaults
stated, measured against stated, and nothing unmeasured ever read as met."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvgate.errors import ProfileError
from kvgate.soak.load import RequestRecord
from kvgate.soak.pool import usage_of
from kvgate.soak.settings import DEFAULT_MIX, Slo, SoakSettings
from kvgate.soak.slo import Allowance, judge, measure

#: a prefill rate so fast the allowance is nothing: the levels as stated, flat
FLAT = Allowance(float("inf"), 9, "flat")


def rec(
    i: int,
    *,
    served: bool = True,
    ttft: float = 0.1,
    e2e: float = 0.5,
    tokens: int = 9,
    bucket: str = "short",
    length: int = 16,
    **kw: object,
) -> RequestRecord:
    args: dict[str, object] = {
        "cancelled": False,
        "status": 200 if served else 500,
        "error": None if served else "HTTP 500",
    }
    args.update(kw)
    return RequestRecord(
        i, 0, bucket, length, f"<KVG{i}>", i * 0.1, served=served, ttft_s=ttft, e2e_s=e2e, tokens=tokens, **args
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
    st = measure(recs, 2.0, slo, FLAT)
    assert (st.requests, st.cancelled, st.served, st.errors) == (11, 1, 9, 1)
    assert st.error_rate == pytest.approx(0.1) and st.goodput == pytest.approx(0.8)  # the slow ttft is not good
    levels = {lv.name: lv for lv in judge(st, slo, FLAT)}
    assert levels["error_rate"].met and levels["goodput"].met
    assert levels["ttft_p99_s"].met is False and "stated <= 1" in levels["ttft_p99_s"].line()
    assert levels["itl_p99_s"].measured == pytest.approx(0.05)  # (0.5 - 0.1) / 8


def test_a_request_sent_to_be_cancelled_but_answered_first_is_load_not_a_level() -> None:
    """It went plain (no first-token time): it counts in the load and the error rate, not in goodput."""
    recs = [rec(i) for i in range(19)] + [rec(19, ttft=None, streamed=False)]
    st = measure(recs, 1.0, Slo(), FLAT)
    assert st.served == 20 and st.error_rate == 0 and st.goodput == 1.0


def test_nothing_answered_is_unmeasured_never_met() -> None:
    st = measure([rec(1, served=False)], 1.0, Slo(), FLAT)
    levels = {lv.name: lv for lv in judge(st, Slo(), FLAT)}
    assert levels["ttft_p99_s"].met is None and levels["error_rate"].met is False
    assert all(lv.met is None for lv in judge(measure([], 1.0, Slo(), FLAT), Slo(), FLAT))


#: a healthy 1M-context deployment under the default load (8 in flight): one-page prompts answered in
#: under a second, the longest accepted prompt's prefill 60 s alone (17,476 tokens/s) and about 4x that
#: while it shares the prefill with the load
HEALTHY_1M = [
    *[rec(i, ttft=0.8, e2e=1.5, tokens=32) for i in range(80)],
    *[rec(100 + i, ttft=30.0, e2e=31.0, tokens=32, bucket="long", length=524_288) for i in range(12)],
    *[rec(200 + i, ttft=240.0, e2e=242.0, tokens=32, bucket="near_limit", length=1_048_576) for i in range(8)],
]


def test_the_flat_levels_fail_a_healthy_long_context_the_per_bucket_allowance_passes_it() -> None:
    """The false block this fixes: flat seconds (the old judgment) fail every prefill-including level and
    goodput on healthy 1M-context latencies; each bucket against level + its prefill share passes them."""
    slo = Slo()
    flat = {lv.name: lv for lv in judge(measure(HEALTHY_1M, 30.0, slo, FLAT), slo, FLAT)}
    assert flat["ttft_p99_s"].met is False and flat["e2e_p99_s"].met is False and flat["goodput"].met is False
    scaled = Allowance(1_048_576 / 60.0, 9, "stated")
    st = measure(HEALTHY_1M, 30.0, slo, scaled)
    levels = judge(st, slo, scaled)
    assert all(lv.met for lv in levels), [lv.line() for lv in levels if not lv.met]
    near = next(lv for lv in levels if lv.name == "ttft_p99_s" and lv.bucket == "near_limit")
    assert near.measured == 240.0 and near.allowance_s == pytest.approx(540.0) and near.stated == pytest.approx(560.0)
    short = next(lv for lv in levels if lv.name == "ttft_p99_s" and lv.bucket == "short")
    assert short.stated == pytest.approx(20.0, abs=0.01)  # a one-page prompt keeps the level as stated
    assert st.goodput == 1.0 and {b.bucket for b in st.buckets} == {"short", "long", "near_limit"}


def test_a_slowdown_still_misses_the_per_bucket_levels() -> None:
    """The same deployment slower than its prefill share plus the level: short prompts waiting, or the
    longest prompt slower than its allowance, each fail their own bucket's level and goodput."""
    slo = Slo()
    scaled = Allowance(1_048_576 / 60.0, 9, "stated")
    slow_short = [rec(i, ttft=25.0, e2e=26.0, tokens=32) if i < 10 else r for i, r in enumerate(HEALTHY_1M)]
    levels = judge(measure(slow_short, 30.0, slo, scaled), slo, scaled)
    missed = {(lv.name, lv.bucket) for lv in levels if lv.met is False}
    assert ("ttft_p99_s", "short") in missed and ("goodput", None) in missed
    slow_long = [
        replace(r, ttft_s=r.ttft_s * 3, e2e_s=r.e2e_s * 3) if r.bucket == "near_limit" else r for r in HEALTHY_1M
    ]
    levels = judge(measure(slow_long, 30.0, slo, scaled), slo, scaled)
    missed = {(lv.name, lv.bucket) for lv in levels if lv.met is False}
    assert ("ttft_p99_s", "near_limit") in missed and ("e2e_p99_s", "near_limit") in missed
    assert ("ttft_p99_s", "short") not in missed


def test_no_prefill_rate_leaves_the_per_bucket_levels_and_goodput_unmeasured_never_met() -> None:
    unknown = Allowance(None, 9, "the rate request was not answered (HTTP 503): state soak.prefill_tokens_per_s")
    levels = judge(measure(HEALTHY_1M, 30.0, Slo(), unknown), Slo(), unknown)
    by = {lv.name: lv for lv in levels}
    for name in ("ttft_p50_s", "ttft_p99_s", "e2e_p50_s", "e2e_p99_s", "goodput"):
        assert by[name].met is None and "soak.prefill_tokens_per_s" in (by[name].why or ""), by[name]
    assert by["itl_p99_s"].met and by["error_rate"].met


def test_prefill_rate_setting() -> None:
    assert SoakSettings.from_mapping(None, "p.yaml").prefill_tokens_per_s is None
    assert SoakSettings.from_mapping({"prefill_tokens_per_s": 20000}, "p.yaml").prefill_tokens_per_s == 20000
    with pytest.raises(ProfileError, match="soak.prefill_tokens_per_s"):
        SoakSettings.from_mapping({"prefill_tokens_per_s": 0}, "p.yaml")


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
