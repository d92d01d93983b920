"""What every command shares: the one fatal path from domain errors to exit statuses."""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

import typer

from kvgate.errors import KvgateError
from kvgate.exitcodes import ExitStatus
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
