"""The workers' SGLang HTTP surface per emulated release (sglang-surface.md section 1)."""

from __future__ import annotations

import json

import httpx
import pytest

from kvgate.upstream.releases import RELEASES
from tests.assets.sim_setup import sizes
from tests.sim.conftest import generate

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("version", RELEASES)
def test_server_info_keys_per_release(deployment, version: str) -> None:
    dep = deployment(
        emulate=version,
        **sizes(8192, 4096, 65536, 16),
        router=False,
        expose_env_vars=True,
        deferred_release=False,
    )
    n = tuple(int(x) for x in version.split("."))
    for url, mode in ((dep.prefill_urls[0], "prefill"), (dep.decode_urls[0], "decode")):
        info = httpx.get(url + "/server_info", timeout=10).json()
        assert httpx.get(url + "/get_server_info", timeout=10).json().keys() == info.keys()
        assert info["version"] == version
        assert info["disaggregation_mode"] == mode
        assert info["context_length"] == 8192
        assert info["max_total_num_tokens"] == (4096 if mode == "prefill" else 65536)
        assert info["max_req_input_len"] == min(8191, info["max_total_num_tokens"] - 1) - 5
        assert info["page_size"] == 16 and info["status"] == "ready"
        assert ("disaggregation_enable_kv_checksum" in info) == (n >= (0, 5, 21))
        assert ("frontend" in info) == (n >= (0, 5, 21))
        assert ("hicache_object_layout" in info) == (n >= (0, 5, 23))
        assert ("disaggregation_decode_allocation_policy" in info) == (n >= (0, 5, 23))
        state = info["internal_states"][0]
        assert state["memory_usage"]["token_capacity"] == info["max_total_num_tokens"]
        # every resolved arg is repeated (so the arg is always there); 0.5.22+ adds the live role and graph keys
        assert state["disaggregation_mode"] == mode
        assert ("decode_cuda_graph_bs" in state) == (n >= (0, 5, 22))
        assert state["env_vars"]["SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"] == "false"
        model = httpx.get(url + "/model_info", timeout=10).json()
        assert model == httpx.get(url + "/get_model_info", timeout=10).json()
        assert ("disaggregation_mode" in model) == (n >= (0, 5, 21))
        assert httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["max_model_len"] == 8192
        assert httpx.get(url + "/health", timeout=10).status_code == 200
        assert httpx.get(url + "/health_generate", timeout=10).status_code == 200
        assert httpx.get(url + "/ready", timeout=10).status_code == (200 if n >= (0, 5, 20) else 404)


def test_worker_without_bootstrap_room_and_completions_shape(deployment) -> None:
    dep = deployment(emulate="0.5.22", context_length=8192, prefill_pool=4096, decode_pool=65536, page_size=16)
    r = generate(dep.prefill_urls[0], {"text": "hi", "rid": "x1"})
    assert r.status_code == 400
    assert r.json() == {
        "error": {
            "message": ("Invalid request: Disaggregated request received without bootstrap room id. req.rid='x1'")
        }
    }
    info = httpx.get(dep.prefill_urls[0] + "/server_info", timeout=10).json()
    assert "env_vars" not in info["internal_states"][0]  # only with SGLANG_EXPOSE_OWN_ENV_VARS=1
    model = httpx.get(dep.prefill_urls[0] + "/v1/models", timeout=10).json()["data"][0]["id"]
    r = httpx.post(
        dep.router_url + "/v1/completions",
        timeout=30,
        json={"model": model, "prompt": "alpha\nbeta\nalpha\n", "max_tokens": 11},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    # the toy model continues after the last complete line: its distinct lines, cyclically from there
    assert body["choices"][0]["text"] == "beta\nalpha\n"
    assert body["usage"]["prompt_tokens"] == 17 and body["usage"]["completion_tokens"] == 11
    r = httpx.post(
        dep.router_url + "/v1/completions", timeout=30, json={"model": model, "prompt": "z" * 5000, "max_tokens": 4}
    )
    assert r.status_code == 400
    assert "Input length (5000 tokens) exceeds the maximum allowed length (4090 tokens)." in r.text
    # streaming /generate through the router: token events with cumulative text, then [DONE]
    r = generate(dep.router_url, {"text": "one\ntwo\n", "stream": True, "sampling_params": {"max_new_tokens": 4}})
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    assert '"text": "one\\n"' in r.text


def test_streaming_completions_through_the_router(deployment) -> None:
    # waiting_timeout: the over-pool stream below waits for it (SGLang's 300 s would make the test slow)
    dep = deployment(emulate="0.5.21", **sizes(8192, 4096, 65536, 16), waiting_timeout=4)
    model = httpx.get(dep.decode_urls[0] + "/v1/models", timeout=10).json()["data"][0]["id"]
    r = httpx.post(
        dep.router_url + "/v1/completions",
        timeout=30,
        json={"model": model, "prompt": "alpha\nbeta\n", "max_tokens": 11, "stream": True},
    )
    assert r.status_code == 200, r.text
    events = [line[len("data: ") :] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "alpha\nbeta\n"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    # Over the prefill's pool: its door retires the request with a 400 that smg relays to a non-streaming
    # client; a streaming one is relayed from the decode, which is not told and fails on its waiting
    # timeout (what the real 0.5.21 and 0.5.23 servers did).
    over = {"model": model, "prompt": "z" * 5000, "max_tokens": 4}
    r = httpx.post(dep.router_url + "/v1/completions", timeout=30, json=over)
    assert r.status_code == 400
    assert "Input length (5000 tokens) exceeds the maximum allowed length (4090 tokens)." in r.text
    r = httpx.post(dep.router_url + "/v1/completions", timeout=30, json={**over, "stream": True})
    assert "timed out after" in r.text and "KVPoll.WaitingForInput" in r.text, r.text
    assert "Input length" not in r.text
