"""The response contract over real loopback HTTP: every outcome is its own class."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx
import pytest

from kvgate.gates.probes.client import GenerateClient
from kvgate.gates.probes.contract import Verdict, classify
from kvgate.gates.probes.plan import ACCEPT, REJECT, LengthProbe
from tests.assets.loopback import LoopbackServer

Answer = Callable[[dict[str, Any]], tuple[int, bytes, str, float]]  # status, body, content type, delay


@pytest.fixture
def generate_server() -> Iterator[Callable[[Answer], str]]:
    servers: list[LoopbackServer] = []

    def make(answer: Answer) -> str:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, data, ctype, delay = answer(body)
                time.sleep(delay)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        srv = LoopbackServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield make
    for s in servers:
        s.shutdown()
        s.server_close()


def ok(text: str = "hi", finish: Any = None, prompt_tokens: int | None = None) -> Answer:
    def answer(body: dict[str, Any]) -> tuple[int, bytes, str, float]:
        n = len(body["input_ids"]) if prompt_tokens is None else prompt_tokens
        meta = {
            "prompt_tokens": n,
            "completion_tokens": len(text),
            "finish_reason": finish if finish is not None else {"type": "length", "length": len(text)},
        }
        return 200, json.dumps({"text": text, "meta_info": meta}).encode(), "application/json", 0.0

    return answer


def ids_only(ids: list[int], finish: Any = None, prompt_tokens: int | None = None) -> Answer:
    """A --skip-tokenizer-init answer as real SGLang 0.5.22 gives it through smg: `output_ids`, no `text`."""

    def answer(body: dict[str, Any]) -> tuple[int, bytes, str, float]:
        n = len(body["input_ids"]) if prompt_tokens is None else prompt_tokens
        meta = {
            "id": "x",
            "finish_reason": finish if finish is not None else {"type": "length", "length": len(ids)},
            "prompt_tokens": n,
            "completion_tokens": len(ids),
            "cached_tokens": 0,
        }
        return 200, json.dumps({"output_ids": ids, "meta_info": meta}).encode(), "application/json", 0.0

    return answer


# The scheduler's rejection of a streaming request, as real SGLang 0.5.22 streams it through smg 1.13.0.
SCHEDULER_ABORT = {
    "type": "abort",
    "status_code": 400,
    "err_type": "BadRequestError",
    "message": "Input length (101 tokens) exceeds the maximum allowed length (101 tokens). "
    "Use a shorter input or enable --allow-auto-truncate.",
}


def err(status: int, message: str, delay: float = 0.0) -> Answer:
    return lambda body: (status, json.dumps({"error": {"message": message}}).encode(), "application/json", delay)


ACC = LengthProbe("longest_accepted", 100, ACCEPT, "none", "", 8)
REJ = LengthProbe("pool_limit", 101, REJECT, "pool", "", 8)
LIMITS = {101, 4096}


def run(url: str, probe: LengthProbe, deadline: float = 5.0, stream: bool = False) -> Verdict:
    with httpx.Client() as http:
        res = GenerateClient(http, url, deadline).generate(
            probe.name, [65] * probe.length, probe.max_new_tokens, stream=stream
        )
    return classify(probe, res, limit_numbers=LIMITS, reject_within_s=min(2.0, deadline)).verdict


@pytest.mark.parametrize(
    "probe, answer, verdict",
    [
        (ACC, ok(), Verdict.OK_ACCEPTED),
        (ACC, ok(prompt_tokens=1), Verdict.PROMPT_TOKENS_MISMATCH),
        (ACC, ok(finish={"type": "abort", "message": "x"}), Verdict.ABORT_UNDER_200),
        (ACC, ok(text="", finish={"type": "length", "length": 0}), Verdict.LENGTH_UNDER_200),
        (ACC, ok(finish={}), Verdict.MISSING_FINISH_REASON),
        (
            ACC,
            err(400, "Input length (100 tokens) exceeds the maximum allowed length (101 tokens)."),
            Verdict.UNEXPECTED_REJECTION,
        ),
        (
            REJ,
            err(400, "Input length (101 tokens) exceeds the maximum allowed length (101 tokens)."),
            Verdict.OK_REJECTED,
        ),
        (REJ, err(400, "bad request"), Verdict.REJECTION_UNEXPLAINED),
        (REJ, err(400, "exceeds the maximum allowed length (101 tokens)", delay=2.5), Verdict.SLOW_REJECTION),
        (REJ, err(500, "Decode handshake failed"), Verdict.SERVER_ERROR),
        (REJ, ok(text="someone else's words"), Verdict.SERVED_OVER_LIMIT),
        (REJ, ok(text="", finish={"type": "abort", "message": "x"}), Verdict.ABORT_UNDER_200),
        (REJ, ok(text="", finish={"type": "stop"}), Verdict.EMPTY_200_OVER_LIMIT),
        (REJ, lambda b: (200, b"not json", "text/plain", 0.0), Verdict.MALFORMED_RESPONSE),
        (REJ, err(401, "unauthorized"), Verdict.UNEXPECTED_STATUS),
        (ACC, ids_only([795, 872, 127, 550]), Verdict.OK_ACCEPTED),
        (ACC, ids_only([]), Verdict.LENGTH_UNDER_200),
        (
            ACC,
            lambda b: (
                200,
                json.dumps(
                    {"meta_info": {"prompt_tokens": 100, "completion_tokens": 1, "finish_reason": {"type": "length"}}}
                ).encode(),
                "application/json",
                0.0,
            ),
            Verdict.MALFORMED_RESPONSE,
        ),
        # 0.5.19 with --skip-tokenizer-init: an over-pool prompt answered from stale pages has ids, no text
        (REJ, ids_only([11, 12, 13]), Verdict.SERVED_OVER_LIMIT),
        (REJ, ids_only([], finish=SCHEDULER_ABORT, prompt_tokens=1), Verdict.OK_REJECTED),
        # real 0.5.19, healthy pool, a length the decode rejects too: one placeholder step, then the 400
        (REJ, ids_only([5], finish=SCHEDULER_ABORT, prompt_tokens=1), Verdict.OK_REJECTED_LATE),
        (REJ, ids_only([5, 6], finish=SCHEDULER_ABORT, prompt_tokens=1), Verdict.SERVED_OVER_LIMIT),
        (REJ, ids_only([5], finish=SCHEDULER_ABORT), Verdict.SERVED_OVER_LIMIT),
        (REJ, ids_only([], finish={"type": "abort", "message": "client disconnected"}), Verdict.ABORT_UNDER_200),
        (REJ, ids_only([], finish={**SCHEDULER_ABORT, "message": "bad request"}), Verdict.REJECTION_UNEXPLAINED),
    ],
)
def test_contract_classes(
    generate_server: Callable[[Answer], str], probe: LengthProbe, answer: Answer, verdict: Verdict
) -> None:
    assert run(generate_server(answer), probe) == verdict


def test_hang_is_named_within_the_deadline(generate_server: Callable[[Answer], str]) -> None:
    url = generate_server(err(400, "(101 tokens)", delay=3.0))
    t = time.monotonic()
    assert run(url, REJ, deadline=0.5) == Verdict.HANG
    assert time.monotonic() - t < 3.0


def sse(events: list[Any], delay: float = 0.0) -> Answer:
    data = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    return lambda body: (200, data, "text/event-stream", delay)


@pytest.mark.parametrize(
    "answer, verdict",
    [
        (
            sse(
                [
                    {
                        "error": {
                            "message": "Input length (101 tokens) exceeds the maximum allowed length (101 tokens).",
                            "code": 400,
                        }
                    }
                ]
            ),
            Verdict.OK_REJECTED,
        ),
        (sse([{"error": {"message": "Decode transfer failed: timed out", "code": 500}}]), Verdict.SERVER_ERROR),
        (
            sse([{"text": "le", "meta_info": {}}, {"text": "leak", "meta_info": {"prompt_tokens": 101}}]),
            Verdict.SERVED_OVER_LIMIT,
        ),
        (
            sse(
                [
                    {
                        "output_ids": [],
                        "meta_info": {
                            "id": "a",
                            "finish_reason": SCHEDULER_ABORT,
                            "prompt_tokens": 1,
                            "completion_tokens": 0,
                        },
                    }
                ]
            ),
            Verdict.OK_REJECTED,
        ),
        (
            sse(
                [
                    {
                        "output_ids": [7],
                        "meta_info": {"finish_reason": None, "prompt_tokens": 101, "completion_tokens": 1},
                    },
                    {
                        "output_ids": [7, 8],
                        "meta_info": {
                            "finish_reason": {"type": "length", "length": 2},
                            "prompt_tokens": 101,
                            "completion_tokens": 2,
                        },
                    },
                ]
            ),
            Verdict.SERVED_OVER_LIMIT,
        ),
    ],
)
def test_streamed_answers(generate_server: Callable[[Answer], str], answer: Answer, verdict: Verdict) -> None:
    assert run(generate_server(answer), REJ, stream=True) == verdict


def test_streamed_hang(generate_server: Callable[[Answer], str]) -> None:
    url = generate_server(sse([{"error": {"message": "timed out", "code": 500}}], delay=3.0))
    assert run(url, REJ, deadline=0.5, stream=True) == Verdict.HANG


def test_no_observation_is_not_a_pass() -> None:
    with httpx.Client() as http:
        res = GenerateClient(http, "http://127.0.0.1:9", 1.0).generate("x", [1], 1)
    c = classify(REJ, res, limit_numbers=LIMITS, reject_within_s=1.0)
    assert c.verdict == Verdict.NO_OBSERVATION and not c.verdict.ok
