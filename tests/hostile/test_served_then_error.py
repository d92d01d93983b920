"""Issue 20, confirmed case 1, rebuilt end to end: a router that streams an over-limit request's text and
`output_ids` and THEN an error frame served that request; `kvgate check` must not pass it.

The deployment is the simulator (SGLang 0.5.22's behaviour, healthy pools, behind the real smg router);
a mutating proxy in front of its router answers every streamed over-limit /generate with one frame of
generated text and ids, then the 400 error frame a rejection would carry, then `[DONE]`. The same run
without the mutation is the control: it passes, so the block comes from the served frame alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.exitcodes import ExitStatus
from kvgate.upstream.admission import max_req_input_len
from tests.assets.sim_setup import doubt_opted_out_args
from tests.hostile.net_servers import MutatingProxy, Request, head, sse_bytes

pytestmark = pytest.mark.slow
runner = CliRunner()
CONTEXT, PREFILL_POOL, DECODE_POOL = 8192, 16_384, 65_536
LIMIT = min(max_req_input_len(CONTEXT, PREFILL_POOL), max_req_input_len(CONTEXT, DECODE_POOL))


def served_then_error(req: Request) -> bytes | None:
    """The stream of issue 20's case 1, for a streamed /generate at or over the limit; else None (forward)."""
    if req.method != "POST" or req.path != "/generate":
        return None
    body = req.json()
    n = len(body.get("input_ids") or [])
    if not body.get("stream") or n < LIMIT:
        return None
    frames = [
        {
            "text": "leaked",
            "output_ids": [108, 101, 97, 107],
            "meta_info": {"id": body.get("rid"), "finish_reason": None, "prompt_tokens": n, "completion_tokens": 4},
        },
        {
            "error": {
                "message": f"Input length ({n} tokens) exceeds the maximum allowed length ({LIMIT} tokens). "
                "Use a shorter input or enable --allow-auto-truncate.",
                "type": "invalid_request_error",
                "code": 400,
                "retryable": False,
            }
        },
        b"data: [DONE]\n\n",
    ]
    return head(200, "text/event-stream") + sse_bytes(frames)


@pytest.fixture
def proxied(deployment: Callable[..., Any]) -> Iterator[tuple[Any, MutatingProxy]]:
    dep = deployment(emulate="0.5.22", context_length=CONTEXT, prefill_pool=PREFILL_POOL, decode_pool=DECODE_POOL)
    proxy = MutatingProxy(dep.router_url, lambda req: None).start()
    yield dep, proxy
    proxy.stop()


def _check(dep: Any, proxy: MutatingProxy, out: Path) -> tuple[int, dict[str, Any]]:
    # As tests/test_binary.py: the simulator runs no sglang code and does not expose its env, and its 8k
    # context is too short for the latency test, so doubt is opted out of; a failure still exits 1.
    res = runner.invoke(app, doubt_opted_out_args(proxy.url, dep, out))
    assert out.is_file(), res.output
    return res.exit_code, json.loads(out.read_text())


def test_a_streamed_over_limit_answer_with_text_before_its_error_frame_blocks(
    proxied: tuple[Any, MutatingProxy], tmp_path: Path
) -> None:
    dep, proxy = proxied
    code, report = _check(dep, proxy, tmp_path / "control.json")
    failed = [f for f in report["findings"] if f["outcome"] == "failed"]
    assert code == ExitStatus.PASSED and not failed, failed  # the control: the same run, nothing mutated

    proxy.mutate = served_then_error
    code, report = _check(dep, proxy, tmp_path / "mutated.json")
    assert proxy.mutated, "no streamed over-limit probe reached the proxy: the test proved nothing"
    assert code == ExitStatus.GATE_FAILED, [(f["id"], f["outcome"]) for f in report["findings"]]
    served = [
        f
        for f in report["findings"]
        if f["gate"] == "probes" and f["outcome"] == "failed" and f["summary"].startswith("served_over_limit")
    ]
    assert served, [(f["id"], f["outcome"], f["summary"][:200]) for f in report["findings"]]
    assert any("before the error frame" in f["summary"] for f in served), served[0]["summary"]
