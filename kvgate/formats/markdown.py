"""Markdown summary, e.g. for $GITHUB_STEP_SUMMARY."""

from __future__ import annotations

from kvgate import sinks
from kvgate.findings import Outcome, Report
from kvgate.formats.base import Formatter
from kvgate.formats.digest import (
    counts_line,
    doc_ref,
    evidence_line,
    headlines,
    nodes_text,
    same_on_nodes,
    verdict_line,
)

_ICON = {
    Outcome.PASSED: "PASS",
    Outcome.FAILED: "FAIL",
    Outcome.INCONCLUSIVE: "INCONCLUSIVE",
    Outcome.ERROR: "ERROR",
    Outcome.INFO: "INFO",
}


def _cell(text: object) -> str:
    """Any text of the report (server text included), shown as text (sinks.markdown)."""
    return sinks.markdown(text)


def _code(text: object) -> str:
    return sinks.code_span(text)


class MarkdownFormatter(Formatter):
    def render(self, report: Report) -> str:
        out = [f"## {verdict_line(report)}", "", counts_line(report), ""]  # kvgate's words only
        lines, more = headlines(report)
        for h in lines:
            out.append(f"- **{_ICON[h.outcome]}** `{_code(h.check_id)}` {_cell(h.where)}: {_cell(h.summary)}")
        if more:
            out.append(f"- ... and {more} more below")
        if lines:
            out.append("")
        out += ["| result | check | node | summary |", "| --- | --- | --- | --- |"]
        for f in report.findings:
            mark = " (waived)" if f.waived else ""
            out.append(f"| {_ICON[f.outcome]}{mark} | `{_code(f.test_id)}` | {_cell(f.node)} | {_cell(f.summary)} |")
        not_passed = [f for f in report.findings if f.outcome not in (Outcome.PASSED, Outcome.INFO) and f.evidence]
        if not_passed:
            out += ["", "### Evidence", ""]
            for f, nodes in same_on_nodes(not_passed):
                out.append(f"- **{_cell(f.test_id)}** ({_cell(nodes_text(nodes))}):")
                for e in f.evidence:
                    out.append(f"  - {_cell(evidence_line(e, f.node))}")
        waived = [f for f in report.findings if f.waived]
        if waived:
            out += ["", "### Waived", ""]
            out += [f"- **{_cell(f.test_id)}** ({_cell(f.node)}): {_cell(f.waived)}" for f in waived]
        remedies = [f for f in report.findings if f.remedy and f.outcome not in (Outcome.PASSED, Outcome.INFO)]
        if remedies:
            out += ["", "### Remedies", ""]
            for f, nodes in same_on_nodes(remedies):
                ref = doc_ref(f)
                see = f" (see `{ref}`)" if ref else ""
                out.append(f"- **{_cell(f.test_id)}** ({_cell(nodes_text(nodes))}): {_cell(f.remedy)}{see}")
        if report.cost:
            out += ["", "### Cost", ""]
            out += [f"- {_cell(k)}: {_cell(v)}" for k, v in report.cost.items()]
        if report.notes:
            out += ["", "### Notes", ""] + [f"- {_cell(n)}" for n in report.notes]
        return "\n".join(out) + "\n"
