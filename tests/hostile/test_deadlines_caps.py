"""Every answer ends within its documented deadline and is read only up to its documented cap.

Issue 20, confirmed case 7, rebuilt: a /server_info that sends one byte every 0.5 s must not run past
`--timeout 2` (nor `--read-deadline`), and a 400 MB body must not be read whole. The same holds for the
router's /workers, the probes' /generate bodies and each line of a streamed answer. Over a cap is a
transport finding naming the cap. Bounds asserted on wall time are generous multiples of the deadline
(they catch "ran until killed", not a slow machine); pytest-timeout stops a regression that hangs.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.defaults import (
    DEFAULT_READ_DEADLINE,
    DEFAULT_TIMEOUT,
    METADATA_BODY_CAP,
    NODE_DEADLINE_REQUESTS,
    PROBE_BODY_CAP,
    STREAM_LINE_CAP,
)
from kvgate.errors import TransportError
from kvgate.exitcodes import ExitStatus
from kvgate.gates.probes.client import GenerateClient
from kvgate.gates.probes.contract import Verdict, classify
from kvgate.gates.probes.plan import REJECT, LengthProbe
from kvgate.reading.discovery import list_router_workers
from kvgate.reading.httpbounds import cap_text
from kvgate.reading.target import TargetClient
from tests.assets import sglang_payloads as P
from tests.hostile.net_servers import Request, Script, ScriptedServer, drip, head, sse

pytestmark = pytest.mark.timeout(180)
runner = CliRunner()
HUGE = 400 * 1000 * 1000  # the 400 MB body
SLACK_S = 5.0  # process and thread start-up on a loaded 2-core machine: far below "until killed"


def docs(role: str) -> dict[str, Any]:
    return {
        "/server_info": P.server_info("0.5.23", mode=role, pool=2_040_000),
        "/v1/models": P.v1_models(),
        "/model_info": P.model_info("0.5.23", role),
    }


class Sent:
    """Counts what a flooding script managed to write before the client stopped reading."""

    def __init__(self) -> None:
        self.bytes = 0


def counting_flood(sent: Sent, total: int, *, announce: bool, ctype: str = "application/json") -> Script:
    def script(req: Request, conn: socket.socket) -> None:
        conn.sendall(head(length=total if announce else None, ctype=ctype))
        block = b" " * (1 << 16)
        while sent.bytes < total:
            conn.sendall(block)
            sent.bytes += len(block)

    return script


def worker(role: str, hostile: dict[str, Script] | None = None) -> ScriptedServer:
    """A worker answering SGLang's documents, except the paths `hostile` scripts."""
    documents = docs(role)

    def script(req: Request, conn: socket.socket) -> None:
        path = req.path.split("?")[0]
        if hostile and path in hostile:
            hostile[path](req, conn)
            return
        if path not in documents:
            conn.sendall(head(404, length=2) + b"{}")
            return
        body = json.dumps(documents[path]).encode()
        conn.sendall(head(length=len(body)) + body)

    return ScriptedServer(script).start()


@pytest.fixture
def servers() -> Iterator[Callable[..., ScriptedServer]]:
    started: list[ScriptedServer] = []

    def make(role: str, hostile: dict[str, Script] | None = None) -> ScriptedServer:
        s = worker(role, hostile)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


def check(tmp_path: Path, prefill: str, decode: str, *extra: str) -> tuple[int, dict[str, Any], float]:
    out = tmp_path / "report.json"
    args = ["check", "--prefill-url", prefill, "--decode-url", decode, "-q", "-f", "json", "-o", str(out)]
    args += ["--trust-version", "--deferred-release", *extra]
    t0 = time.monotonic()
    res = runner.invoke(app, args)
    elapsed = time.monotonic() - t0
    assert out.is_file(), res.output
    return res.exit_code, json.loads(out.read_text()), elapsed


def target_errors(report: dict[str, Any]) -> list[str]:
    return [f["summary"] for f in report["findings"] if f["outcome"] == "error"]


# --- confirmed case 7: the slow drip -----------------------------------------------------------


def test_a_dripping_server_info_ends_at_timeout(servers: Callable[..., ScriptedServer], tmp_path: Path) -> None:
    stop = threading.Event()
    body = json.dumps(docs("prefill")["/server_info"]).encode()
    prefill = servers("prefill", {"/server_info": drip(body, 0.5, stop)})
    decode = servers("decode")
    try:
        code, report, elapsed = check(tmp_path, prefill.url, decode.url, "--timeout", "2")
    finally:
        stop.set()
    assert code == ExitStatus.TRANSPORT_ERROR, report["findings"]
    assert any("/server_info: no whole answer within 2s" in s for s in target_errors(report)), target_errors(report)
    # one request's budget (2 s) ends the node; the bound is its documented worst case, plus start-up
    assert elapsed < NODE_DEADLINE_REQUESTS * 2 + SLACK_S, elapsed


def test_a_dripping_server_info_ends_at_the_read_deadline(
    servers: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    stop = threading.Event()
    body = json.dumps(docs("prefill")["/server_info"]).encode()
    prefill = servers("prefill", {"/server_info": drip(body, 0.5, stop)})
    decode = servers("decode")
    try:
        code, report, elapsed = check(tmp_path, prefill.url, decode.url, "--timeout", "60", "--read-deadline", "2")
    finally:
        stop.set()
    assert code == ExitStatus.TRANSPORT_ERROR, report["findings"]
    assert any("the whole read's deadline" in s for s in target_errors(report)), target_errors(report)
    assert elapsed < 2 + SLACK_S, elapsed


def test_the_deadline_holds_for_one_slow_byte_after_a_fast_start() -> None:
    """A body that arrives almost whole at once, then stalls: cut at the deadline, not one read later."""

    def script(req: Request, conn: socket.socket) -> None:
        conn.sendall(head(length=101) + b"x" * 99)
        time.sleep(1.6)  # just before the deadline: the last read would wait a whole timeout more
        conn.sendall(b" ")  # one byte still owed: the stream stalls for good
        time.sleep(30)

    srv = ScriptedServer(script).start()
    try:
        with TargetClient(timeout=2.0) as client:
            t0 = time.monotonic()
            with pytest.raises(TransportError, match="no whole answer within 2s"):
                client.get_json(srv.url, "/server_info")
            elapsed = time.monotonic() - t0
    finally:
        srv.stop()
    assert elapsed < 2 + 1.0, elapsed  # per-read timeouts would end it at 3.6 s or later


# --- confirmed case 7: the 400 MB body ---------------------------------------------------------


@pytest.mark.parametrize("announce", [True, False], ids=["content-length", "until-close"])
def test_a_400_mb_server_info_is_not_read_whole(
    servers: Callable[..., ScriptedServer], tmp_path: Path, announce: bool
) -> None:
    sent = Sent()
    prefill = servers("prefill", {"/server_info": counting_flood(sent, HUGE, announce=announce)})
    decode = servers("decode")
    code, report, elapsed = check(tmp_path, prefill.url, decode.url, "--timeout", "20")
    assert code == ExitStatus.TRANSPORT_ERROR, report["findings"]
    errors = target_errors(report)
    assert any(f"{cap_text(METADATA_BODY_CAP)} cap" in s and "metadata cap" in s for s in errors), errors
    # What left the server is the cap plus what the socket buffers held: nowhere near 400 MB.
    assert sent.bytes < METADATA_BODY_CAP + 64 * (1 << 20), sent.bytes
    assert elapsed < 20 + SLACK_S, elapsed


def test_a_compressed_answer_is_refused_not_inflated(servers: Callable[..., ScriptedServer], tmp_path: Path) -> None:
    import gzip

    bomb = gzip.compress(b" " * (64 << 20))  # 64 MiB of JSON whitespace in about 64 KB

    def script(req: Request, conn: socket.socket) -> None:
        conn.sendall(head(length=len(bomb), extra="Content-Encoding: gzip") + bomb)

    prefill = servers("prefill", {"/server_info": script})
    code, report, _ = check(tmp_path, prefill.url, servers("decode").url)
    assert code == ExitStatus.TRANSPORT_ERROR
    assert any("Content-Encoding 'gzip'" in s for s in target_errors(report)), target_errors(report)
    assert prefill.requests[0].headers.get("accept-encoding") == "identity"


def test_a_huge_router_worker_list_is_a_transport_error_naming_the_cap() -> None:
    sent = Sent()
    router = ScriptedServer(counting_flood(sent, HUGE, announce=False)).start()
    try:
        with TargetClient(timeout=20.0) as client, pytest.raises(TransportError) as err:
            list_router_workers(client, router.url)
    finally:
        router.stop()
    assert "/workers" in str(err.value) and f"{cap_text(METADATA_BODY_CAP)} cap" in str(err.value), err.value
    assert sent.bytes < METADATA_BODY_CAP + 64 * (1 << 20), sent.bytes


def test_a_dripping_router_worker_list_ends_within_its_reads() -> None:
    stop = threading.Event()
    router = ScriptedServer(drip(b'{"workers": []}' + b" " * 1000, 0.3, stop)).start()
    t0 = time.monotonic()
    try:
        with TargetClient(timeout=1.0) as client, pytest.raises(TransportError, match="no whole answer"):
            list_router_workers(client, router.url)
    finally:
        stop.set()
        router.stop()
    assert time.monotonic() - t0 < NODE_DEADLINE_REQUESTS * 1.0 + SLACK_S


@pytest.mark.parametrize("announce", [True, False], ids=["content-length", "until-close"])
def test_the_watch_pass_reads_server_info_up_to_the_metadata_cap(announce: bool) -> None:
    """`kvgate watch`'s per-interval pass has the cap `kvgate check` has: a server_info of 6 MiB (padded
    JSON, over the 4 MiB the pass once had of its own) is read, one larger than the cap is not read whole,
    whether announced or ending at the close (the asyncio reader it had read the latter with one buffer's
    read: a 1 MiB until-close server_info came out as malformed JSON)."""
    from kvgate.watch.fleetpass import read_fleet
    from tests.assets import router_payloads as R

    doc = json.dumps(docs("prefill")["/server_info"]).encode()
    padded = doc[:-1] + b" " * (6 * (1 << 20)) + b"}"
    big_head = head(length=len(padded) if announce else None)
    sent = Sent()
    big = ScriptedServer(lambda req, conn: conn.sendall(big_head + padded)).start()
    flood = ScriptedServer(counting_flood(sent, HUGE, announce=announce)).start()
    listing = json.dumps(R.smg_workers(R.smg_entry(big.url, "prefill"), R.smg_entry(flood.url, "decode"))).encode()
    router = ScriptedServer(lambda req, conn: conn.sendall(head(length=len(listing)) + listing)).start()
    try:
        snap = read_fleet(router.url, timeout=20.0, token=None, concurrency=4, deadline_s=30.0)
    finally:
        for srv in (router, big, flood):
            srv.stop()
    assert snap.listing_error is None and big.url in snap.readings, snap.errors
    assert snap.readings[big.url].max_total_num_tokens == 2_040_000
    assert flood.url in snap.errors and f"{cap_text(METADATA_BODY_CAP)} cap" in snap.errors[flood.url], snap.errors
    assert sent.bytes < METADATA_BODY_CAP + 64 * (1 << 20), sent.bytes


# --- the probes: /generate bodies and stream lines ---------------------------------------------

REJECT_P = LengthProbe("pool_limit", 100, REJECT, "pool", "first rejected", 8)


def _probe(url: str, *, stream: bool, deadline_s: float = 10.0) -> tuple[Verdict, str, float]:
    with TargetClient(timeout=10.0) as target:
        client = GenerateClient(target.http, url, deadline_s=deadline_s)
        res = client.generate("p", [1] * 100, 8, rid="r", stream=stream)
    c = classify(REJECT_P, res, limit_numbers=(99,), reject_within_s=5.0)
    return c.verdict, c.detail, res.elapsed_s


def test_a_huge_generate_answer_is_not_observed_and_names_the_probe_cap() -> None:
    sent = Sent()
    srv = ScriptedServer(counting_flood(sent, HUGE, announce=False)).start()
    try:
        verdict, detail, _ = _probe(srv.url, stream=False)
    finally:
        srv.stop()
    assert verdict is Verdict.NO_OBSERVATION and f"{cap_text(PROBE_BODY_CAP)} cap" in detail, detail
    assert sent.bytes < PROBE_BODY_CAP + 64 * (1 << 20), sent.bytes


def test_an_endless_stream_line_is_cut_at_the_line_cap() -> None:
    sent = Sent()
    srv = ScriptedServer(counting_flood(sent, HUGE, announce=False, ctype="text/event-stream")).start()
    try:
        verdict, detail, _ = _probe(srv.url, stream=True)
    finally:
        srv.stop()
    assert verdict is Verdict.NO_OBSERVATION, detail
    assert f"{cap_text(STREAM_LINE_CAP)} line cap" in detail, detail
    assert sent.bytes < STREAM_LINE_CAP + 64 * (1 << 20), sent.bytes


def test_an_endless_stream_of_short_lines_stops_at_the_probe_cap() -> None:
    def script(req: Request, conn: socket.socket) -> None:
        conn.sendall(head(ctype="text/event-stream"))
        line = b": keep-alive" + b" " * 1000 + b"\n"
        while True:
            conn.sendall(line * 64)

    srv = ScriptedServer(script).start()
    try:
        verdict, detail, _ = _probe(srv.url, stream=True)
    finally:
        srv.stop()
    assert verdict is Verdict.NO_OBSERVATION and f"{cap_text(PROBE_BODY_CAP)} cap" in detail, detail


def _probe_a_trickle(script: Script, stop: threading.Event, *, stream: bool) -> tuple[Verdict, str, float]:
    """Probe a server that trickles until `stop` is set, with a 2 s deadline; then end the trickle and the server."""
    srv = ScriptedServer(script).start()
    try:
        return _probe(srv.url, stream=stream, deadline_s=2.0)
    finally:
        stop.set()
        srv.stop()


def test_a_trickling_stream_is_a_hang_within_the_probe_deadline() -> None:
    stop = threading.Event()

    def script(req: Request, conn: socket.socket) -> None:
        conn.sendall(head(ctype="text/event-stream"))
        while not stop.is_set():
            conn.sendall(b": keep-alive\n\n")
            time.sleep(0.2)

    verdict, detail, elapsed = _probe_a_trickle(script, stop, stream=True)
    assert verdict is Verdict.HANG, detail
    assert elapsed < 2.0 + 1.0, elapsed


def test_a_trickling_plain_answer_is_a_hang_within_the_probe_deadline() -> None:
    stop = threading.Event()
    verdict, detail, elapsed = _probe_a_trickle(
        drip(b'{"error": {"message": "99"}}' + b" " * 500, 0.2, stop), stop, stream=False
    )
    assert verdict is Verdict.HANG, detail
    assert elapsed < 2.0 + 1.0, elapsed


def test_an_ordinary_stream_still_reads_whole() -> None:
    """The caps bound the hostile, not the ordinary: a normal rejection stream is judged as before."""
    frame = {
        "error": {"message": "Input length (100 tokens) exceeds the maximum allowed length (99 tokens).", "code": 400}
    }
    srv = ScriptedServer(sse(b"data: " + json.dumps(frame).encode() + b"\n\ndata: [DONE]\n\n")).start()
    try:
        verdict, detail, _ = _probe(srv.url, stream=True)
    finally:
        srv.stop()
    assert verdict is Verdict.OK_REJECTED, detail


# --- the documented defaults --------------------------------------------------------------------


def test_help_shows_the_documented_deadlines() -> None:
    res = runner.invoke(app, ["check", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    assert f"whole metadata answer may take, body included (default: {DEFAULT_TIMEOUT:g})" in text, text
    assert f"(default: {DEFAULT_READ_DEADLINE:g})" in text


# --- any pacing, any size -----------------------------------------------------------------------


@settings(max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(1, 300), st.sampled_from((0.0, 0.0, 0.05, 0.2, 0.4))), min_size=1, max_size=8))
def test_any_pacing_ends_within_the_timeout(pieces: list[tuple[int, float]]) -> None:
    """However a body is paced, the answer is whole within the timeout or a timeout error by then."""
    timeout = 0.6
    body = b'{"a": "' + b"x" * sum(n for n, _ in pieces) + b'"}'

    def script(req: Request, conn: socket.socket) -> None:
        conn.sendall(head(length=len(body)) + body[:7])
        at = 7
        for n, pause in pieces:
            time.sleep(pause)
            conn.sendall(body[at : at + n])
            at += n
        conn.sendall(body[at:])

    srv = ScriptedServer(script).start()
    try:
        with TargetClient(timeout=timeout) as client:
            t0 = time.monotonic()
            try:
                doc = client.get_json(srv.url, "/x")
                assert doc == {"a": "x" * (len(body) - 9)}
            except TransportError as exc:
                assert "no whole answer within" in str(exc), exc
                assert sum(p for _, p in pieces) > 0  # only a paced body may time out
            elapsed = time.monotonic() - t0
    finally:
        srv.stop()
    assert elapsed < timeout + 1.0, elapsed  # per-read timeouts let such a body run for up to 3.2 s


@settings(max_examples=50, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(900, 1100), st.booleans())
def test_a_body_is_read_up_to_its_cap_and_not_one_byte_more(size: int, announce: bool) -> None:
    cap = 1000
    body = b'{"a": "' + b"x" * (size - 9) + b'"}'

    def script(req: Request, conn: socket.socket) -> None:
        conn.sendall(head(length=len(body) if announce else None) + body)

    srv = ScriptedServer(script).start()
    try:
        with TargetClient(timeout=5.0, metadata_cap=cap) as client:
            if size <= cap:
                assert client.get_json(srv.url, "/x") == {"a": "x" * (size - 9)}
            else:
                with pytest.raises(TransportError, match="1,000 bytes cap"):
                    client.get_json(srv.url, "/x")
    finally:
        srv.stop()
