"""What every command shares: the one fatal path from errors to exit statuses, and strictness."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import typer

from kvgate.errors import InternalError, Interrupted, KvgateError
from kvgate.exitcodes import ExitStatus
from kvgate.findings import INTERNAL_CHECK, Finding, Outcome, Report
from kvgate.formats import ReportFormat
from kvgate.redact import redact_output, register
from kvgate.redact import scope as redact_scope

F = TypeVar("F", bound=Callable[..., Any])

STRICT_HELP = (
    "Inconclusive checks block (exit 3): the default. --no-strict lets them pass; the report then says "
    "so and lists what was not observed."
)
# The report options every reporting command names one of these ways.
_FORMAT_KWARGS = ("fmt", "formats")
_OUTPUT_KWARGS = ("output", "outputs")


def fail(message: str, status: ExitStatus) -> typer.Exit:
    """Print an actionable message to stderr and return the Exit to raise."""
    typer.echo(f"kvgate: error: {redact_output(message)}", err=True)
    return typer.Exit(int(status))


def resolve_strict(flag: bool | None, profile_strict: bool | None = None) -> tuple[bool, str]:
    """Strictness and where it came from: the flag, then the profile, then the default (strict)."""
    if flag is not None:
        return flag, "--strict" if flag else "--no-strict"
    if profile_strict is not None:
        return profile_strict, f"profile strict: {str(profile_strict).lower()}"
    return True, "default"


def _reported_pairs(kwargs: dict[str, Any]) -> list[tuple[ReportFormat, Path | None]]:
    """The report destinations a command was asked for, from its own arguments (stdout table if unusable)."""
    fmts = next((kwargs[k] for k in _FORMAT_KWARGS if k in kwargs), None)
    outs = next((kwargs[k] for k in _OUTPUT_KWARGS if k in kwargs), None)
    if fmts is None and outs is None:
        return []
    from kvgate.reporting import pair_outputs

    try:
        return pair_outputs(list(fmts or []), list(outs or []))
    except KvgateError:
        return [(ReportFormat.TABLE, None)]


def handle_errors(func: F) -> F:
    """Turn every exception into one fatal path: the report (where the command writes one), then the exit.

    Domain errors exit with their own status; anything else is kvgate's own crash (exit 5), reported
    without a traceback. typer.Exit subclasses RuntimeError, so it is re-raised untouched first.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # The secrets a command reads are its own: every output of the command (the report, the fatal
        # path below) happens inside this scope, and a later command in the same process (a test, a
        # library caller) starts without them.
        with redact_scope():
            # Known before anything can print: an error about a flag or a profile is redacted too.
            name = kwargs.get("token_env")
            if isinstance(name, str) and name and os.environ.get(name, "").strip():
                register(os.environ[name].strip())
            return _run(*args, **kwargs)

    def _run(*args: Any, **kwargs: Any) -> Any:
        from kvgate.supervisor import stop_on_sigterm

        try:
            with stop_on_sigterm():  # a pipeline's timeout sends SIGTERM: it gets a report too
                return func(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (kvgate.supervisor.Stopped)
            stopped = Interrupted(func.__name__)
            pairs = _reported_pairs(kwargs)
            if not pairs:
                raise fail(str(stopped), stopped.exit_status) from None
            finish(fatal_report(func.__name__, stopped), pairs)
        except Exception as exc:  # noqa: BLE001 - the one place that turns a crash into an exit status
            err = exc if isinstance(exc, KvgateError) else InternalError(func.__name__, exc)
            pairs = _reported_pairs(kwargs)
            if not pairs:
                raise fail(str(err), err.exit_status) from None
            finish(fatal_report(func.__name__, err), pairs)

    return wrapper  # type: ignore[return-value]


def fatal_report(command: str, exc: BaseException, strict: bool = True) -> Report:
    """The report of a run that could not start or broke: one error finding, the error's exit status.

    A non-domain exception is kvgate's own crash: exit 5 (internal), never a pass.
    """
    err = exc if isinstance(exc, KvgateError) else InternalError(command, exc)
    typer.echo(f"kvgate: error: {redact_output(str(err))}", err=True)
    check = INTERNAL_CHECK if isinstance(err, InternalError) else "run"
    finding = Finding("kvgate", check, "kvgate", Outcome.ERROR, str(err))
    return Report(command=command, findings=(finding,), strict=strict, fatal_status=err.exit_status)


VERBOSE_HELP = "Show every finding's detail in the table, passed ones too."


def finish(report: Report, pairs: list[tuple[ReportFormat, Path | None]], verbose: bool = False) -> NoReturn:
    """Write the report everywhere it was asked for, then exit with its status.

    With strictness opted out the report says so and names what was not observed. A report file that
    could not be written turns a pass into a usage error: a pipeline must not promote on a verdict
    nobody can read.
    """
    from kvgate.reporting import emit

    note = report.strictness_note()
    if note and report.fatal_status is None:
        report = replace(report, notes=report.notes + (note,))
    problems = emit(report, pairs, verbose=verbose)
    for p in problems:
        typer.echo(f"kvgate: error: {redact_output(p)}", err=True)
    status = report.exit_status
    if problems and status is ExitStatus.PASSED:
        status = ExitStatus.USAGE_ERROR
    raise typer.Exit(int(status))
