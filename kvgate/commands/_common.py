"""What every command shares: the one fatal path from errors to exit statuses, and strictness."""

from __future__ import annotations

import contextvars
import functools
import io
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import typer
from typer.core import TyperCommand, TyperGroup

from kvgate.errors import InternalError, Interrupted, KvgateError, UsageError
from kvgate.exitcodes import ExitStatus
from kvgate.formats import ReportFormat
from kvgate.output import sinks
from kvgate.output.redact import register
from kvgate.output.redact import scope as redact_scope
from kvgate.results.findings import INTERNAL_CHECK, Finding, Outcome, Report

F = TypeVar("F", bound=Callable[..., Any])
# click's UsageError (typer vendors click from 0.27 on): the base of typer.BadParameter, found by name.
_CLICK_USAGE_ERROR: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")

# The report options every reporting command names one of these ways.
_FORMAT_KWARGS = ("fmt", "formats")
_OUTPUT_KWARGS = ("output", "outputs")


def fail(message: str, status: ExitStatus) -> typer.Exit:
    """Print an actionable message to stderr and return the Exit to raise."""
    sinks.echo(f"kvgate: error: {message}", err=True, indent_lines=True)
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
    from kvgate.formats.reporting import pair_outputs

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
            for key in ("token_env", "router_token_env"):
                name = kwargs.get(key)
                if isinstance(name, str) and name and os.environ.get(name, "").strip():
                    register(os.environ[name].strip())
            return _run(*args, **kwargs)

    def _run(*args: Any, **kwargs: Any) -> Any:
        from kvgate.deploy.supervisor import stop_on_sigterm

        try:
            with stop_on_sigterm():  # a pipeline's timeout sends SIGTERM: it gets a report too
                return func(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (kvgate.deploy.supervisor.Stopped)
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
    check = INTERNAL_CHECK if isinstance(err, InternalError) else "run"
    finding = Finding("kvgate", check, "kvgate", Outcome.ERROR, str(err))
    return Report(command=command, findings=(finding,), strict=strict, fatal_status=err.exit_status)


def logs_left(what: str, log_dir: Path | None) -> tuple[str, ...]:
    """The report's note for a run's log folder, where it left one (interrupted runs included)."""
    from kvgate.paths import left_behind

    if log_dir is None or not log_dir.is_dir():
        return ()
    return (left_behind(what, log_dir, f"delete with rm -rf {log_dir}"),)


def with_notes(report: Report, notes: tuple[str, ...]) -> Report:
    return replace(report, notes=report.notes + notes) if notes else report


def _same_place() -> bool:
    """stdout and stderr end in the same place: the same terminal, or the same file or pipe (`2>&1`,
    a job log that takes both through one pipe). A line on each would show it twice there."""
    try:
        out, err = os.fstat(sys.stdout.fileno()), os.fstat(sys.stderr.fileno())
        if (out.st_dev, out.st_ino) == (err.st_dev, err.st_ino):
            return True
        if sys.stdout.isatty() and sys.stderr.isatty():
            return os.ttyname(sys.stdout.fileno()) == os.ttyname(sys.stderr.fileno())
        return False
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return False


def _cannot_write(dest: Path) -> str | None:
    """Why a report file plainly cannot be written there (checked before anything is rendered)."""
    if dest.is_dir():
        return "it is a folder"
    parent = dest.parent
    if not parent.is_dir():
        return f"no folder {parent}"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"the folder {parent} is not writable"
    return None


def _unwritable_outputs(
    report: Report, pairs: list[tuple[ReportFormat, Path | None]]
) -> tuple[Report, list[tuple[ReportFormat, Path | None]]]:
    """A passing report whose file cannot be written is a usage error (exit 2) in every output, the
    table included, before any is rendered; any other verdict stands, with a note. Returns the report
    and the outputs still to write."""
    why = {i: _cannot_write(dest) for i, (_, dest) in enumerate(pairs) if dest is not None}
    said = [f"cannot write the {pairs[i][0].value} report to {pairs[i][1]}: {w}" for i, w in why.items() if w]
    if not said:
        return report, pairs
    kept = [pair for i, pair in enumerate(pairs) if not why.get(i)]
    if report.exit_status is ExitStatus.PASSED:
        errors = tuple(Finding("kvgate", "run", "kvgate", Outcome.ERROR, s) for s in said)
        return replace(report, findings=report.findings + errors, fatal_status=ExitStatus.USAGE_ERROR), kept
    for s in said:
        sinks.echo(f"kvgate: error: {s}", err=True)
    return replace(report, notes=report.notes + tuple(said)), kept


def finish(
    report: Report, pairs: list[tuple[ReportFormat, Path | None]], verbose: bool = False, hint: str | None = None
) -> NoReturn:
    """Write the report everywhere it was asked for, then exit with its status.

    The table on stdout carries the verdict and any error. stderr repeats them (`kvgate: error: ...`,
    once, then the verdict line) only where the table is not read there: stdout carries a machine format
    (`-f json`, `-f sarif`, ...), or stdout goes elsewhere than stderr. `hint` follows an
    error. With strictness opted out the report says so and names what was not observed. A report file
    that could not be written turns a pass into a usage error, and the table says so: a pipeline must
    not promote on a verdict nobody can read.
    """
    from kvgate.formats.digest import verdict_line
    from kvgate.formats.reporting import emit

    report, pairs = _unwritable_outputs(report, pairs)
    on_stdout = [fmt for fmt, dest in pairs if dest is None]
    table_read = (not on_stdout or ReportFormat.TABLE in on_stdout) and _same_place()
    if report.fatal_status is not None:
        if not table_read:
            for f in report.findings:
                if f.outcome is Outcome.ERROR:
                    sinks.echo(f"kvgate: error: {f.summary}", err=True, indent_lines=True)
        if hint:
            for line in hint.split("\n"):  # kvgate's own lines
                sinks.echo(line, err=True)

    note = report.strictness_note()
    if note and report.fatal_status is None:
        report = replace(report, notes=report.notes + (note,))
    problems = emit(report, pairs, verbose=verbose)
    for p in problems:
        sinks.echo(f"kvgate: error: {p}", err=True)
    if on_stdout and ReportFormat.TABLE not in on_stdout:
        sinks.echo(verdict_line(report), err=True)  # stdout is for a machine: the person reads stderr
    status = report.exit_status
    if problems and status is ExitStatus.PASSED:
        status = ExitStatus.USAGE_ERROR
    raise typer.Exit(int(status))


def _requested_pairs(args: list[str]) -> list[tuple[ReportFormat, Path | None]]:
    """The report destinations named on a command line that did not parse (best effort, never raises).

    Read from the raw arguments, since the parser gave up: `--format X`, `--format=X`, `-f X`, `-fX`
    and the same for `--output`/`-o`. An unknown format is left out (it may be the very error); with
    nothing usable the report is the table on stdout.
    """
    fmts: list[ReportFormat] = []
    outs: list[Path] = []
    known = {f.value: f for f in ReportFormat}
    i = 0
    while i < len(args):
        arg = args[i]
        value: str | None = None
        kind = None
        for long, short, k in (("--format", "-f", "f"), ("--output", "-o", "o")):
            if arg in (long, short):
                kind, value = k, args[i + 1] if i + 1 < len(args) else None
                i += 1
            elif arg.startswith(long + "="):
                kind, value = k, arg[len(long) + 1 :]
            elif arg.startswith(short) and not arg.startswith("--") and len(arg) > 2:
                kind, value = k, arg[2:]
        if arg == "--":
            break
        if kind == "f" and value in known:
            fmts.append(known[value])
        elif kind == "o" and value:
            outs.append(Path(value))
        i += 1
    from kvgate.formats.reporting import pair_outputs

    try:
        return pair_outputs(fmts, outs)
    except KvgateError:
        return [(ReportFormat.TABLE, None)]


_RAW_ARGS: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("kvgate_raw_args", default=())


def raw_args() -> list[str]:
    """The arguments the running command was given, as typed (after its name)."""
    return list(_RAW_ARGS.get())


class ReportingCommand(TyperCommand):
    """A command whose flag-validation errors (a value out of range, an unknown option) write the report too.

    The parser fails before the command's own code runs, so this writes the usage-error report to
    every destination the raw arguments ask for, prints the error once (`kvgate: error: ...` and
    where to look), and exits 2, as a profile error does.
    """

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        raw = list(args)
        try:
            made = super().make_context(info_name, args, parent=parent, **extra)
            _RAW_ARGS.set(tuple(raw))
            return made
        except _CLICK_USAGE_ERROR as exc:
            resilient = extra.get("resilient_parsing") or getattr(parent, "resilient_parsing", False)
            if resilient or not any(p.name in _FORMAT_KWARGS for p in self.params):
                raise  # only parsing (completion, a test's parser check): no run, no report
            name = info_name or self.name or "kvgate"
            report = fatal_report(name, UsageError(getattr(exc, "format_message", exc.__str__)()))
            ctx = getattr(exc, "ctx", None)
            prog = ctx.command_path if ctx is not None else f"kvgate {name}"
            try:
                finish(report, _requested_pairs(raw), hint=f"Try '{prog} --help' for help.")
            except typer.Exit as done:
                raise typer.Exit(done.exit_code) from None


def with_anchors(report: Report, **files: str | Path | None) -> Report:
    """The report with the files a SARIF reader may anchor results at (profile_file, baseline_file,
    sarif_anchor): only those that exist as files; the formatter picks the first inside the repository.
    A `--sarif-anchor` that is not a file is said in the report's notes (results anchor elsewhere)."""
    named = {k: str(v) for k, v in files.items() if v is not None and Path(v).is_file()}
    anchor = files.get("sarif_anchor")
    if anchor is not None and "sarif_anchor" not in named:
        why = "does not exist" if not Path(anchor).exists() else "is not a file"
        note = (
            f"--sarif-anchor {anchor} {why}: SARIF results are anchored at the next file named, or .kvgate/deployment"
        )
        report = replace(report, notes=(*report.notes, note))
    if not named or not isinstance(report.target, dict):
        return report
    return replace(report, target={**report.target, **named})


def deprecated_alias(new: str, old: str, value: Any, old_value: Any) -> Any:
    """The value of `new`, or of its hidden deprecated spelling `old` (said once on stderr); both is a usage error."""
    if old_value is None:
        return value
    if value is not None:
        raise UsageError(f"{old} is the deprecated spelling of {new}: give {new} only")
    sinks.echo(f"kvgate: warning: {old} is deprecated; use {new}", err=True)
    return old_value


class _KvgateUsage(_CLICK_USAGE_ERROR):  # type: ignore[misc,valid-type]
    """A parser error said kvgate's way: `kvgate: error: ...` and where to look, exit 2."""

    def show(self, file: Any = None) -> None:
        prog = self.ctx.command_path if self.ctx is not None else "kvgate"
        sinks.echo(f"kvgate: error: {self.message}", err=True)
        sinks.echo(f"Try '{prog} --help' for help.", err=True)


# Metavars by what an option names (the first match wins), then by its type: never `<list[str]>`.
_METAVAR_BY_NAME: tuple[tuple[str, str], ...] = (
    ("url", "URL"),
    ("listen", "HOST:PORT"),
    ("token-env", "VAR"),
    ("python", "CMD"),
    ("profile", "PROFILE"),
    ("engine", "sim|sglang"),
    ("ib-device", "DEVICE"),
    ("device", "gpu|cpu"),
    ("transfer-backend", "BACKEND"),
    ("backend", "BACKEND"),
    ("kv-cache-dtype", "DTYPE"),
    ("model-arch", "ARCH"),
    ("model-path", "PATH"),
    ("worker-arg", "ARG"),
    ("rev", "REV"),
    ("fixed-by", "SERIES"),
    ("waiver", "CHECK"),
    ("deadline", "SECONDS"),
    ("timeout", "SECONDS"),
    ("interval", "SECONDS"),
    ("max-age", "SECONDS"),
    ("regate-every", "SECONDS"),
)


def _metavar(param: Any) -> str | None:
    """The placeholder `--help` shows for a value: what it is (URL, PATH, N, SECONDS), never a Python type."""
    if param.metavar is not None or getattr(param, "is_flag", False) or getattr(param, "count", False):
        return None
    opt = max(param.opts, key=len).lstrip("-")
    for key, metavar in _METAVAR_BY_NAME:
        if key in opt:
            return metavar
    desc = getattr(param, "type_descriptor", None)  # typer's own reading of the annotation (typer vendors click)
    if desc is None:  # typer before 0.29 (the single file pins 0.28): read click's parameter type instead
        return _metavar_from_click(param, opt)
    if desc.choices:
        return "|".join(str(getattr(c, "value", c)) for c in desc.choices)
    ann = desc.annotation
    if desc.is_list:
        ann = ann.__args__[0]
    if desc.is_path or ann is Path or opt.endswith(("dir", "baseline", "config", "output", "anchor", "packages")):
        return "PATH"
    if ann is int:
        return "N"
    if ann is float:
        return "X"
    return "TEXT"


def _default_said(param: Any) -> None:
    """One style of defaults: `(default: X)` in the help; never typer's `[default: X]` beside it."""
    help_text = param.help or ""
    help_text = help_text.replace("(default ", "(default: ").replace("(default: :", "(default:")
    default = param.default
    shown = default not in (None, False, (), []) and not getattr(param, "is_flag", False)
    if shown and "default" not in help_text and not callable(default):
        value = (
            f"{default:g}" if isinstance(default, float) and abs(default) < 1e6 else getattr(default, "value", default)
        )
        value = int(value) if isinstance(value, float) and value.is_integer() else value
        help_text = (
            f"{help_text.rstrip()[:-1] if help_text.rstrip().endswith('.') else help_text.rstrip()} (default: {value})."
        )
    param.help = help_text
    param.show_default = False


def _metavar_from_click(param: Any, opt: str) -> str:
    """The same placeholder, from click's ParamType (typer < 0.29 has no type descriptor)."""
    kind = getattr(param, "type", None)
    choices = getattr(kind, "choices", None)
    if choices:
        return "|".join(str(getattr(c, "value", c)) for c in choices)
    name = type(kind).__name__
    if name == "Path" or opt.endswith(("dir", "baseline", "config", "output", "anchor", "packages")):
        return "PATH"
    if name in ("IntParamType", "IntRange"):
        return "N"
    if name in ("FloatParamType", "FloatRange"):
        return "X"
    return "TEXT"


def one_vocabulary(cmd: Any) -> None:
    """Every option of `cmd` and its subcommands with a real metavar and one style of defaults."""
    for param in getattr(cmd, "params", ()):
        if isinstance(param, typer.core.TyperOption) and not param.hidden:
            param.metavar = param.metavar or _metavar(param)
            _default_said(param)
    for sub in (getattr(cmd, "commands", None) or {}).values():
        one_vocabulary(sub)


def summary_of(cmd: Any) -> str:
    """A command's one-sentence summary: its short help, else its help's first sentence, whole."""
    text = cmd.short_help or (cmd.help or "").split("\n\n")[0]
    text = " ".join(text.split())
    head, dot, _ = text.partition(". ")
    return head + "." if dot else text


class KvgateGroup(TyperGroup):
    """The command groups: an unknown command or a missing argument answers as every kvgate error does;
    every option shows a real metavar and its default one way (one_vocabulary)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        one_vocabulary(self)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """Each command with its whole summary, wrapped (click cuts it at the width with "...")."""
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is None or cmd.hidden:
                continue
            rows.append((name, summary_of(cmd)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except _KvgateUsage:
            raise
        except _CLICK_USAGE_ERROR as exc:
            raise _KvgateUsage(exc.format_message(), getattr(exc, "ctx", None)) from None  # type: ignore[attr-defined]
