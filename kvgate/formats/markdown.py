"""Markdown summary, e.g. for $GITHUB_STEP_SUMMARY."""

from __future__ import annotations

from kvgate.findings import Outcome, Report
from kvgate.formats.base import Formatter

_ICON = {Outcome.PASSED: "PASS", Outcome.FAILED: "FAIL", Outcome.INCONCLUSIVE: "INCONCLUSIVE", Outcome.ERROR: "ERROR"}


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


class MarkdownFormatter(Formatter):
    def render(self, report: Report) -> str:
        status = report.exit_status
        c = report.counts()
        out = [
            f"## kvgate {report.command}: {status.name.replace('_', ' ').lower()} (exit {int(status)})",
            "",
            f"{c['passed']} passed, {c['failed']} failed, {c['inconclusive']} inconclusive, {c['error']} errors"
            + (f" ({c['waived']} waived)" if c["waived"] else ""),
            "",
            "| result | gate | check | node | summary |",
            "| --- | --- | --- | --- | --- |",
        ]
        for f in report.findings:
            out.append(
                f"| {_ICON[f.outcome]}{' (waived)' if f.waived else ''} | {_cell(f.gate)} | {_cell(f.check)} | {_cell(f.node)} | {_cell(f.summary)} |"
            )
        not_passed = [f for f in report.findings if f.outcome is not Outcome.PASSED and f.evidence]
        if not_passed:
            out += ["", "### Evidence", ""]
            for f in not_passed:
                out.append(f"- **{_cell(f.test_id)}** ({_cell(f.node)}):")
                for e in f.evidence:
                    want = f" (expected {_cell(e.expected)})" if e.expected else ""
                    out.append(f"  - `{_cell(e.field)}` = `{_cell(e.value)}`{want}")
        waived = [f for f in report.findings if f.waived]
        if waived:
            out += ["", "### Waived", ""]
            out += [f"- **{_cell(f.test_id)}** ({_cell(f.node)}): {_cell(f.waived)}" for f in waived]
        remedies = [f for f in report.findings if f.remedy and f.outcome is not Outcome.PASSED]
        if remedies:
            out += ["", "### Remedies", ""]
            out += [f"- **{_cell(f.test_id)}** ({_cell(f.node)}): {_cell(f.remedy)}" for f in remedies]
        if report.cost:
            out += ["", "### Cost", ""]
            out += [f"- {_cell(k)}: {_cell(v)}" for k, v in report.cost.items()]
        if report.notes:
            out += ["", "### Notes", ""] + [f"- {_cell(n)}" for n in report.notes]
        return "\n".join(out) + "\n"
