"""Issue 39 rebuilt as a new user met it: a toy PD deployment whose decode misreads what it received.

Three small HTTP servers on real sockets speak the SGLang surface kvgate reads: a prefill and a decode
worker (server_info, /v1/models, /model_info, /generate, /abort_request) and a router in front of them.
The "model" is autoregressive on ids: each token follows from the one before it (`step`), confident
(top-1 leads top-2 by 6 nats). The prefill computes the first token on the prompt it holds and keeps the
prompt as the request's KV under its bootstrap room; the decode fetches that KV from the prefill (the
transfer) and computes every later token from what it received. A faulty decode garbles every token
after the first the same way every time (or only for prompts longer than a few pages): nothing foreign,
replay agrees with itself, every contract holds. `kvgate check` must exit 1 on `probes.handoff` alone
(every other check's outcome as without the fault); without the fault the handoff check passes.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.exitcodes import ExitStatus
from tests.assets.loopback import LoopbackServer
from tests.assets.router_payloads import smg_entry, smg_workers
from tests.assets.sglang_payloads import max_req_input_len, model_info, server_info, v1_models

pytestmark = pytest.mark.slow
runner = CliRunner()
CONTEXT, POOL, PAGE, VERSION = 8192, 10_240, 64, "0.5.22"
LIMIT = max_req_input_len(CONTEXT, POOL)
VOCAB = 1000
#: the "few pages" past which the long-only fault garbles
LONG_FAULT_TOKENS = 4 * PAGE
#: the toy prefill's speed: its forward pass takes prompt tokens / this many seconds
PREFILL_TOKENS_PER_S = 40_000
HANDOFF = "probes.handoff.prefill_oracle"


def step(prev: int) -> int:
    """The toy model: the next token follows from the one before it."""
    return (prev * 31 + 17) % VOCAB


def garbled(prev: int) -> int:
    """The faulty decode's misreading, the same every time."""
    return (step(prev) + 1) % VOCAB


def logprobs(tokens: list[int], gap: float = 6.0, first_gap: float | None = None) -> dict[str, Any]:
    """SGLang's logprob fields; `gap`: nats by which each token leads its runner-up (`first_gap`, when
    given, for the first token: prefill's)."""
    gaps = [gap if j or first_gap is None else first_gap for j in range(len(tokens))]
    return {
        "output_token_logprobs": [[-0.01, t, None] for t in tokens],
        "output_top_logprobs": [
            [[-0.01, t, None], [-0.01 - g, (t + 1) % VOCAB, None]] for t, g in zip(tokens, gaps, strict=True)
        ],
    }


@dataclass
class Toy:
    """One toy server: role "prefill", "decode" or "router"."""

    role: str
    fault: str | None = None
    peers: dict[str, str] = field(default_factory=dict)
    gap: float = 6.0
    #: the first token's lead over its runner-up (prefill's token); None: `gap`
    first_gap: float | None = None
    kv: dict[int, list[int]] = field(default_factory=dict)
    url: str = ""
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30))
    _server: LoopbackServer | None = None

    def metadata(self, path: str) -> Any:
        if self.role == "router":
            entries = [smg_entry(self.peers["prefill"], "prefill", bootstrap_port=8998)]
            return {"/workers": smg_workers(*entries, smg_entry(self.peers["decode"], "decode"))}.get(path)
        mode = self.role
        docs = {
            "/server_info": server_info(VERSION, mode=mode, context=CONTEXT, pool=POOL, page_size=PAGE, tp_size=1),
            "/v1/models": v1_models(CONTEXT),
            "/model_info": model_info(VERSION, mode=mode),
            "/health": {},
        }
        return docs.get(path)

    def generate(self, body: dict[str, Any]) -> tuple[int, Any]:
        ids = body.get("input_ids") or []
        params = body.get("sampling_params") or {}
        new = int(params.get("max_new_tokens", 16))
        if self.role == "router":
            return self.route(body, ids, new)
        room = int(body["bootstrap_room"])
        if self.role == "prefill":
            time.sleep(len(ids) / PREFILL_TOKENS_PER_S)  # the forward pass
            self.kv[room] = list(ids)  # the KV this prefill wrote, kept for the decode's transfer
            return 200, {"first": step(ids[-1])}
        got = self.http.get(f"{self.peers['prefill']}/toy/kv/{room}").json()  # the transfer
        received, first = got["ids"], got["first"]
        bad = self.fault == "every" or (self.fault == "long" and len(received) > LONG_FAULT_TOKENS)
        out = [first]
        while len(out) < new:
            out.append(garbled(out[-1]) if bad else step(out[-1]))
        meta: dict[str, Any] = {
            "id": body.get("rid"),
            "finish_reason": {"type": "length", "length": new},
            "prompt_tokens": len(received),
            "completion_tokens": len(out),
            "cached_tokens": 0,
        }
        if body.get("return_logprob"):
            meta.update(logprobs(out, self.gap, self.first_gap))
        return 200, {"output_ids": out, "meta_info": meta}

    def route(self, body: dict[str, Any], ids: list[int], new: int) -> tuple[int, Any]:
        """SGLang's admission (tokenizer, then scheduler) and the PD dispatch: prefill, then decode."""
        n = len(ids)
        if n >= CONTEXT or n + new > CONTEXT:
            msg = f"The input ({n} tokens) is longer than the model's context length ({CONTEXT} tokens)."
            return 400, {"error": {"message": msg, "type": "BadRequestError", "code": 400}}
        if n >= LIMIT:
            msg = f"Input length ({n} tokens) exceeds the maximum allowed length ({LIMIT} tokens)."
            return 400, {"error": {"message": msg, "type": "BadRequestError", "code": 400}}
        leg = {**body, "bootstrap_room": secrets.randbits(62)}
        if self.http.post(self.peers["prefill"] + "/generate", json=leg).status_code != 200:
            return 500, {"error": {"message": "prefill failed", "code": 500}}
        resp = self.http.post(self.peers["decode"] + "/generate", json=leg)
        return resp.status_code, resp.json()

    def start(self) -> Toy:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def reply(self, status: int, doc: Any, stream: bool = False) -> None:
                if stream and status == 200:
                    data = "".join(f"data: {json.dumps(doc)}\n\n" for _ in (0,)).encode() + b"data: [DONE]\n\n"
                    ctype = "text/event-stream"
                else:
                    data, ctype = json.dumps(doc).encode(), "application/json"
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_GET(self) -> None:  # noqa: N802
                path = self.path.split("?")[0]
                if owner.role == "prefill" and path.startswith("/toy/kv/"):
                    room = int(path.rsplit("/", 1)[1])
                    ids = owner.kv.pop(room)
                    self.reply(200, {"ids": ids, "first": step(ids[-1])})
                    return
                doc = owner.metadata(path)
                self.reply(404 if doc is None else 200, {"detail": "Not Found"} if doc is None else doc)

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path == "/generate":
                    status, doc = owner.generate(body)
                    self.reply(status, doc, stream=bool(body.get("stream")))
                else:
                    self.reply(200, {})

        self._server = LoopbackServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        self.http.close()


@pytest.fixture
def toy() -> Iterator[Any]:
    started: list[Toy] = []

    def make(fault: str | None, gap: float = 6.0, first_gap: float | None = None) -> tuple[Toy, Toy, Toy]:
        prefill = Toy("prefill").start()
        decode = Toy("decode", fault, {"prefill": prefill.url}, gap, first_gap).start()
        router = Toy("router", None, {"prefill": prefill.url, "decode": decode.url}).start()
        started.extend((prefill, decode, router))
        return prefill, decode, router

    yield make
    for t in started:
        t.stop()


def check(servers: tuple[Toy, Toy, Toy], out: Path) -> tuple[int, dict[str, Any]]:
    prefill, decode, router = servers
    args = ["check", "--prefill-url", prefill.url, "--decode-url", decode.url, "--router-url", router.url]
    args += ["-q", "--tenants", "8", "-f", "json", "-o", str(out)]
    res = runner.invoke(app, args)
    assert out.is_file(), res.output
    return res.exit_code, json.loads(out.read_text())


def outcomes(report: dict[str, Any]) -> dict[str, str]:
    return {f["id"]: f["outcome"] for f in report["findings"]}


def finding(report: dict[str, Any], check_id: str) -> dict[str, Any]:
    return next(f for f in report["findings"] if f["id"] == check_id)


def test_toy_model_is_what_the_description_says(toy: Any) -> None:
    _, _, router = toy(None)
    doc = httpx.post(
        router.url + "/generate", json={"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4}}
    ).json()
    assert doc["output_ids"] == [step(7), step(step(7)), step(step(step(7))), step(step(step(step(7))))]
    _, _, bad = toy("every")
    doc = httpx.post(bad.url + "/generate", json={"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3}})
    assert doc.json()["output_ids"] == [step(7), garbled(step(7)), garbled(garbled(step(7)))]


@pytest.mark.parametrize("fault", ["every", "long"])
def test_a_decode_that_garbles_its_tokens_fails_on_the_handoff_check_alone(
    toy: Any, tmp_path: Path, fault: str
) -> None:
    code, healthy = check(toy(None), tmp_path / "healthy.json")
    h = finding(healthy, HANDOFF)
    assert h["outcome"] == "passed", h["summary"]
    assert "near_limit" in h["summary"]

    t0 = time.monotonic()
    code_bad, faulty = check(toy(fault), tmp_path / "faulty.json")
    f = finding(faulty, HANDOFF)
    assert code_bad == ExitStatus.GATE_FAILED, (time.monotonic() - t0, f["summary"])
    assert f["outcome"] == "failed", f["summary"]
    failed = [k for k, v in outcomes(faulty).items() if v == "failed"]
    assert failed == [HANDOFF], failed
    # the finding names the position, both tokens with their logprobs and the prompt
    assert "position" in f["summary"] and "logprob" in f["summary"] and "tokens)" in f["summary"]
    if fault == "long":
        assert f["summary"].startswith("decode's answer differs") and "near_limit" in f["summary"]
    # every other check's outcome is the same as without the fault
    other_h = {k: v for k, v in outcomes(healthy).items() if k != HANDOFF}
    other_f = {k: v for k, v in outcomes(faulty).items() if k != HANDOFF}
    assert other_f == other_h, {k: (other_h.get(k), other_f.get(k)) for k in set(other_h) | set(other_f)}
    assert code != ExitStatus.GATE_FAILED


def test_a_model_never_confident_by_the_margin_is_inconclusive_never_passed(toy: Any, tmp_path: Path) -> None:
    _, report = check(toy("every", gap=0.5), tmp_path / "unsure.json")
    f = finding(report, HANDOFF)
    assert f["outcome"] == "inconclusive", f["summary"]
    assert "only 0 confident position(s) compared" in f["summary"] and "at 0 of its" in f["summary"], f["summary"]
    assert "--enable-deterministic-inference" in f["remedy"]
    plan = next(e["value"] for e in f["evidence"] if e["field"] == "handoff.plan")
    assert "one_page_5" in plan  # the four extra one-page prompts were tried first


def test_prefill_unsure_of_its_token_still_judges_decodes_confident_one(toy: Any, tmp_path: Path) -> None:
    """A decode that misreads its KV makes answers prefill is seldom sure of (the real 0.5.22 decode with
    a dropped layer: prefill below the margin at 15 of 16 replays); decode's confident token is the
    reference, so the check fails on prefill's other top-1 and passes where prefill agrees, unsure."""
    code, healthy = check(toy(None, first_gap=0.5), tmp_path / "healthy.json")
    h = finding(healthy, HANDOFF)
    assert h["outcome"] == "passed", h["summary"]
    assert "is prefill's top-1" in h["summary"], h["summary"]

    code_bad, faulty = check(toy("every", first_gap=0.5), tmp_path / "faulty.json")
    f = finding(faulty, HANDOFF)
    assert code_bad == ExitStatus.GATE_FAILED and f["outcome"] == "failed", f["summary"]
    assert "prefill computes id" in f["summary"] and "runner-up" in f["summary"], f["summary"]
