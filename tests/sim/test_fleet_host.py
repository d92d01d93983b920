"""The metadata-only fleet host: many workers in one process, the full worker's documents, no generation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from kvgate.sim.deploy import SimDeployment
from tests.assets.sim_setup import sizes


def _shape(doc: Any) -> Any:
    """Keys and value types, recursively: what must match between the full and the light worker."""
    if isinstance(doc, dict):
        return {k: _shape(v) for k, v in doc.items() if k not in ("launch_command",)}
    if isinstance(doc, list):
        return [_shape(v) for v in doc]
    return type(doc).__name__


def test_light_workers_answer_like_full_workers(deployment: Callable[..., SimDeployment]) -> None:
    kw = dict(
        emulate="0.5.23",
        prefill=1,
        decode=1,
        **sizes(4096, 1000, 8192, 16),
        router=False,
    )
    full = deployment(**kw)
    light = deployment(light=True, **kw)
    assert len(light.pids) == 1  # both workers in one process
    for path in ("/server_info", "/get_server_info", "/model_info", "/v1/models"):
        for a, b in ((full.prefill_urls[0], light.prefill_urls[0]), (full.decode_urls[0], light.decode_urls[0])):
            got, want = httpx.get(b + path, timeout=10).json(), httpx.get(a + path, timeout=10).json()
            assert _shape(got) == _shape(want), path
            for key in ("max_total_num_tokens", "max_req_input_len", "disaggregation_mode", "version", "page_size"):
                assert got.get(key) == want.get(key), (path, key)
    info = httpx.get(light.prefill_urls[0] + "/server_info", timeout=10).json()
    assert info["max_total_num_tokens"] == 992 and info["max_req_input_len"] == 986  # whole pages; min(...)-5


def test_light_workers_do_not_generate_and_their_health_can_be_switched(
    deployment: Callable[..., SimDeployment],
) -> None:
    dep = deployment(emulate="0.5.22", prefill=1, decode=2, context_length=4096, light=True, router=False)
    url = dep.decode_urls[1]
    res = httpx.post(url + "/generate", json={"text": "hi"}, timeout=10)
    assert res.status_code == 501 and "STUB" in res.json()["message"]
    assert httpx.get(url + "/health", timeout=10).status_code == 200
    assert httpx.post(url + "/sim/health", json={"healthy": False}, timeout=10).status_code == 200
    assert httpx.get(url + "/health", timeout=10).status_code == 503
    assert httpx.get(dep.decode_urls[0] + "/health", timeout=10).status_code == 200  # only that worker
