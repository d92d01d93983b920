"""Human report rendered with Rich (colour on a TTY, plain text otherwise).

Read in ten seconds: the verdict, then the findings that decide it (one line each), then the detail
of what did not pass as `field = value (want ...)` lines, each with its remedy and its page in
docs/checks.md; passed checks are one line unless `--verbose` asks for all of them.
"""

from __future__ import annotations

import io
import shutil

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvgate.formats.base import Formatter
from kvgate.formats.digest import (
    NEXT_STEP,
    counts_line,
    doc_ref,
    evidence_line,
    headlines,
    nodes_text,
    passed_digest,
    same_on_nodes,
    verdict_line,
)
from kvgate.results.findings import Finding, Outcome, Report

_STYLE = {
    Outcome.PASSED: "green",
    Outcome.FAILED: "bold red",
    Outcome.INCONCLUSIVE: "yellow",
    Outcome.ERROR: "magenta",
    Outcome.INFO: "cyan",
}
_LABEL = {
    Outcome.PASSED: "PASS",
    Outcome.FAILED: "FAIL",
    Outcome.INCONCLUSIVE: "INCONCLUSIVE",
    Outcome.ERROR: "ERROR",
    Outcome.INFO: "INFO",
}
_QUIET = (Outcome.PASSED, Outcome.INFO)  # one digest line each unless --verbose
FILE_WIDTH = 100  # a report written to a file has no terminal; wide enough for a log viewer


def terminal_width() -> int:
    """The real terminal's width (COLUMNS, then the tty), never below 60."""
    return max(60, shutil.get_terminal_size((FILE_WIDTH, 24)).columns)


class TableFormatter(Formatter):
    def __init__(self, color: bool = False, width: int | None = None, verbose: bool = False) -> None:
        self.color = color
        self.width = width or FILE_WIDTH
        self.verbose = verbose

    def render(self, report: Report) -> str:
        buf = io.StringIO()
        console = Console(
            file=buf,
            force_terminal=self.color,
            no_color=not self.color,
            width=self.width,
            soft_wrap=False,
            highlight=False,
            emoji=False,  # ":smile:" in a server's text prints as typed
        )
        self.print_to(console, report)
        return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"

    def _label(self, f: Finding) -> str:
        return f"[{_STYLE[f.outcome]}]{_LABEL[f.outcome]}[/]" + (" [dim](waived)[/]" if f.waived else "")

    def print_to(self, console: Console, report: Report) -> None:
        status = report.exit_status
        style = "bold green" if status == 0 else "bold red"
        # Text from targets and gates is data, not markup: "[...]" must print as is.
        # one line, never folded: pipelines grep "(exit N)"
        console.print(f"[{style}]{escape(verdict_line(report))}[/]", soft_wrap=True)
        console.print(escape(counts_line(report)))
        lines, more = headlines(report)
        if lines:
            grid = Table.grid(padding=(0, 1))
            grid.add_column(no_wrap=True)
            grid.add_column(overflow="fold")
            for h in lines:
                grid.add_row(
                    f"[{_STYLE[h.outcome]}]{_LABEL[h.outcome]}[/]",
                    f"[bold]{escape(h.check_id)}[/] {escape(h.where)}: {escape(h.summary)}",
                )
            console.print(grid)
            if more:
                console.print(f"... and {more} more below")
        for n in report.notes:
            if n.startswith(NEXT_STEP):
                console.print(f"[bold]{escape(n)}[/]", soft_wrap=True)  # one line: it is copied whole
        headlined = {(h.check_id, n) for h in lines for n in h.nodes}
        if self._details(console, report, headlined):
            console.print(f"[bold]{escape(verdict_line(report))}[/]", soft_wrap=True)  # again, below a long report

    def _details(self, console: Console, report: Report, headlined: set[tuple[str, str]]) -> bool:
        """The detail below the headlines; False when there was nothing more to say."""

        def adds_nothing(f: Finding) -> bool:  # its headline already said all of it (e.g. a usage error)
            return (f.test_id, f.node) in headlined and not (f.evidence or f.remedy or f.waived)

        shown = [
            f
            for f in report.findings
            if (self.verbose or f.outcome not in _QUIET or f.waived) and not (adds_nothing(f) and not self.verbose)
        ]
        said = bool(shown)
        if shown:
            console.print()
            console.rule(
                "detail" if self.verbose else "detail (what did not pass; --verbose for all)", style="dim", align="left"
            )
        for f, nodes in same_on_nodes(shown):
            console.print(f"{self._label(f)} [bold]{escape(f.test_id)}[/] {escape(nodes_text(nodes))}")
            grid = Table.grid(padding=(0, 0))
            grid.add_column(width=4, no_wrap=True)
            grid.add_column(no_wrap=True)
            grid.add_column(overflow="fold")
            grid.add_row("", "", escape(f.summary))
            for e in f.evidence:
                grid.add_row("", "- ", escape(evidence_line(e, f.node, full=self.verbose)))
            if f.waived:
                grid.add_row("", "", f"[bold]waived[/]: {escape(f.waived)}")
            if f.remedy and f.outcome not in _QUIET:
                grid.add_row("", "", f"[bold]fix[/]: {escape(f.remedy)}")
            ref = doc_ref(f)
            if ref and f.outcome not in _QUIET:
                grid.add_row("", "", f"see {escape(ref)}")
            console.print(grid)
        if not self.verbose:
            digests = [(o.value, passed_digest(report, o)) for o in _QUIET]
            if any(d for _, d in digests):
                console.print()
            for name, digest in digests:
                if digest:
                    said = True
                    console.print(escape(f"{name}: {digest}"))
        if report.cost:
            said = True
            # a soak's series (a nested document) belong to the json and html reports, not to this line
            flat = {k: v for k, v in report.cost.items() if not isinstance(v, (dict, list))}
            console.print(escape("cost: " + ", ".join(f"{k}={v}" for k, v in flat.items())))
        for n in report.notes:
            if n.startswith(NEXT_STEP):
                continue  # shown under the headlines
            said = True
            console.print(escape(f"note: {n}"))
        return said
