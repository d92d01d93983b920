"""Human report rendered with Rich (colour on a TTY, plain text otherwise)."""

from __future__ import annotations

import io

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvgate.findings import Outcome, Report
from kvgate.formats.base import Formatter

_STYLE = {Outcome.PASSED: "green", Outcome.FAILED: "bold red", Outcome.INCONCLUSIVE: "yellow", Outcome.ERROR: "magenta"}


def _evidence_text(report_finding) -> str:  # type: ignore[no-untyped-def]
    parts = []
    for e in report_finding.evidence:
        exp = f" (want {e.expected})" if e.expected else ""
        parts.append(f"{e.field}={e.value}{exp}")
    return "; ".join(parts)


class TableFormatter(Formatter):
    def __init__(self, color: bool = False, width: int = 160) -> None:
        self.color = color
        self.width = width

    def render(self, report: Report) -> str:
        buf = io.StringIO()
        console = Console(file=buf, force_terminal=self.color, no_color=not self.color, width=self.width)
        self.print_to(console, report)
        return buf.getvalue()

    def print_to(self, console: Console, report: Report) -> None:
        table = Table(title=f"kvgate {report.command}", show_lines=False, expand=False)
        for col in ("result", "gate", "check", "node", "summary", "evidence"):
            table.add_column(col, overflow="fold")
        for f in report.findings:
            # Text from targets and gates is data, not markup: "[...]" must print as is.
            table.add_row(
                f"[{_STYLE[f.outcome]}]{f.outcome.value}[/]" + (" [dim](waived)[/]" if f.waived else ""),
                *(escape(x) for x in (f.gate, f.check, f.node, f.summary, _evidence_text(f))),
            )
        console.print(table)
        for f in report.findings:
            if f.waived:
                console.print(f"[bold]waived[/] {escape(f.test_id)} ({escape(f.node)}): {escape(f.waived)}")
            if f.remedy and f.outcome is not Outcome.PASSED:
                console.print(f"[bold]remedy[/] {escape(f.test_id)} ({escape(f.node)}): {escape(f.remedy)}")
        if report.cost:
            console.print(escape("cost: " + ", ".join(f"{k}={v}" for k, v in report.cost.items())))
        for n in report.notes:
            console.print(escape(f"note: {n}"))
        status = report.exit_status
        c = report.counts()
        console.print(
            f"[bold]{status.name.replace('_', ' ').lower()}[/] (exit {int(status)}): "
            f"{c['passed']} passed, {c['failed']} failed, {c['inconclusive']} inconclusive, {c['error']} errors"
            + (f" ({c['waived']} waived)" if c["waived"] else "")
        )
