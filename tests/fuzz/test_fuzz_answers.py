"""Fuzz what the probes read from /generate: bodies, streams, finish reasons, usage fields, raw bytes.

Invariants: reading and judging an answer never raises; an answer is judged OK only when every field
the contract needs is there and well typed (checked here by an independent predicate); a length that
must be rejected is never OK under HTTP 200; a foreign whole sentinel is always found and one's own
never is. The client itself is fuzzed against a real loopback server sending arbitrary status codes,
bytes, truncated JSON and SSE streams.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvgate.gates.probes.client import GenerateClient, ProbeResult, _stream_body
from kvgate.gates.probes.contract import Verdict, classify
from kvgate.gates.probes.plan import ACCEPT, REJECT, LengthProbe
from kvgate.gates.probes.sentinels import WHOLE, new_sentinel, scan
from tests.assets.loopback import LoopbackServer
from tests.fuzz.conftest import CLI_EXAMPLES
from tests.fuzz.mutations import KINDS, mutate, paths

SENT = 100
ACCEPT_P = LengthProbe("longest", SENT, ACCEPT, "pool", "longest accepted", 8)
REJECT_P = LengthProbe("first_rejected", SENT, REJECT, "pool", "first rejected", 8)
LIMITS = (SENT, 99)
VALID = {
    "text": "hello",
    "output_ids": [1, 2],
    "meta_info": {
        "id": "r1",
        "finish_reason": {"type": "length", "length": 8},
        "prompt_tokens": SENT,
        "completion_tokens": 8,
        "cached_tokens": 0,
        "e2e_latency": 0.1,
    },
}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=16),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids, max_size=5),
    max_leaves=25,
)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def well_formed_accept(body: Any) -> bool:
    """Independent of contract.py: what an accepted /generate answer must hold (sglang-surface.md 2): an
    output, as `text` or, under --skip-tokenizer-init (measured on the real servers), `output_ids` only."""
    body = body[0] if isinstance(body, list) and body else body
    if not isinstance(body, dict) or "error" in body:
        return False
    ids = body.get("output_ids")
    ids_ok = isinstance(ids, list) and all(type(i) is int for i in ids)
    if not isinstance(body.get("text"), str) and not ids_ok:
        return False
    meta = body.get("meta_info")
    if not isinstance(meta, dict) or not _int(meta.get("prompt_tokens")) or meta["prompt_tokens"] != SENT:
        return False
    fr = meta.get("finish_reason")
    ftype = fr.get("type") if isinstance(fr, dict) else fr
    if ftype not in ("stop", "length"):
        return False
    return ftype != "length" or (_int(meta.get("completion_tokens")) and meta["completion_tokens"] >= 1)


def _result(status: int | None, body: Any, stream: bool = False) -> ProbeResult:
    raw = json.dumps(body) if body is not None else ""
    return ProbeResult("p", SENT, 8, status, 0.01, body, raw, stream=stream)


def test_valid_answer_is_ok_so_the_property_is_not_vacuous() -> None:
    verdict = classify(ACCEPT_P, _result(200, VALID), limit_numbers=LIMITS, reject_within_s=5).verdict
    assert verdict is Verdict.OK_ACCEPTED


@given(
    st.sampled_from(list(paths(VALID))),
    st.sampled_from(KINDS),
    st.sampled_from((200, 200, 200, 400, 500)),
    st.booleans(),
)
@example(("meta_info", "prompt_tokens"), "retype_frac", 200, False)
@example(("meta_info", "completion_tokens"), "retype_bool", 200, False)  # `true` was read as 1 token generated
@example(("meta_info", "prompt_tokens"), "retype_bool", 200, False)
def test_a_broken_answer_is_never_ok(
    count: Callable[[], None], path: tuple[Any, ...], kind: str, status: int, stream: bool
) -> None:
    count()
    body = mutate(VALID, path, kind)
    res = _result(status, body, stream)
    verdict = classify(ACCEPT_P, res, limit_numbers=LIMITS, reject_within_s=5).verdict
    if verdict is Verdict.OK_ACCEPTED:
        assert status == 200 and well_formed_accept(body), (path, kind, body)
    rejected = classify(REJECT_P, res, limit_numbers=LIMITS, reject_within_s=5).verdict
    if status == 200 and not stream:
        assert not rejected.ok, (path, kind, body)


@given(json_values, st.integers(min_value=100, max_value=599) | st.none(), st.booleans(), st.text(max_size=200))
def test_arbitrary_answers_never_crash_and_ok_means_well_formed(
    count: Callable[[], None], body: Any, status: int | None, stream: bool, raw: str
) -> None:
    count()
    res = ProbeResult("p", SENT, 8, status, 0.01, body, raw, stream=stream)
    _ = (res.text, res.served, res.meta, res.searchable)
    for probe in (ACCEPT_P, REJECT_P):
        c = classify(probe, res, limit_numbers=LIMITS, reject_within_s=5)
        if c.verdict is Verdict.OK_ACCEPTED:
            assert status == 200 and well_formed_accept(body), (status, body)
        if c.verdict is Verdict.OK_REJECTED:
            assert not res.text


@given(st.lists(json_values, max_size=8))
def test_stream_folding_never_crashes(count: Callable[[], None], events: list[Any]) -> None:
    count()
    body = _stream_body(events)
    assert body is None or isinstance(body, dict)


@given(st.text(max_size=300), st.integers(min_value=0, max_value=300), st.booleans())
def test_scan_finds_foreign_whole_sentinels_and_never_ones_own(
    count: Callable[[], None], noise: str, at: int, plant_foreign: bool
) -> None:
    count()
    own, foreign = new_sentinel("own"), new_sentinel("foreign")
    at = min(at, len(noise))
    text = noise[:at] + own.text + (foreign.text if plant_foreign else "") + noise[at:]
    hits = scan("own", own, text, [own, foreign])
    assert all(h.source != "own" for h in hits)
    assert any(h.source == "foreign" and h.kind == WHOLE for h in hits) == plant_foreign


# --- the client over real sockets --------------------------------------------------------------


class _Generate:
    """A loopback /generate that answers what the current example says: status, headers, bytes, pacing."""

    def __init__(self) -> None:
        self.status = 200
        self.chunks: list[bytes] = []
        self.content_type = "application/json"
        self.pause_s = 0.0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = b"".join(owner.chunks)
                try:
                    self.send_response(owner.status)
                    self.send_header("Content-Type", owner.content_type)
                    self.send_header("Content-Length", str(len(body)))
                    self.send_header("Connection", "close")
                    self.end_headers()
                    for c in owner.chunks:
                        self.wfile.write(c)
                        self.wfile.flush()
                        if owner.pause_s:
                            time.sleep(owner.pause_s)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = LoopbackServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def generate() -> Iterator[_Generate]:
    g = _Generate()
    yield g
    g.server.shutdown()
    g.server.server_close()


sse_lines = st.one_of(
    st.builds(lambda v: b"data: " + json.dumps(v).encode() + b"\n\n", json_values),
    st.just(b"data: [DONE]\n\n"),
    st.binary(max_size=40),
    st.just(b'data: {"text": "trunc'),
    st.just(b"data: \xff\xfe\n\n"),
    st.just(b": keep-alive\n\n"),
)


@settings(max_examples=CLI_EXAMPLES)
@given(
    st.sampled_from((200, 200, 200, 301, 400, 404, 429, 500, 503)),
    st.booleans(),
    st.one_of(
        st.lists(sse_lines, max_size=6),
        st.lists(st.binary(max_size=60), max_size=3),
        st.builds(lambda v, cut: [json.dumps(v).encode()[:cut]], json_values, st.integers(0, 200)),
    ),
    st.sampled_from((0.0, 0.0, 0.0, 0.15)),
)
def test_client_never_crashes_on_any_answer(
    count: Callable[[], None], generate: _Generate, status: int, stream: bool, chunks: list[bytes], pause_s: float
) -> None:
    count()
    generate.status, generate.chunks, generate.pause_s = status, chunks, pause_s
    generate.content_type = "text/event-stream" if stream else "application/json"
    with httpx.Client() as http:
        client = GenerateClient(http, generate.url, deadline_s=0.3)
        res = client.generate("p", [1] * SENT, 8, rid="r", stream=stream)
    assert isinstance(res, ProbeResult)
    c = classify(ACCEPT_P, res, limit_numbers=LIMITS, reject_within_s=5)
    if c.verdict is Verdict.OK_ACCEPTED:
        assert res.status == 200 and not res.timed_out and well_formed_accept(res.body)
    if res.timed_out:
        assert c.verdict is Verdict.HANG
