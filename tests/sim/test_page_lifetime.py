"""Page lifetime (incident.md section 4, gate 4): a decode-side abort while prefill is still writing.

Two prefills (one slow, one instant) and one decode. Request A (its sentinel on every page) computes
1-second chunks on the slow prefill, and each chunk's KV write is in flight for 4 s (a transfer
bandwidth, as with RDMA: the write is posted and lands later). While A's first write is in flight,
the test aborts A on the decode (SGLang's `/abort_request`). Request B, small (its one write takes
0.25 s, so it lands well before A's even on a loaded CI machine), then goes to the fast prefill.
With deferred release OFF the decode frees A's pages at once, B gets the lowest of them, and A's
in-flight write lands in B's pages while B is decoding (6 s): B's text carries A's sentinel. With it
ON the pages are held until the prefill's drain ACK, B gets other pages, and B's text stays its own.

From 0.5.20 the simulator posts nothing more once the prefill learned of the abort (the room is
failed) and skips queued writes; only the write already in flight lands, so the abort must come
while one is in flight (the prefill's `/sim/state` shows its `pages_in_flight`).

Both requests are pinned to a prefill with `pd_generate`, which sends exactly what the router
forwards (same JSON + bootstrap host/port/room to prefill and decode); the router's own policy would
pick the prefill otherwise.
"""

from __future__ import annotations

import threading

import httpx
import pytest

from kvgate.sim.client import pd_generate
from kvgate.sim.releases import get_release
from tests.assets.sim_setup import sizes
from tests.sim.conftest import state, wait_for

pytestmark = pytest.mark.slow

SENTINEL = "SECRET-OF-A-91d2"
SIZE = 4096  # 256 pages of 16; four 1024-token chunks of 1 s each on the slow prefill
B_SIZE = 64  # 4 pages: B's one write (0.25 s) lands long before A's in-flight one (4 s)


def _a_prompt() -> str:
    return ((SENTINEL + "\n") * (SIZE // len(SENTINEL) + 1))[:SIZE]  # a sentinel line on every page


def _b_prompt() -> str:
    return ("bbbb-own-line\n" * 400)[:B_SIZE]


def _a_in_flight(prefill_url: str) -> bool:
    rooms = state(prefill_url)["rooms"].values()
    return any(r["rid"] == "req-A" and r["pages_in_flight"] > 0 for r in rooms)


def _run(deployment, emulate: str, deferred: bool | None) -> tuple[str, dict]:
    dep = deployment(
        emulate=emulate,
        prefill=2,
        decode=1,
        **sizes(16384, 16384, 65536, 16),
        chunked_prefill_size=1024,
        prefill_tokens_per_s=[1024, 0],
        transfer_tokens_per_s=256,
        decode_tokens_per_s=25,
        deferred_release=deferred,
        router=False,
    )
    slow, fast = dep.prefill_urls
    slow_port, fast_port = dep.bootstrap_ports
    decode = dep.decode_urls[0]
    result: dict = {}

    def run_a() -> None:
        result["A"] = pd_generate(
            slow,
            slow_port,
            decode,
            {"text": _a_prompt(), "rid": "req-A", "sampling_params": {"max_new_tokens": 8}},
            timeout=60,
        )

    th = threading.Thread(target=run_a)
    th.start()
    try:
        assert wait_for(lambda: _a_in_flight(slow), 30)
        assert state(decode)["transfers"]["req-A"]["pages_received"] == 0  # the first write has not landed
        assert httpx.post(decode + "/abort_request", json={"rid": "req-A"}, timeout=10).status_code == 200
        # the abort is handled asynchronously: let the decode retire A before B asks for pages
        assert wait_for(lambda: "req-A" not in state(decode)["transfers"], 30)
        b = pd_generate(
            fast,
            fast_port,
            decode,
            {"text": _b_prompt(), "rid": "req-B", "sampling_params": {"max_new_tokens": 150}},
            timeout=60,
        )
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
    if get_release(emulate).stops_late_chunks_after_abort():
        # the room failed on the abort: only the write already in flight (one 1024-token chunk) landed
        assert dstate["stats"]["late_pages_received"] == SIZE // 4 // 16


def test_deferred_release_on_keeps_pages_until_the_drain_ack(deployment) -> None:
    text, dstate = _run(deployment, "0.5.21", deferred=None)  # on by default from 0.5.21
    assert dstate["deferred_release"] is True
    assert SENTINEL not in text and "bbbb-own-line" in text
    assert dstate["stats"]["late_pages_received"] == 0
