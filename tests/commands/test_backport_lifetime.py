"""`kvgate backport --verify`'s page-lifetime findings from each scenario's outcome: a race the payload
could not stage (INCONCLUSIVE) is an inconclusive finding that says so and names the rerun, never a
verdict; SAFE passes, EXPOSED fails, a payload ERROR is inconclusive as a probe error."""

from __future__ import annotations

from typing import Any

import pytest

from kvgate.backport import probe
from kvgate.catalogue.series import load_series
from kvgate.commands.backport import _lifetime_findings

OUTCOMES = {
    "kvgate-preserve-abort-ack": "SAFE",
    "kvgate-ack-fanout": "EXPOSED",
    "kvgate-force-arm-on-failure": "INCONCLUSIVE",
    "kvgate-ack-generations": "ERROR",
}


def test_each_outcome_becomes_its_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    def stub_run_payload(*args: Any, **kwargs: Any) -> tuple[dict[str, Any], float]:  # STUB of the subprocess
        scenarios = {p: {"outcome": o, "why": f"{o.lower()} because"} for p, o in OUTCOMES.items()}
        return {"status": "ok", "version": "0.5.20", "scenarios": scenarios}, 1.0

    monkeypatch.setattr(probe, "_run_payload", stub_run_payload)
    findings, statuses = _lifetime_findings(load_series("v0.5.20"), "node", "python", [], 60.0)
    assert statuses == {
        "kvgate-preserve-abort-ack": probe.RETIRED,
        "kvgate-ack-fanout": probe.NOT_RETIRED,
        "kvgate-force-arm-on-failure": probe.INCONCLUSIVE,
        "kvgate-ack-generations": probe.ERROR,
    }
    by_check = {f.check: f for f in findings}
    assert by_check["preserve-abort-ack"].outcome.value == "passed"
    assert by_check["ack-fanout"].outcome.value == "failed"
    unstaged = by_check["force-arm-on-failure"]
    assert unstaged.outcome.value == "inconclusive"
    assert unstaged.summary.startswith("race not staged (no verdict)") and "rerun" in (unstaged.remedy or "")
    assert by_check["ack-generations"].outcome.value == "inconclusive"
    assert by_check["ack-generations"].summary.startswith("probe error (no verdict)")
