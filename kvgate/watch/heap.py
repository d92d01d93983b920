"""The watch process's malloc heap: few arenas, and what a full gate freed handed back to the OS (glibc; a
no-op elsewhere)."""

from __future__ import annotations

import ctypes
import sys

#: glibc's mallopt parameter M_ARENA_MAX, and the arenas a watch keeps
_M_ARENA_MAX = -8
ARENAS = 2


def _glibc() -> ctypes.CDLL | None:
    if sys.platform != "linux":
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt  # noqa: B018 - glibc has it, musl does not
        return libc
    except (OSError, AttributeError):
        return None


def limit_arenas() -> None:
    """Keep the process to ARENAS malloc arenas (glibc; a no-op elsewhere), as MALLOC_ARENA_MAX=2 would.

    A full gate's thread pools (64 canary tenants) each get a glibc arena; the memory freed in them
    stays mapped, so the watch's RSS climbed about 8% over its first simulated hour of gates every
    15 minutes before it levelled off (bench/watch_soak.py), with no Python object retained. With two
    arenas it stayed flat. Process-wide: for a process that runs a watch.
    """
    libc = _glibc()
    if libc is not None:
        libc.mallopt(_M_ARENA_MAX, ARENAS)


def release_heap() -> None:
    """Give the heap a full gate freed back to the OS (glibc's malloc_trim; a no-op elsewhere)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
