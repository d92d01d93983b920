"""`kvgate cache`: what kvgate keeps in its cache folder (KVGATE_CACHE_DIR), how big, and clearing it.

Clearing is confined to the cache folder: an entry is removed where it lies, a symbolic link as a link
(never what it points to), and a cache folder that is itself a link is refused rather than followed.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import typer

from kvgate.commands import options as opt
from kvgate.commands._common import fail
from kvgate.exitcodes import ExitStatus
from kvgate.output import sinks


def _entry_size(path: Path) -> int:
    from kvgate.paths import tree_size

    st = os.lstat(path)
    return tree_size(path) if stat.S_ISDIR(st.st_mode) else st.st_size


def _remove(entry: Path, root: Path) -> None:
    """Remove one top-level entry of `root` without following any link out of it."""
    if entry.parent != root or entry.name in ("", ".", ".."):
        raise ValueError(f"{entry} is not an entry of {root}")
    st = os.lstat(entry)
    if stat.S_ISDIR(st.st_mode):
        # rmtree removes links inside as links (it does not descend into them) and refuses a link as its top.
        shutil.rmtree(entry)
    else:
        entry.unlink()


def cache(
    clear: bool = typer.Option(False, "--clear", help="Delete the cache's contents (every entry, or each --entry)."),
    names: list[str] = typer.Option([], "--entry", metavar="NAME", help="One entry to list or clear (repeatable)."),
    quiet: bool = opt.quiet("Print only the total (errors still print)."),
) -> None:
    """List kvgate's cache (real sglang wheels, CPU environments, tiny models) with sizes, or clear it."""
    from kvgate.paths import cache_dir, human_size

    configured = os.environ.get("KVGATE_CACHE_DIR")
    if configured and os.path.islink(configured):
        raise fail(f"KVGATE_CACHE_DIR {configured} is a symbolic link: name the folder itself", ExitStatus.USAGE_ERROR)
    root = cache_dir()
    if root.is_symlink():
        raise fail(f"the cache folder {root} is a symbolic link: name the folder itself", ExitStatus.USAGE_ERROR)
    root = root.resolve()
    entries = sorted(root.iterdir(), key=lambda p: p.name)
    names = list(names or [])
    for name in names:
        if "/" in name or name in (".", "..") or not any(e.name == name for e in entries):
            known = ", ".join(e.name for e in entries) or "none"
            raise fail(f"{name!r} is not an entry of the cache {root} (entries: {known})", ExitStatus.USAGE_ERROR)
    chosen = [e for e in entries if not names or e.name in names]
    sizes = {e: _entry_size(e) for e in chosen}
    if not clear:
        sinks.echo(f"kvgate cache: {root} ({human_size(sum(sizes.values()))}; KVGATE_CACHE_DIR moves it)")
        for e in [] if quiet else chosen:
            kind = f"link -> {os.readlink(e)}" if e.is_symlink() else ("folder" if e.is_dir() else "file")
            sinks.echo(f"  {human_size(sizes[e]):>9}  {e.name}  ({kind})")
        if chosen and not quiet:
            sinks.echo("Clear it with: kvgate cache --clear [--entry NAME]... (rebuilt on next use)")
        return
    freed = 0
    for e in chosen:
        try:
            _remove(e, root)
        except OSError as exc:
            raise fail(f"could not delete {e}: {exc}", ExitStatus.TRANSPORT_ERROR) from None
        freed += sizes[e]
        if not quiet:
            sinks.echo(f"deleted {e} ({human_size(sizes[e])})")
    sinks.echo(f"kvgate cache: freed {human_size(freed)} in {root}")
