"""Unit tests of the abort probe's bookkeeping: what counts as a request cancelled in flight."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from kvgate.findings import Outcome
from kvgate.gates.probes.abort import CancelPoints, plan_abort, run_abort
from kvgate.gates.probes.calibrate import Calibration
from kvgate.gates.probes.canary import Sender
from kvgate.gates.probes.client import ProbeResult
from kvgate.gates.probes.cost import CostMeter
from kvgate.gates.probes.plan import ProbeLimits
from kvgate.gates.probes.sentinels import ByteCodec
from kvgate.gates.probes.settings import ProbeSettings
from kvgate.progress import NullObserver

LIMITS = ProbeLimits(context=8192, max_req_input_len=8000, page_size=1, pool=None)
# A deployment measured at 1 ms per one-page request (0.5 ms noise) and 10 ms at 4,096 tokens.
CAL = Calibration(
    one_page_tokens=16,
    base_s=0.001,
    jitter_s=0.0005,
    lengths=((4096, 0.011),),
    s_per_token=0.01 / 4080,
    observable=True,
    requests=0,
    failures=(),
)


class _Client:
    """Answers canaries with a clean 200; the victim with whatever `victim` returns."""

    deadline_s = 5.0

    def __init__(self, victim: Any) -> None:
        self.victim = victim
        self.http = httpx.Client()

    def generate(
        self,
        name: str,
        ids: list[int],
        max_new_tokens: int,
        *,
        rid: str | None = None,
        cancel_after_s: float | None = None,
        stream: bool = False,
    ) -> ProbeResult:
        if name == "abort_victim":
            return self.victim(name, len(ids), max_new_tokens)
        body = {"text": "ok", "meta_info": {"prompt_tokens": len(ids), "finish_reason": {"type": "stop"}}}
        return ProbeResult(name, len(ids), max_new_tokens, 200, 0.001, body, '{"text": "ok"}')


def _run(victim: Any, decode_urls: tuple[str, ...] = (), attempts: int = 2) -> Any:
    client: Any = _Client(victim)
    codec: Any = ByteCodec()
    sender = Sender(client, codec, CostMeter(context=LIMITS.context), NullObserver())
    settings = ProbeSettings(
        abort_tokens=256, abort_attempts=attempts, abort_canaries=2, abort_budget=4, deadline_s=5.0
    )
    try:
        return run_abort(sender, list(decode_urls), LIMITS, settings, plan_abort(CAL, LIMITS, settings), "test")
    finally:
        client.http.close()


class _AbortEndpoint:
    """A real loopback decode worker's /abort_request: answers `status` (SGLang: an empty 200) and records rids."""

    def __init__(self, status: int) -> None:
        owner = self
        self.rids: list[bytes] = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                owner.rids.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                self.send_response(status if self.path == "/abort_request" else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def abort_endpoint() -> Iterator[Any]:
    made: list[_AbortEndpoint] = []

    def make(status: int) -> _AbortEndpoint:
        made.append(_AbortEndpoint(status))
        return made[-1]

    yield make
    for e in made:
        e.close()


def _aborted(n: str, k: int, m: int) -> ProbeResult:
    """What a decode-initiated abort mid-transfer answers through the router (SGLang's 500 message)."""
    raw = (
        '{"object":"error","message":"Decode transfer failed for request rank=0 ... with exception '
        'KVTransferError(bootstrap_room=1): Aborted by AbortReq.","type":"500","param":null,"code":500}'
    )
    return ProbeResult(n, k, m, 500, 0.5, None, raw)


@pytest.mark.parametrize(
    "victim",
    [
        # transport failure: nothing was sent, nothing was aborted
        lambda n, k, m: ProbeResult(n, k, m, None, 0.0, transport_error="ConnectError: refused"),
        # an error answer that came before the cancel point
        lambda n, k, m: ProbeResult(n, k, m, 503, 0.0, None, "busy"),
    ],
)
def test_failures_that_are_no_abort_do_not_count_as_cancelled(victim: Any) -> None:
    f = _run(victim)
    assert f.outcome == Outcome.INCONCLUSIVE, f.summary
    ev = {e.field: e.value for e in f.evidence}
    assert ev["abort.cancelled"] == []


def test_client_disconnect_alone_is_unacknowledged_and_inconclusive() -> None:
    f = _run(lambda n, k, m: ProbeResult(n, k, m, None, 0.01, cancelled=True))
    assert f.outcome == Outcome.INCONCLUSIVE, f.summary
    assert "disconnect only" in f.summary
    ev = {e.field: e.value for e in f.evidence}
    assert len(ev["abort.cancelled"]) == 2 and ev["abort.acknowledged"] == 0


def test_acknowledged_and_observed_abort_with_clean_canaries_passes(abort_endpoint: Any) -> None:
    decode = abort_endpoint(200)
    f = _run(_aborted, (decode.url,))
    assert f.outcome == Outcome.PASSED, f.summary
    ev = {e.field: e.value for e in f.evidence}
    assert ev["abort.acknowledged"] == 2 and decode.rids and b'"rid"' in decode.rids[0]


@pytest.mark.parametrize("status", [404, 401, 500])
def test_issue_route_3_unacknowledged_abort_request_is_not_a_pass(abort_endpoint: Any, status: int) -> None:
    decode = abort_endpoint(status)
    f = _run(_aborted, (decode.url,))
    assert f.outcome == Outcome.INCONCLUSIVE, f.summary
    notes = next(e.value for e in f.evidence if e.field == "abort.notes")
    assert any(f"HTTP {status}" in n for n in notes)


@pytest.mark.parametrize(
    "victim",
    [
        # a timeout after the cancel point: nobody saw an abort
        lambda n, k, m: ProbeResult(n, k, m, None, 5.0, timed_out=True),
        # an unrelated 5xx after the cancel point
        lambda n, k, m: ProbeResult(n, k, m, 503, 0.5, None, '{"message":"busy"}'),
    ],
)
def test_issue_route_3_a_timeout_or_unrelated_5xx_is_not_an_abort(abort_endpoint: Any, victim: Any) -> None:
    decode = abort_endpoint(200)
    f = _run(victim, (decode.url,))
    assert f.outcome == Outcome.INCONCLUSIVE, f.summary
    assert next(e.value for e in f.evidence if e.field == "abort.cancelled") == []


def test_retries_at_learned_points_until_an_acknowledged_cancel_and_says_after_how_many(abort_endpoint: Any) -> None:
    """The first three victims answer before their cancel takes (200 in 2 ms); the fourth is aborted."""
    decode = abort_endpoint(200)
    calls: list[int] = []

    def victim(n: str, k: int, m: int) -> ProbeResult:
        calls.append(k)
        if len(calls) <= 3:
            body = {"text": "x", "meta_info": {"prompt_tokens": k, "finish_reason": {"type": "length"}}}
            return ProbeResult(n, k, m, 200, 0.002, body, '{"text": "x"}')
        return _aborted(n, k, m)

    f = _run(victim, (decode.url,), attempts=1)
    assert f.outcome == Outcome.PASSED, f.summary
    ev = {e.field: e.value for e in f.evidence}
    assert ev["abort.tries"] == 4 and ev["abort.first_cancel_at_try"] == 4
    assert "first at try 4 of 4" in f.summary
    # after victims served in 2 ms, the later cancels aim before that answer
    assert all(p < 0.002 for p in ev["abort.cancel_points_s"][1:]), ev["abort.cancel_points_s"]


def test_without_a_cancel_in_flight_the_remedy_is_a_computed_profile_key(abort_endpoint: Any) -> None:
    decode = abort_endpoint(200)

    def late(n: str, k: int, m: int) -> ProbeResult:
        body = {"text": "x", "meta_info": {"prompt_tokens": k, "finish_reason": {"type": "length"}}}
        return ProbeResult(n, k, m, 200, 0.002, body, '{"text": "x"}')

    f = _run(late, (decode.url,), attempts=1)
    assert f.outcome == Outcome.INCONCLUSIVE, f.summary
    ev = {e.field: e.value for e in f.evidence}
    assert ev["abort.tries"] == ev["abort.plan"]["max_tries"] > 1
    # every victim answered first: a longer victim (4 x 256, within the longest accepted prompt)
    assert f.remedy == "set the profile key probes.abort_tokens: 1024 (a longer prefill window to cancel in)"


def test_cancel_points_narrow_to_before_an_observed_answer() -> None:
    plan = plan_abort(CAL, LIMITS, ProbeSettings())
    points = CancelPoints.from_plan(plan)
    first = points.next()
    assert plan.lead_s <= first <= plan.expected_s
    served = ProbeResult("abort_victim", 1, 1, 200, first / 2, {"text": "x", "meta_info": {}}, "")
    points.learn(first, served)  # answered before the cancel: late, so every next point is earlier
    assert all(points.next() < first for _ in range(5))
