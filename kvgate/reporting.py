"""Writing a report to its destinations. Called before every exit, whatever the outcome."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from kvgate.errors import UsageError
from kvgate.findings import Report
from kvgate.formats import ReportFormat
from kvgate.redact import redact_obj, redact_output
from kvgate.safeio import write_atomic


def pair_outputs(formats: list[ReportFormat], outputs: list[Path]) -> list[tuple[ReportFormat, Path | None]]:
    """The i-th --output receives the i-th --format; formats without an output go to stdout."""
    if len(outputs) > max(len(formats), 1):
        raise UsageError(f"{len(outputs)} --output given for {len(formats)} --format; give one --format per --output")
    if not formats:
        formats = [ReportFormat.TABLE]
    pairs: list[tuple[ReportFormat, Path | None]] = []
    for i, fmt in enumerate(formats):
        pairs.append((fmt, outputs[i] if i < len(outputs) else None))
    return pairs


def emit(
    report: Report,
    pairs: list[tuple[ReportFormat, Path | None]],
    stdout: TextIO | None = None,
    verbose: bool = False,
) -> list[str]:
    """Render the report in every requested format; return problems writing files (never raise).

    The table on stdout fits the terminal; a table written to a file gets a fixed width. `verbose`
    shows every finding's detail in the table, not only what did not pass.

    Every format, whatever it is, is redacted twice here: the report before it is rendered (no
    formatter ever sees a secret, so none can fold or cut one) and the rendered text, its final bytes.
    Files are written through `safeio.write_atomic` (no planted temp name or symlink is followed).
    """
    from kvgate.formats.table import TableFormatter, terminal_width

    stdout = stdout or sys.stdout
    width = terminal_width()
    problems: list[str] = []
    report = redact_obj(report)
    to_stdout = [fmt for fmt, dest in pairs if dest is None]
    for fmt, dest in pairs:
        if fmt is ReportFormat.TABLE:
            on_stdout = dest is None
            text = TableFormatter(
                color=on_stdout and stdout.isatty(), width=width if on_stdout else None, verbose=verbose
            ).render(report)
        else:
            text = fmt.formatter().render(report)
        text = redact_output(text)
        if dest is None:
            stdout.write(text)
            continue
        try:
            write_atomic(dest, text)
        except OSError as exc:
            problems.append(f"could not write {fmt.value} report to {dest}: {exc}")
    if not to_stdout:
        # Every format went to a file: a human still reads the verdict in the job log.
        stdout.write(redact_output(TableFormatter(color=stdout.isatty(), width=width, verbose=verbose).render(report)))
    stdout.flush()
    return problems
