"""Unit tests of the abort probe's bookkeeping: what counts as a request cancelled in flight."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.exitcodes import ExitStatus
from kvgate.gates.probes.abort import (
    CANCELLED,
    EARLY,
    HANDSHAKE,
    LATE,
    UNKNOWN,
    CancelPoints,
    classify,
    plan_abort,
    run_abort,
)
from kvgate.gates.probes.calibrate import Calibration
from kvgate.gates.probes.canary import Sender
from kvgate.gates.probes.client import ProbeResult
from kvgate.gates.probes.cost import CostMeter
from kvgate.gates.probes.plan import ProbeLimits
from kvgate.gates.probes.sentinels import ByteCodec, ServerCodec
from kvgate.gates.probes.settings import ProbeSettings
from kvgate.output.progress import NullObserver
from kvgate.results.findings import Outcome
from tests.assets.loopback import LoopbackServer
from tests.assets.sim_setup import HEALTHY_POOL, SIM_UP, check_args

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


def _run(
    victim: Any,
    decode_urls: tuple[str, ...] = (),
    attempts: int = 2,
    cal: Calibration = CAL,
    codec: Any = None,
    abort_tokens: int | None = 256,
) -> Any:
    client: Any = _Client(victim)
    codec = codec or ByteCodec()
    sender = Sender(client, codec, CostMeter(context=LIMITS.context), NullObserver())
    settings = ProbeSettings(
        abort_tokens=abort_tokens, abort_attempts=attempts, abort_canaries=2, abort_budget=4, deadline_s=5.0
    )
    try:
        return run_abort(sender, list(decode_urls), LIMITS, settings, plan_abort(cal, LIMITS, settings), "test")
    finally:
        client.http.close()


class _AbortEndpoint:
    """A real loopback decode worker's /abort_request: answers `status` (SGLang: an empty 200) and records rids."""

    def __init__(self, status: int) -> None:
        owner = self
        self.rids: list[bytes] = []
        self.times: list[float] = []  # time.monotonic() of each /abort_request

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                owner.times.append(time.monotonic())
                owner.rids.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                self.send_response(status if self.path == "/abort_request" else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = LoopbackServer(("127.0.0.1", 0), Handler)
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
    """The first three victims answer before their cancel takes (200 in 0.1 ms); the fourth is aborted."""
    decode = abort_endpoint(200)
    calls: list[int] = []

    def victim(n: str, k: int, m: int) -> ProbeResult:
        calls.append(k)
        if len(calls) <= 3:
            return _served(n, k, m, 0.0001)
        return _aborted(n, k, m)

    f = _run(victim, (decode.url,), attempts=1)
    assert f.outcome == Outcome.PASSED, f.summary
    ev = {e.field: e.value for e in f.evidence}
    assert ev["abort.tries"] == 4 and ev["abort.first_cancel_at_try"] == 4
    assert "first at try 4 of 4" in f.summary
    # after victims answered within their cancel's tail, the later cancels stay in the first ms or two
    assert all(p < 0.002 for p in ev["abort.cancel_points_s"][1:]), ev["abort.cancel_points_s"]


def _served(n: str, k: int, m: int, elapsed: float, finish: dict[str, Any] | None = None) -> ProbeResult:
    body = {"text": "x", "meta_info": {"prompt_tokens": k, "finish_reason": finish or {"type": "length"}}}
    return ProbeResult(n, k, m, 200, elapsed, body, json.dumps(body))


def test_without_a_cancel_in_flight_the_remedy_is_a_computed_profile_key(abort_endpoint: Any) -> None:
    decode = abort_endpoint(200)
    f = _run(lambda n, k, m: _served(n, k, m, 0.0001), (decode.url,), attempts=1)
    assert f.outcome == Outcome.INCONCLUSIVE, f.summary
    ev = {e.field: e.value for e in f.evidence}
    assert ev["abort.tries"] == ev["abort.plan"]["max_tries"] > 1
    # every victim answered before its cancel could reach it (too late): a longer victim (4 x 256)
    assert set(ev["abort.try_outcomes"]) == {"late"}
    assert f.remedy == "set the profile key probes.abort_tokens: 1024 (a longer prefill window to cancel in)"


def test_when_no_cancel_ever_reaches_the_request_the_remedy_names_the_decode_urls(abort_endpoint: Any) -> None:
    """Every /abort_request is acknowledged, yet every victim answers normally long after its cancel: the
    URLs given are not the decode workers serving the router (a longer victim or more tries would not help)."""
    decode = abort_endpoint(200)
    f = _run(lambda n, k, m: _served(n, k, m, 0.5), (decode.url,), attempts=1)
    assert f.outcome == Outcome.INCONCLUSIVE, f.summary
    ev = {e.field: e.value for e in f.evidence}
    assert set(ev["abort.try_outcomes"]) == {"early"}
    assert f.remedy is not None and f.remedy.startswith("pass with --decode-url every decode worker"), f.remedy
    # the bisection went where the requests were: each next cancel later, up to the end of the answers
    points = ev["abort.cancel_points_s"]
    assert points == sorted(points) and points[-1] > 0.4, points


def test_classify_reads_where_the_victim_was_from_its_own_answer() -> None:
    at, tail = 0.1, 0.01
    handshake = (
        '{"object":"error","message":"Decode handshake failed for request rank=0 ... with exception '
        'KVTransferError(bootstrap_room=1): Aborted by AbortReq.","code":500}'
    )
    assert classify(_aborted("v", 1, 1), at, tail) == CANCELLED
    assert classify(ProbeResult("v", 1, 1, 500, 0.2, None, handshake), at, tail) == HANDSHAKE
    running = {"type": "abort", "message": "Abort in running batch."}
    assert classify(_served("v", 1, 1, 0.3, running), at, tail) == LATE
    assert classify(_served("v", 1, 1, 0.105), at, tail) == LATE  # answering already when cancelled
    assert classify(_served("v", 1, 1, 0.8), at, tail) == EARLY  # the cancel found nothing to abort
    assert classify(ProbeResult("v", 1, 1, None, 5.0, timed_out=True), at, tail) == UNKNOWN
    assert classify(ProbeResult("v", 1, 1, 503, 0.2, None, "busy"), at, tail) == UNKNOWN
    # an abort answer from before the cancel is not this cancel's; a few ms of the victim's clock skew are
    assert classify(replace(_aborted("v", 1, 1), elapsed_s=0.05), at, tail) == UNKNOWN
    assert classify(replace(_aborted("v", 1, 1), elapsed_s=0.095), at, tail) == CANCELLED


class _Timeline:
    """A victim whose decode holds it for KV only in [start, end) of its own clock, answering after
    `total` end to end, as a deployment whose answer takes ten times its prefill window: a cancel
    (seen by the real loopback /abort_request endpoint) before `start` finds nothing (the victim answers
    normally at `total`), one inside aborts it in flight (SGLang's 500), one after it reaches the
    running batch (HTTP 200, finish_reason abort). With `per_token_s`, the window is that long per
    prompt token past `from_tokens` instead (its prefill: none at all at or below `from_tokens`)."""

    def __init__(
        self, endpoint: Any, start: float, end: float, total: float, per_token_s: float = 0.0, from_tokens: int = 0
    ) -> None:
        self.endpoint, self.start, self.end, self.total = endpoint, start, end, total
        self.per_token_s, self.from_tokens = per_token_s, from_tokens
        self.lengths: list[int] = []

    def __call__(self, n: str, k: int, m: int) -> ProbeResult:
        t0 = time.monotonic()
        self.lengths.append(k)
        end = self.start + max(0, k - self.from_tokens) * self.per_token_s if self.per_token_s else self.end
        seen = len(self.endpoint.rids)
        while time.monotonic() - t0 < self.total:
            if len(self.endpoint.rids) > seen:
                at = self.endpoint.times[-1] - t0
                if at < self.start:
                    seen = len(self.endpoint.rids)  # nothing to abort yet: the request goes on
                    continue
                if at < end:
                    return replace(_aborted(n, k, m), elapsed_s=time.monotonic() - t0)
                return _served(n, k, m, time.monotonic() - t0, {"type": "abort", "message": "Abort in running batch."})
            time.sleep(0.002)
        return _served(n, k, m, time.monotonic() - t0)


# The held-out pair's calibration: 40 ms per one-page request, 80 ms at the victim's length.
HELD_OUT_CAL = replace(CAL, base_s=0.04, jitter_s=0.003, lengths=((256, 0.08),), s_per_token=0.04 / 240)


def test_a_victim_in_flight_far_past_the_calibrated_window_is_found_by_bisection(abort_endpoint: Any) -> None:
    """Issue 32: a held-out real pair kept its cancels in the calibrated prefill window (39-70 ms) while its
    victims answered 200 after ten times as long: no cancel found the request there. Here the decode holds
    the victim for its KV in [0.25, 0.45) s of a 0.8 s answer; the search follows what each try observed
    (the earlier search, capped at the calibrated window until it closed, spent its 8 tries below 0.07 s).
    The window is wide and the tries repeat, so a busy machine shifts the try it takes, not the outcome."""
    decode = abort_endpoint(200)
    f = _run(_Timeline(decode, 0.25, 0.45, 0.8), (decode.url,), attempts=1, cal=HELD_OUT_CAL)
    ev = {e.field: e.value for e in f.evidence}
    assert f.outcome == Outcome.PASSED, (f.summary, ev["abort.cancel_points_s"], ev["abort.try_outcomes"])
    assert ev["abort.try_outcomes"][0] == "early" and ev["abort.try_outcomes"][-1] == "cancelled"
    assert ev["abort.cancel_points_s"][0] < 0.08 and 0.25 <= ev["abort.cancel_points_s"][-1]


class _SlowTokenizer:
    """A real loopback worker's /v1/tokenize that answers after `delay_s`, as a busy worker's tokenizer does
    (byte ids, offset 3): what `ServerCodec` asks before each request of a text-mode server goes out."""

    def __init__(self, delay_s: float) -> None:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                time.sleep(delay_s)
                out = json.dumps({"tokens": [b + 3 for b in body["prompt"].encode()]}).encode()
                self.send_response(200 if self.path == "/v1/tokenize" else 404)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = LoopbackServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_cancel_is_timed_from_the_victim_going_out_not_from_building_its_ids(abort_endpoint: Any) -> None:
    """Issue 46: on a text-mode server the victim's ids come from the worker's /v1/tokenize, which a busy
    worker answers late. Timed from before that, every cancel of a held-out real pair came before its
    request existed (no rid to abort: each "early") or at a point the search could not place. Here the
    tokenizer takes 0.5 s, longer than the victim's whole answer (0.3 s), and the decode holds the victim
    for its KV in [0.02, 0.1) s of its own clock: only a cancel timed from the send finds it."""
    decode = abort_endpoint(200)
    tokenizer = _SlowTokenizer(0.5)
    http = httpx.Client()
    try:
        codec = ServerCodec(http, tokenizer.url)
        f = _run(_Timeline(decode, 0.02, 0.1, 0.3), (decode.url,), attempts=1, cal=HELD_OUT_CAL, codec=codec)
    finally:
        http.close()
        tokenizer.close()
    ev = {e.field: e.value for e in f.evidence}
    seen = (f.summary, ev["abort.cancel_points_s"], ev["abort.try_outcomes"], ev["abort.send_lag_s"])
    assert f.outcome == Outcome.PASSED, seen
    assert ev["abort.try_outcomes"][-1] == "cancelled" and ev["abort.acknowledged"] == 1, seen
    assert all(lag >= 0.5 for lag in ev["abort.send_lag_s"]), seen  # the wait for the tokenizer, measured


def test_a_window_narrower_than_the_noise_is_widened_by_a_longer_victim(abort_endpoint: Any) -> None:
    """Issue 46: where the bracket between a cancel too early and one too late closes with none in
    flight, the victim is lengthened within the budget (its prefill, the window, grows with it) instead of
    bisecting on to noise. The decode learns of the victim 50 ms in; its KV arrives at once up to 300
    prompt tokens (no window at all: the planned 256-token victim can never be cancelled in flight) and
    0.2 ms later per token past them."""
    decode = abort_endpoint(200)
    timeline = _Timeline(decode, 0.05, 0.0, 0.4, per_token_s=0.0002, from_tokens=300)
    f = _run(timeline, (decode.url,), attempts=1, cal=HELD_OUT_CAL, abort_tokens=None)
    ev = {e.field: e.value for e in f.evidence}
    seen = (f.summary, ev["abort.cancel_points_s"], ev["abort.try_outcomes"], ev["abort.victim_tokens_per_try"])
    assert ev["abort.plan"]["victim_tokens"] == 256, seen
    assert f.outcome == Outcome.PASSED, seen
    lengths = ev["abort.victim_tokens_per_try"]
    assert lengths[0] == 256 and lengths[-1] > 300 and lengths == sorted(lengths), seen
    assert ev["abort.widened"] and ev["abort.try_outcomes"][-1] == "cancelled", seen
    assert "early" in ev["abort.try_outcomes"] and "late" in ev["abort.try_outcomes"], seen


def test_an_operator_fixed_victim_is_never_lengthened(abort_endpoint: Any) -> None:
    """probes.abort_tokens is the operator's: a window too narrow at that length stays inconclusive (never
    passed on nothing observed), and the remedy names a longer victim."""
    decode = abort_endpoint(200)
    timeline = _Timeline(decode, 0.05, 0.0, 0.4, per_token_s=0.0002, from_tokens=300)
    f = _run(timeline, (decode.url,), attempts=1, cal=HELD_OUT_CAL, abort_tokens=256)
    ev = {e.field: e.value for e in f.evidence}
    assert f.outcome == Outcome.INCONCLUSIVE, f.summary
    assert set(timeline.lengths) == {256} and not ev["abort.widened"], ev["abort.victim_tokens_per_try"]
    assert f.remedy is not None and "probes.abort_tokens: 1024" in f.remedy, f.remedy


def test_cancel_points_narrow_to_before_an_observed_answer() -> None:
    plan = plan_abort(CAL, LIMITS, ProbeSettings())
    points = CancelPoints.start(plan.lead_s, plan.window_s)
    first = points.next()
    assert plan.lead_s <= first <= plan.expected_s
    served = _served("abort_victim", 1, 1, first / 2)
    points.learn(first, LATE, served)  # answered before the cancel: late, so every next point is earlier
    for _ in range(5):
        at = points.next()
        assert at < first
        points.learn(at, LATE, None)


def test_cancel_points_bisect_the_observed_time_in_flight_and_reopen_on_noise() -> None:
    plan = plan_abort(CAL, LIMITS, ProbeSettings())
    points = CancelPoints.start(plan.lead_s, plan.window_s)
    first = points.next()
    points.learn(first, EARLY, _served("abort_victim", 1, 1, 1.0))  # found nothing; answered after 1 s
    second = points.next()
    assert second == pytest.approx((first + 1.0 - points.tail) / 2, abs=1e-3)
    points.learn(second, LATE, None)
    third = points.next()
    assert first < third < second
    # noise: an EARLY cancel after a LATE one closes the bracket; the search reopens across the answers
    points.learn(second + 0.1, EARLY, None)
    fourth = points.next()
    assert points.floor <= fourth <= 1.0 and not points.early and not points.late
    points.learn(fourth, CANCELLED, None)
    assert points.next() == fourth  # a cancel there was in flight: again there


@pytest.mark.slow
@pytest.mark.parametrize("emulate", ["0.5.22", "0.5.23"])
def test_a_healthy_sim_ten_times_slower_end_to_end_passes_the_abort_probe_at_the_defaults(
    deployment: Any, tmp_path: Path, emulate: str
) -> None:
    """`sim up` defaults (healthy pool, defenses observable) with --e2e-factor 10: every answer of more
    than one token takes ten times its time to the KV, as the held-out real pair's victims did."""
    dep = deployment(
        emulate=emulate,
        prefill_pool=HEALTHY_POOL,
        expose_env_vars=True,
        deferred_release=True,
        e2e_factor=10.0,
        **SIM_UP,
    )
    out = tmp_path / "report.json"
    res = CliRunner().invoke(app, check_args(dep, out))
    doc = json.loads(out.read_text())
    bad = [f"{f['id']}: {f['summary']}" for f in doc["findings"] if f["outcome"] not in ("passed", "info")]
    assert res.exit_code == ExitStatus.PASSED, bad
    abort = next(f for f in doc["findings"] if f["id"] == "probes.abort.mid_transfer")
    ev = {e["field"]: e["value"] for e in abort["evidence"]}
    assert ev["abort.try_outcomes"][-1] == "cancelled" and ev["abort.acknowledged"] == 1
