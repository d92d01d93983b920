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
import errno
import os
import re
import secrets
import stat
import sys
import time
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


#: How long an output FIFO may go without a reader before the write is given up (a bounded wait).
FIFO_READER_WAIT_S = 10.0
_STREAM_PATH = re.compile(r"/dev/(stdout|stderr)|/dev/fd/(\d+)|/proc/(self|thread-self|\d+)/fd/(\d+)")
_MAX_HOPS = 40


def write_output(path: Path, data: bytes | str) -> None:
    """Write an output the operator named (`--output`, `--write-baseline`).

    A path that does not exist, or names a regular file (directly or through a symlink), is replaced
    through `write_atomic`: a symlink at the destination is replaced, not followed. A path that exists
    and is not a regular file is written in place, never replaced by a regular file:

    - a path that is, or links through, `/dev/stdout`, `/dev/stderr`, `/dev/fd/N` or `/proc/self/fd/N`
      is written to that descriptor of this process (whatever it is: a pipe, a terminal, a file the
      shell opened), after Python's own streams are flushed;
    - a character device (a terminal, `/dev/null`) or a FIFO is opened without creating or truncating
      and written; a FIFO with no reader is waited for at most `FIFO_READER_WAIT_S`. Reached through a
      symlink, every link on the way must be owned by root, by this user or by its folder's owner (the
      kernel's protected_symlinks rule); a link someone else planted is replaced, as above.

    A directory, a block device or a socket is refused (OSError naming it); nothing else is touched.
    """
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd = stream_fd(path)
    if fd is not None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        _write_all(fd, raw)
        return
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is None or stat.S_ISREG(st.st_mode):
        write_atomic(path, raw)
        return
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory: not written", str(path))
    if not (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
        raise OSError(errno.EINVAL, f"is a {_kind(st.st_mode)}: not written", str(path))
    if not _links_trusted(path):
        write_atomic(path, raw)  # a planted link is replaced, never followed
        return
    _write_in_place(path, raw)


def stream_fd(path: Path) -> int | None:
    """The descriptor of this process that `path` names (`/dev/stdout`, `/dev/fd/N`, `/proc/self/fd/N`,
    or a symlink chain to one), or None. Such a path is written to the descriptor itself: opening it
    anew would start a regular file at offset 0, and replacing it would replace the system's link."""
    p = os.path.abspath(path)
    for _ in range(_MAX_HOPS):
        m = _STREAM_PATH.fullmatch(os.path.normpath(p))
        if m:
            if m.group(1):
                return 1 if m.group(1) == "stdout" else 2
            if m.group(2):
                return int(m.group(2))
            if m.group(3) in ("self", "thread-self") or int(m.group(3)) == os.getpid():
                return int(m.group(4))
            return None
        if not os.path.islink(p):
            return None
        p = os.path.join(os.path.dirname(p), os.readlink(p))
    return None


def _links_trusted(path: Path) -> bool:
    """Every symlink on the way from `path` is owned by root, this user, or the owner of its folder."""
    p = os.path.abspath(path)
    for _ in range(_MAX_HOPS):
        try:
            st = os.lstat(p)
        except OSError:
            return False
        if not stat.S_ISLNK(st.st_mode):
            return True
        try:
            folder_owner = os.stat(os.path.dirname(p)).st_uid
        except OSError:
            return False
        if st.st_uid not in (0, os.geteuid(), folder_owner):
            return False
        p = os.path.join(os.path.dirname(p), os.readlink(p))
    return False


def _write_in_place(path: Path, raw: bytes) -> None:
    """Open a character device or FIFO (no create, no truncate, never a controlling terminal), check
    that what was opened is still one, and write every byte."""
    flags = os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    deadline = time.monotonic() + FIFO_READER_WAIT_S
    while True:
        try:
            fd = os.open(path, flags)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO or time.monotonic() >= deadline:
                if exc.errno == errno.ENXIO:
                    raise OSError(
                        errno.ENXIO, f"a FIFO with no reader for {FIFO_READER_WAIT_S:g} s: not written", str(path)
                    ) from None
                raise
            time.sleep(0.05)
    try:
        st = os.fstat(fd)
        if not (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
            raise OSError(errno.EINVAL, f"became a {_kind(st.st_mode)} while opened: not written", str(path))
        os.set_blocking(fd, True)
        _write_all(fd, raw)
    finally:
        os.close(fd)


def _write_all(fd: int, raw: bytes) -> None:
    view = memoryview(raw)
    while view:
        view = view[os.write(fd, view) :]


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"), (stat.S_ISDIR, "directory")):
        if test(mode):
            return name
    return "special file"


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
