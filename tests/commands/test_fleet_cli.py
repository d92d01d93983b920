"""`kvgate check --router-url` against simulated fleets behind the REAL router (smg 1.13.0).

Fleets of 16 and 64 use the metadata-only fleet host (kvgate/sim/fleet.py: every worker of the fleet
in one process, no generation) so that a 64-worker fleet costs two processes; the 2-worker fleet
uses full simulated workers. Probes are off (--no-probes): these tests are about the fleet's metadata.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.exitcodes import ExitStatus
from kvgate.reading.discovery import list_router_workers, normalize_url
from kvgate.reading.target import TargetClient
from kvgate.sim.deploy import SimDeployment
from tests.assets.sim_setup import sizes

runner = CliRunner()
CONTEXT = 4096
GOOD_POOL = 8192
SHORT_POOL = 2048


def check(*args: str) -> Any:
    # The simulator runs no sglang code (its release label is the evidence) and --no-probes leaves the
    # probes unobserved on purpose: both opt-outs are explicit, as an operator gating metadata only would.
    return runner.invoke(app, ["check", "--quiet", "--no-probes", "--trust-version", "--no-strict", *args])


def healthy_fleet(deployment: Callable[..., SimDeployment], prefill: int, decode: int, **extra: Any) -> SimDeployment:
    """A light fleet of the fixed release (0.5.22), every pool healthy for the context, behind the real router."""
    return deployment(
        emulate="0.5.22", prefill=prefill, decode=decode, **sizes(CONTEXT, GOOD_POOL, GOOD_POOL), light=True, **extra
    )


def not_passed(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["outcome"] not in ("passed", "inconclusive", "info")]


@pytest.mark.parametrize(
    "prefill,decode,short", [(1, 1, 0), (8, 8, 5), (32, 32, 17)], ids=["2-workers", "16-workers", "64-workers"]
)
def test_router_alone_finds_the_one_short_pool(
    deployment: Callable[..., SimDeployment], prefill: int, decode: int, short: int
) -> None:
    pools = [GOOD_POOL] * prefill
    pools[short] = SHORT_POOL
    dep = deployment(
        emulate="0.5.22",
        prefill=prefill,
        decode=decode,
        **sizes(CONTEXT, pools, GOOD_POOL),
        light=prefill + decode > 2,
    )
    res = check("--router-url", str(dep.router_url), "--format", "json")
    assert res.exit_code == ExitStatus.GATE_FAILED, res.output
    doc = json.loads(res.stdout)
    short_url = dep.prefill_urls[short]
    bad = not_passed(doc)
    assert bad and {short_url in f["node"] for f in bad} == {True}, [f["node"] for f in bad]
    assert {f["check"] for f in bad} >= {"headroom"}
    reached = [
        f
        for f in doc["findings"]
        if f["gate"] == "target" and f["check"] == "reachable" and not f["node"].startswith("router ")
    ]
    assert len(reached) == prefill + decode and all(f["outcome"] == "passed" for f in reached)
    roles = sorted(n["role"] for n in doc["target"]["nodes"])
    assert roles == ["decode"] * decode + ["prefill"] * prefill
    if prefill > 1:
        assert "prefill-admission-consistency" in {f["check"] for f in bad}
    # Never the router's own /get_server_info (it proxies the first prefill only).
    assert all(n["url"] != dep.router_url for n in doc["target"]["nodes"])


def test_real_router_workers_shape_is_what_discovery_reads(deployment: Callable[..., SimDeployment]) -> None:
    dep = healthy_fleet(deployment, 2, 2)
    raw = httpx.get(f"{dep.router_url}/workers", timeout=5).json()
    # The shape smg 1.13.0 really returns (fleet.md section 2), observed rather than assumed.
    assert raw["total"] == 4 and raw["stats"]["prefill_count"] == 2 and raw["stats"]["decode_count"] == 2
    for w in raw["workers"]:
        assert {"url", "worker_type", "status", "is_healthy"} <= set(w)
    assert {w["bootstrap_port"] for w in raw["workers"] if w["worker_type"] == "prefill"} == set(dep.bootstrap_ports)
    assert httpx.get(f"{dep.router_url}/list_workers", timeout=5).status_code == 404  # smg has no /list_workers
    with TargetClient(timeout=5) as client:
        listing = list_router_workers(client, str(dep.router_url))
    assert listing.endpoint == "/workers"
    by_url = {normalize_url(w.url): w for w in listing.workers}
    assert {u: by_url[u].role for u in dep.prefill_urls} == {u: "prefill" for u in dep.prefill_urls}
    assert {u: by_url[u].role for u in dep.decode_urls} == {u: "decode" for u in dep.decode_urls}
    assert {w.status for w in listing.workers} == {"ready"}
    assert {by_url[u].bootstrap_port for u in dep.prefill_urls} == set(dep.bootstrap_ports)


def test_cross_check_names_a_worker_the_gate_was_not_told_about(deployment: Callable[..., SimDeployment]) -> None:
    dep = healthy_fleet(deployment, 2, 2)
    left_out = dep.decode_urls[1]
    res = check(
        "--router-url",
        str(dep.router_url),
        "--prefill-url",
        dep.prefill_urls[0],
        "--prefill-url",
        dep.prefill_urls[1],
        "--decode-url",
        dep.decode_urls[0],
        "--decode-url",
        "http://127.0.0.1:9",
        "--format",
        "json",
    )
    doc = json.loads(res.stdout)
    member = {f["node"]: f["outcome"] for f in doc["findings"] if f["check"] == "router-membership"}
    assert member[f"worker {left_out}"] == "failed"
    assert member["decode[1] http://127.0.0.1:9"] == "inconclusive"
    assert res.exit_code == ExitStatus.GATE_FAILED, res.output


def test_given_role_differs_from_the_router_role(deployment: Callable[..., SimDeployment]) -> None:
    dep = healthy_fleet(deployment, 1, 1)
    # The decode passed as a prefill: the node reports decode, and the router routes it as decode.
    res = check(
        "--router-url",
        str(dep.router_url),
        "--prefill-url",
        dep.decode_urls[0],
        "--decode-url",
        dep.prefill_urls[0],
        "--format",
        "json",
    )
    assert res.exit_code == ExitStatus.GATE_FAILED
    doc = json.loads(res.stdout)
    roles = [f for f in doc["findings"] if f["check"] == "role" and f["outcome"] == "failed"]
    assert len(roles) == 2


def test_router_lists_a_failed_worker(deployment: Callable[..., SimDeployment]) -> None:
    dep = healthy_fleet(
        deployment,
        2,
        2,
        router_args=[
            "--health-check-interval-secs",
            "1",
            "--health-failure-threshold",
            "1",
            "--no-remove-unhealthy-workers",
        ],
    )
    sick = dep.decode_urls[1]
    assert httpx.post(f"{sick}/sim/health", json={"healthy": False}, timeout=5).status_code == 200
    end = time.monotonic() + 30
    entry: dict[str, Any] = {}
    while time.monotonic() < end:
        listed = httpx.get(f"{dep.router_url}/workers", timeout=5).json()["workers"]
        entry = next(w for w in listed if w["url"] == sick)
        if entry["status"] != "ready" or not entry["is_healthy"]:
            break
        time.sleep(0.5)
    # What smg 1.13.0 really does with a worker whose health check fails: not_ready and unhealthy.
    assert (entry["status"], entry["is_healthy"]) == ("not_ready", False), entry
    res = check("--router-url", str(dep.router_url), "--format", "json")
    doc = json.loads(res.stdout)
    status = [f for f in doc["findings"] if f["check"] == "router-status" and sick in f["node"]]
    assert len(status) == 1 and status[0]["outcome"] == "failed", status
    assert "not_ready (unhealthy)" in status[0]["summary"]
    # Not silently skipped: the worker is still read and gated directly.
    assert any(sick in n["url"] for n in doc["target"]["nodes"])
    assert res.exit_code == ExitStatus.GATE_FAILED


def test_baseline_round_trip_on_the_fleet(deployment: Callable[..., SimDeployment], tmp_path: Path) -> None:
    dep = healthy_fleet(deployment, 2, 2)
    base = tmp_path / "fleet-baseline.json"
    first = check("--router-url", str(dep.router_url), "--write-baseline", str(base), "--format", "json")
    assert first.exit_code == ExitStatus.PASSED, first.output
    doc = json.loads(base.read_text())
    assert doc["schema_version"] == 1 and set(doc["workers"]) == set(dep.prefill_urls + dep.decode_urls)
    again = check("--router-url", str(dep.router_url), "--baseline", str(base), "--format", "json")
    assert again.exit_code == ExitStatus.PASSED, again.output
    drift = [f for f in json.loads(again.stdout)["findings"] if f["gate"] == "baseline"]
    assert len(drift) == 4 and {f["outcome"] for f in drift} == {"passed"}


def test_dp_aware_router_lists_ranks_and_each_worker_is_read_once(deployment: Callable[..., SimDeployment]) -> None:
    dep = healthy_fleet(
        deployment,
        1,
        1,
        dp_size=2,
        router_args=["--dp-aware"],
    )
    raw = httpx.get(f"{dep.router_url}/workers", timeout=5).json()["workers"]
    # What smg 1.13.0 --dp-aware really lists: one entry per rank, `url@rank` plus dp_base_url/dp_rank/dp_size.
    assert sorted(w["url"] for w in raw) == sorted(
        f"{u}@{r}" for u in dep.prefill_urls + dep.decode_urls for r in (0, 1)
    )
    assert {(w["dp_base_url"] in w["url"], w["dp_size"]) for w in raw} == {(True, 2)}
    res = check("--router-url", str(dep.router_url), "--format", "json")
    assert res.exit_code == ExitStatus.PASSED, res.output
    nodes = json.loads(res.stdout)["target"]["nodes"]
    assert sorted((n["url"], n["dp_ranks"]) for n in nodes) == sorted(
        (u, 2) for u in dep.prefill_urls + dep.decode_urls
    )
