"""Each release's behaviour for an over-pool prompt, end to end: worker processes, the TCP KV
transfer and the real smg router. Scenario (incident.md section 2 at small scale): prefill pool <
prompt < context, decode pool large; an earlier request planted a sentinel in pages that are now free.
"""

from __future__ import annotations

import concurrent.futures as cf
import time

import httpx
import pytest

from tests.assets.sim_setup import sizes
from tests.sim.conftest import (
    CONTEXT,
    DECODE_POOL,
    PAGE,
    PREFILL_POOL,
    SMALL_INCIDENT,
    generate,
    sentinel_prompt,
    state,
    wait_for,
)

pytestmark = pytest.mark.slow

LIMIT = min(CONTEXT - 1, PREFILL_POOL - 1) - 5  # prefill max_req_input_len = 1018
OVER = 2000  # prefill rejects (>= LIMIT), decode and context accept
SENTINEL = "SENTINEL-7c1e-canary"
INPUT_MSG = (
    f"Input length ({OVER} tokens) exceeds the maximum allowed length ({LIMIT} tokens). "
    "Use a shorter input or enable --allow-auto-truncate."
)


def _plant(router: str) -> None:
    r = generate(router, {"text": sentinel_prompt(SENTINEL, 900), "sampling_params": {"max_new_tokens": 16}})
    assert r.status_code == 200, r.text


def _over_pool(stream: bool = False, n: int = OVER) -> dict:
    return {"input_ids": [ord("z")] * (n - 1) + [10], "sampling_params": {"max_new_tokens": 256}, "stream": stream}


def test_0519_leaks_stale_pages_under_http_200(deployment) -> None:
    dep = deployment(emulate="0.5.19", **SMALL_INCIDENT)
    info = httpx.get(dep.prefill_urls[0] + "/server_info", timeout=10).json()
    assert info["max_req_input_len"] == LIMIT and info["max_total_num_tokens"] == PREFILL_POOL
    _plant(dep.router_url)
    r = generate(dep.router_url, _over_pool())
    assert r.status_code == 200, r.text
    body = r.json()
    assert SENTINEL in body["text"]  # another request's content, served as this one's answer
    assert body["meta_info"]["prompt_tokens"] == OVER  # looks like the caller's prompt was processed
    d = state(dep.decode_urls[0])
    assert d["stats"]["kv_pages_received"] >= 1
    # exactly at the limit the rejection path fires too; one token under, the prompt is served normally
    r = generate(dep.router_url, _over_pool(n=LIMIT))
    assert r.status_code == 200 and SENTINEL in r.json()["text"]
    r = generate(dep.router_url, _over_pool(n=LIMIT - 1))
    assert r.status_code == 200 and SENTINEL not in r.json()["text"] and "zzz" in r.json()["text"]


def test_0520_no_leak_but_decode_hangs_until_waiting_timeout(deployment) -> None:
    timeout = 3.0
    dep = deployment(
        emulate="0.5.20",
        **SMALL_INCIDENT,
        waiting_timeout=timeout,
    )
    _plant(dep.router_url)
    decode = dep.decode_urls[0]
    # Streaming: smg relays the decode's stream, so the client sees the error only after the timeout.
    t0 = time.monotonic()
    r = generate(dep.router_url, _over_pool(stream=True))
    elapsed = time.monotonic() - t0
    assert SENTINEL not in r.text
    assert "timed out after" in r.text and "KVPoll.WaitingForInput" in r.text, r.text
    assert elapsed >= timeout
    assert wait_for(lambda: state(decode)["free_pages"] == state(decode)["num_pages"], 15)
    # Non-streaming: smg answers with the prefill's 400 at once; the decode still holds its
    # reservation (nothing will ever arrive) until its timeout or its disconnect check.
    r = generate(dep.router_url, _over_pool())
    assert r.status_code == 400 and INPUT_MSG in r.json()["error"]["message"]
    held = state(decode)
    assert held["transfers"] and held["free_pages"] < held["num_pages"]
    assert wait_for(lambda: state(decode)["free_pages"] == state(decode)["num_pages"], 15)
    assert state(decode)["stats"]["kv_pages_received"] == 57  # only the planting request's pages


@pytest.mark.parametrize("version", ["0.5.21", "0.5.23"])
def test_0521_plus_door_reject_is_a_400_but_the_decode_is_not_told(deployment, version: str) -> None:
    """The real 0.5.21 and 0.5.23 servers (CPU, behind smg 1.13.0): the prefill retires the request at
    its door and tells nobody; the decode waits for the KV until its waiting timeout. A non-streaming
    client gets the prefill's 400 at once, a streaming one (smg relays the decode) waits for that
    timeout. A 5 s waiting timeout instead of SGLang's 300 s keeps the test short."""
    timeout = 5.0
    dep = deployment(
        emulate=version,
        **SMALL_INCIDENT,
        waiting_timeout=timeout,
    )
    _plant(dep.router_url)
    decode, prefill = dep.decode_urls[0], dep.prefill_urls[0]
    received = state(decode)["stats"]["kv_pages_received"]
    t0 = time.monotonic()
    r = generate(dep.router_url, _over_pool())
    assert time.monotonic() - t0 < timeout  # the prefill's own answer, not the decode's timeout
    assert r.status_code == 400
    assert INPUT_MSG in r.json()["error"]["message"] and SENTINEL not in r.text
    # The decode was not told: it holds its reservation until it notices the router's dropped
    # connection (SGLANG_REQUEST_STATE_WAIT_TIMEOUT, 4 s), far below its waiting timeout in SGLang.
    assert wait_for(lambda: bool(state(decode)["transfers"]), 3)
    assert wait_for(lambda: state(decode)["free_pages"] == state(decode)["num_pages"], 15)
    t0 = time.monotonic()
    r = generate(dep.router_url, _over_pool(stream=True))
    assert time.monotonic() - t0 >= timeout
    assert r.status_code == 200  # the decode's failure arrives as a stream chunk
    assert "timed out after" in r.text and "KVPoll.WaitingForInput" in r.text, r.text
    assert INPUT_MSG not in r.text and SENTINEL not in r.text  # the prefill's 400 never reaches this client
    # The timed-out decode tells the prefill, which has nothing in flight for the room and acknowledges
    # at once: the deferred release (on from 0.5.21) frees without its 30 s hold.
    assert wait_for(lambda: state(decode)["free_pages"] == state(decode)["num_pages"], 15)
    assert state(prefill)["rooms"] == {}  # no registration is left behind
    assert state(decode)["stats"]["kv_pages_received"] == received  # no KV moved for the rejected ones


@pytest.mark.parametrize("version", ["0.5.20", "0.5.22"])
def test_a_rejected_stream_holds_a_small_decode_pool_until_the_waiting_timeout(deployment, version: str) -> None:
    """What the real 0.5.20-0.5.23 servers did with a small decode pool: the decode's reservation for a
    prefill-rejected streaming request stays until the waiting timeout, even after the client gave up,
    and the next request queues behind it. A 6 s waiting timeout stands in for SGLang's 300 s."""
    timeout = 6.0
    small_pool = 160 * PAGE  # room for one over-pool reservation (126 pages), not two requests
    dep = deployment(
        emulate=version,
        **sizes(CONTEXT, PREFILL_POOL, small_pool, PAGE),
        waiting_timeout=timeout,
    )
    decode = dep.decode_urls[0]
    t0 = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):  # the client gives up long before the decode does
        generate(dep.router_url, _over_pool(stream=True), timeout=1.5)
    held = state(decode)
    assert held["transfers"] and held["free_pages"] < held["num_pages"]
    r = generate(dep.router_url, {"text": "next tenant\n" * 80, "sampling_params": {"max_new_tokens": 12}})
    waited = time.monotonic() - t0
    assert r.status_code == 200 and r.json()["text"] == "next tenant\n", r.text
    assert waited >= timeout  # it queued until the abandoned reservation timed out
    assert waited < timeout + 20  # and no longer: no 30 s deferred-release hold on top (0.5.22)


def test_context_overflow_is_a_tokenizer_stage_400(deployment) -> None:
    dep = deployment(emulate="0.5.22", **SMALL_INCIDENT)
    r = generate(dep.router_url, _over_pool(n=CONTEXT))
    assert r.status_code == 400
    # smg relays whichever worker's 400 comes first (the prefill's wraps the raw body); same message
    assert (
        f"The input ({CONTEXT} tokens) is longer than the model's context length ({CONTEXT} tokens)."
        in r.json()["error"]["message"]
    )


def test_several_prefill_and_decode_workers_serve_their_own_content(deployment) -> None:
    dep = deployment(
        emulate="0.5.22",
        prefill=2,
        decode=2,
        **SMALL_INCIDENT,
    )

    def one(i: int) -> tuple[int, str]:
        r = generate(dep.router_url, {"text": f"request-{i}-line\n" * 30, "sampling_params": {"max_new_tokens": 17}})
        assert r.status_code == 200, r.text
        return i, r.json()["text"]

    with cf.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(8)))
    for i, text in results:
        assert text.startswith(f"request-{i}-line\n")  # its own prompt, nobody else's
    served = [state(u)["stats"]["requests"] for u in dep.prefill_urls + dep.decode_urls]
    assert sum(served[:2]) == 8 and sum(served[2:]) == 8


def test_latency_signal_leaky_answer_is_faster_than_a_real_prefill(deployment) -> None:
    """incident.md section 5, signal 3: prefill time grows with length; the leak skips the prefill."""
    tps = 2000.0
    dep = deployment(
        emulate="0.5.19",
        **SMALL_INCIDENT,
        prefill_tokens_per_s=tps,
    )
    t0 = time.monotonic()
    ok = generate(dep.router_url, _over_pool(n=1000))
    accepted_s = time.monotonic() - t0
    assert ok.status_code == 200 and ok.json()["meta_info"]["prompt_tokens"] == 1000
    assert accepted_s >= 1000 / tps  # a real 1000-token prefill cannot be faster than the configured speed
    t0 = time.monotonic()
    leak = generate(dep.router_url, _over_pool(n=OVER))
    leaky_s = time.monotonic() - t0
    assert leak.status_code == 200 and leak.json()["meta_info"]["prompt_tokens"] == OVER
    assert leaky_s < accepted_s  # twice the prompt, answered faster: only the one-token placeholder ran


def test_kv_transfer_takes_time_when_bandwidth_is_set(deployment) -> None:
    dep = deployment(
        emulate="0.5.22",
        **sizes(CONTEXT, 4096, DECODE_POOL, PAGE),
        prefill_tokens_per_s=0,
        transfer_tokens_per_s=4096,
    )
    t0 = time.monotonic()
    r = generate(dep.router_url, {"text": "payload line\n" * 230, "sampling_params": {"max_new_tokens": 13}})
    assert r.status_code == 200 and r.json()["text"] == "payload line\n"
    assert time.monotonic() - t0 >= 2990 / 4096  # the pages were in flight for size / bandwidth
