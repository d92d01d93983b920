"""JUnit XML: one testcase per check per node; inconclusive is skipped, error is error."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from kvgate.findings import Finding, Outcome, Report
from kvgate.formats.base import Formatter


def _details(f: Finding) -> str:
    lines = [f.summary]
    for e in f.evidence:
        exp = f" (expected {e.expected})" if e.expected else ""
        lines.append(f"{e.node} {e.field} = {e.value!r}{exp}")
    if f.remedy:
        lines.append(f"remedy: {f.remedy}")
    return "\n".join(lines)


class JunitFormatter(Formatter):
    def render(self, report: Report) -> str:
        counts = report.counts()
        suites = ET.Element("testsuites", name="kvgate")
        by_gate: dict[str, list[Finding]] = {}
        for f in report.findings:
            by_gate.setdefault(f.gate, []).append(f)
        if not by_gate:
            by_gate["kvgate"] = []
        for gate, findings in by_gate.items():
            suite = ET.SubElement(
                suites,
                "testsuite",
                name=gate,
                tests=str(len(findings)),
                failures=str(sum(f.outcome is Outcome.FAILED and not f.waived for f in findings)),
                errors=str(sum(f.outcome is Outcome.ERROR for f in findings)),
                skipped=str(sum(f.outcome is Outcome.INCONCLUSIVE or bool(f.waived) for f in findings)),
                timestamp=report.started_at,
            )
            for f in findings:
                case = ET.SubElement(suite, "testcase", classname=f"kvgate.{f.gate}", name=f"{f.check} [{f.node}]")
                if f.waived:
                    ET.SubElement(case, "skipped", message=f"waived ({f.outcome.value}): {f.waived}: {f.summary}")
                elif f.outcome is Outcome.FAILED:
                    el = ET.SubElement(case, "failure", message=f.summary, type="gate-failed")
                    el.text = _details(f)
                elif f.outcome is Outcome.ERROR:
                    el = ET.SubElement(case, "error", message=f.summary, type="transport")
                    el.text = _details(f)
                elif f.outcome is Outcome.INCONCLUSIVE:
                    ET.SubElement(case, "skipped", message=f"inconclusive: {f.summary}")
                else:  # passed, or info (reported, not required: JUnit has no such state)
                    out = ET.SubElement(case, "system-out")
                    out.text = ("info (not required): " if f.outcome is Outcome.INFO else "") + _details(f)
        suites.set("tests", str(len(report.findings)))
        waived_failures = sum(f.outcome is Outcome.FAILED and bool(f.waived) for f in report.findings)
        suites.set("failures", str(counts["failed"] - waived_failures))
        suites.set("errors", str(counts["error"]))
        suites.set("skipped", str(counts["inconclusive"] + waived_failures))
        ET.indent(suites)
        return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
