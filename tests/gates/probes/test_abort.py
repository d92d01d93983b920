"""Unit tests of the abort probe's bookkeeping: what counts as a request cancelled in flight."""

from __future__ import annotations

from typing import Any

import pytest

from kvgate.findings import Outcome
from kvgate.gates.probes.abort import run_abort
from kvgate.gates.probes.canary import Sender
from kvgate.gates.probes.client import ProbeResult
from kvgate.gates.probes.cost import CostMeter
from kvgate.gates.probes.latency import LatencyModel
from kvgate.gates.probes.plan import ProbeLimits
from kvgate.gates.probes.sentinels import ByteCodec
from kvgate.gates.probes.settings import ProbeSettings
from kvgate.progress import NullObserver

LIMITS = ProbeLimits(context=8192, max_req_input_len=8000, page_size=1, pool=None)
MODEL = LatencyModel(short_tokens=16, long_tokens=4096, short_s=0.001, long_s=0.01)


class _Client:
    """Answers canaries with a clean 200; the victim with whatever `victim` returns."""

    http: Any = None
    deadline_s = 5.0

    def __init__(self, victim: Any) -> None:
        self.victim = victim

    def generate(self, name: str, ids: list[int], max_new_tokens: int, *, rid: str | None = None,
                 cancel_after_s: float | None = None, stream: bool = False) -> ProbeResult:
        if name == "abort_victim":
            return self.victim(name, len(ids), max_new_tokens)
        body = {"text": "ok", "meta_info": {"prompt_tokens": len(ids), "finish_reason": {"type": "stop"}}}
        return ProbeResult(name, len(ids), max_new_tokens, 200, 0.001, body, '{"text": "ok"}')


def _run(victim: Any) -> Any:
    client: Any = _Client(victim)
    codec: Any = ByteCodec()
    sender = Sender(client, codec, CostMeter(context=LIMITS.context), NullObserver())
    settings = ProbeSettings(abort_tokens=256, abort_attempts=2, abort_canaries=2, abort_budget=4, deadline_s=5.0)
    return run_abort(sender, [], LIMITS, settings, MODEL, "test")


@pytest.mark.parametrize("victim", [
    # transport failure: nothing was sent, nothing was aborted
    lambda n, k, m: ProbeResult(n, k, m, None, 0.0, transport_error="ConnectError: refused"),
    # an error answer that came before the cancel point
    lambda n, k, m: ProbeResult(n, k, m, 503, 0.0, None, "busy"),
])
def test_failures_that_are_no_abort_do_not_count_as_cancelled(victim: Any) -> None:
    f = _run(victim)
    assert f.outcome == Outcome.INCONCLUSIVE, f.summary
    ev = {e.field: e.value for e in f.evidence}
    assert ev["abort.cancelled"] == []


def test_client_cancel_counts_and_clean_canaries_pass() -> None:
    f = _run(lambda n, k, m: ProbeResult(n, k, m, None, 0.01, cancelled=True))
    assert f.outcome == Outcome.PASSED, f.summary
    ev = {e.field: e.value for e in f.evidence}
    assert len(ev["abort.cancelled"]) == 2
