"""probes.pd.engaged / probes.pd.coverage: the workers' own request counters show the probes went through a
prefill and a decode, and reached every listed worker.

The deployments are simulated workers over real sockets with the real router (smg 1.13.0) in front, in
PD mode over some of the workers, or in regular mode; the counters are the simulator's `/metrics`,
shaped as SGLang's.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvgate.deploy.pdstart import find_smg
from kvgate.deploy.supervisor import Supervisor
from kvgate.gates.base import CheckOptions
from kvgate.gates.probes import ProbeGate, ProbeSettings
from kvgate.gates.probes.engaged import parse_loads, parse_metrics
from kvgate.pipeline.check import run_check
from kvgate.results.findings import Finding, Outcome, Report
from kvgate.sim.deploy import SimDeployment

# Small and quick: the contract lengths stay short, and the expensive phases are off (they are not
# what these tests are about, and the counters move with every request the probes send).
CONTEXT = 4096
SETTINGS = {"deadline_s": 20, "abort_probe": False, "isolation_probe": False, "load_probe": False}


def _check(router: str, prefill: list[str], decode: list[str]) -> Report:
    options = CheckOptions(prefill_urls=tuple(prefill), decode_urls=tuple(decode), router_url=router, timeout=20.0)
    return run_check(options, gates=[ProbeGate(ProbeSettings.from_mapping(SETTINGS, "test"))])


def _finding(report: Report, check: str) -> Finding:
    found = [f for f in report.findings if f.gate == "probes" and f.check == check]
    assert len(found) == 1, [f.test_id for f in report.findings]
    return found[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def own_router(tmp_path: Path) -> Iterator[Any]:
    """Start the real smg on a command line of the test's choosing, once it lists `want` workers;
    stopped after the test."""
    sups: list[Supervisor] = []

    def start(mode: list[str], want: int) -> str:
        port = _free_port()
        argv = [
            find_smg(),
            "launch",
            *mode,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--prometheus-port",
            str(_free_port()),
            "--prometheus-host",
            "127.0.0.1",
            "--worker-startup-check-interval",
            "1",
            "--disable-retries",
            "--disable-circuit-breaker",
            "--log-level",
            "warn",
        ]
        sup = Supervisor(log_dir=tmp_path, grace_s=3.0)
        sups.append(sup)
        url = f"http://127.0.0.1:{port}"
        sup.start("router", argv)
        deadline = time.monotonic() + 120
        with httpx.Client(timeout=5) as c:
            while time.monotonic() < deadline:
                try:
                    if len(c.get(url + "/workers").json().get("workers", [])) >= want:
                        return url
                except (httpx.HTTPError, ValueError, AttributeError):
                    pass
                time.sleep(0.5)
        raise AssertionError(f"the router at {url} did not list {want} workers in time")

    yield start
    for sup in sups:
        sup.stop()


def test_metrics_parser_sums_every_sample_and_refuses_what_is_not_a_count() -> None:
    page = (
        b"# HELP sglang:num_requests_total Number of requests processed.\n"
        b"# TYPE sglang:num_requests_total counter\n"
        b'sglang:num_requests_total{model_name="a}b c",is_streaming="false"} 3.0\n'
        b'sglang:num_requests_total{model_name="m",is_streaming="true"} 2.0 1700000000\n'
        b'sglang:num_requests_created{model_name="m",is_streaming="true"} 1.7e9\n'
        b'sglang:prompt_tokens_total{model_name="m",is_streaming="true"} 99.0\n'
    )
    assert parse_metrics(page) == (5.0, None)
    assert parse_metrics(b"sglang:token_usage 0.1\n") == (0.0, None)  # SGLang's page, no request finished yet
    assert parse_metrics(b"process_cpu_seconds_total 1.0\n")[0] is None  # not SGLang's page
    for bad in (b"nan", b"-1", b"1e300", b"x"):
        value, why = parse_metrics(b"sglang:num_requests_total{} " + bad + b"\n")
        assert value is None and why and "num_requests_total" in why
    assert parse_metrics(b"\xff\xfe")[0] is None


def test_loads_parser_reads_the_cumulative_step_counters() -> None:
    doc = (
        b'{"loads":[{"dp_rank":0,"total_prefill_uncached_tokens":40,"decode_moments":[3,1,1,1,1,1]},'
        b'{"dp_rank":1,"total_prefill_uncached_tokens":2}]}'
    )
    got = parse_loads(doc)
    assert (got.prefill_tokens, got.decode_steps) == (42.0, 3.0)
    assert parse_loads(b"[]").problem and parse_loads(b"{").problem


@pytest.mark.slow
def test_healthy_pair_passes_from_its_own_counters(deployment: Any) -> None:
    dep: SimDeployment = deployment(emulate="0.5.22", context_length=CONTEXT, prefill_pool=8192, decode_pool=8192)
    report = _check(dep.router_url or "", dep.prefill_urls, dep.decode_urls)
    engaged, coverage = _finding(report, "pd.engaged"), _finding(report, "pd.coverage")
    assert engaged.outcome == Outcome.PASSED, engaged.summary
    assert coverage.outcome == Outcome.PASSED, coverage.summary
    assert "1 prefill(s) and 1 decode(s)" in engaged.summary


@pytest.mark.slow
def test_every_worker_of_a_two_by_two_fleet_is_covered(deployment: Any) -> None:
    """Two prefills and two decodes behind the real PD router: each one is shown to have served probes."""
    dep: SimDeployment = deployment(
        emulate="0.5.22", prefill=2, decode=2, context_length=CONTEXT, prefill_pool=8192, decode_pool=8192
    )
    report = _check(dep.router_url or "", dep.prefill_urls, dep.decode_urls)
    coverage = _finding(report, "pd.coverage")
    assert coverage.outcome == Outcome.PASSED, coverage.summary
    assert all(url in coverage.summary for url in dep.prefill_urls + dep.decode_urls)
    assert _finding(report, "pd.engaged").outcome == Outcome.PASSED


@pytest.mark.slow
def test_a_prefill_the_router_never_picks_is_named(deployment: Any, own_router: Any) -> None:
    """Two prefills, the router's pool holds one (smg #2375's shape: the other is never routed to)."""
    dep: SimDeployment = deployment(
        emulate="0.5.22", prefill=2, context_length=CONTEXT, prefill_pool=8192, decode_pool=8192, router=False
    )
    mode = ["--pd-disaggregation", "--prefill", dep.prefill_urls[0], str(dep.bootstrap_ports[0])]
    router = own_router([*mode, "--decode", dep.decode_urls[0]], want=2)
    report = _check(router, dep.prefill_urls, dep.decode_urls)
    coverage = _finding(report, "pd.coverage")
    assert coverage.outcome == Outcome.INCONCLUSIVE, coverage.summary
    assert dep.prefill_urls[1] in coverage.summary and dep.prefill_urls[0] not in coverage.summary
    assert "1 of 3 listed worker(s) served no probe (after 32 extra probes)" in coverage.summary
    assert coverage.remedy and "#2375" in coverage.remedy
    assert _finding(report, "pd.engaged").outcome == Outcome.PASSED  # what was served did go through PD


@pytest.mark.slow
def test_everything_straight_to_decode_fails_as_not_pd(deployment: Any, own_router: Any) -> None:
    """The real smg in regular mode in front of the decode alone: no prefill, no transfer."""
    dep: SimDeployment = deployment(
        emulate="0.5.22", context_length=CONTEXT, prefill_pool=8192, decode_pool=8192, router=False
    )
    router = own_router(["--worker-urls", dep.decode_urls[0]], want=1)
    report = _check(router, dep.prefill_urls, dep.decode_urls)
    engaged = _finding(report, "pd.engaged")
    assert engaged.outcome == Outcome.FAILED, engaged.summary
    assert report.exit_status != 0


@pytest.mark.slow
def test_regular_mode_over_both_workers_fails_as_not_pd(deployment: Any, own_router: Any) -> None:
    """The real smg in regular mode in front of the prefill and the decode: each request goes to one."""
    dep: SimDeployment = deployment(
        emulate="0.5.22", context_length=CONTEXT, prefill_pool=8192, decode_pool=8192, router=False
    )
    router = own_router(["--worker-urls", dep.prefill_urls[0], dep.decode_urls[0]], want=2)
    report = _check(router, dep.prefill_urls, dep.decode_urls)
    engaged = _finding(report, "pd.engaged")
    assert engaged.outcome == Outcome.FAILED, engaged.summary
    assert report.exit_status != 0


def _rule(prefill: list[float], decode: list[float], served: int) -> Finding:
    """The verdict `probes.pd.engaged` gives counters that moved by these amounts (no router listing)."""
    from kvgate.gates.probes.engaged import Engagement, Served
    from kvgate.reading.node import NodeSpec, parse_node

    def state(role: str, i: int, delta: float) -> Served:
        spec = NodeSpec(role, f"http://{role}{i}:1", i)
        reading = parse_node(spec, "/server_info", {"disaggregation_mode": role}, None, None)
        return Served(reading, role, delta > 0, delta, f"moved {delta:g}")

    eng = Engagement.__new__(Engagement)
    eng.ctx = type("Ctx", (), {"listing": None})()  # type: ignore[assignment]
    states = [state("prefill", i, d) for i, d in enumerate(prefill)] + [
        state("decode", i, d) for i, d in enumerate(decode)
    ]
    return eng._engaged(states, served, "router")


def test_the_counters_alone_decide_when_the_router_lists_no_roles() -> None:
    assert _rule([20], [20], 20).outcome == Outcome.PASSED
    assert _rule([19], [20], 20).outcome == Outcome.PASSED  # one prefill finish not counted yet
    straight = _rule([0], [20], 20)  # decode counters move, prefill's do not
    assert straight.outcome == Outcome.FAILED and "straight to decode" in straight.summary
    assert _rule([20], [0], 20).outcome == Outcome.FAILED  # no decode: no transfer
    half = _rule([10], [10], 20)  # each request reached one worker: regular routing
    assert half.outcome == Outcome.FAILED and "counted 10 requests" in half.summary
    assert _rule([0, 0], [0], 20).outcome == Outcome.FAILED  # answers from somewhere else
    assert _rule([0], [0], 0).outcome == Outcome.INCONCLUSIVE  # nothing served, nothing to show
