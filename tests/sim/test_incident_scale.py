"""The incident's numbers end to end (incident.md section 1): context 1,048,576, prefill pool 681,280."""

from __future__ import annotations

import httpx
import pytest

from tests.sim.conftest import generate, sentinel_prompt

pytestmark = pytest.mark.slow

CONTEXT, PREFILL_POOL, DECODE_POOL = 1_048_576, 681_280, 2_097_152
LIMIT = min(CONTEXT - 1, PREFILL_POOL - 1) - 5  # 681,274
SENTINEL = "TENANT-A-SECRET-5b7f"


def _prompt(n: int) -> dict:
    return {"text": ("x" * 100 + "\n") * (n // 101) + "y" * (n % 101), "sampling_params": {"max_new_tokens": 256}}


def _dep(deployment, emulate: str):
    return deployment(
        emulate=emulate, context_length=CONTEXT, prefill_pool=PREFILL_POOL, decode_pool=DECODE_POOL, page_size=16
    )


def test_incident_numbers_on_0519_leak(deployment) -> None:
    dep = _dep(deployment, "0.5.19")
    info = httpx.get(dep.prefill_urls[0] + "/server_info", timeout=10).json()
    assert info["max_total_num_tokens"] == PREFILL_POOL and info["max_req_input_len"] == LIMIT
    # the worker reports the effective context; smg's own /v1/models has no max_model_len
    assert httpx.get(dep.decode_urls[0] + "/v1/models", timeout=10).json()["data"][0]["max_model_len"] == CONTEXT
    r = generate(dep.router_url, {"text": sentinel_prompt(SENTINEL, 600_000), "sampling_params": {"max_new_tokens": 8}})
    assert r.status_code == 200
    r = generate(dep.router_url, _prompt(700_000))
    assert r.status_code == 200, r.text[:500]
    assert SENTINEL in r.json()["text"]
    assert r.json()["meta_info"]["prompt_tokens"] == 700_000


def test_incident_numbers_on_0522_reject_and_serve(deployment) -> None:
    dep = _dep(deployment, "0.5.22")
    r = generate(dep.router_url, _prompt(700_000))
    assert r.status_code == 400
    assert (
        f"Input length (700000 tokens) exceeds the maximum allowed length ({LIMIT} tokens). "
        "Use a shorter input or enable --allow-auto-truncate."
    ) in r.json()["error"]["message"]
    r = generate(dep.router_url, _prompt(CONTEXT))
    assert r.status_code == 400
    # smg relays whichever worker's 400 comes first (the prefill's wraps the raw body); same message
    assert (
        f"The input ({CONTEXT} tokens) is longer than the model's context length ({CONTEXT} tokens)."
        in r.json()["error"]["message"]
    )
    r = generate(dep.router_url, _prompt(LIMIT - 1))  # the longest accepted prompt is served for real
    assert r.status_code == 200 and r.json()["meta_info"]["prompt_tokens"] == LIMIT - 1
    assert "x" * 100 in r.json()["text"]
