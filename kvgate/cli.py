"""The kvgate command line: parse, call the library, write the report, exit. Nothing else lives here."""

from __future__ import annotations

import sys

import typer

from kvgate import __version__
from kvgate.commands._common import KvgateGroup

app = typer.Typer(
    name="kvgate",
    cls=KvgateGroup,
    help="Deploy gate and backport toolkit against cross-request KV exposure in SGLang PD disaggregation.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help: Rich's boxed panels cut option names off at 80 columns.
    rich_markup_mode=None,
)


def _version_callback(value: bool) -> None:
    if value:
        from kvgate.output import sinks

        sinks.echo(f"kvgate {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version."
    ),
) -> None:
    """kvgate: make a rejected request that is served from another tenant's KV impossible to ship."""


# --- subcommands: each lives in its own module and is registered here -------------------------
# ReportingCommand: a flag that fails validation still gets the report, in every format asked for.
from kvgate.commands._common import ReportingCommand  # noqa: E402
from kvgate.commands.check import check  # noqa: E402

app.command("check", cls=ReportingCommand)(check)
from kvgate.commands.drill import drill  # noqa: E402

app.command("drill", cls=ReportingCommand)(drill)
from kvgate.commands.up import up  # noqa: E402

app.command("up", cls=ReportingCommand)(up)
# (more subcommands are registered below this line)
from kvgate.commands.backport import backport  # noqa: E402

app.command("backport", cls=ReportingCommand)(backport)
from kvgate.sim.cli import sim_app  # noqa: E402

app.add_typer(sim_app, name="sim")
from kvgate.commands.fixes import fixes  # noqa: E402

app.command("fixes", cls=ReportingCommand)(fixes)
from kvgate.commands.schema import schema  # noqa: E402

app.command("schema", cls=ReportingCommand)(schema)
from kvgate.commands.watch import watch  # noqa: E402

app.command("watch")(watch)
from kvgate.commands.soak import soak  # noqa: E402

app.command("soak", cls=ReportingCommand)(soak)

from kvgate.commands.plan import plan  # noqa: E402

app.command("plan", cls=ReportingCommand)(plan)
from kvgate.commands.cache import cache  # noqa: E402

app.command("cache")(cache)


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover - interactive only
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
