"""How a contract failure is named: which sample leads it, and a hang when the prefill rejects a length
that the decode admits.

What the real 0.5.20-0.5.23 servers did behind smg 1.13.0: the prefill retires such a request (after
its forward, or at the 0.5.21+ admission door) and never tells the decode, which waits for the KV
until its waiting timeout. The non-streaming client gets the prefill's 400, the streaming one hangs,
and on a small decode pool the requests after it queue behind the held reservation.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kvgate.gates.probes.canary import Sent
from kvgate.gates.probes.client import ProbeResult
from kvgate.gates.probes.contract import Classified, Verdict
from kvgate.gates.probes.gate import _Run
from kvgate.gates.probes.judging import REMEDY_REJECT, REMEDY_UNTOLD_DECODE
from kvgate.gates.probes.plan import ACCEPT, REJECT, LengthProbe
from kvgate.gates.probes.sentinels import Sentinel
from kvgate.reading.node import DECODE, PREFILL
from kvgate.results.findings import Outcome

POOL_LIMIT = LengthProbe("pool_limit", 4090, REJECT, "pool", "first rejected length of the pool bound", 8)
LONGEST = LengthProbe("longest_accepted", 4089, ACCEPT, "none", "largest accepted prompt", 8)
BAND = LengthProbe("pool_limit", 8186, REJECT, "pool", "first rejected length of the pool bound", 6)


def _run(prefill_mril: int, decode_mril: int) -> Any:
    run = object.__new__(_Run)
    nodes = {
        PREFILL: [SimpleNamespace(max_req_input_len=prefill_mril)],
        DECODE: [SimpleNamespace(max_req_input_len=decode_mril)],
    }
    run.ctx = SimpleNamespace(nodes=lambda role: nodes[role])
    run.node = "router"
    run.findings = []
    run.observations = {}
    run.answered = []
    return run


def _observe(run: Any, probe: LengthProbe, phase: str, verdict: Verdict, *, stream: bool, status: int | None) -> None:
    res = ProbeResult(
        probe.name,
        probe.length,
        probe.max_new_tokens,
        status,
        0.3 if status else 20.0,
        timed_out=status is None,
        stream=stream,
        deadline_s=20.0,
    )
    rec = Sent(probe, phase, Sentinel(f"{probe.name}-{phase}", "KVG0000000000"), res)
    run.observations.setdefault(probe.name, []).append((rec, Classified(verdict, "detail")))
    run.answered.append(rec)


def test_a_stream_hang_on_a_length_only_the_prefill_rejects_says_the_decode_was_not_told() -> None:
    run = _run(prefill_mril=4090, decode_mril=8186)
    _observe(run, POOL_LIMIT, "A", Verdict.OK_REJECTED, stream=False, status=400)
    _observe(run, POOL_LIMIT, "A-stream", Verdict.HANG, stream=True, status=None)
    run._contract_findings([POOL_LIMIT])
    (f,) = run.findings
    assert f.outcome == Outcome.FAILED and f.summary.startswith("hang: pool_limit (4,090 tokens) [A-stream]")
    assert "its max_req_input_len is 4,090, the decode's 8,186" in f.summary
    assert "gave the non-streaming request its 400 in 0.3 s" in f.summary
    assert "the decode, which admitted it, is not told" in f.summary
    assert f.remedy == REMEDY_UNTOLD_DECODE  # not "upgrade": no release tells the decode


def test_an_accepted_request_hanging_behind_such_streams_is_explained() -> None:
    run = _run(prefill_mril=4090, decode_mril=8186)
    _observe(run, POOL_LIMIT, "A-stream", Verdict.HANG, stream=True, status=None)
    _observe(run, LONGEST, "B-plant", Verdict.HANG, stream=False, status=None)
    run._contract_findings([LONGEST])
    (f,) = run.findings
    assert (
        "1 rejected request(s) sent before or with it hung the same way (pool_limit (4,090 tokens) [A-stream])"
        in f.summary
    )
    assert "can queue behind them" in f.summary and f.remedy == REMEDY_UNTOLD_DECODE


def test_rejected_streams_that_hung_only_after_the_accepted_one_are_not_blamed() -> None:
    run = _run(prefill_mril=4090, decode_mril=8186)
    _observe(run, LONGEST, "B-plant", Verdict.HANG, stream=False, status=None)
    _observe(run, POOL_LIMIT, "B-stream", Verdict.HANG, stream=True, status=None)  # round B, after the plant
    run._contract_findings([LONGEST])
    (f,) = run.findings
    assert f.summary == "hang: longest_accepted (4,089 tokens) [B-plant]: detail" and f.remedy == REMEDY_REJECT


def test_a_hang_where_both_workers_reject_keeps_the_upgrade_remedy() -> None:
    # Real 0.5.20 with healthy pools: both reject the 6 tokens below the context; only 0.5.21+'s decode
    # door retires the request there, so upgrading is the fix.
    run = _run(prefill_mril=8186, decode_mril=8186)
    _observe(run, BAND, "A-stream", Verdict.HANG, stream=True, status=None)
    run._contract_findings([BAND])
    (f,) = run.findings
    assert f.summary == "hang: pool_limit (8,186 tokens) [A-stream]: detail"
    assert f.remedy == REMEDY_REJECT


def test_an_accepted_request_hanging_behind_a_band_hang_where_both_reject_keeps_the_upgrade_remedy() -> None:
    # Real 0.5.20 with a healthy 5,120-token pool (clean-clone CI, 2026-12-02): the A-stream hang at
    # 4,090 held the decode's reservation, and the 4,089-token plant of round B hung behind it.
    run = _run(prefill_mril=4090, decode_mril=4090)
    _observe(run, POOL_LIMIT, "A-stream", Verdict.HANG, stream=True, status=None)
    _observe(run, LONGEST, "B-plant", Verdict.HANG, stream=False, status=None)
    run._contract_findings([LONGEST])
    (f,) = run.findings
    assert "1 rejected request(s) sent before or with it hung the same way (pool_limit (4,090 tokens) [A-stream])" in (
        f.summary
    )
    assert "retired them without sending their KV" in f.summary and f.remedy == REMEDY_REJECT


def test_an_accepted_hang_without_hung_rejections_is_not_blamed_on_them() -> None:
    run = _run(prefill_mril=4090, decode_mril=8186)
    _observe(run, POOL_LIMIT, "A-stream", Verdict.OK_REJECTED, stream=True, status=200)
    _observe(run, LONGEST, "B-plant", Verdict.HANG, stream=False, status=None)
    run._contract_findings([LONGEST])
    (f,) = run.findings
    assert f.summary == "hang: longest_accepted (4,089 tokens) [B-plant]: detail" and f.remedy == REMEDY_REJECT


def test_a_served_sample_leads_the_finding_whichever_sample_ran_first() -> None:
    """The simulated 0.5.19 incident once answered its first over-limit sample empty (its pages never
    written yet) and the later ones with stale text: the headline named the empty one. The served
    answer is the incident itself: it leads, and every class seen is still listed."""
    for order in (
        (Verdict.EMPTY_200_OVER_LIMIT, Verdict.SERVED_OVER_LIMIT),
        (Verdict.SERVED_OVER_LIMIT, Verdict.EMPTY_200_OVER_LIMIT),
    ):
        run = _run(prefill_mril=4090, decode_mril=4090)
        for phase, verdict in zip(("A", "B"), order, strict=True):
            _observe(run, POOL_LIMIT, phase, verdict, stream=False, status=200)
        run._contract_findings([POOL_LIMIT])
        (f,) = run.findings
        assert f.outcome == Outcome.FAILED
        assert f.summary.startswith("served_over_limit: pool_limit (4,090 tokens) ["), f.summary
        assert "(classes seen: empty_200_over_limit, served_over_limit)" in f.summary
        assert f.remedy == REMEDY_REJECT
