"""JUnit as dashboards read it: valid against the Jenkins xUnit plugin's junit-10.xsd (vendored), read by
junitparser, a blocked (exit 3) run shows a failure, info is a pass with its detail in system-out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import junitparser
import pytest
from lxml import etree
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.exitcodes import ExitStatus
from kvgate.formats import ReportFormat
from kvgate.results.findings import Finding, Outcome, Report

XSD = Path(__file__).resolve().parent.parent / "assets" / "junit" / "junit-10.xsd"
runner = CliRunner()
NODE = "prefill[0] http://x"


def valid(path: Path) -> None:
    schema = etree.XMLSchema(etree.parse(str(XSD)))
    doc = etree.parse(str(path))
    assert schema.validate(doc), schema.error_log


def _report(strict: bool) -> Report:
    findings = tuple(Finding("g", f"c-{o.value}", NODE, o, f"summary {o.value}") for o in Outcome) + (
        Finding("g", "c-waived", NODE, Outcome.FAILED, "off", waived="OPS-1 (until 2026-12-31)"),
    )
    return Report(command="check", findings=findings, strict=strict)


def _cases(path: Path) -> dict[str, Any]:
    xml = junitparser.JUnitXml.fromfile(str(path))
    return {case.name: case for suite in xml for case in suite}


@pytest.mark.parametrize("strict", [True, False])
def test_every_outcome_as_a_dashboard_reads_it(tmp_path: Path, strict: bool) -> None:
    path = tmp_path / "r.xml"
    path.write_text(ReportFormat.JUNIT.formatter().render(_report(strict)))
    valid(path)
    cases = _cases(path)

    def kinds(name: str) -> list[str]:
        return [type(r).__name__ for r in cases[f"{name} [{NODE}]"].result]

    assert kinds("c-failed") == ["Failure"] and kinds("c-error") == ["Error"]
    assert kinds("c-inconclusive") == (["Failure"] if strict else ["Skipped"])
    assert kinds("c-passed") == [] and kinds("c-info") == []  # info is a pass...
    assert "summary info" in (cases[f"c-info [{NODE}]"].system_out or "")  # ...with its detail
    assert kinds("c-waived") == ["Skipped"]


def test_empty_report_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "r.xml"
    path.write_text(ReportFormat.JUNIT.formatter().render(Report(command="check", findings=())))
    valid(path)


def test_the_schema_is_not_vacuous(tmp_path: Path) -> None:
    """What kvgate wrote before (`skipped` on <testsuites>) is refused by the schema."""
    path = tmp_path / "bad.xml"
    path.write_text('<testsuites name="kvgate" tests="0" skipped="1"></testsuites>')
    with pytest.raises(AssertionError):
        valid(path)


def test_an_exit_3_check_shows_a_failure(tmp_path: Path, payload_server: Any) -> None:
    """A healthy pair without a router: the probes are not sent, the strict check blocks, the file is red."""
    import tests.assets.sglang_payloads as P
    from tests.conftest import Route

    routes = {"/v1/models": Route(P.v1_models())}
    pre = payload_server({"/server_info": Route(P.server_info("0.5.23", pool=2_097_152)), **routes})
    dec = payload_server({"/server_info": Route(P.server_info("0.5.23", mode="decode", pool=2_097_152)), **routes})
    out = tmp_path / "r.xml"
    args = ["check", "--prefill-url", pre.url, "--decode-url", dec.url, "-q", "-f", "junit", "-o", str(out)]
    res = runner.invoke(app, args)
    assert res.exit_code == ExitStatus.INCONCLUSIVE, res.output
    valid(out)
    xml = junitparser.JUnitXml.fromfile(str(out))
    assert sum(s.failures for s in xml) >= 1
    results = [r for s in xml for c in s for r in c.result]
    assert any(isinstance(r, junitparser.Failure) and r.type == "inconclusive" for r in results)
    res = runner.invoke(app, [*args, "--no-strict"])
    assert res.exit_code == ExitStatus.PASSED, res.output
    valid(out)
    assert sum(s.failures for s in junitparser.JUnitXml.fromfile(str(out))) == 0


def test_a_usage_error_is_an_error(tmp_path: Path) -> None:
    out = tmp_path / "r.xml"
    assert runner.invoke(app, ["check", "--headroom", "-1", "-f", "junit", "-o", str(out)]).exit_code == 2
    valid(out)
    assert sum(s.errors for s in junitparser.JUnitXml.fromfile(str(out))) == 1
