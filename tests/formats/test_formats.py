"""Every format renders every outcome; a new format cannot be forgotten."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from kvgate.exitcodes import ExitStatus
from kvgate.formats import ReportFormat
from kvgate.results.findings import Evidence, Finding, Outcome, Report


def _report() -> Report:
    findings = tuple(
        Finding(
            "pool-context",
            f"check-{o.value}",
            "prefill[0] http://x",
            o,
            f"summary {o.value} | pipe",
            (Evidence("prefill[0] http://x", "max_total_num_tokens", 681280, ">= 1,310,720"),),
            remedy="raise the pool" if o is Outcome.FAILED else None,
        )
        for o in Outcome
    )
    return Report(command="check", findings=findings, cost={"tokens_sent": 12})


@pytest.mark.parametrize("fmt", list(ReportFormat))
def test_every_format_renders_every_outcome(fmt: ReportFormat) -> None:
    text = fmt.formatter().render(_report())
    for o in Outcome:
        if fmt is ReportFormat.SARIF and o is Outcome.PASSED:
            # code scanning reads every result as an alert: a pass is counted, not listed
            assert f"check-{o.value}" not in text and '"passed": 1' in text
            continue
        assert f"check-{o.value}" in text
    assert "681280" in text or "681,280" in text


def test_json_schema() -> None:
    doc = json.loads(ReportFormat.JSON.formatter().render(_report()))
    assert doc["schema_version"] == 1
    assert doc["exit_status"] == ExitStatus.GATE_FAILED
    assert doc["counts"] == {"passed": 1, "failed": 1, "inconclusive": 1, "error": 1, "info": 1, "waived": 0}
    assert doc["findings"][1]["evidence"][0]["value"] == 681280


def test_junit_maps_outcomes() -> None:
    root = ET.fromstring(ReportFormat.JUNIT.formatter().render(_report()).split("\n", 1)[1])
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert cases["check-failed [prefill[0] http://x]"].find("failure") is not None
    assert cases["check-error [prefill[0] http://x]"].find("error") is not None
    # strict (the default): the inconclusive blocks, so it is a failure a dashboard shows red
    assert cases["check-inconclusive [prefill[0] http://x]"].find("failure").get("type") == "inconclusive"
    assert root.get("failures") == "2" and root.get("errors") == "1" and root.get("skipped") is None


def test_junit_of_empty_report_is_valid() -> None:
    text = ReportFormat.JUNIT.formatter().render(Report(command="check", findings=()))
    root = ET.fromstring(text.split("\n", 1)[1])
    assert root.get("tests") == "0"


def test_markdown_escapes_pipes() -> None:
    text = ReportFormat.MARKDOWN.formatter().render(_report())
    assert "summary failed \\| pipe" in text and "### Remedies" in text


def test_table_prints_brackets_verbatim() -> None:
    from kvgate.results.findings import failed

    report = Report(command="check", findings=(failed("g", "c", "prefill[0] http://x", "saw [tenant-a] in [b]"),))
    text = ReportFormat.TABLE.formatter().render(report)
    assert "[tenant-a]" in text and "prefill[0]" in text


def test_info_is_neither_a_pass_nor_a_failure() -> None:
    from kvgate.results.findings import exit_status_for, info, passed

    note = info(
        "defenses",
        "kv-canary",
        "prefill[0] http://x",
        "KV canary off: optional detection",
        Evidence("prefill[0] http://x", "kv_canary", "none", "log|raise to count as a defense"),
    )
    ok = passed("target", "reachable", "prefill[0] http://x", "answered")
    assert exit_status_for([note, ok], strict=True) == ExitStatus.PASSED
    report = Report(command="check", findings=(note, ok))
    table = ReportFormat.TABLE.formatter().render(report)
    assert "info: defenses.kv-canary" in table and "passed: target.reachable" in table
    assert "PASS defenses.kv-canary" not in table and "0 failed, 0 errors, 0 inconclusive, 1 passed, 1 info" in table
    md = ReportFormat.MARKDOWN.formatter().render(report)
    assert "| INFO | `defenses.kv-canary`" in md
    doc = json.loads(ReportFormat.JSON.formatter().render(report))
    assert doc["counts"]["info"] == 1 and doc["findings"][0]["outcome"] == "info"


def test_table_leads_with_the_verdict_and_the_deciding_findings_at_80_columns() -> None:
    from kvgate.formats.table import TableFormatter
    from kvgate.results.findings import failed, passed

    node = "prefill[0] http://127.0.0.1:30000"
    findings = [passed("target", "reachable", node, "answered")] * 20 + [
        failed(
            "pool-context",
            "headroom",
            node,
            "pool 681,280 < 1,310,720 required for context 1,048,576",
            Evidence(node, "max_total_num_tokens", 681280, ">= 1,310,720"),
            remedy="raise the pool",
        ),
        failed("pool-context", "headroom-dp0", node, "pool 681,280 < 1,310,720 required for context 1,048,576"),
        failed(
            "probes",
            "canary.round_a",
            "router http://r",
            "content of tenant-plantA30 leaked into pool_limit",
            Evidence("router http://r", "canary.leaks", ["a -> b"] * 9, "every answer carries only its own sentinel"),
        ),
    ]
    text = TableFormatter(width=80).render(Report(command="check", findings=tuple(findings)))
    lines = text.splitlines()
    assert lines[0] == "kvgate check: GATE FAILED: do not promote (exit 1)"
    heads = [ln for ln in lines[2:8] if ln.startswith("FAIL")]  # a headline may wrap, indented
    assert heads[0].startswith("FAIL probes.canary.round_a router http://r: content of tenant-plantA30")
    assert heads[1].startswith("FAIL pool-context.headroom " + node)  # the DP-rank duplicate is merged
    headline_block = "\n".join(lines[: lines.index("")])  # a blank line ends the headlines
    assert len(heads) == 2 and "headroom-dp0" not in headline_block
    assert all(len(ln) <= 80 for ln in lines), [ln for ln in lines if len(ln) > 80]
    assert "- max_total_num_tokens = 681,280 (want >= 1,310,720)" in text
    assert "... (5 more; --verbose)" in text and "see docs/checks.md#probes.canary" in text
    assert "passed: target.reachable x20" in text and "answered" not in text
    verbose = TableFormatter(width=80, verbose=True).render(Report(command="check", findings=tuple(findings)))
    assert "answered" in verbose and "(5 more" not in verbose


def test_passed_list_names_the_node_of_an_id_that_fails_elsewhere() -> None:
    """Issue 23: `passed: pool-context.headroom` next to its failure on prefill read as 'passed everywhere'."""
    from kvgate.formats.digest import passed_digest

    findings = (
        Finding("pool-context", "headroom", "prefill[0] http://p", Outcome.FAILED, "pool too small"),
        Finding("pool-context", "headroom", "decode[0] http://d", Outcome.PASSED, "ok"),
        Finding("target", "reachable", "prefill[0] http://p", Outcome.PASSED, "ok"),
        Finding("target", "reachable", "decode[0] http://d", Outcome.PASSED, "ok"),
    )
    report = Report(command="check", findings=findings)
    assert passed_digest(report) == "pool-context.headroom on decode[0] http://d, target.reachable x2"
    table = ReportFormat.TABLE.formatter().render(report)
    assert "passed: pool-context.headroom on decode[0] http://d, target.reachable x2" in table


def test_words_say_what_the_run_did() -> None:
    """The verdict line of a --no-strict run that still blocked does not claim --strict; one error is one
    error; a command whose own default is not strict does not claim an opt-out."""
    from dataclasses import replace

    from kvgate.formats.digest import counts_line, verdict_line
    from kvgate.results.findings import inconclusive

    blocked = replace(inconclusive("g", "c", "n", "not seen"), blocking=True)
    r = Report(command="check", findings=(blocked,), strict=False, strict_source="--no-strict")
    assert r.exit_status is ExitStatus.INCONCLUSIVE
    assert "--strict" not in verdict_line(r) and "whatever the strictness" in verdict_line(r)
    strict = Report(command="check", findings=(blocked,))
    assert "INCONCLUSIVE under --strict" in verdict_line(strict)
    one = Report(command="check", findings=(Finding("g", "c", "n", Outcome.ERROR, "down"),))
    assert "1 error," in counts_line(one) and "1 errors" not in counts_line(one)
    fixes = Report(command="fixes", findings=(), strict=False, strict_source="default for fixes: ...")
    assert (fixes.strictness_note() or "").startswith("not strict (default for fixes")
    opted = Report(command="fixes", findings=(), strict=False, strict_source="--no-strict")
    assert (opted.strictness_note() or "").startswith("strictness opted out (--no-strict)")
