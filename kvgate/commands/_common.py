"""What every command shares: the one fatal path from domain errors to exit statuses."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable, NoReturn, TypeVar

import typer

from kvgate.errors import KvgateError
from kvgate.exitcodes import ExitStatus
from kvgate.findings import Finding, Outcome, Report
from kvgate.formats import ReportFormat
from kvgate.secrets import redact

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, status: ExitStatus) -> typer.Exit:
    """Print an actionable message to stderr and return the Exit to raise."""
    typer.echo(f"kvgate: error: {redact(message)}", err=True)
    return typer.Exit(int(status))


def handle_errors(func: F) -> F:
    """Turn domain exceptions into one fatal path with the right exit status.

    typer.Exit subclasses RuntimeError, so it is re-raised untouched before any broad handler.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except typer.Exit:
            raise
        except KvgateError as exc:
            raise fail(str(exc), exc.exit_status) from None

    return wrapper  # type: ignore[return-value]


def fatal_report(command: str, exc: KvgateError, strict: bool) -> Report:
    """The report of a run that could not start or broke: one error finding, the error's exit status."""
    typer.echo(f"kvgate: error: {redact(str(exc))}", err=True)
    finding = Finding("kvgate", "run", "kvgate", Outcome.ERROR, str(exc))
    return Report(command=command, findings=(finding,), strict=strict, fatal_status=exc.exit_status)


VERBOSE_HELP = "Show every finding's detail in the table, passed ones too."


def finish(report: Report, pairs: list[tuple[ReportFormat, Path | None]], verbose: bool = False) -> NoReturn:
    """Write the report everywhere it was asked for, then exit with its status.

    A report file that could not be written turns a pass into a usage error: a pipeline must not
    promote on a verdict nobody can read.
    """
    from kvgate.reporting import emit

    problems = emit(report, pairs, verbose=verbose)
    for p in problems:
        typer.echo(f"kvgate: error: {redact(p)}", err=True)
    status = report.exit_status
    if problems and status is ExitStatus.PASSED:
        status = ExitStatus.USAGE_ERROR
    raise typer.Exit(int(status))
