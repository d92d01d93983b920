"""A router's word on its fleet, and waivers over workers that went ungated (issue 20, fleet).

Routers and workers are real loopback HTTP servers answering smg's `GET /workers` shape (fleet.md
section 2, tests/assets/router_payloads.py). A listing whose `total` differs from what it lists may
be partial: the workers it leaves out would go ungated, so it is inconclusive and no opt-out lets it
pass. No waiver reaches a check that means a worker went ungated.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.errors import ProfileError
from kvgate.exitcodes import ExitStatus
from kvgate.reading.discovery import parse_workers
from kvgate.results.findings import failed, inconclusive
from kvgate.results.waivers import UNWAIVABLE, Waiver, apply_waivers, parse_waivers
from tests.assets import router_payloads as R
from tests.assets import sglang_payloads as P
from tests.conftest import PayloadServer, Route

runner = CliRunner()
TODAY = dt.date(2026, 12, 2)


def worker(make: Callable[..., PayloadServer], mode: str) -> PayloadServer:
    return make(
        {
            "/server_info": Route(P.server_info("0.5.22", mode=mode, pool=2_040_000)),
            "/v1/models": Route(P.v1_models()),
            "/model_info": Route(P.model_info("0.5.22", mode)),
        }
    )


def check(*args: str) -> tuple[int, dict[str, Any], str]:
    # Payload servers run no sglang code and --no-probes is an explicit opt-out: both said explicitly.
    res = runner.invoke(
        app,
        ["check", "--quiet", "--no-probes", "--trust-version", "--no-strict", "--deferred-release", *args]
        + ["--format", "json"],
    )
    return res.exit_code, (json.loads(res.stdout) if res.stdout.startswith("{") else {}), res.stderr


def router_list(doc: dict[str, Any]) -> dict[str, Any]:
    [f] = [f for f in doc["findings"] if f["check"] == "router-list"]
    return f


@pytest.fixture
def fleet(payload_server: Callable[..., PayloadServer]) -> tuple[PayloadServer, PayloadServer]:
    return worker(payload_server, "prefill"), worker(payload_server, "decode")


def test_a_whole_listing_passes(payload_server: Callable[..., PayloadServer], fleet: Any) -> None:
    p, d = fleet
    doc = R.smg_workers(R.smg_entry(p.url, "prefill", bootstrap_port=8998), R.smg_entry(d.url, "decode"))
    r = payload_server({"/workers": Route(doc), "/readiness": Route({"status": "ready"})})
    code, report, _ = check("--router-url", r.url)
    assert code == ExitStatus.PASSED and router_list(report)["outcome"] == "passed"


@pytest.mark.parametrize("total", [3, 7, 1, "2", None, -1, True])
def test_a_total_that_differs_from_the_listing_blocks(
    payload_server: Callable[..., PayloadServer], fleet: Any, total: object
) -> None:
    p, d = fleet
    doc = R.smg_workers(R.smg_entry(p.url, "prefill", bootstrap_port=8998), R.smg_entry(d.url, "decode"))
    doc["total"] = total
    r = payload_server({"/workers": Route(doc), "/readiness": Route({"status": "ready"})})
    code, report, _ = check("--router-url", r.url)
    f = router_list(report)
    if total is None:  # `"total": null` says nothing (as an older router without the key)
        assert code == ExitStatus.PASSED and f["outcome"] == "passed"
        return
    assert code == ExitStatus.INCONCLUSIVE, f  # --no-strict was given: this doubt is not the operator's to wave
    assert f["outcome"] == "inconclusive" and f["blocking"] and "may be partial" in f["summary"]
    assert repr(total) in f["summary"] or f"total {total}" in f["summary"]
    # The listed workers are still read and gated.
    assert {n["url"] for n in report["target"]["nodes"]} == {p.url, d.url}


def test_a_dp_worker_listed_once_per_rank_may_count_as_one(payload_server: Callable[..., PayloadServer]) -> None:
    doc = R.smg_workers(
        R.smg_entry("http://p0:30000@0", "prefill", dp_base_url="http://p0:30000", dp_rank=0, dp_size=2),
        R.smg_entry("http://p0:30000@1", "prefill", dp_base_url="http://p0:30000", dp_rank=1, dp_size=2),
    )
    for total in (2, 1):  # entries, or workers
        doc["total"] = total
        assert parse_workers("http://router", doc).total_problem() is None
    doc["total"] = 3
    assert "total 3" in str(parse_workers("http://router", doc).total_problem())


@settings(max_examples=300, deadline=None, database=None)
@given(
    ranks=st.lists(st.integers(1, 4), min_size=1, max_size=6),
    total=st.one_of(st.none(), st.integers(-2, 40), st.text(max_size=3), st.booleans(), st.floats()),
)
def test_a_listing_is_whole_only_when_its_total_counts_what_it_lists(ranks: list[int], total: object) -> None:
    entries = [
        R.smg_entry(f"http://w{i}:30000@{r}", "decode", dp_base_url=f"http://w{i}:30000", dp_rank=r, dp_size=n)
        for i, n in enumerate(ranks)
        for r in range(n)
    ]
    doc = R.smg_workers(*entries)
    doc["total"] = total
    problem = parse_workers("http://router", doc).total_problem()
    whole = total is None or (
        isinstance(total, int) and not isinstance(total, bool) and total in (len(entries), len(ranks))
    )
    assert (problem is None) is whole, (total, len(entries), len(ranks), problem)


# --- waivers ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern",
    [
        "fleet.*",
        "fleet.router-*",
        "fleet.router-membership",
        "fleet.router-list",
        "fleet.router-identity",
        "target.reachable",
        "target.*",
    ],
)
def test_no_waiver_reaches_a_worker_that_went_ungated(pattern: str) -> None:
    with pytest.raises(ProfileError) as exc:
        parse_waivers([{"check": pattern, "reason": "x", "expires": "2026-12-31"}], "p.yaml", today=TODAY)
    assert exc.value.key == "waivers[0].check" and "went ungated" in exc.value.problem


def test_other_fleet_checks_stay_waivable_by_exact_id() -> None:
    ws = parse_waivers(
        [{"check": "fleet.router-status", "reason": "draining for the rollout", "expires": "2026-12-31"}],
        "p.yaml",
        today=TODAY,
    )
    out, _ = apply_waivers([inconclusive("fleet", "router-status", "decode[1] u", "draining")], ws, today=TODAY)
    assert out[0].waived


@pytest.mark.parametrize("test_id", UNWAIVABLE)
def test_a_waiver_built_by_hand_does_not_match_either(test_id: str) -> None:
    gate, check_id = test_id.split(".", 1)
    for pattern in ("fleet.*", test_id, "*.*"):
        w = Waiver(pattern, "x", dt.date(2026, 12, 31))
        out, _ = apply_waivers([failed(gate, check_id, "worker http://x", "ungated")], [w], today=TODAY)
        assert out[0].waived is None


def test_end_to_end_a_fleet_waiver_cannot_pass_an_ungated_worker(
    payload_server: Callable[..., PayloadServer], fleet: Any, tmp_path: Path
) -> None:
    p, d = fleet
    other = worker(payload_server, "decode")  # the router routes to it; the gate is not told
    entries = [R.smg_entry(p.url, "prefill", bootstrap_port=8998), R.smg_entry(d.url, "decode")]
    doc = R.smg_workers(*entries, R.smg_entry(other.url, "decode"))
    r = payload_server({"/workers": Route(doc), "/readiness": Route({"status": "ready"})})
    far = (dt.date.today() + dt.timedelta(days=30)).isoformat()
    prof = tmp_path / "p.yaml"
    prof.write_text(f"waivers:\n  - check: 'fleet.*'\n    reason: ship it\n    expires: {far}\n")
    args = ["--router-url", r.url, "--prefill-url", p.url, "--decode-url", d.url]
    code, report, err = check(*args, "--profile", str(prof))
    assert code == ExitStatus.USAGE_ERROR and "went ungated" in err
    code, report, _ = check(*args)  # without the profile: the ungated worker fails the gate
    assert code == ExitStatus.GATE_FAILED
    assert any(f["check"] == "router-membership" and other.url in f["node"] for f in report["findings"])
