"""Waivers: reason and expiry required; the finding stays in the report; only the exit ignores it."""

from __future__ import annotations

import datetime as dt
import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.errors import ProfileError
from kvgate.exitcodes import ExitStatus
from kvgate.results.findings import error, failed, inconclusive
from kvgate.results.waivers import Waiver, apply_waivers, parse_waivers
from tests.assets import sglang_payloads as P
from tests.conftest import PayloadServer, Route

runner = CliRunner()
TODAY = dt.date(2026, 11, 29)


def test_apply_marks_only_matching_unexpired_findings() -> None:
    ws = (
        Waiver("defenses.kv-canary", "DSA pool: no canary support", dt.date(2026, 12, 31)),
        Waiver("pool-context.headroom", "old", dt.date(2026, 11, 1)),
        Waiver("probes.never", "stale", dt.date(2027, 1, 1)),
    )
    fs = [
        inconclusive("defenses", "kv-canary", "decode[0] u", "not supported"),
        failed("pool-context", "headroom", "prefill[0] u", "pool too small"),
        error("defenses", "kv-canary", "prefill[0] u", "transport"),
    ]
    out, notes = apply_waivers(fs, ws, today=TODAY)
    assert out[0].waived and "until 2026-12-31" in out[0].waived and out[0].outcome.value == "inconclusive"
    assert out[1].waived is None  # expired
    assert out[2].waived is None  # errors are never waived
    assert any("expired on 2026-11-01" in n for n in notes)
    assert any("probes.never" in n and "matched nothing" in n for n in notes)


@pytest.mark.parametrize(
    "raw,key",
    [
        ([{"check": "defenses.kv-canary", "expires": "2026-12-31"}], "waivers[0].reason"),
        ([{"check": "defenses.kv-canary", "reason": "x"}], "waivers[0].expires"),
        ([{"check": "defenses.kv-canary", "reason": "x", "expires": "soon"}], "waivers[0].expires"),
        ([{"check": "kv-canary", "reason": "x", "expires": "2026-12-31"}], "waivers[0].check"),
        ([{"check": "a.b", "reason": "x", "expires": "2026-12-31", "owner": "me"}], "waivers[0].owner"),
        ({"check": "a.b"}, "waivers"),
    ],
)
def test_invalid_waivers_name_the_key(raw: object, key: str) -> None:
    with pytest.raises(ProfileError) as exc:
        parse_waivers(raw, "p.yaml")
    assert exc.value.key == key


def test_waived_failure_does_not_block_but_stays_in_every_report(
    tmp_path: Path, payload_server: Callable[..., PayloadServer]
) -> None:
    srv = payload_server(
        {"/server_info": Route(P.server_info("0.5.22", pool=1_100_000)), "/v1/models": Route(P.v1_models())}
    )
    far = (dt.date.today() + dt.timedelta(days=30)).isoformat()
    prof = tmp_path / "p.yaml"
    # A pool/context check is waived one exact id at a time (headroom, then each DP rank's).
    prof.write_text(
        "headroom: 1.25\nwaivers:\n"
        + "".join(
            f"  - check: pool-context.{c}\n    reason: pool doubling lands next week (TICKET-1)\n    expires: {far}\n"
            for c in ("headroom", "headroom-dp0")
        )
    )
    # One node: the checksum check cannot be judged (inconclusive); this test is about the waived failure.
    base = ["check", "-q", "--prefill-url", srv.url, "--profile", str(prof), "--deferred-release", "--no-strict"]
    res = runner.invoke(
        app, base + ["-f", "json", "-o", str(tmp_path / "r.json"), "-f", "junit", "-o", str(tmp_path / "r.xml")]
    )
    doc = json.loads((tmp_path / "r.json").read_text())
    headroom = [f for f in doc["findings"] if f["check"].startswith("headroom")]
    assert headroom and all(f["outcome"] == "failed" and "TICKET-1" in f["waived"] for f in headroom)
    assert not [f for f in doc["findings"] if f["outcome"] == "failed" and not f["waived"]]
    assert res.exit_code == doc["exit_status"] == ExitStatus.PASSED, res.output
    assert doc["counts"]["waived"] == len(headroom)
    assert ET.parse(tmp_path / "r.xml").getroot().get("failures") == "0"
    # Without the waiver the same deployment fails the gate.
    prof.write_text("headroom: 1.25\n")
    assert runner.invoke(app, base).exit_code == ExitStatus.GATE_FAILED


@pytest.mark.parametrize("pattern", ["*.*", "*.kv-canary", "?efenses.kv-canary", "[dp]*.x"])
def test_a_waiver_that_could_waive_every_gate_is_a_profile_error(pattern: str) -> None:
    with pytest.raises(ProfileError) as exc:
        parse_waivers([{"check": pattern, "reason": "x", "expires": "2026-12-31"}], "p.yaml", today=TODAY)
    assert exc.value.key == "waivers[0].check" and "every gate" in exc.value.problem


@pytest.mark.parametrize(
    "pattern",
    [
        "pool-context.*",
        "pool-context.headroom*",
        "fixes.*",
        "defenses.*",
        "defenses.rel*",
        "probes.selftest.*",
        "probes.*",
        "probes.canary.*",
    ],
)
def test_protected_checks_cannot_be_waived_by_a_wildcard(pattern: str) -> None:
    with pytest.raises(ProfileError) as exc:
        parse_waivers([{"check": pattern, "reason": "x", "expires": "2026-12-31"}], "p.yaml", today=TODAY)
    assert "exact id" in exc.value.problem


def test_protected_check_is_not_matched_by_a_wildcard_even_if_constructed_directly() -> None:
    w = Waiver("pool-context.*", "x", dt.date(2026, 12, 31))
    out, _ = apply_waivers([failed("pool-context", "headroom", "n", "pool too small")], [w], today=TODAY)
    assert out[0].waived is None
    exact = Waiver("pool-context.headroom", "x", dt.date(2026, 12, 31))
    out, _ = apply_waivers([failed("pool-context", "headroom", "n", "pool too small")], [exact], today=TODAY)
    assert out[0].waived


def test_expiry_has_a_maximum_horizon() -> None:
    ok = (TODAY + dt.timedelta(days=90)).isoformat()
    assert parse_waivers([{"check": "defenses.kv-canary", "reason": "x", "expires": ok}], "p", today=TODAY)
    with pytest.raises(ProfileError) as exc:
        parse_waivers([{"check": "defenses.kv-canary", "reason": "x", "expires": "9999-12-31"}], "p", today=TODAY)
    assert exc.value.key == "waivers[0].expires" and "90 days" in exc.value.problem


def test_issue_route_6_wildcard_forever_waiver_is_refused_even_without_strict(
    tmp_path: Path, payload_server: Callable[..., PayloadServer]
) -> None:
    srv = payload_server(
        {"/server_info": Route(P.server_info("0.5.20", pool=681_280)), "/v1/models": Route(P.v1_models())}
    )
    prof = tmp_path / "p.yaml"
    prof.write_text("waivers:\n  - check: '*.*'\n    reason: ship it\n    expires: 9999-12-31\n")
    out = tmp_path / "r.json"
    res = runner.invoke(
        app,
        ["check", "-q", "--prefill-url", srv.url, "--profile", str(prof), "--no-strict", "-f", "json", "-o", str(out)],
    )
    assert res.exit_code == ExitStatus.USAGE_ERROR, res.output
    assert "waivers[0]" in res.stderr
    assert json.loads(out.read_text())["exit_status"] == ExitStatus.USAGE_ERROR
