"""kvgate watch's golden set (kvgate/watch/isolation.py): what a burst judges (synthetic answers), then a
real watch process against a simulated deployment whose injected fault is switched on after promotion
(POST /sim/fault): /verdict stays 200 over healthy bursts and flips to 503 within two bursts of the fault."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from kvgate.gates.probes.load_plan import Prompt
from kvgate.gates.probes.margin import score
from kvgate.gates.probes.plan import ProbeLimits
from kvgate.gates.probes.sentinels import ByteCodec
from kvgate.gates.probes.settings import ProbeSettings
from kvgate.sim import faults
from kvgate.sim.deploy import SimDeployment
from kvgate.watch.budget import TrafficBudget
from kvgate.watch.isolation import (
    CHANGED_TOKEN,
    CORRUPTION_ABORT,
    EXTRA_CANDIDATES,
    GOLDEN,
    Golden,
    IsolationWatch,
    burst_every,
    finding,
    judge,
)
from kvgate.watch.route import ProbeRoute
from tests.gates.probes.test_under_load import answer
from tests.watch.helpers import WatchProcess

MARGIN = 2.0


def golden(label: str, ids: list[int], margins: list[float]) -> Golden:
    ref = score(answer(ids, margins), MARGIN)
    assert ref is not None
    return Golden(Prompt(label, [1, 2, 3], 4), ref)


def test_a_kept_answer_and_noise_below_the_margin_are_no_violation() -> None:
    a = golden("g0", [10, 11, 12, 13], [5.0, 5.0, 0.1, 5.0])
    b = golden("g1", [20, 21, 22, 23], [5.0] * 4)
    # g0's third token was near-tied alone (0.1 nats): a flip there is batch noise, never judged.
    out = judge([(a, answer([10, 11, 99, 13], [5.0] * 4)), (b, answer([20, 21, 22, 23], [5.0] * 4))], MARGIN)
    assert out.sent and not out.violations and out.judged == 7


def test_a_changed_confident_token_and_a_corruption_abort_are_violations() -> None:
    a = golden("g0", [10, 11, 12, 13], [5.0] * 4)
    b = golden("g1", [20, 21, 22, 23], [5.0] * 4)
    c = golden("g2", [30, 31, 32, 33], [5.0] * 4)
    out = judge(
        [
            (a, answer([20, 11, 12, 13], [5.0] * 4)),  # g1's first token: #17259's silent form
            (b, answer([], status=500, raw=faults.ABORT_MESSAGE)),
            (c, answer([], status=503, raw="overloaded")),  # shed: not judged, not a violation
        ],
        MARGIN,
    )
    kinds = [k for k, _ in out.violations]
    assert kinds == [CHANGED_TOKEN, CORRUPTION_ABORT] and out.unanswered == 1
    assert "g0: confident positions [0] changed (the tokens of g1 alone: g1 is the donor)" in out.violations[0][1]
    f = finding(out, 3)
    assert f.test_id == "probes.isolation.load" and f.outcome.value == "failed"
    assert "2 of 3 golden prompts" in f.summary and "metadata/context corruption" in f.summary


def _recorder(margins: list[list[float]], budget: TrafficBudget | None = None) -> tuple[IsolationWatch, list[str]]:
    """An IsolationWatch whose answers alone come, in turn, with these per-token margins (no server)."""
    limits = ProbeLimits(context=4096, max_req_input_len=4090, page_size=16, pool=8192)
    b = budget or TrafficBudget(requests_per_min=10_000, prefill_tokens_per_min=10**9, clock=lambda: 0.0)
    iso = IsolationWatch(ProbeRoute(httpx.Client(), "http://127.0.0.1:9", limits, ByteCodec(), ProbeSettings()), b)
    sent: list[str] = []

    def send(p: Prompt, phase: str) -> object:
        sent.append(p.label)
        m = margins[len(sent) - 1]
        return answer([len(sent) * 10 + j for j in range(len(m))], m)

    iso._send = send  # type: ignore[method-assign]
    return iso, sent


def test_a_golden_set_keeps_drawing_prompts_until_enough_answers_hold_a_confident_token() -> None:
    unsure, sure = [0.5] * 4, [0.5, 5.0, 0.5, 0.5]
    # the first six answers hold no confident token (a small model, a short answer): more are drawn
    iso, sent = _recorder([unsure] * GOLDEN + [sure] * GOLDEN)
    assert iso.record() is None
    assert len(sent) == 2 * GOLDEN and len(iso.golden) == GOLDEN and iso.confident == GOLDEN
    # never one with none: at most EXTRA_CANDIDATES more, then it says why, naming what resolves it
    iso, sent = _recorder([unsure] * (GOLDEN + EXTRA_CANDIDATES + 1))
    why = iso.record()
    assert len(sent) == GOLDEN + EXTRA_CANDIDATES and not iso.golden
    assert why is not None and "leading its runner-up" in why and "probes.load_new_tokens" in why
    # a few confident answers are enough when the draws run out: the most confident are kept
    iso, sent = _recorder([unsure] * (GOLDEN + EXTRA_CANDIDATES - 1) + [sure])
    assert iso.record() is None and iso.confident == 1 and len(iso.golden) == GOLDEN
    # each extra draw is charged to the budget first: none is sent past it
    tight = TrafficBudget(requests_per_min=GOLDEN + 2, prefill_tokens_per_min=10**9, clock=lambda: 0.0)
    iso, sent = _recorder([unsure] * (GOLDEN + EXTRA_CANDIDATES), tight)
    assert iso.record() is not None and len(sent) == GOLDEN + 2


def test_a_burst_is_charged_whole_or_not_at_all() -> None:
    b = TrafficBudget(requests_per_min=10, prefill_tokens_per_min=1000, clock=lambda: 0.0)
    assert b.try_spend_all([32] * GOLDEN)
    assert not b.try_spend_all([32] * GOLDEN)  # 12 > 10: nothing of it is charged
    assert b.requests_total == GOLDEN and b.prefill_tokens_total == 32 * GOLDEN


def test_bursts_take_at_most_half_the_request_budget() -> None:
    assert burst_every(6, 30) == 4  # the defaults: 6 requests a minute, a burst of 6 every 2 minutes
    assert burst_every(300, 3) == 1
    assert burst_every(GOLDEN - 1, 30) == 0  # a burst never fits: none is sent (the watch logs why)
    for rpm, interval in ((6, 30), (60, 30), (300, 3), (12, 5)):
        every = burst_every(rpm, interval)
        assert GOLDEN * 60 / (interval * every) <= rpm / 2


def test_a_violation_stands_until_a_gate_after_a_fleet_change_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scheduled re-gate that passes does not clear it (the race may just not have struck during the
    gate); a gate that a fleet change (a rollout, a restart) triggered and that passed does."""
    from kvgate.gates.base import CheckOptions
    from kvgate.results.findings import Report, passed
    from kvgate.watch import loop
    from kvgate.watch.loop import Watcher
    from kvgate.watch.settings import WatchSettings

    ok = Report(command="check", findings=(passed("fleet", "router-list", "router", "ok"),))
    monkeypatch.setattr(loop, "run_check", lambda *_a, **_k: ok)
    w = Watcher(
        CheckOptions(router_url="http://127.0.0.1:9", probes_enabled=False),
        WatchSettings(interval_s=1),
        listen=("127.0.0.1", 0),
    )
    try:
        w.full_gate("start")
        assert w.verdict_answer().status == 200
        a = golden("g0", [10, 11, 12, 13], [5.0] * 4)
        out = judge([(a, answer([], status=500, raw=faults.ABORT_MESSAGE))], MARGIN)
        w.isolation_finding = finding(out, 1)
        w.report = w.report and replace(w.report, findings=(*w.report.findings, w.isolation_finding))
        assert w.verdict_answer().status == 503
        w.full_gate("schedule")
        answer_ = w.verdict_answer()
        assert answer_.status == 503 and b"isolation under load failed after the gate passed" in answer_.body
        assert w.report is not None and w.report.exit_status == 1
        w.full_gate("change")
        assert w.verdict_answer().status == 200 and w.isolation_finding is None
    finally:
        w.http.close()


# -- a real watch against the simulator ------------------------------------------------------------

INTERVAL = 3
GATE_S = 300.0  # a bound on one full gate with probes on a busy machine (a wait, not an assertion)
HEALTHY_BURSTS = 3
PROFILE = f"""
name: watch-isolation
probes:
  latency_long_tokens: 2000
watch:
  interval_s: {INTERVAL}
  requests_per_min: 300
  prefill_tokens_per_min: 40000
"""


def _bursts(w: WatchProcess) -> float:
    return w.metric("kvgate_isolation_bursts_total") or 0.0


@pytest.mark.slow
@pytest.mark.parametrize("fault", faults.LOAD_FAULTS)
def test_a_fault_after_promotion_flips_the_verdict_within_two_bursts(tmp_path: Path, fault: str) -> None:
    profile = tmp_path / "watch.yaml"
    profile.write_text(PROFILE)
    args = ["--profile", str(profile), "--trust-version", "--deferred-release-env", "--tenants", "4"]
    with SimDeployment(
        emulate="0.5.22", context_length=4096, prefill_pool=8192, decode_pool=16384, prefill_tokens_per_s=100_000
    ) as dep:
        assert dep.router_url
        w = WatchProcess(["--router-url", dep.router_url, *args], tmp_path / "watch.log")
        try:
            w.wait(w.verdict_settled, GATE_S, "a first full gate")
            res = w.get("/verdict")
            assert res is not None and res.status_code == 200, res.json()["reason"]
            w.wait(lambda: "isolation golden set recorded" in w.log(), 60, "the golden set")
            confident = w.metric("kvgate_isolation_confident_positions")
            assert confident is not None
            # Healthy: the same deployment over HEALTHY_BURSTS bursts of the golden set stays 200.
            start, seen = _bursts(w), []

            def healthy_bursts() -> bool:
                v = w.get("/verdict")
                if v is not None:  # an unanswered read (a loaded machine) says nothing either way
                    seen.append(v.status_code)
                return _bursts(w) >= start + HEALTHY_BURSTS

            w.wait(healthy_bursts, INTERVAL * HEALTHY_BURSTS + 120, "healthy bursts of the golden set")
            assert seen and set(seen) == {200}, seen
            assert w.metric("kvgate_isolation_ok") == 1
            before = (w.get("/metrics") or httpx.Response(500)).text
            # Both kinds' series exist from the start at 0 (an alert on their increase sees the first).
            assert 'kvgate_isolation_violations_total{kind="corruption_abort"} 0.0' in before, before
            assert 'kvgate_isolation_violations_total{kind="changed_token"} 0.0' in before, before

            r = httpx.post(dep.decode_urls[0] + "/sim/fault", json={"fault": fault}, timeout=10)
            assert r.status_code == 200 and r.json() == {"fault": fault}
            on = _bursts(w)  # a burst in flight now may have started before the switch: at most 2 more
            flipped = w.wait(
                lambda: (v := w.get("/verdict")) is not None and v.status_code == 503 and v.json(),
                INTERVAL * 3 + 120,
                "the verdict to flip after the fault",
            )
            assert _bursts(w) <= on + 2, (on, _bursts(w))
            assert flipped["passed"] is False and flipped["exit_status"] == 1
            assert flipped["reason"].startswith("isolation under load failed after the gate passed")
            ids = [f["id"] for f in flipped["report"]["findings"] if f["outcome"] == "failed"]
            assert "probes.isolation.load" in " ".join(ids), ids
            assert w.metric("kvgate_isolation_ok") == 0 and w.metric("kvgate_verdict") == 1
            text = (w.get("/metrics") or httpx.Response(500)).text
            if fault == faults.META_SLOT_SHARED:
                assert "Metadata corruption detected" in flipped["reason"]
                assert re.search(r'kvgate_isolation_violations_total\{kind="corruption_abort"\} [1-9]', text)
            else:
                # No room check: only changed confident tokens can show it: the first token under a shared
                # slot; under early page reuse the later ones (the first is prefill's, computed on its own
                # KV and sent with the transfer), the donor's.
                assert confident > 0
                if fault == faults.META_SLOT_SHARED_UNCHECKED:
                    assert "confident positions [0" in flipped["reason"], flipped["reason"]
                else:
                    assert "is the donor" in flipped["reason"], flipped["reason"]
                assert re.search(r'kvgate_isolation_violations_total\{kind="changed_token"\} [1-9]', text)
            assert "ISOLATION:" in w.log()
        finally:
            assert w.terminate() == 0
