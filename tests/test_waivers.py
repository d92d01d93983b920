"""Waivers: reason and expiry required; the finding stays in the report; only the exit ignores it."""

from __future__ import annotations

import datetime as dt
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Callable

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.errors import ProfileError
from kvgate.exitcodes import ExitStatus
from kvgate.findings import error, failed, inconclusive
from kvgate.waivers import Waiver, apply_waivers, parse_waivers
from tests.assets import sglang_payloads as P
from tests.conftest import PayloadServer, Route

runner = CliRunner()
TODAY = dt.date(2026, 11, 29)


def test_apply_marks_only_matching_unexpired_findings() -> None:
    ws = (Waiver("defenses.kv-canary", "DSA pool: no canary support", dt.date(2026, 12, 31)),
          Waiver("pool-context.headroom*", "old", dt.date(2026, 11, 1)),
          Waiver("probes.never", "stale", dt.date(2027, 1, 1)))
    fs = [inconclusive("defenses", "kv-canary", "decode[0] u", "not supported"),
          failed("pool-context", "headroom", "prefill[0] u", "pool too small"),
          error("defenses", "kv-canary", "prefill[0] u", "transport")]
    out, notes = apply_waivers(fs, ws, today=TODAY)
    assert out[0].waived and "until 2026-12-31" in out[0].waived and out[0].outcome.value == "inconclusive"
    assert out[1].waived is None  # expired
    assert out[2].waived is None  # errors are never waived
    assert any("expired on 2026-11-01" in n for n in notes)
    assert any("probes.never" in n and "matched nothing" in n for n in notes)


@pytest.mark.parametrize("raw,key", [
    ([{"check": "defenses.kv-canary", "expires": "2026-12-31"}], "waivers[0].reason"),
    ([{"check": "defenses.kv-canary", "reason": "x"}], "waivers[0].expires"),
    ([{"check": "defenses.kv-canary", "reason": "x", "expires": "soon"}], "waivers[0].expires"),
    ([{"check": "kv-canary", "reason": "x", "expires": "2026-12-31"}], "waivers[0].check"),
    ([{"check": "a.b", "reason": "x", "expires": "2026-12-31", "owner": "me"}], "waivers[0].owner"),
    ({"check": "a.b"}, "waivers"),
])
def test_invalid_waivers_name_the_key(raw: object, key: str) -> None:
    with pytest.raises(ProfileError) as exc:
        parse_waivers(raw, "p.yaml")
    assert exc.value.key == key


def test_waived_failure_does_not_block_but_stays_in_every_report(
        tmp_path: Path, payload_server: Callable[..., PayloadServer]) -> None:
    srv = payload_server({"/server_info": Route(P.server_info("0.5.22", pool=1_100_000)),
                          "/v1/models": Route(P.v1_models())})
    far = (dt.date.today() + dt.timedelta(days=30)).isoformat()
    prof = tmp_path / "p.yaml"
    prof.write_text(
        "headroom: 1.25\nwaivers:\n"
        f"  - check: pool-context.headroom*\n    reason: pool doubling lands next week (TICKET-1)\n    expires: {far}\n")
    base = ["check", "-q", "--prefill-url", srv.url, "--profile", str(prof)]
    res = runner.invoke(app, base + ["-f", "json", "-o", str(tmp_path / "r.json"), "-f", "junit", "-o",
                                     str(tmp_path / "r.xml")])
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
