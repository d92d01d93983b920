"""`kvgate schema`: print the JSON Schema of the `--format json` report."""

from __future__ import annotations

from kvgate.commands import options as opt


def schema(
    quiet: bool = opt.quiet(opt.QUIET_HELP + " schema prints none; accepted everywhere."),
) -> None:
    """Print the JSON Schema that every `--format json` report validates against."""
    import sys

    from kvgate.formats.json_report import schema_text
    from kvgate.output import sinks

    sinks.write_stream(sys.stdout, schema_text())
