"""`kvgate soak` against simulated PD deployments over real sockets: a healthy release passes every slice
at the defaults; the gradual drift (switched on at start) and a load fault (switched on mid-run through
POST /sim/fault) each fail the soak in the slice where they begin, naming the slice, the request and what
changed; the report is written in every case."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvgate.sim import faults
from tests.soak.helpers import slices, soak

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SHAPE: dict[str, Any] = {
    "emulate": "0.5.23",
    "context_length": 4096,
    "prefill_pool": 16384,
    "decode_pool": 16384,
    "page_size": 16,
}


def _first_failed(doc: dict[str, Any]) -> dict[str, Any]:
    bad = [s for s in slices(doc) if s["verdict"] == "failed"]
    assert bad, slices(doc)
    before = [s for s in slices(doc) if s["index"] < bad[0]["index"]]
    assert all(s["verdict"] == "passed" for s in before), [
        (f["node"], f["outcome"], f["summary"][:400]) for f in doc["findings"] if f["outcome"] != "passed"
    ]
    return bad[0]


def _covers(s: dict[str, Any], doc: dict[str, Any], wall: float) -> bool:
    """The slice's covered span (since the previous slice's checks ended) holds this wall-clock instant."""
    t0 = doc["cost"]["soak"]["t0_unix"]
    lo, hi = s["covered_s"]
    return t0 + lo - 0.01 <= wall <= t0 + hi + 0.01


def test_a_healthy_release_passes_the_whole_soak_at_the_defaults(
    deployment: Callable[..., Any], tmp_path: Path
) -> None:
    dep = deployment(**SHAPE)
    code, doc, page, out = soak(dep.router_url, tmp_path)
    assert code == 0, out
    got = slices(doc)
    assert len(got) == 4 and all(s["verdict"] == "passed" for s in got)
    for s in got:
        assert [c["check"] for c in s["content"]] == ["canary", "isolation", "handoff"]
        assert s["stats"]["requests"] > 0 and s["stats"]["errors"] == 0
    run = doc["cost"]["soak"]["run"]
    assert {lv["name"] for lv in run["levels"]} >= {"ttft_p99_s", "itl_p99_s", "e2e_p99_s", "error_rate", "goodput"}
    assert all(lv["met"] for lv in run["levels"])
    assert run["stats"]["cancelled"] >= 0 and run["stats"]["served"] > 0
    # the mix's buckets are planned on the deployment: the near-limit prompt at the longest accepted length
    lengths = doc["cost"]["soak"]["lengths"]
    assert lengths["short"] < lengths["medium"] < lengths["long"] < lengths["near_limit"]
    assert 0.95 * 4096 < lengths["near_limit"] < 4096
    pool = doc["cost"]["soak"]["pool"]
    assert pool["samples"] and not pool["problems"]
    assert any(v > 0 for _, got_ in pool["samples"] for v in got_.values())  # the load used the pool
    assert page.is_file() and "<svg" in page.read_text()


def test_the_gradual_drift_fails_the_soak_in_the_slice_where_it_begins(
    deployment: Callable[..., Any], tmp_path: Path
) -> None:
    dep = deployment(**SHAPE, extra_env={faults.ENV: faults.GRADUAL_DRIFT, faults.DRIFT_ENV: "80"})
    code, doc, page, out = soak(dep.router_url, tmp_path)
    assert code == 1, out
    state = httpx.get(dep.decode_urls[0] + "/sim/state", timeout=10).json()
    since = state["drift_since"]
    assert since is not None and state["stats"]["drifted"] > 0
    bad = _first_failed(doc)
    assert _covers(bad, doc, since), (bad, since)
    failed = [f for f in doc["findings"] if f["outcome"] == "failed" and f["check"] == "content"]
    first = failed[0]["summary"]
    # names the slice and what changed: a confident token of a golden prompt, or decode vs prefill
    assert first.startswith(f"slice {bad['index']} (")
    assert "changed a token the model was confident of alone" in first or "differs from what prefill computes" in first
    assert "stopped after slice" in failed[-1]["summary"]  # the soak ends at the failed slice
    assert "failed" in page.read_text()


@pytest.mark.parametrize("fault", faults.LOAD_FAULTS)
def test_a_load_fault_switched_on_mid_run_fails_the_soak_in_that_slice(
    deployment: Callable[..., Any], tmp_path: Path, fault: str
) -> None:
    dep = deployment(**SHAPE)
    switched: list[float] = []

    def switch() -> None:
        time.sleep(5.0)  # well into the soak (the golden set and a slice or two before it)
        switched.append(time.time())
        r = httpx.post(dep.decode_urls[0] + "/sim/fault", json={"fault": fault}, timeout=10)
        assert r.status_code == 200

    t = threading.Thread(target=switch)
    t.start()
    try:
        code, doc, _page, out = soak(dep.router_url, tmp_path, "--duration", "16")
    finally:
        t.join()
    assert code == 1, out
    bad = _first_failed(doc)
    # the fault strikes from the switch on; the slice that fails is the one covering it or the next
    # (a slice's requests are its own only when they started in its window)
    t0 = doc["cost"]["soak"]["t0_unix"]
    assert bad["covered_s"][1] >= switched[0] - t0
    assert _covers(bad, doc, switched[0]) or _covers(slices(doc)[bad["index"] - 2], doc, switched[0])
    summary = next(f["summary"] for f in doc["findings"] if f["outcome"] == "failed")
    assert summary.startswith(f"slice {bad['index']} (")
    # what changed: the room check's abort, another request's sentinel, a changed confident token, or the
    # handoff check's decode answer against prefill's own KV (the slice's checks may meet the fault before
    # any load request does: seen on a loaded host)
    said = (
        "corruption",
        "another request's content",
        "changed a token the model was confident of alone",
        "differs from what prefill computes",
    )
    assert any(s in summary for s in said), summary


def test_a_bad_soak_section_is_a_usage_error_with_the_report_written(tmp_path: Path) -> None:
    prof = tmp_path / "p.yaml"
    prof.write_text("schema: 1\nname: p\nsoak:\n  slo:\n    ttft_p99: 3\n")
    code, doc, page, out = soak("http://127.0.0.1:9", tmp_path, "--profile", str(prof))
    assert code == 2, out
    assert "soak.slo.ttft_p99" in doc["findings"][0]["summary"]
    assert page.is_file()


def test_an_unreachable_router_exits_4_with_the_report_written(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, doc, page, out = soak(f"http://127.0.0.1:{port}", tmp_path, "--timeout", "2")
    assert code == 4, out
    assert page.is_file() and doc["verdict"]
