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


def tree_size(path: Path) -> int:
    """Bytes under `path` (files only, links not followed); 0 when it does not exist."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def human_size(n: int) -> str:
    """1234567 -> '1.2 MB'."""
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"


def left_behind(what: str, path: Path, clear: str) -> str:
    """The note a run leaves when it leaves files: where, how big, how to clear them."""
    return f"{what}: {path} ({human_size(tree_size(path))}); {clear}"


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
