"""Page lifetime (incident.md section 4, gate 4): a decode-side abort while prefill is still writing.

Two prefills (one slow, one instant) and one decode. Request A (with a sentinel) streams its KV in
1-second chunks from the slow prefill; when its first chunk has landed, the test aborts A on the
decode (SGLang's `/abort_request`). Request B, the same size, then goes to the fast prefill. With
deferred release OFF the decode frees A's pages at once, B gets them, and A's in-flight chunk lands
in B's pages while B is decoding: B's text carries A's sentinel. With it ON the pages are held until
the prefill's drain ACK, B gets other pages, and B's text stays its own.

Both requests are pinned to a prefill with `pd_generate`, which sends exactly what the router
forwards (same JSON + bootstrap host/port/room to prefill and decode); the router's own policy would
pick the prefill otherwise.
"""

from __future__ import annotations

import threading

import httpx
import pytest

from kvgate.sim.client import pd_generate
from tests.sim.conftest import state, wait_for

pytestmark = pytest.mark.slow

SENTINEL = "SECRET-OF-A-91d2"
SIZE = 4096  # 256 pages of 16; four 1024-token chunks of 1 s each on the slow prefill


def _a_prompt() -> str:
    text = ("aaaa\n" * 300 + SENTINEL + "\n") * 20
    return text[:SIZE]


def _b_prompt() -> str:
    return ("bbbb-own-line\n" * 400)[:SIZE]


def _run(deployment, emulate: str, deferred: bool | None) -> tuple[str, dict]:
    dep = deployment(emulate=emulate, prefill=2, decode=1, context_length=16384, prefill_pool=16384,
                     decode_pool=65536, page_size=16, chunked_prefill_size=1024,
                     prefill_tokens_per_s=[1024, 0], decode_tokens_per_s=25, deferred_release=deferred,
                     router=False)
    slow, fast = dep.prefill_urls
    slow_port, fast_port = dep.bootstrap_ports
    decode = dep.decode_urls[0]
    result: dict = {}

    def run_a() -> None:
        result["A"] = pd_generate(slow, slow_port, decode, {
            "text": _a_prompt(), "rid": "req-A", "sampling_params": {"max_new_tokens": 8}}, timeout=60)

    th = threading.Thread(target=run_a)
    th.start()
    try:
        assert wait_for(lambda: state(decode)["transfers"].get("req-A", {}).get("pages_received", 0) >= 64, 30)
        assert httpx.post(decode + "/abort_request", json={"rid": "req-A"}, timeout=10).status_code == 200
        # the abort is handled asynchronously: let the decode retire A before B asks for pages
        assert wait_for(lambda: "req-A" not in state(decode)["transfers"], 30)
        b = pd_generate(fast, fast_port, decode, {
            "text": _b_prompt(), "rid": "req-B", "sampling_params": {"max_new_tokens": 100}}, timeout=60)
    finally:
        th.join(60)
    assert b.decode.status_code == 200, b.decode.text
    assert result["A"].decode.status_code == 500 and "Aborted by AbortReq." in result["A"].decode.text
    assert wait_for(lambda: state(decode)["free_pages"] == state(decode)["num_pages"], 40)
    return b.decode.json()["text"], state(decode)


@pytest.mark.parametrize("emulate", ["0.5.19", "0.5.21"])
def test_deferred_release_off_late_writes_land_in_the_next_request(deployment, emulate: str) -> None:
    text, dstate = _run(deployment, emulate, deferred=False)
    assert SENTINEL in text, text  # B's answer carries the aborted request's content
    assert dstate["stats"]["late_pages_received"] > 0


def test_deferred_release_on_keeps_pages_until_the_drain_ack(deployment) -> None:
    text, dstate = _run(deployment, "0.5.21", deferred=None)  # on by default from 0.5.21
    assert dstate["deferred_release"] is True
    assert SENTINEL not in text and "bbbb-own-line" in text
    assert dstate["stats"]["late_pages_received"] == 0
