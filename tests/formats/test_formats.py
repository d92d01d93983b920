"""Every format renders every outcome; a new format cannot be forgotten."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from kvgate.exitcodes import ExitStatus
from kvgate.findings import Evidence, Finding, Outcome, Report
from kvgate.formats import ReportFormat


def _report() -> Report:
    findings = tuple(
        Finding("pool-context", f"check-{o.value}", "prefill[0] http://x", o, f"summary {o.value} | pipe",
                (Evidence("prefill[0] http://x", "max_total_num_tokens", 681280, ">= 1,310,720"),),
                remedy="raise the pool" if o is Outcome.FAILED else None)
        for o in Outcome
    )
    return Report(command="check", findings=findings, cost={"tokens_sent": 12})


@pytest.mark.parametrize("fmt", list(ReportFormat))
def test_every_format_renders_every_outcome(fmt: ReportFormat) -> None:
    text = fmt.formatter().render(_report())
    for o in Outcome:
        assert f"check-{o.value}" in text
    assert "681280" in text or "681,280" in text


def test_json_schema() -> None:
    doc = json.loads(ReportFormat.JSON.formatter().render(_report()))
    assert doc["schema_version"] == 1
    assert doc["exit_status"] == ExitStatus.GATE_FAILED
    assert doc["counts"] == {"passed": 1, "failed": 1, "inconclusive": 1, "error": 1, "waived": 0}
    assert doc["findings"][1]["evidence"][0]["value"] == 681280


def test_junit_maps_outcomes() -> None:
    root = ET.fromstring(ReportFormat.JUNIT.formatter().render(_report()).split("\n", 1)[1])
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert cases["check-failed [prefill[0] http://x]"].find("failure") is not None
    assert cases["check-error [prefill[0] http://x]"].find("error") is not None
    assert cases["check-inconclusive [prefill[0] http://x]"].find("skipped") is not None
    assert root.get("failures") == "1" and root.get("errors") == "1" and root.get("skipped") == "1"


def test_junit_of_empty_report_is_valid() -> None:
    text = ReportFormat.JUNIT.formatter().render(Report(command="check", findings=()))
    root = ET.fromstring(text.split("\n", 1)[1])
    assert root.get("tests") == "0"


def test_markdown_escapes_pipes() -> None:
    text = ReportFormat.MARKDOWN.formatter().render(_report())
    assert "summary failed \\| pipe" in text and "### Remedies" in text


def test_table_prints_brackets_verbatim() -> None:
    from kvgate.findings import failed

    report = Report(command="check", findings=(failed("g", "c", "prefill[0] http://x", "saw [tenant-a] in [b]"),))
    text = ReportFormat.TABLE.formatter().render(report)
    assert "[tenant-a]" in text and "prefill[0]" in text
