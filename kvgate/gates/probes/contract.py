"""The response contract of one length probe, checked as a whole, and its named failure classes.

Accepted length: HTTP 200, `meta_info.prompt_tokens` equal to what was sent, a finish reason of type
stop or length (with tokens generated), and the output (`text`, or only `output_ids` when the server
runs with --skip-tokenizer-init). Rejected length: a 4xx within `reject_within_s` whose message names
the limit, and nothing generated. Everything else is one named class (style.md, "Peers' lessons": each
PD failure shape is its own class).

How real SGLang (0.5.19-0.5.23, behind smg 1.13.0) rejects, measured against the real servers:
- non-streaming: HTTP 400 `{"error": {"code": "prefill_bad_request" | "decode_bad_request", "message"}}`,
  the message from whichever worker refused first (decode names its own limit, from its own pool);
- streaming, tokenizer bound: HTTP 200, `data: {"error": {"message", "code": 400}}`;
- streaming, scheduler bound (len >= max_req_input_len): HTTP 200, one chunk with `output_ids: []`,
  `prompt_tokens: 1` and `finish_reason: {"type": "abort", "status_code": 400, "message": "Input length
  (N tokens) exceeds the maximum allowed length (M tokens). ..."}`. That is a rejection, judged by its
  status_code; the same frame with tokens generated is not, except that on 0.5.19 a request the decode
  rejects too runs its one-token placeholder for one step first (`prompt_tokens: 1`, one token, then
  the abort 400): rejected late, its own page only, `ok_rejected_late`.

A stream is judged by every frame, not only its last or its error: a frame that carried output (text,
output ids, completion_tokens > 0) before, after or beside an error or abort means the request was
served, and for a length that must be rejected that is `served_over_limit`, whatever the error says.
The one exception is real 0.5.19's placeholder step above: its one token arrives in the abort frame
itself (one frame, `prompt_tokens: 1`, at most one token, a 4xx status_code), never before it. A
stream that broke off (cut, or a line over the cap) with nothing served is `no_observation`; a frame
that is not a JSON object under HTTP 200 is `malformed_response`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from kvgate.gates.probes.client import ProbeResult
from kvgate.gates.probes.plan import ACCEPT, LengthProbe
from kvgate.output.redact import clip


class Verdict(str, Enum):
    """Contract outcome classes. OK_* pass; NO_OBSERVATION is inconclusive; every other is a failure."""

    OK_ACCEPTED = "ok_accepted"
    OK_REJECTED = "ok_rejected"
    # Rejected with its original 4xx after its one-token placeholder ran (SGLang <= 0.5.20 without
    # #38935, when the decode rejects too: it reserved and read only the placeholder's own page).
    OK_REJECTED_LATE = "ok_rejected_late"
    SERVED_OVER_LIMIT = "served_over_limit"  # 200 with generated tokens for a length that must be rejected
    EMPTY_200_OVER_LIMIT = "empty_200_over_limit"  # 200, nothing generated, no rejection status
    PROMPT_TOKENS_MISMATCH = "prompt_tokens_mismatch"
    SERVER_ERROR = "server_error"  # 5xx
    ABORT_UNDER_200 = "abort_under_200"  # 200 with finish_reason abort and no 4xx status_code
    LENGTH_UNDER_200 = "length_under_200"  # 200 with finish_reason length but nothing generated
    ERROR_UNDER_200 = "error_under_200"  # 200 whose body is an error document
    MISSING_FINISH_REASON = "missing_finish_reason"
    MALFORMED_RESPONSE = "malformed_response"  # 200 that is not a /generate document
    HANG = "hang"  # no answer within the probe deadline
    SLOW_REJECTION = "slow_rejection"  # 4xx, but not promptly
    REJECTION_UNEXPLAINED = "rejection_unexplained"  # 4xx whose body does not name the limit
    REJECTION_WITH_TEXT = "rejection_with_text"  # 4xx that still carries generated tokens
    UNEXPECTED_REJECTION = "unexpected_rejection"  # 4xx for a length that must be accepted
    UNEXPECTED_STATUS = "unexpected_status"  # 1xx/3xx, or 4xx of auth/routing
    NO_OBSERVATION = "no_observation"  # transport failure: nothing observed

    @property
    def ok(self) -> bool:
        return self in (Verdict.OK_ACCEPTED, Verdict.OK_REJECTED, Verdict.OK_REJECTED_LATE)


@dataclass(frozen=True)
class Classified:
    """A verdict and the reason in words."""

    verdict: Verdict
    detail: str


def _finish(meta: dict) -> tuple[str | None, object]:
    fr = meta.get("finish_reason")
    if isinstance(fr, dict):
        return (fr.get("type") if isinstance(fr.get("type"), str) else None), fr
    if isinstance(fr, str):
        return fr, fr
    return None, fr


def _names_limit(raw: str, limits: Iterable[int]) -> bool:
    for n in limits:
        if re.search(rf"(?<![\d,]){n}(?![\d,])", raw) or re.search(rf"(?<![\d,]){n:,}(?![\d,])", raw):
            return True
    return False


def _stream_error_code(res: ProbeResult) -> int | None:
    if not (res.stream and res.status == 200 and isinstance(res.body, dict) and "error" in res.body):
        return None
    err = res.body["error"]
    code = err.get("code", err.get("status")) if isinstance(err, dict) else None
    if isinstance(code, int) and 400 <= code < 600:
        return code
    msg = str(err.get("message", "")) if isinstance(err, dict) else str(err)
    return 500 if "failed" in msg.lower() or "timed out" in msg.lower() else 400


def _placeholder_ran(res: ProbeResult) -> bool:
    """At most one token generated over the one-token placeholder (`prompt_tokens` 1, not what was sent)."""
    ids = res.output_ids
    ct = res.meta.get("completion_tokens")
    return (
        res.meta.get("prompt_tokens") == 1 != res.sent_tokens
        and isinstance(ct, int)
        and ct <= 1
        and (ids is None or len(ids) <= 1)
    )


def _abort_status(res: ProbeResult) -> int | None:
    """The status_code of a `finish_reason: abort` answered under HTTP 200 with nothing generated (or
    only the one-token placeholder's step)."""
    fr = res.finish_abort
    if res.status != 200 or fr is None or (res.generated and not _placeholder_ran(res)):
        return None
    code = fr.get("status_code")
    return code if isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 600 else None


def _served_stream(res: ProbeResult) -> bool:
    """Some frame of a streamed HTTP 200 answer carried output, other than 0.5.19's lone placeholder step
    (its one token in the abort frame itself, the only frame with output, under a 4xx status_code)."""
    shape = res.shape
    if not res.stream or res.status != 200 or shape is None or not shape.output_frames:
        return False
    code = _abort_status(res)
    lone_placeholder = (
        shape.output_frames == (shape.terminal_at,)
        and shape.error_at is None
        and code is not None
        and 400 <= code < 500
        and _placeholder_ran(res)
    )
    return not lone_placeholder


def _served_detail(res: ProbeResult) -> str:
    shape = res.shape
    assert shape is not None
    first = shape.output_frames[0]
    how = f"frame {first + 1} of {shape.frames} carried output ({_generated(res)})"
    if shape.error_at is not None:
        err = res.document.get("error") if res.document else None
        how += (
            f" {'before' if first < shape.error_at else 'beside'} the error frame (frame "
            f"{shape.error_at + 1}: {str(err)[:120]!r})"
        )
    elif res.finish_abort is not None:
        how += f" with finish_reason {res.finish_abort!r}"
    if res.timed_out:
        how += ", then the stream stopped answering"
    elif res.transport_error is not None:
        how += f", then the stream broke off ({res.transport_error})"
    return how


def _generated(res: ProbeResult) -> str:
    ids = res.output_ids
    if ids:
        return f"{len(ids)} generated token(s)"
    if res.text:
        return f"{len(res.text)} chars of generated text"
    return f"completion_tokens {res.meta.get('completion_tokens')!r}"


def classify(
    probe: LengthProbe, res: ProbeResult, *, limit_numbers: Iterable[int], reject_within_s: float
) -> Classified:
    """Check one answer against the whole contract of its probe."""
    if res.not_sent is not None:
        return Classified(Verdict.NO_OBSERVATION, f"not sent: {res.not_sent}")
    if probe.expect != ACCEPT and _served_stream(res):
        # What reached the client decides, not the error that followed it (an error frame after text is
        # still a served request).
        return Classified(
            Verdict.SERVED_OVER_LIMIT,
            f"over-limit request served: streamed HTTP 200 where {_served_detail(res)}, for a length that "
            "must be rejected",
        )
    if res.timed_out:
        limit = f"the {res.deadline_s:g} s probe deadline" if res.deadline_s else "the probe deadline"
        mode = "streaming" if res.stream else "non-streaming"
        return Classified(
            Verdict.HANG, f"no complete {mode} answer within {limit} (gave up after {res.elapsed_s:.1f} s)"
        )
    if res.status is None:
        return Classified(Verdict.NO_OBSERVATION, f"transport failure: {res.transport_error}")
    shape = res.shape
    if res.stream and res.status == 200 and res.transport_error is not None:
        frames = shape.frames if shape is not None else 0
        return Classified(
            Verdict.NO_OBSERVATION, f"the HTTP 200 stream broke off after {frames} frame(s): {res.transport_error}"
        )
    if res.stream and res.status == 200 and shape is not None and shape.garbage:
        return Classified(
            Verdict.MALFORMED_RESPONSE,
            f"HTTP 200 stream whose frame {shape.garbage[0] + 1} of {shape.frames} is not a JSON object: "
            f"{res.raw[:160]!r}",
        )
    st = res.status
    how = "HTTP"
    streamed_error = _stream_error_code(res)
    aborted = _abort_status(res)
    if streamed_error is not None:
        # SGLang streams a rejection as HTTP 200 + `data: {"error": {...}}`: judge it by the error's code.
        st = streamed_error
        how = "streamed error (HTTP 200)"
    elif aborted is not None:
        # The scheduler's rejection under HTTP 200 (see the module docstring): judge it by its status_code.
        st = aborted
        how = "finish_reason abort (HTTP 200)"
    if st >= 500:
        return Classified(Verdict.SERVER_ERROR, f"{how} {st}: {clip(res.raw, 200)!r}")
    if 400 <= st < 500:
        if st in (401, 403, 404, 405, 429):
            return Classified(Verdict.UNEXPECTED_STATUS, f"HTTP {st}: {clip(res.raw, 200)!r}")
        if probe.expect == ACCEPT:
            return Classified(Verdict.UNEXPECTED_REJECTION, f"HTTP {st} for an accepted length: {clip(res.raw, 200)!r}")
        late = aborted is not None and res.generated
        if res.generated and not late:
            return Classified(Verdict.REJECTION_WITH_TEXT, f"{how} {st} with {_generated(res)}")
        if res.elapsed_s > reject_within_s:
            return Classified(
                Verdict.SLOW_REJECTION, f"{how} {st} after {res.elapsed_s:.1f} s (> {reject_within_s:g} s)"
            )
        if not _names_limit(res.raw, limit_numbers):
            return Classified(Verdict.REJECTION_UNEXPLAINED, f"{how} {st} body names no limit: {clip(res.raw, 200)!r}")
        if late:
            return Classified(
                Verdict.OK_REJECTED_LATE,
                f"{how} {st} in {res.elapsed_s:.2f} s, after its one-token placeholder ran "
                f"(prompt_tokens 1, {_generated(res)}: the pre-#38935 path, see the defenses gate): "
                f"{clip(res.raw, 160)!r}",
            )
        return Classified(Verdict.OK_REJECTED, f"{how} {st} in {res.elapsed_s:.2f} s: {clip(res.raw, 160)!r}")
    if st != 200:
        return Classified(Verdict.UNEXPECTED_STATUS, f"HTTP {st}: {clip(res.raw, 200)!r}")
    body = res.document
    if body is None:
        return Classified(Verdict.MALFORMED_RESPONSE, f"HTTP 200 but not a JSON object: {clip(res.raw, 120)!r}")
    if "error" in body and not res.generated:
        return Classified(Verdict.ERROR_UNDER_200, f"HTTP 200 carrying an error: {clip(res.raw, 200)!r}")
    meta = res.meta
    ftype, fr = _finish(meta)
    if probe.expect != ACCEPT:
        if res.generated:
            return Classified(
                Verdict.SERVED_OVER_LIMIT,
                f"over-limit request served: HTTP 200 with {_generated(res)} for a length that must "
                f"be rejected (prompt_tokens {meta.get('prompt_tokens')!r}, finish_reason {fr!r})",
            )
        if ftype == "abort":
            return Classified(Verdict.ABORT_UNDER_200, f"HTTP 200 with finish_reason {fr!r}")
        if ftype == "length":
            return Classified(Verdict.LENGTH_UNDER_200, f"HTTP 200 with finish_reason {fr!r}")
        return Classified(Verdict.EMPTY_200_OVER_LIMIT, f"HTTP 200 for a length that must be rejected: {fr!r}")
    if "meta_info" not in body or (res.answer is None):
        return Classified(
            Verdict.MALFORMED_RESPONSE,
            f"HTTP 200 without meta_info or an output (text or output_ids): {clip(res.raw, 160)!r}",
        )
    pt = meta.get("prompt_tokens")
    if pt != res.sent_tokens:
        return Classified(Verdict.PROMPT_TOKENS_MISMATCH, f"meta_info.prompt_tokens {pt!r}, sent {res.sent_tokens}")
    if ftype is None:
        return Classified(Verdict.MISSING_FINISH_REASON, f"meta_info.finish_reason {fr!r}")
    if ftype == "abort":
        return Classified(Verdict.ABORT_UNDER_200, f"HTTP 200 with finish_reason {fr!r}")
    ct = meta.get("completion_tokens")
    if ftype == "length" and not (isinstance(ct, int) and not isinstance(ct, bool) and ct >= 1):
        return Classified(Verdict.LENGTH_UNDER_200, f"finish_reason {fr!r} with completion_tokens {ct!r}")
    if ftype not in ("stop", "length"):
        return Classified(Verdict.MISSING_FINISH_REASON, f"unknown finish_reason {fr!r}")
    return Classified(
        Verdict.OK_ACCEPTED, f"HTTP 200, prompt_tokens {pt}, finish_reason {ftype}, {res.elapsed_s:.2f} s"
    )
