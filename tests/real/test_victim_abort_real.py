"""Issue 32 on the REAL server: the abort probe finds a request in flight where its answer takes far
longer end to end than the calibrated prefill window.

A held-out real pair's victims answered after 0.77-0.84 s while the calibration's one-token requests put
the window at 39-70 ms, and the probe, searching only there, cancelled nothing in 8 tries. Here the
victims ask for many new tokens (the real decode of the tiny model on this CPU then takes most of their
time), the calibration sees none of it, and the probe must still cancel one in flight: an answer SGLang
gives only from its transfer queue ("Decode transfer failed ... Aborted by AbortReq."), acknowledged by
the decode's /abort_request. The probe runs as `kvgate check` runs it (calibration, plan, tries), through
the real router, on the healthy pairs.

The file's name sorts it after test_verdicts.py: a pair's tests run in file order, and the late-write
race (test_backport_real.py) must be a healthy pair's first test, on fresh pools.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvgate.gates.probes.abort import CANCELLED, AbortPlan, plan_abort, run_abort
from kvgate.gates.probes.calibrate import calibrate, calibration_budget
from kvgate.gates.probes.canary import Sender
from kvgate.gates.probes.client import GenerateClient, ProbeResult
from kvgate.gates.probes.cost import CostMeter
from kvgate.gates.probes.plan import ACCEPT, LengthProbe, ProbeLimits, limits_from_readings, max_new_tokens_for
from kvgate.gates.probes.sentinels import ByteCodec
from kvgate.gates.probes.settings import ProbeSettings
from kvgate.output.progress import NullObserver
from kvgate.reading.node import DECODE, PREFILL, NodeSpec
from kvgate.reading.target import TargetClient
from kvgate.results.findings import Outcome
from tests.real.conftest import NO_WORKERS, RealPair

pytestmark = [pytest.mark.slow, pytest.mark.real]

#: Asked of every victim: the decode of this many tokens is most of its time end to end.
LONG_ANSWER = 512
#: Calibrations and whole victims tried before the shape counts as not staged (no verdict).
STAGINGS = 3


def _stage(
    real_pair: RealPair, sender: Sender, limits: ProbeLimits, settings: ProbeSettings
) -> tuple[ProbeSettings, AbortPlan, ProbeResult]:
    """Calibrate through the router, plan the abort, and send one victim to completion: the staging."""
    cal = calibrate(sender, limits, calibration_budget(limits.context))
    assert cal.ok, cal.failures
    plan = plan_abort(cal, limits, settings)
    if plan.victim_tokens > limits.longest_accepted - LONG_ANSWER:
        # A loaded machine's calibration (much noise) sizes the victim at the whole context, leaving
        # no room for the long answer this test is about (CI once got 6 new tokens: end to end 0.98x
        # the calibrated time, nothing staged). Sized as an operator's profile would (abort_tokens).
        settings = replace(settings, abort_tokens=limits.longest_accepted - LONG_ANSWER)
        plan = plan_abort(cal, limits, settings)
    # The shape of the held-out pair: one victim sent to completion takes far longer than the
    # calibrated prefill window the cancel used to be kept in (what one run measured is in the message).
    victim = LengthProbe(
        "abort_victim",
        plan.victim_tokens,
        ACCEPT,
        "none",
        "victim sent to completion",
        max_new_tokens_for(limits, plan.victim_tokens, settings.max_new_tokens),
    )
    whole = sender.one(victim, "whole").result
    if whole.status == 503 and NO_WORKERS in whole.raw:
        # smg excluded the decode for a while (RealPair.wait_routable: a CI run's 0.5.20 pair, its
        # decode starved by the previous test's hang); the router's answer, not SGLang's. Once more.
        real_pair.wait_routable()
        whole = sender.one(victim, "whole-again").result
    assert whole.served, (whole.status, whole.raw[:300])
    return settings, plan, whole


def test_abort_probe_cancels_in_flight_when_the_answer_takes_far_longer_than_the_prefill(
    real_pair: RealPair,
) -> None:
    if real_pair.spec.kind != "healthy":
        pytest.skip("a short pool starves the real decode (README, 'Order matters'); the healthy pairs cover it")
    real_pair.wait_routable()
    client = TargetClient(timeout=30.0)
    try:
        readings = [
            client.read_node(NodeSpec(PREFILL, real_pair.prefill)),
            client.read_node(NodeSpec(DECODE, real_pair.decode)),
        ]
        limits, problems = limits_from_readings(readings)
        assert limits is not None, problems
        settings = ProbeSettings(max_new_tokens=LONG_ANSWER, deadline_s=120)
        sender = Sender(
            GenerateClient(client.http, real_pair.router, settings.deadline_s),
            ByteCodec(settings.byte_offset),
            CostMeter(context=limits.context),
            NullObserver(),
        )
        unstaged: list[str] = []
        for _ in range(STAGINGS):
            settings, plan, whole = _stage(real_pair, sender, limits, settings)
            ratio = whole.elapsed_s / plan.expected_s
            took = f"{whole.elapsed_s:.3f} s end to end, the calibration expected {plan.expected_s:.3f} s"
            if ratio >= 3:
                break
            # Not staged (issue 33: then no verdict): the answer ended early against a calibration a loaded
            # machine inflated (a CI run's 0.5.21 text pair once answered in 1.3x the calibrated time; a
            # clean clone beside a busy core: 2.76x, 5.378 s against 1.945 s). Calibrated and sent again.
            unstaged.append(f"{took}, {whole.meta.get('completion_tokens')} tokens of answer")
        else:
            pytest.skip(f"{real_pair.spec.id}: not staged in {STAGINGS} stagings: " + "; ".join(unstaged))
        f = run_abort(sender, [real_pair.decode], limits, settings, plan, f"router {real_pair.router}")
    finally:
        client.close()
    ev = {e.field: e.value for e in f.evidence}
    seen = (
        f"{f.summary}; victim end to end {whole.elapsed_s:.3f} s = {ratio:.1f} x the calibrated "
        f"{plan.expected_s * 1000:.1f} ms; points {ev['abort.cancel_points_s']}; outcomes {ev['abort.try_outcomes']}"
    )
    assert f.outcome == Outcome.PASSED, seen
    assert ev["abort.try_outcomes"][-1] == CANCELLED and ev["abort.acknowledged"] == 1, seen
    print(seen)
