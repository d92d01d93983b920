"""Redaction of everything kvgate prints, and the secrets (bearer tokens) it redacts, read from the environment."""

from __future__ import annotations

import os

from kvgate.errors import UsageError

_SECRETS: set[str] = set()
MASK = "***"


def register(value: str) -> None:
    """Remember a secret so that `redact` removes it from any text."""
    if value:
        _SECRETS.add(value)


def token_from_env(name: str | None) -> str | None:
    """Read a bearer token from environment variable `name`; a named but unset variable is a usage error."""
    if not name:
        return None
    value = os.environ.get(name)
    if value is None or not value.strip():
        raise UsageError(f"--token-env {name}: environment variable {name} is not set or empty")
    value = value.strip()
    register(value)
    return value


def redact(text: str) -> str:
    """`text` with every registered secret replaced by MASK (longest first)."""
    for s in sorted(_SECRETS, key=len, reverse=True):
        text = text.replace(s, MASK)
    return text
