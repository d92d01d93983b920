"""Markdown summary, e.g. for $GITHUB_STEP_SUMMARY."""

from __future__ import annotations

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
from kvgate.output import sinks
from kvgate.results.findings import Outcome, Report

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


#: GitHub drops a step summary over 1 MiB whole (nothing of it is shown). A report rendered larger than
#: this is summarized to fit: the verdict, the counts and the deciding findings always stay whole.
BUDGET_BYTES = 1024 * 1024 - 64 * 1024
#: nodes named per grouped line of a summarized report (the rest counted)
_NODES_SHOWN = 5


class MarkdownFormatter(Formatter):
    def render(self, report: Report) -> str:
        head = self._head(report)
        full = head + self._body(report, compact=False)
        text = "\n".join(full) + "\n"
        if len(text.encode("utf-8")) <= BUDGET_BYTES:
            return text
        # Too large for a step summary: passed checks counted per check, the same finding on many nodes
        # once, then whole lines while they fit. The head (verdict, counts, deciding findings) never goes.
        note = (
            f"*Summarized to fit GitHub's 1 MiB step-summary limit ({len(report.findings):,} findings): passed "
            "checks are counted per check, a finding said alike on many nodes is shown once; every finding "
            "is in the JSON report (`--format json`).*"
        )
        out = [*head, note, ""]
        used = len(("\n".join(out) + "\n").encode("utf-8"))
        body = self._body(report, compact=True)
        for i, line in enumerate(body):
            size = len(line.encode("utf-8")) + 1
            if used + size > BUDGET_BYTES - 512:
                left = sum(1 for rest in body[i:] if rest.startswith(("|", "-", "  -")))
                out += ["", f"*... {left:,} more lines left out to fit the limit: see the JSON report.*"]
                break
            out.append(line)
            used += size
        return "\n".join(out) + "\n"

    def _head(self, report: Report) -> list[str]:
        out = [f"## {verdict_line(report)}", "", counts_line(report), ""]  # kvgate's words only
        lines, more = headlines(report)
        for h in lines:
            out.append(f"- **{_ICON[h.outcome]}** `{_code(h.check_id)}` {_cell(h.where)}: {_cell(h.summary)}")
        if more:
            out.append(f"- ... and {more} more below")
        if lines:
            out.append("")
        return out

    def _body(self, report: Report, *, compact: bool) -> list[str]:
        nodes_of = _few_nodes if compact else nodes_text
        out = ["| result | check | node | summary |", "| --- | --- | --- | --- |"]
        if compact:
            shown = [f for f in report.findings if f.outcome is not Outcome.PASSED or f.waived]
            for f, nodes in same_on_nodes(shown):
                mark, where = " (waived)" if f.waived else "", _cell(nodes_of(nodes))
                out.append(f"| {_ICON[f.outcome]}{mark} | `{_code(f.test_id)}` | {where} | {_cell(f.summary)} |")
            passed: dict[str, int] = {}
            for f in report.findings:
                if f.outcome is Outcome.PASSED and not f.waived:
                    passed[f.test_id] = passed.get(f.test_id, 0) + 1
            for check, n in passed.items():
                out.append(f"| PASS | `{_code(check)}` | {n:,} finding(s) | passed |")
        else:
            for f in report.findings:
                mark = " (waived)" if f.waived else ""
                out.append(
                    f"| {_ICON[f.outcome]}{mark} | `{_code(f.test_id)}` | {_cell(f.node)} | {_cell(f.summary)} |"
                )
        not_passed = [f for f in report.findings if f.outcome not in (Outcome.PASSED, Outcome.INFO) and f.evidence]
        if not_passed:
            out += ["", "### Evidence", ""]
            for f, nodes in same_on_nodes(not_passed):
                out.append(f"- **{_cell(f.test_id)}** ({_cell(nodes_of(nodes))}):")
                for e in f.evidence:
                    out.append(f"  - {_cell(evidence_line(e, f.node))}")
        waived = [f for f in report.findings if f.waived]
        if waived:
            out += ["", "### Waived", ""]
            if compact:
                out += [
                    f"- **{_cell(f.test_id)}** ({_cell(nodes_of(n))}): {_cell(f.waived)}"
                    for f, n in same_on_nodes(waived)
                ]
            else:
                out += [f"- **{_cell(f.test_id)}** ({_cell(f.node)}): {_cell(f.waived)}" for f in waived]
        remedies = [f for f in report.findings if f.remedy and f.outcome not in (Outcome.PASSED, Outcome.INFO)]
        if remedies:
            out += ["", "### Remedies", ""]
            for f, nodes in same_on_nodes(remedies):
                ref = doc_ref(f)
                see = f" (see `{ref}`)" if ref else ""
                out.append(f"- **{_cell(f.test_id)}** ({_cell(nodes_of(nodes))}): {_cell(f.remedy)}{see}")
        if report.cost:
            out += ["", "### Cost", ""]
            out += [f"- {_cell(k)}: {_cell(v)}" for k, v in report.cost.items() if not isinstance(v, (dict, list))]
        if report.notes:
            out += ["", "### Notes", ""] + [f"- {_cell(n)}" for n in report.notes]
        return out


def _few_nodes(nodes: tuple[str, ...]) -> str:
    """`nodes_text` for a summarized report: the first few nodes, the rest counted."""
    if len(nodes) <= _NODES_SHOWN:
        return nodes_text(nodes)
    return f"{len(nodes):,} nodes: " + ", ".join(nodes[:_NODES_SHOWN]) + f" and {len(nodes) - _NODES_SHOWN:,} more"
