"""JUnit XML as dashboards (Jenkins, GitLab) read it: one testcase per check per node.

Failed is a `<failure>`, error an `<error>`. An inconclusive check that blocks the run (under
`--strict`, the default, or one asked for explicitly) is a `<failure type="inconclusive">`: a
dashboard must not show a blocked run as green; one that did not block (`--no-strict`) and a waived
finding are `<skipped>`. Info is a pass whose detail is in `<system-out>`. The document is valid
against the Jenkins xUnit plugin's `junit-10.xsd` (tests/assets/junit/junit-10.xsd checks it):
`skipped` is counted per suite only, since that schema has no such attribute on `<testsuites>`.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from kvgate.formats.base import Formatter
from kvgate.results.findings import Finding, Outcome, Report


def _details(f: Finding) -> str:
    lines = [f.summary]
    for e in f.evidence:
        exp = f" (expected {e.expected})" if e.expected else ""
        lines.append(f"{e.node} {e.field} = {e.value!r}{exp}")
    if f.remedy:
        lines.append(f"remedy: {f.remedy}")
    return "\n".join(lines)


def _state(f: Finding, strict: bool) -> str:
    """failure, error, skipped or pass: what the testcase says."""
    if f.waived:
        return "skipped"
    if f.outcome is Outcome.FAILED:
        return "failure"
    if f.outcome is Outcome.ERROR:
        return "error"
    if f.outcome is Outcome.INCONCLUSIVE:
        return "failure" if strict or f.blocking else "skipped"
    return "pass"


class JunitFormatter(Formatter):
    def render(self, report: Report) -> str:
        suites = ET.Element("testsuites", name="kvgate")
        by_gate: dict[str, list[Finding]] = {}
        for f in report.findings:
            by_gate.setdefault(f.gate, []).append(f)
        if not by_gate:
            by_gate["kvgate"] = []
        totals = {"failure": 0, "error": 0}
        for gate, findings in by_gate.items():
            states = [_state(f, report.strict) for f in findings]
            suite = ET.SubElement(
                suites,
                "testsuite",
                name=gate,
                tests=str(len(findings)),
                failures=str(states.count("failure")),
                errors=str(states.count("error")),
                skipped=str(states.count("skipped")),
                timestamp=report.started_at,
            )
            totals["failure"] += states.count("failure")
            totals["error"] += states.count("error")
            for f, state in zip(findings, states, strict=True):
                case = ET.SubElement(suite, "testcase", classname=f"kvgate.{f.gate}", name=f"{f.check} [{f.node}]")
                if f.waived:
                    ET.SubElement(case, "skipped", message=f"waived ({f.outcome.value}): {f.waived}: {f.summary}")
                elif state == "failure":
                    kind = "gate-failed" if f.outcome is Outcome.FAILED else "inconclusive"
                    prefix = "" if f.outcome is Outcome.FAILED else "inconclusive (blocks under --strict): "
                    el = ET.SubElement(case, "failure", message=prefix + f.summary, type=kind)
                    el.text = _details(f)
                elif state == "error":
                    el = ET.SubElement(case, "error", message=f.summary, type="transport")
                    el.text = _details(f)
                elif state == "skipped":
                    ET.SubElement(case, "skipped", message=f"inconclusive (strictness opted out): {f.summary}")
                else:  # passed, or info (reported, not required): a pass with its detail
                    out = ET.SubElement(case, "system-out")
                    out.text = ("info (reported, not required): " if f.outcome is Outcome.INFO else "") + _details(f)
        suites.set("tests", str(len(report.findings)))
        suites.set("failures", str(totals["failure"]))
        suites.set("errors", str(totals["error"]))
        ET.indent(suites)
        return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
