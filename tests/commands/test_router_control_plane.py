"""The router as smg 1.13.0 really works: control-plane auth, the probe listener, draining, /get_loads.

Each test starts the REAL `smg` the project installs (`.venv/bin/smg`, command line from
kvgate/deploy/pdstart.py `router_argv`) in front of simulated metadata workers, over real sockets. Where smg
1.13.0 does not fill a feature (per-rank pools in /get_loads for HTTP PD workers), the test says so
and a server shaped from smg's own response types stands in for the router.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.deploy.pdstart import router_argv
from kvgate.exitcodes import ExitStatus
from kvgate.gates.fleet import router_status
from kvgate.pipeline.router import router_readiness
from kvgate.reading.discovery import list_router_workers
from kvgate.reading.target import TargetClient
from kvgate.sim.deploy import SimDeployment
from tests.assets.sim_setup import sizes
from tests.conftest import PayloadServer, Route

runner = CliRunner()
ADMIN_KEY = "kvg-admin-7Qm2Xr9LpT4wZs1N"  # a test key; it must never appear in any output
SECRET_ENV = "KVGATE_TEST_ROUTER_KEY"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check(*args: str, env: dict[str, str] | None = None) -> Any:
    # The simulator runs no sglang code and --no-probes is an explicit opt-out: both said explicitly.
    return runner.invoke(app, ["check", "--quiet", "--no-probes", "--trust-version", "--no-strict", *args], env=env)


class Smg:
    """The real smg over a worker-only simulated deployment, with the extra flags a test needs."""

    def __init__(self, dep: SimDeployment, extra: list[str], log: Path) -> None:
        self.port, self.health_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.health_url = f"http://127.0.0.1:{self.health_port}"
        argv = router_argv(
            prefill=list(zip(dep.prefill_urls, dep.bootstrap_ports, strict=True)),
            decode=list(dep.decode_urls),
            host="127.0.0.1",
            port=self.port,
            prometheus_port=free_port(),
            extra=["--health-check-port", str(self.health_port), "--health-check-interval-secs", "1", *extra],
        )
        self._log = log.open("w")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)
        self.want = len(dep.prefill_urls) + len(dep.decode_urls)

    def wait(self, deadline_s: float = 120.0) -> None:
        """Until its public /readiness counts every worker healthy."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            assert self.proc.poll() is None, "smg exited"
            try:
                doc = httpx.get(self.url + "/readiness", timeout=2).json()
                # Before its first health pass smg answers 503 with no counts at all: not ready yet.
                healthy, total = doc.get("healthy_workers"), doc.get("total_workers")
                # --dp-aware counts one entry per rank: every entry healthy, at least one per worker
                if isinstance(healthy, int) and isinstance(total, int) and healthy == total >= self.want:
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        raise AssertionError("smg never counted every worker healthy")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._log.close()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Callable[..., tuple[SimDeployment, Smg]]]:
    started: list[tuple[SimDeployment, Smg]] = []

    def make(extra: list[str], decode: int = 1, dp_size: int = 1) -> tuple[SimDeployment, Smg]:
        dep = SimDeployment(
            emulate="0.5.22",
            prefill=1,
            decode=decode,
            **sizes(4096, 8192, 8192),
            light=True,
            router=False,
            dp_size=dp_size,
        ).start()
        smg = Smg(dep, extra, tmp_path / f"smg-{len(started)}.log")
        started.append((dep, smg))
        smg.wait()
        return dep, smg

    yield make
    for dep, smg in started:
        smg.stop()
        dep.stop()


AUTH = ["--control-plane-api-keys", f"k1:kvgate:admin:{ADMIN_KEY}"]


def _finding(doc: dict[str, Any], gate: str, check_id: str) -> dict[str, Any]:
    return next(f for f in doc["findings"] if f["gate"] == gate and f["check"] == check_id)


def test_a_listing_refused_for_lack_of_a_router_token_says_so(fleet: Callable[..., Any]) -> None:
    """smg 1.13.0 with --control-plane-api-keys: /workers is 401 without a key, /readiness stays public."""
    _, smg = fleet(AUTH)
    assert httpx.get(smg.url + "/workers", timeout=5).status_code == 401  # observed, not assumed
    assert httpx.get(smg.url + "/readiness", timeout=5).status_code == 200
    res = check("--router-url", smg.url, "--format", "json")
    assert res.exit_code == ExitStatus.TRANSPORT_ERROR, res.output
    f = _finding(json.loads(res.stdout), "fleet", "router-list")
    assert f["outcome"] == "error"
    assert "for lack of a router token" in f["summary"] and "--router-token-env" in f["summary"]


def test_the_router_token_from_the_environment_lists_and_never_shows(fleet: Callable[..., Any]) -> None:
    _, smg = fleet(AUTH)
    env = {SECRET_ENV: ADMIN_KEY}
    res = check("--router-url", smg.url, "--router-token-env", SECRET_ENV, "--format", "json", env=env)
    assert res.exit_code == ExitStatus.PASSED, res.output
    doc = json.loads(res.stdout)
    assert _finding(doc, "fleet", "router-list")["outcome"] == "passed"
    assert len(doc["target"]["nodes"]) == 2
    table = check("--router-url", smg.url, "--router-token-env", SECRET_ENV, "--verbose", env=env)
    for out in (res.output, table.output):
        assert ADMIN_KEY not in out and ADMIN_KEY[:8] not in out and ADMIN_KEY[-8:] not in out
    wrong = check(
        "--router-url",
        smg.url,
        "--router-token-env",
        SECRET_ENV,
        "--format",
        "json",
        env={SECRET_ENV: "kvg-wrong-key-1"},
    )
    assert wrong.exit_code == ExitStatus.TRANSPORT_ERROR, wrong.output
    f = _finding(json.loads(wrong.stdout), "fleet", "router-list")
    assert "refused the token from --router-token-env" in f["summary"]
    assert "kvg-wrong-key-1" not in wrong.output
    unset = check("--router-url", smg.url, "--router-token-env", "KVGATE_TEST_UNSET_VAR", env={})
    assert unset.exit_code == ExitStatus.USAGE_ERROR and "--router-token-env KVGATE_TEST_UNSET_VAR" in unset.output


def test_readiness_is_read_where_the_router_serves_its_probes(fleet: Callable[..., Any]) -> None:
    """smg 1.13.0 --health-check-port serves /readiness on its own listener (smg #1711)."""
    _, smg = fleet([])
    assert httpx.get(smg.health_url + "/readiness", timeout=5).json()["status"] == "ready"
    res = check("--router-url", smg.url, "--router-health-url", smg.health_url, "--format", "json")
    assert res.exit_code == ExitStatus.PASSED, res.output
    f = _finding(json.loads(res.stdout), "fleet", "router-readiness")
    assert f["outcome"] == "passed" and f["node"] == f"router {smg.health_url}"
    assert any(e["field"] == f"{smg.health_url}/readiness healthy_workers / total_workers" for e in f["evidence"])


def test_a_draining_worker_is_not_routable_and_not_failed(fleet: Callable[..., Any]) -> None:
    """smg 1.13.0: DELETE /workers/{worker_id} drains the worker for a few seconds (drain_settle_secs 5):
    listed `is_healthy: false, status: draining`, and /readiness counts it not healthy. That is a drain
    (inconclusive: no new requests), never a failed health check."""
    dep, smg = fleet([], decode=2)
    with TargetClient(timeout=5) as client:
        before = list_router_workers(client, smg.url)
        gone = next(w for w in before.workers if w.role == "decode")
        assert gone.worker_id  # the router's key: what DELETE /workers/{worker_id} names
        assert httpx.delete(f"{smg.url}/workers/{gone.worker_id}", timeout=5).status_code == 202
        end = time.monotonic() + 3
        while True:
            listing = list_router_workers(client, smg.url)
            entry = next((w for w in listing.workers if w.url == gone.url), None)
            if entry is not None and entry.draining:
                break
            assert time.monotonic() < end, "smg never listed the worker as draining"
        assert entry.healthy is False and entry.ready is False  # "healthy" is not "routable"
        readiness = router_readiness(client, smg.health_url, listing)
        statuses = router_status(listing, {})
    [drained] = [f for f in statuses if gone.url in f.node]
    assert drained.outcome.value == "inconclusive" and "draining" in drained.summary
    assert any(e.field == "router worker_id" and gone.worker_id in str(e.value) for e in drained.evidence)
    [r] = readiness
    assert r.outcome.value == "inconclusive" and "2 of 3" in r.summary, r.summary
    assert gone.worker_id in r.summary


def test_get_loads_of_smg_1_13_is_empty_for_http_pd_workers_and_is_not_agreement(fleet: Callable[..., Any]) -> None:
    """smg 1.13.0 answers /get_loads `loads: []` for HTTP-connected PD workers (its load snapshots come
    from its gRPC workers); kvgate says it compared nothing, never that the pools agree. No released smg
    fills it for HTTP workers (1.13.0 is the newest on the package index), so the comparison itself is
    tested against a server shaped from smg 1.13.0's own response types, below."""
    _, smg = fleet(AUTH)
    refused = httpx.get(smg.url + "/get_loads", timeout=5)
    assert refused.status_code == 401 and "control-plane" in refused.headers.get("www-authenticate", "")
    doc = httpx.get(smg.url + "/get_loads", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=5).json()
    assert doc["loads"] == [] and doc["version"] == "smg-1.13.0"
    res = check(
        "--router-url", smg.url, "--router-token-env", SECRET_ENV, "--format", "json", env={SECRET_ENV: ADMIN_KEY}
    )
    assert res.exit_code == ExitStatus.PASSED, res.output
    f = _finding(json.loads(res.stdout), "fleet", "router-pool")
    assert f["outcome"] == "info" and "not compared" in f["summary"]


def _loads(rows: list[tuple[str, int, int]]) -> dict[str, Any]:
    """smg's WorkerLoadResponse with SchedulerLoadSnapshot entries (the field names of smg 1.13.0's
    response types; 1.13.0 leaves `loads` empty for HTTP PD workers, so this stands in for a router
    that fills it: which smg version does is not established)."""
    return {
        "timestamp": "2026-12-06T00:00:00Z",
        "version": "smg-fake",
        "dp_rank_count": len(rows),
        "loads": [
            {
                "worker": w,
                "dp_rank": r,
                "num_used_tokens": 0,
                "max_total_num_tokens": pool,
                "token_usage": 0.0,
                "max_running_requests": 64,
            }
            for w, r, pool in rows
        ],
    }


def test_get_loads_pool_is_compared_with_each_workers_own(
    fleet: Callable[..., Any], payload_server: Callable[..., PayloadServer]
) -> None:
    dep, smg = fleet([])
    urls = list(dep.prefill_urls) + list(dep.decode_urls)
    workers = httpx.get(smg.url + "/workers", timeout=5).json()
    fake = payload_server({"/workers": Route(workers), "/readiness": Route({"status": "ready"})})
    fake.routes["/get_loads"] = Route(_loads([(u, 0, 8192) for u in urls]))
    res = check("--router-url", fake.url, "--format", "json")
    assert res.exit_code == ExitStatus.PASSED, res.output
    assert _finding(json.loads(res.stdout), "fleet", "router-pool")["outcome"] == "passed"
    fake.routes["/get_loads"] = Route(_loads([(urls[0], 0, 8192), (urls[1], 0, 4096)]))
    res = check("--router-url", fake.url, "--format", "json", "--strict")
    assert res.exit_code == ExitStatus.INCONCLUSIVE, res.output
    f = _finding(json.loads(res.stdout), "fleet", "router-pool")
    assert f["outcome"] == "inconclusive" and urls[1] in f["node"]
    assert "4,096" in f["summary"] and "8,192" in f["summary"]


def test_a_secret_env_var_is_not_read_from_the_command_line() -> None:
    """The flag takes the variable's NAME: a key pasted in its place is an unset variable, a usage error."""
    res = check("--router-url", "http://127.0.0.1:9", "--router-token-env", ADMIN_KEY, env={})
    assert res.exit_code == ExitStatus.USAGE_ERROR
    assert ADMIN_KEY not in os.environ.get(SECRET_ENV, "")


def test_one_host_several_workers_each_gated_under_the_routers_name(fleet: Callable[..., Any]) -> None:
    """Three workers on one host (as smg's ports annotation makes one pod several workers): the router
    keys each by its own worker_id; each is read once and reported under the router's names."""
    dep, smg = fleet([], decode=2)
    raw = httpx.get(smg.url + "/workers", timeout=5).json()["workers"]
    ids = {w["url"]: w["id"] for w in raw}
    assert len(set(ids.values())) == 3 and {u.split(":")[1] for u in ids} == {"//127.0.0.1"}
    res = check("--router-url", smg.url, "--format", "json")
    assert res.exit_code == ExitStatus.PASSED, res.output
    nodes = json.loads(res.stdout)["target"]["nodes"]
    assert sorted(n["url"] for n in nodes) == sorted(ids)
    for n in nodes:
        assert n["router_names"] == [f"{ids[n['url']]} ({n['url']})"]


def test_dp_aware_virtual_workers_keep_their_own_names(fleet: Callable[..., Any]) -> None:
    """smg 1.13.0 --dp-aware lists `url@rank` virtual workers, each with its own worker_id; the physical
    worker is read once and carries every name the router gives its ranks."""
    dep, smg = fleet(["--dp-aware"], dp_size=2)
    raw = httpx.get(smg.url + "/workers", timeout=5).json()["workers"]
    assert sorted(w["url"] for w in raw) == sorted(
        f"{u}@{r}" for u in [*dep.prefill_urls, *dep.decode_urls] for r in (0, 1)
    )
    assert len({w["id"] for w in raw}) == 4
    res = check("--router-url", smg.url, "--format", "json")
    assert res.exit_code == ExitStatus.PASSED, res.output
    for n in json.loads(res.stdout)["target"]["nodes"]:
        want = sorted(f"{w['id']} ({w['url']})" for w in raw if w["url"].startswith(n["url"] + "@"))
        assert sorted(n["router_names"]) == want and len(want) == 2


def test_watchs_metadata_pass_lists_with_the_router_token(fleet: Callable[..., Any]) -> None:
    """`kvgate watch` lists the fleet every interval with the same reader: without the key the pass says
    why it has no listing; with it (--router-token-env) every worker is read."""
    from kvgate.watch.fleetpass import read_fleet

    dep, smg = fleet(AUTH)
    kw: dict[str, Any] = {"timeout": 5.0, "token": None, "concurrency": 4, "deadline_s": 20.0}
    refused = read_fleet(smg.url, **kw)
    assert refused.listing_error is not None and "for lack of a router token" in refused.listing_error
    snap = read_fleet(smg.url, router_token=ADMIN_KEY, **kw)
    assert snap.listing_error is None
    assert sorted(snap.readings) == sorted([*dep.prefill_urls, *dep.decode_urls])
