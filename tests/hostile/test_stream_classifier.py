"""The stream classifier against an independent model of the contract, over real sockets.

Hypothesis draws frame sequences (output chunks, meta-only chunks, finish chunks, abort chunks, error
frames, keep-alives, garbage, an over-long line, `[DONE]`, a stream cut mid-frame); a loopback server
sends them as SGLang's event stream; kvgate's probe client reads them through the bounded HTTP client
and `classify` judges them as the answer to a length that must be rejected. `expected` below is the
contract written again from the issue and sglang-surface.md, sharing no code with kvgate:

- a frame that carried output (text, ids, completion_tokens > 0) anywhere in what was read means the
  request was served (`served_over_limit`), whatever error or abort came before or after it; except
  real 0.5.19's placeholder step: its one token inside the abort frame itself, the only frame with
  output and the first that ends the answer, `prompt_tokens` 1, a 4xx status_code (`ok_rejected_late`);
- otherwise a stream cut by a line over the cap is not observed; a frame that is not a JSON object is
  malformed; the answer is judged by its first error frame, else its first finished chunk: a rejection
  only with a 4xx (not auth, routing or rate limit) and the limit named.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvgate.gates.probes.client import GenerateClient
from kvgate.gates.probes.contract import Verdict, classify
from kvgate.gates.probes.plan import ACCEPT, REJECT, LengthProbe
from kvgate.reading.target import TargetClient
from tests.hostile.net_servers import ScriptedServer, sse

SENT, LIMIT, LINE_CAP = 5000, 4242, 4096
REJECT_P = LengthProbe("pool_limit", SENT, REJECT, "pool", "first rejected", 8)
ACCEPT_P = LengthProbe("longest", SENT, ACCEPT, "pool", "longest accepted", 8)
EXAMPLES = int(os.environ.get("KVGATE_FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
MESSAGE = f"Input length ({SENT} tokens) exceeds the maximum allowed length ({LIMIT} tokens)."
VAGUE = "request refused"


@dataclass(frozen=True)
class F:
    """One abstract frame: kind is chunk, abort, error, keepalive, garbage, long, done or cut."""

    kind: str
    text: str = ""
    ids: tuple[int, ...] = ()
    ct: int | None = None  # completion_tokens (chunks; abort frames report len(ids))
    pt: int = SENT  # prompt_tokens
    finish: str | None = None  # chunks: None, "stop", "length"
    code: int = 400  # abort status_code / error code
    named: bool = True  # the message names the limit
    variant: int = 0

    def output(self) -> bool:
        if self.kind == "chunk":
            return bool(self.text) or bool(self.ids) or (self.ct or 0) > 0
        if self.kind == "abort":
            return bool(self.text) or bool(self.ids)
        return self.kind == "error" and bool(self.text)

    def ends(self) -> bool:
        return self.kind in ("abort", "error") or (self.kind == "chunk" and self.finish is not None)

    def encode(self) -> bytes:
        if self.kind == "chunk":
            meta = {"id": "r", "finish_reason": _finish(self.finish), "prompt_tokens": self.pt}
            if self.ct is not None:
                meta["completion_tokens"] = self.ct
            return _data({"text": self.text, "output_ids": list(self.ids), "meta_info": meta})
        if self.kind == "abort":
            fr = {"type": "abort", "message": MESSAGE if self.named else VAGUE, "status_code": self.code}
            meta = {"id": "r", "finish_reason": fr, "prompt_tokens": self.pt, "completion_tokens": len(self.ids)}
            return _data({"text": self.text, "output_ids": list(self.ids), "meta_info": meta})
        if self.kind == "error":
            err: dict[str, Any] = {"error": {"message": MESSAGE if self.named else VAGUE, "code": self.code}}
            if self.text:
                err["text"] = self.text
            return _data(err)
        if self.kind == "keepalive":
            return (b": keep-alive\n\n", b"data:\n\n", b"\n", b"event: ping\n\n")[self.variant % 4]
        if self.kind == "garbage":
            return (b"data: {not json\n\n", b"data: [1, 2]\n\n", b"data: 42\n\n", b"data: null\n\n")[self.variant % 4]
        if self.kind == "long":
            return b'data: {"text": "' + b"x" * (2 * LINE_CAP) + b'"}\n\n'
        if self.kind == "done":
            return b"data: [DONE]\n\n"
        assert self.kind == "cut"
        return b'data: {"text": "cu'


def _finish(kind: str | None) -> Any:
    return None if kind is None else {"type": kind, **({"length": 8} if kind == "length" else {"matched": None})}


def _data(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def expected(frames: list[F]) -> tuple[Verdict | None, str]:
    """The model's verdict for a length that must be rejected (None: any failure that is not one of
    the named classes), and why."""
    seen: list[F] = []
    broke = False
    for f in frames:
        if f.kind == "done":
            break
        if f.kind == "long":
            broke = True
            break
        seen.append(f)
        if f.kind == "cut":
            break  # the connection closes inside this frame
    data = [f for f in seen if f.kind != "keepalive"]
    outputs = [i for i, f in enumerate(data) if f.output()]
    first_end = next((i for i, f in enumerate(data) if f.ends()), None)
    placeholder = (
        len(outputs) == 1
        and outputs[0] == first_end
        and data[first_end].kind == "abort"
        and 400 <= data[first_end].code < 500
        and data[first_end].pt == 1
        and len(data[first_end].ids) <= 1
        and not any(f.kind == "error" for f in data)
    )
    if outputs and not placeholder:
        return Verdict.SERVED_OVER_LIMIT, "a frame carried output"
    if broke:
        return Verdict.NO_OBSERVATION, "a line over the cap cut the stream"
    if any(f.kind in ("garbage", "cut") for f in data):
        return Verdict.MALFORMED_RESPONSE, "a frame is not a JSON object"
    named = any(f.kind in ("abort", "error") and f.named for f in data)
    errors = [f for f in data if f.kind == "error"]
    judged = errors[0] if errors else (data[first_end] if first_end is not None else None)
    if judged is None or judged.kind == "chunk":
        return None, "no rejection frame"
    if not 400 <= judged.code < 500 or judged.code in (401, 403, 404, 405, 429):
        return None, f"status {judged.code}"
    if not named:
        return None, "the limit is not named"
    if placeholder:
        return Verdict.OK_REJECTED_LATE, "0.5.19's placeholder step"
    return Verdict.OK_REJECTED, "a rejection frame, nothing served"


texts = st.sampled_from(("", "", "", "leak", "d"))
ids = st.one_of(st.just(()), st.lists(st.integers(0, 1000), max_size=3).map(tuple))
frame = st.one_of(
    st.builds(
        F,
        st.just("chunk"),
        texts,
        ids,
        ct=st.sampled_from((None, 0, 1, 3)),
        pt=st.sampled_from((SENT, 1)),
        finish=st.sampled_from((None, None, "stop", "length")),
    ),
    st.builds(
        F,
        st.just("abort"),
        texts,
        ids,
        pt=st.sampled_from((1, 1, SENT)),
        code=st.sampled_from((400, 400, 500)),
        named=st.booleans(),
    ),
    st.builds(F, st.just("error"), texts, code=st.sampled_from((400, 400, 429, 500, 503)), named=st.booleans()),
    st.builds(F, st.sampled_from(("keepalive", "garbage")), variant=st.integers(0, 3)),
    st.builds(F, st.sampled_from(("done", "long", "cut"))),
)


def _cut_last(frames: list[F]) -> list[F]:
    """A cut frame ends the stream (the connection closes inside it): nothing is sent after it."""
    cut = next((i for i, f in enumerate(frames) if f.kind == "cut"), None)
    return frames if cut is None else frames[: cut + 1]


# Half the streams carry no output at all, so the rejection classes are drawn as often as the served one.
streams = st.one_of(
    st.lists(frame, max_size=7),
    st.lists(frame.filter(lambda f: not f.output()), max_size=5),
).map(_cut_last)


class Stream:
    """The loopback server and the probe client that reads it, shared by every example."""

    def __init__(self) -> None:
        self.payload = b""
        self.server = ScriptedServer(sse(lambda req: self.payload)).start()
        self.target = TargetClient(timeout=10.0)
        self.client = GenerateClient(self.target.http, self.server.url, deadline_s=10.0, line_cap=LINE_CAP)

    def judge(self, frames: list[F], probe: LengthProbe = REJECT_P) -> tuple[Verdict, str]:
        self.payload = b"".join(f.encode() for f in frames)
        res = self.client.generate(probe.name, [7] * SENT, 8, rid="r", stream=True)
        c = classify(probe, res, limit_numbers=(LIMIT,), reject_within_s=60.0)
        return c.verdict, c.detail


@pytest.fixture(scope="module")
def stream() -> Iterator[Stream]:
    s = Stream()
    yield s
    s.target.close()
    s.server.stop()


CASE_1 = [F("chunk", "leaked", (108, 101), ct=2), F("error", code=400), F("done")]
PLACEHOLDER_0519 = [F("abort", "dis", (730,), pt=1, code=400), F("done")]


@FUZZ
@given(streams)
@example(CASE_1)
@example(PLACEHOLDER_0519)
@example([F("chunk", "d", (730,), ct=1, pt=1), *PLACEHOLDER_0519])  # the token in a frame BEFORE the abort
@example([F("error", code=400), F("chunk", "late", (1,), ct=1), F("done")])  # output after the error
@example([F("abort"), F("done")])  # 0.5.20+'s scheduler rejection: nothing generated
@example([F("error"), F("done")])  # the tokenizer's rejection
@example([F("chunk", ct=0), F("keepalive"), F("error"), F("long")])
@example([F("chunk", "leak"), F("long")])
def test_the_classifier_agrees_with_the_model(stream: Stream, frames: list[F]) -> None:
    want, why = expected(frames)
    got, detail = stream.judge(frames)
    if want is None:
        assert not got.ok and got is not Verdict.NO_OBSERVATION, (why, got, detail, frames)
    else:
        assert got is want, (why, got, detail, frames)


@FUZZ
@given(streams)
def test_a_stream_with_an_error_frame_garbage_or_a_cut_is_never_accepted(stream: Stream, frames: list[F]) -> None:
    got, detail = stream.judge(frames, ACCEPT_P)
    if got is Verdict.OK_ACCEPTED:
        seen = frames[: next((i for i, f in enumerate(frames) if f.kind == "done"), len(frames))]
        assert not any(f.kind in ("error", "garbage", "long", "cut") for f in seen), (detail, frames)


def test_case_1_names_what_was_served_before_the_error(stream: Stream) -> None:
    got, detail = stream.judge(CASE_1)
    assert got is Verdict.SERVED_OVER_LIMIT
    assert "frame 1 of 2 carried output (2 generated token(s)) before the error frame (frame 2" in detail, detail


def test_a_line_over_the_cap_is_a_transport_finding_naming_the_cap(stream: Stream) -> None:
    got, detail = stream.judge([F("long"), F("done")])
    assert got is Verdict.NO_OBSERVATION
    assert "OverCap" in detail and "4 KiB line cap" in detail, detail
