"""Writes that never follow a planted path, and paths from files that never leave their root.

Every file kvgate writes (reports, baselines, backport backups, markers, patched sources) goes through
`write_atomic`: the bytes go to a temp file created exclusively (O_CREAT|O_EXCL|O_NOFOLLOW, a fresh
random name) in the destination's own folder, then are renamed over the destination. A symlink or
file someone planted at any name kvgate might use is never opened, so what it points to is never
written; a symlink at the destination itself is replaced, not followed. Readers never see half a file.

Every path read from a state file or manifest goes through `confine`: relative, no `..`, and inside
its root once symlinks are resolved; otherwise `UnsafePath` (exit 2) names the file it came from,
before anything is written.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath

from kvgate.errors import UsageError

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_ATTEMPTS = 64


class UnsafePath(UsageError):
    """A path read from a file points outside its root (absolute, `..`, or a symlink out): exit 2."""

    def __init__(self, source: Path | str, value: object, root: Path, why: str) -> None:
        self.source = str(source)
        super().__init__(f"{source}: path {value!r} {why}; it must stay inside {root}. Nothing was written.")


def write_temp(path: Path, data: bytes | str, mode: int | None = None) -> Path:
    """Write `data` to a new, exclusively created temp file next to `path`; return the temp's path.

    `mode`: the permission bits to give it; None keeps those of an existing regular file at `path`,
    else the umask's default. The caller renames it over `path` (os.replace) or unlinks it.
    """
    path = Path(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    if mode is None:
        with contextlib.suppress(OSError):
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                mode = stat.S_IMODE(st.st_mode)
    for _ in range(_ATTEMPTS):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.kvgate-tmp")
        try:
            fd = os.open(tmp, _FLAGS, 0o666)
        except FileExistsError:
            continue  # someone's file (or link) has that name: never touch it, take another
        break
    else:
        raise FileExistsError(f"{path.parent}: no free temp name after {_ATTEMPTS} tries")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if mode is not None:
                os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def write_atomic(path: Path, data: bytes | str, mode: int | None = None) -> None:
    """Replace `path` with `data` in one rename, through an exclusively created temp file beside it.

    The folder is created if missing. On any failure the temp file is removed and `path` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = write_temp(path, data, mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def relative_part(value: object, source: Path | str, root: Path) -> str:
    """`value` as a safe relative path: a non-empty string, not absolute, no `..`, no NUL, no backslash."""
    if not isinstance(value, str) or not value.strip():
        raise UnsafePath(source, value, root, "is not a non-empty string")
    if "\0" in value or "\\" in value:
        raise UnsafePath(source, value, root, "contains a NUL or a backslash")
    if PurePosixPath(value).is_absolute() or PureWindowsPath(value).is_absolute() or PureWindowsPath(value).drive:
        raise UnsafePath(source, value, root, "is absolute")
    if ".." in PurePosixPath(value).parts:
        raise UnsafePath(source, value, root, "climbs out with '..'")
    return value


def confine(root: Path, value: object, source: Path | str) -> Path:
    """`root / value`, checked: relative, no `..`, and inside `root` once every symlink is resolved.

    `source` is the file `value` was read from; it is named in the error (UnsafePath, exit 2).
    """
    rel = relative_part(value, source, root)
    path = root / rel
    real_root = root.resolve()
    real = path.resolve()
    if real != real_root and real_root not in real.parents:
        raise UnsafePath(source, value, root, f"resolves to {real} through a symlink")
    return path


def inside(root: Path, path: Path, source: Path | str) -> Path:
    """`path` (built by kvgate under `root`), checked to resolve inside `root`: no symlink out."""
    real_root, real = root.resolve(), path.resolve()
    if real != real_root and real_root not in real.parents:
        raise UnsafePath(source, str(path), root, f"resolves to {real} through a symlink")
    return path
