"""Where kvgate keeps its data (profiles, patch series) and its cache."""

from __future__ import annotations

import os
from pathlib import Path

_PKG = Path(__file__).resolve().parent


def _data_dir(name: str) -> Path:
    # A source checkout (editable install) keeps the folders at the top level; a wheel ships them
    # under kvgate/_data.
    repo = _PKG.parent / name
    if repo.is_dir():
        return repo
    return _PKG / "_data" / name


def profiles_dir() -> Path:
    return _data_dir("gate_profiles")


def backports_dir() -> Path:
    return _data_dir("backports")


def checks_doc() -> Path:
    """docs/checks.md: one short page per check ID."""
    return _data_dir("docs") / "checks.md"


def cache_dir() -> Path:
    """KVGATE_CACHE_DIR, else .cache/kvgate in a source checkout, else ~/.cache/kvgate."""
    env = os.environ.get("KVGATE_CACHE_DIR")
    if env:
        path = Path(env)
    elif (_PKG.parent / "pyproject.toml").is_file():
        path = _PKG.parent / ".cache" / "kvgate"
    else:
        path = Path.home() / ".cache" / "kvgate"
    path.mkdir(parents=True, exist_ok=True)
    return path
