"""Writing a report to its destinations. Called before every exit, whatever the outcome."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from kvgate.errors import UsageError
from kvgate.formats import ReportFormat
from kvgate.output import sinks
from kvgate.output.redact import map_strings, redact_obj
from kvgate.output.safeio import stream_fd
from kvgate.results.findings import Report

# Each format's neutralisation of the report's text (server text included) before it is rendered;
# Markdown escapes cell by cell (formats/markdown.py), JSON escapes by its own syntax.
_SINK = {
    ReportFormat.TABLE: sinks.terminal,
    ReportFormat.JUNIT: sinks.xml,
    ReportFormat.SARIF: sinks.terminal,
    ReportFormat.HTML: sinks.visible,
}


def pair_outputs(formats: list[ReportFormat], outputs: list[Path]) -> list[tuple[ReportFormat, Path | None]]:
    """The i-th --output receives the i-th --format; formats without an output, or whose output is
    `-` or names this process's stdout (`/dev/stdout`, `/dev/fd/1`, a link to one), go to stdout."""
    if len(outputs) > max(len(formats), 1):
        raise UsageError(f"{len(outputs)} --output given for {len(formats)} --format; give one --format per --output")
    if not formats:
        formats = [ReportFormat.TABLE]
    pairs: list[tuple[ReportFormat, Path | None]] = []
    for i, fmt in enumerate(formats):
        dest = outputs[i] if i < len(outputs) else None
        pairs.append((fmt, None if dest is not None and (str(dest) == "-" or stream_fd(dest) == 1) else dest))
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
    formatter ever sees a secret, so none can fold or cut one) and the rendered text, its final bytes
    (`sinks.write_stream` / `sinks.write_file`, the output boundary). Between the two, the report's
    text is neutralised for the format's sink (`_SINK`). Files are written through `safeio.write_output`:
    a regular file atomically (no planted temp name or symlink is followed), a path that exists and is
    not a regular file (a FIFO, a terminal, `/dev/stdout`) in place.
    """
    from kvgate.formats.table import TableFormatter, terminal_width

    stdout = stdout or sys.stdout
    width = terminal_width()
    problems: list[str] = []
    report = redact_obj(report)
    to_stdout = [fmt for fmt, dest in pairs if dest is None]
    for fmt, dest in pairs:
        shown = map_strings(report, _SINK[fmt]) if fmt in _SINK else report
        if fmt is ReportFormat.TABLE:
            on_stdout = dest is None
            text = TableFormatter(
                color=on_stdout and stdout.isatty(), width=width if on_stdout else None, verbose=verbose
            ).render(shown)
        else:
            text = fmt.formatter().render(shown)
        if dest is None:
            sinks.write_stream(stdout, text)
            continue
        try:
            sinks.write_file(dest, text)
        except OSError as exc:
            problems.append(f"could not write {fmt.value} report to {dest}: {exc}")
    if not to_stdout:
        # Every format went to a file: a human still reads the verdict in the job log.
        table = TableFormatter(color=stdout.isatty(), width=width, verbose=verbose)
        sinks.write_stream(stdout, table.render(map_strings(report, sinks.terminal)))
    stdout.flush()
    return problems
