"""A /generate client that sends exact token counts (`input_ids`) and keeps everything it saw.

Non-streaming with a hard deadline: a request that has not answered by then is a `hang`, whatever the
server does later. The elapsed time of a non-streaming request with a short generation is the
time-to-first-token plus a few decode steps, which is what the latency probe compares.

Streams are read line by line, each line up to `line_cap` bytes (an endless line is a transport error
naming the cap, never read whole), and folded with a record of every frame (`StreamShape`): a frame
that carried output is remembered even when an error frame comes after it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import httpx

from kvgate.defaults import STREAM_LINE_CAP
from kvgate.output.redact import clip
from kvgate.reading.httpbounds import OverCap, cap_text, parse_json


@dataclass(frozen=True)
class StreamShape:
    """Which frames of a streamed answer carried what (indices count the data frames, [DONE] excluded)."""

    frames: int = 0
    output_frames: tuple[int, ...] = ()  # frames carrying text, output ids or completion_tokens > 0
    error_at: int | None = None  # the first `{"error": ...}` frame
    terminal_at: int | None = None  # the frame the answer is judged by: the first error or finish_reason
    garbage: tuple[int, ...] = ()  # frames that are not a JSON object
    done: bool = False  # `data: [DONE]` arrived


@dataclass(frozen=True)
class ProbeResult:
    """What one /generate probe observed."""

    name: str
    sent_tokens: int
    max_new_tokens: int
    status: int | None  # None: no HTTP answer (hang or transport failure)
    elapsed_s: float
    body: Any = None  # parsed JSON, or None
    raw: str = ""  # first bytes of the body as text
    timed_out: bool = False
    transport_error: str | None = None
    cancelled: bool = False
    stream: bool = False
    deadline_s: float | None = None
    ttft_s: float | None = None  # streaming: time to the first data event
    not_sent: str | None = None  # why the request was never sent (the deployment had stopped answering)
    shape: StreamShape | None = None  # streaming: what each frame carried

    @property
    def document(self) -> dict[str, Any] | None:
        """The /generate answer as one object (a batch answer's first element), or None."""
        body = self.body[0] if isinstance(self.body, list) and self.body else self.body
        return body if isinstance(body, dict) else None

    @property
    def text(self) -> str:
        """Generated text ("" when absent: with `--skip-tokenizer-init` SGLang answers `output_ids` only)."""
        doc = self.document
        t = doc.get("text") if doc is not None else None
        return t if isinstance(t, str) else ""

    @property
    def output_ids(self) -> list[int] | None:
        """Generated token ids (`output_ids`; with `--skip-tokenizer-init` the only output), or None."""
        doc = self.document
        ids = doc.get("output_ids") if doc is not None else None
        if isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            return ids
        return None

    @property
    def generated(self) -> bool:
        """The answer carries generated content: text, output ids, or a positive completion_tokens."""
        ct = self.meta.get("completion_tokens")
        return bool(self.text) or bool(self.output_ids) or (isinstance(ct, int) and not isinstance(ct, bool) and ct > 0)

    @property
    def answer(self) -> tuple[int, ...] | str | None:
        """What the model generated, for comparing two answers: the ids when present, else the text."""
        ids = self.output_ids
        if ids is not None:
            return tuple(ids)
        doc = self.document
        return self.text if doc is not None and isinstance(doc.get("text"), str) else None

    @property
    def finish_abort(self) -> dict[str, Any] | None:
        """The `finish_reason` when it is an abort (SGLang: `{"type": "abort", "message", "status_code"}`)."""
        fr = self.meta.get("finish_reason")
        return fr if isinstance(fr, dict) and fr.get("type") == "abort" else None

    @property
    def served(self) -> bool:
        """The target answered with a result (not an error, not an abort, not a hang)."""
        if self.status != 200 or self.timed_out:
            return False
        doc = self.document
        return doc is not None and "error" not in doc and self.finish_abort is None

    @property
    def meta(self) -> dict[str, Any]:
        doc = self.document
        if doc is not None and isinstance(doc.get("meta_info"), dict):
            return doc["meta_info"]
        return {}

    @property
    def searchable(self) -> str:
        """Everything in the answer a foreign sentinel could hide in (text and error bodies)."""
        return self.raw

    def unserved(self, width: int, deadline: str = "{:g} s", *, abort: bool = False) -> str:
        """Why this answer serves nothing, for a finding: not sent, no answer within `deadline` (its seconds
        formatted in), lost in transport, aborted (with `abort`), else its status and body; the server's
        text clipped to `width`."""
        if self.not_sent is not None:
            return f"not sent: {self.not_sent}"
        if self.timed_out:
            return f"no answer within {deadline.format(self.deadline_s or 0)}"
        if self.transport_error:
            return f"transport: {clip(self.transport_error, width)}"
        fr = self.finish_abort
        if abort and fr is not None:
            return f"HTTP {self.status}, aborted: {clip(str(fr.get('message', '')), width)}"
        return f"HTTP {self.status}: {clip(self.raw, width)}"


class GenerateClient:
    """Sends /generate probes to the router with a per-probe deadline."""

    def __init__(
        self,
        http: httpx.Client,
        router_url: str,
        deadline_s: float,
        raw_limit: int = 1 << 20,
        line_cap: int = STREAM_LINE_CAP,
    ) -> None:
        self.http = http
        self.url = router_url.rstrip("/") + "/generate"
        self.deadline_s = deadline_s
        self.raw_limit = raw_limit
        self.line_cap = line_cap

    def payload(
        self, ids: list[int], max_new_tokens: int, rid: str | None = None, stream: bool = False, top_logprobs: int = 0
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0},
            "stream": stream,
        }
        if rid:
            body["rid"] = rid
        if top_logprobs:
            # SGLang answers meta_info.output_top_logprobs: per output position [[logprob, id, text], ...]
            body["return_logprob"] = True
            body["top_logprobs_num"] = top_logprobs
        return body

    @staticmethod
    def _no_answer(name: str, ids: list[int], max_new_tokens: int, t0: float, **why: Any) -> ProbeResult:
        """A request that got no HTTP answer: late, cancelled or a transport failure (`why` says which)."""
        return ProbeResult(name, len(ids), max_new_tokens, None, time.monotonic() - t0, **why)

    def generate(
        self,
        name: str,
        ids: list[int],
        max_new_tokens: int,
        *,
        rid: str | None = None,
        deadline_s: float | None = None,
        cancel_after_s: float | None = None,
        stream: bool = False,
        top_logprobs: int = 0,
    ) -> ProbeResult:
        """POST one probe. `cancel_after_s` drops the connection after that long (client-side cancel);
        `top_logprobs` > 0 asks for that many top logprobs per output position (non-streaming only)."""
        if stream:
            return replace(
                self._generate_stream(name, ids, max_new_tokens, rid, deadline_s or self.deadline_s),
                deadline_s=deadline_s or self.deadline_s,
            )
        return replace(
            self._generate_plain(name, ids, max_new_tokens, rid, deadline_s, cancel_after_s, top_logprobs),
            deadline_s=None if cancel_after_s is not None else (deadline_s or self.deadline_s),
        )

    def _generate_plain(
        self,
        name: str,
        ids: list[int],
        max_new_tokens: int,
        rid: str | None,
        deadline_s: float | None,
        cancel_after_s: float | None,
        top_logprobs: int = 0,
    ) -> ProbeResult:
        limit = cancel_after_s if cancel_after_s is not None else (deadline_s or self.deadline_s)
        timeout = httpx.Timeout(limit, connect=min(limit, 10.0))
        content = json.dumps(self.payload(ids, max_new_tokens, rid, top_logprobs=top_logprobs)).encode()
        t0 = time.monotonic()
        try:
            resp = self.http.post(
                self.url, content=content, timeout=timeout, headers={"Content-Type": "application/json"}
            )
        except httpx.TimeoutException:
            return self._no_answer(
                name, ids, max_new_tokens, t0, timed_out=cancel_after_s is None, cancelled=cancel_after_s is not None
            )
        except httpx.HTTPError as exc:
            return self._no_answer(name, ids, max_new_tokens, t0, transport_error=f"{type(exc).__name__}: {exc}")
        elapsed = time.monotonic() - t0
        raw = resp.content[: self.raw_limit].decode("utf-8", errors="replace")
        try:
            body: Any = parse_json(resp.content)
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
            body = None
        if elapsed > limit and cancel_after_s is None:
            # httpx's read timeout is per read; a trickled answer past the deadline is still a hang.
            return ProbeResult(name, len(ids), max_new_tokens, resp.status_code, elapsed, body, raw, timed_out=True)
        return ProbeResult(name, len(ids), max_new_tokens, resp.status_code, elapsed, body, raw, cancelled=False)

    def _generate_stream(
        self, name: str, ids: list[int], max_new_tokens: int, rid: str | None, deadline: float
    ) -> ProbeResult:
        """Streaming /generate: the router relays the decode's stream, so a decode that waits for KV that
        never comes shows here (a non-streaming request may get the prefill's error at once)."""
        content = json.dumps(self.payload(ids, max_new_tokens, rid, stream=True)).encode()
        t0 = time.monotonic()
        events: list[Any] = []
        raw_parts: list[str] = []
        raw_size = 0  # what raw_parts holds: only the first raw_limit characters are kept
        ttft: float | None = None
        status: int | None = None
        timed_out = False
        done = False
        failure: str | None = None
        try:
            with self.http.stream(
                "POST",
                self.url,
                content=content,
                headers={"Content-Type": "application/json"},
                timeout=httpx.Timeout(deadline, connect=min(deadline, 10.0)),
            ) as resp:
                status = resp.status_code
                for line in _lines(resp, self.line_cap):
                    if time.monotonic() - t0 > deadline:
                        timed_out = True
                        break
                    if raw_size < self.raw_limit:
                        raw_parts.append(line)
                        raw_size += len(line) + 1
                    if not line.startswith("data:"):
                        continue  # SSE comments (keep-alives), event names, blank separators
                    data = line[5:].strip()
                    if not data:
                        continue  # an empty data line: a keep-alive
                    if ttft is None:
                        ttft = time.monotonic() - t0
                    if data == "[DONE]":
                        done = True
                        break
                    try:
                        events.append(parse_json(data))
                    except ValueError:
                        events.append(Garbage(data[:200]))
        except httpx.TimeoutException:
            timed_out = True
        except httpx.HTTPError as exc:
            failure = f"{type(exc).__name__}: {exc}"
        elapsed = time.monotonic() - t0
        body, shape = fold_stream(events, done=done)
        return ProbeResult(
            name,
            len(ids),
            max_new_tokens,
            None if timed_out and status is None else status,
            elapsed,
            body,
            "\n".join(raw_parts)[: self.raw_limit],
            timed_out=timed_out and failure is None,
            transport_error=failure,
            stream=True,
            ttft_s=ttft,
            shape=shape,
        )


def _lines(resp: httpx.Response, cap: int) -> Iterator[str]:
    """The answer's lines (LF or CRLF), each at most `cap` bytes: a longer one raises OverCap."""
    buf = bytearray()
    for chunk in resp.iter_raw():
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            piece = chunk[start:] if nl < 0 else chunk[start:nl]
            if len(buf) + len(piece) > cap:
                raise OverCap(
                    f"a streamed line is longer than kvgate's {cap_text(cap)} line cap (not read further)",
                    cap=cap,
                    request=resp.request,
                )
            buf += piece
            if nl < 0:
                break
            yield bytes(buf).rstrip(b"\r").decode("utf-8", errors="replace")
            buf.clear()
            start = nl + 1
    if buf:
        yield bytes(buf).rstrip(b"\r").decode("utf-8", errors="replace")


@dataclass(frozen=True)
class Garbage:
    """A data frame that is not JSON."""

    data: str


def carries_output(frame: Any) -> bool:
    """The frame carries generated output: any text, any output id, or completion_tokens > 0.

    Deliberately wide (a non-string `text` counts too): a frame that might have served something is
    never read as one that did not.
    """
    if not isinstance(frame, dict):
        return False
    if frame.get("text") not in (None, "", [], {}):
        return True
    if frame.get("output_ids") not in (None, [], {}, ""):
        return True
    meta = frame.get("meta_info")
    ct = meta.get("completion_tokens") if isinstance(meta, dict) else None
    return isinstance(ct, (int, float)) and not isinstance(ct, bool) and ct > 0


def _finished(frame: dict[str, Any]) -> bool:
    meta = frame.get("meta_info")
    return isinstance(meta, dict) and meta.get("finish_reason") is not None


def fold_stream(events: list[Any], *, done: bool = False) -> tuple[Any, StreamShape]:
    """The stream as one document (see `_stream_body`) and the record of what each frame carried."""
    error_at = next((i for i, ev in enumerate(events) if isinstance(ev, dict) and "error" in ev), None)
    finish_at = next(
        (i for i, ev in enumerate(events) if isinstance(ev, dict) and "error" not in ev and _finished(ev)), None
    )
    terminal = min((i for i in (error_at, finish_at) if i is not None), default=None)
    shape = StreamShape(
        frames=len(events),
        output_frames=tuple(i for i, ev in enumerate(events) if carries_output(ev)),
        error_at=error_at,
        terminal_at=terminal,
        garbage=tuple(i for i, ev in enumerate(events) if not isinstance(ev, dict)),
        done=done,
    )
    return _stream_body(events), shape


def _stream_body(events: list[Any]) -> Any:
    """The stream folded into one document: the error event if any, else the chunk that finished the
    answer (the first with a finish_reason), else the last chunk; texts and ids added up over the
    chunks up to it when the server streams increments. An error event after chunks that carried
    output keeps that output (`text`, `output_ids`, `meta_info` beside `error`): it was served.

    Real SGLang (0.5.19-0.5.23) streams cumulative chunks: `{"text"?, "output_ids", "meta_info"}` per
    token (no `text` under --skip-tokenizer-init), then `data: [DONE]`. A tokenizer rejection is a
    `{"error": {"message", "code": 400}}` event; a scheduler rejection is a normal chunk with
    `output_ids: []`, `prompt_tokens: 1` (the one-token placeholder) and `finish_reason {"type": "abort",
    "status_code": 400, "message": ...}`, all under HTTP 200.
    """
    dicts = [ev for ev in events if isinstance(ev, dict) and "error" not in ev]
    error = next((ev for ev in events if isinstance(ev, dict) and "error" in ev), None)
    if error is not None:
        served = [ev for ev in dicts if carries_output(ev)]
        return {**error, **_fold_chunks(served)} if served else error
    if not dicts:
        return None
    upto = next((i for i, ev in enumerate(dicts) if _finished(ev)), len(dicts) - 1)
    return _fold_chunks(dicts[: upto + 1])


def _fold_chunks(dicts: list[dict[str, Any]]) -> dict[str, Any]:
    last = dict(dicts[-1])
    if "text" in last and not (isinstance(last.get("text"), str) and last["text"]):
        # incremental streaming output: the chunks' texts add up
        last["text"] = "".join(str(ev.get("text", "")) for ev in dicts)
    ids = last.get("output_ids")
    ct = last.get("meta_info", {}).get("completion_tokens") if isinstance(last.get("meta_info"), dict) else None
    if isinstance(ids, list) and isinstance(ct, int) and len(ids) < ct:
        # incremental streaming output (--incremental-streaming-output): the chunks' ids add up
        last["output_ids"] = [i for ev in dicts if isinstance(ev.get("output_ids"), list) for i in ev["output_ids"]]
    return last
