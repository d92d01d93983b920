"""`--fixed-by kvgate-backport[-hardened]`: 0.5.20 plus kvgate's own series (issue 6), and a short
handoff that no release catches: with --allow-auto-truncate each worker truncates to its OWN limit, so
a prefill with a small pool sends fewer tokens than the decode reserved (a simulator prediction from
the code paths it models, not observed on a real SGLang)."""

from __future__ import annotations

import pytest

from tests.sim.conftest import SMALL_INCIDENT, generate, sentinel_prompt, state, wait_for

pytestmark = pytest.mark.slow

SENTINEL = "PLANTED-9e4a"


def _scenario(deployment, waiting_timeout: float = 120, **kw):
    dep = deployment(
        **SMALL_INCIDENT,
        waiting_timeout=waiting_timeout,
        **kw,
    )
    # The plant's answer echoes its sentinel; the decode writes that answer's KV after the prompt
    # (slots 1000..1299), beyond what a truncating prefill will send for the next request.
    r = generate(dep.router_url, {"text": sentinel_prompt(SENTINEL, 1000), "sampling_params": {"max_new_tokens": 300}})
    assert r.status_code == 200 and SENTINEL in r.json()["text"], r.text
    return dep


TRUNCATED = [ord("z")] * 10 + [10] + [ord("q")] * 1989 + [10]  # 2001 tokens > the prefill limit (1018)


def test_backport_on_0520_retires_at_the_door(deployment) -> None:
    # Like #38935 the backport's door tells the decode nothing (backports/v0.5.20/0001-*.patch): the
    # decode waits for the KV until its waiting timeout, 4 s here instead of SGLang's 300 s.
    timeout = 4.0
    dep = _scenario(deployment, waiting_timeout=timeout, emulate="0.5.20", fixed_by="kvgate-backport")
    r = generate(dep.router_url, {"input_ids": [ord("z")] * 2000, "sampling_params": {"max_new_tokens": 64}})
    assert r.status_code == 400 and "Input length (2000 tokens) exceeds" in r.text and SENTINEL not in r.text
    decode = dep.decode_urls[0]
    assert state(decode)["deferred_release"] is True  # the series turns it on by default
    # Freed once the decode's wait ends (the router's dropped connection, or the waiting timeout) and
    # the prefill, with nothing in flight for the room, acknowledged the abort: no 30 s hold.
    assert wait_for(lambda: state(decode)["free_pages"] == state(decode)["num_pages"], 15)
    # A streaming client, whose answer smg relays from the decode, gets the decode's timeout, not the 400.
    r = generate(
        dep.router_url, {"input_ids": [ord("z")] * 2000, "sampling_params": {"max_new_tokens": 64}, "stream": True}
    )
    assert "KVPoll.WaitingForInput" in r.text and "Input length" not in r.text, r.text
    assert wait_for(lambda: state(decode)["free_pages"] == state(decode)["num_pages"], 15)


def test_auto_truncate_short_handoff_leaks_even_on_0522(deployment) -> None:
    dep = _scenario(deployment, emulate="0.5.22", allow_auto_truncate=True)
    r = generate(dep.router_url, {"input_ids": TRUNCATED, "sampling_params": {"max_new_tokens": 2000}})
    assert r.status_code == 200 and r.json()["meta_info"]["prompt_tokens"] == 2001
    assert SENTINEL in r.json()["text"]  # decode read past what the truncating prefill sent


def test_hardened_backport_refuses_the_short_handoff(deployment) -> None:
    dep = _scenario(deployment, emulate="0.5.20", fixed_by="kvgate-backport-hardened", allow_auto_truncate=True)
    r = generate(dep.router_url, {"input_ids": TRUNCATED, "sampling_params": {"max_new_tokens": 2000}})
    assert r.status_code >= 500 and "coverage mismatch" in r.text and SENTINEL not in r.text
