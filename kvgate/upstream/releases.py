"""The real sglang releases from the package index, downloaded once and cached, and the few facts
about them that more than one layer needs.

They are ground truth for the fix catalogue, the backports and the simulator's citations: nothing
here imitates sglang's source, it fetches it (tests/upstream/test_releases.py checks the facts below against
the wheels).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType

from kvgate.errors import KvgateError, TransportError
from kvgate.output.safeio import write_atomic
from kvgate.paths import cache_dir

RELEASES = ("0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")

#: Deferred decode-side KV release: the variable (no CLI flag, not in server_info) and its default in
#: each release's srt/environ.py: `EnvBool(False)` until #41023 turned it on in 0.5.21.
DEFERRED_ENV = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"
DEFERRED_RELEASE_DEFAULT: Mapping[str, bool] = MappingProxyType(
    {"0.5.19": False, "0.5.20": False, "0.5.21": True, "0.5.22": True, "0.5.23": True}
)
#: The catalogue entry whose code turns that default on (kvgate-deferred-release-default stands in for it):
#: where the code a worker runs was read, its presence there, not the version string, says the default.
DEFERRED_DEFAULT_FIX = "pr-41023"

#: `/health` (srt/entrypoints/http_server.py `health_generate`) sends a one-token request and answers
#: 200 at its first 1 s poll that saw the scheduler reply, or 503 after this many seconds
#: (SGLANG_HEALTH_CHECK_TIMEOUT): a readiness poll with a shorter read timeout misses healthy answers.
HEALTH_CHECK_TIMEOUT_S = 20

#: Prefill with DP ranks (0.5.22, real server 2026-12-05): it places a request on rank bootstrap_room %
#: dp_size and fails one a router dispatched to another rank with an error naming this mark, unless every
#: worker has FORCE_QUERY_PREFILL_DP_RANK=1 (then the decode asks the prefill which rank holds the KV).
#: Behind smg --dp-aware without it, about 4 requests in 10 failed.
DP_RANK_CONFLICT_MARK = "follow_bootstrap_room conflict"
FORCE_QUERY_PREFILL_DP_RANK = "SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK"
#: SGLang on CPU binds each rank to a NUMA node and refuses more ranks than nodes unless this names each
#: rank's cores ('|' between ranks).
CPU_THREADS_BIND = "SGLANG_CPU_OMP_THREADS_BIND"


# What pip prints when it never got an answer from the index (connection, DNS, proxy, TLS, timeout).
# "No matching distribution" alone is an answer: wrong pins or an unsupported Python, not the network.
_UNREACHABLE = (
    "NewConnectionError",
    "ConnectionError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "Network is unreachable",
    "Temporary failure in name resolution",
    "Name or service not known",
    "nodename nor servname",
    "Connection refused",
    "ProxyError",
    "SSLError",
    "Max retries exceeded",
)


def index_unreachable(pip_output: str) -> bool:
    """True when pip's output says the package index could not be reached at all."""
    return any(marker in pip_output for marker in _UNREACHABLE)


class DownloadError(TransportError):
    """The package index could not be reached (`unreachable`), or answered without the release."""

    def __init__(self, url: str, problem: str, *, unreachable: bool | None = None) -> None:
        super().__init__(url, problem)
        self.unreachable = index_unreachable(problem) if unreachable is None else unreachable


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (created), across threads and processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Never truncate, never follow a link planted at the lock's name.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def wheel_path(version: str, package: str = "sglang") -> Path:
    """Download (once) the wheel of `package==version` with `pip download --no-deps`."""
    dest = cache_dir() / "wheels" / f"{package}-{version}"
    with locked(dest.with_suffix(".lock")):
        found = sorted(dest.glob("*.whl")) if dest.is_dir() else []
        if found:
            return found[0]
        dest.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
            str(dest),
            f"{package}=={version}",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        found = sorted(dest.glob("*.whl"))
        if proc.returncode != 0 or not found:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise DownloadError(
                f"pip download {package}=={version}",
                " | ".join(tail) or "no wheel",
                unreachable=index_unreachable(proc.stderr + proc.stdout),
            )
        return found[0]


def unpacked_wheel(version: str, package: str = "sglang") -> Path:
    """The wheel of `package==version` unpacked (site-packages layout); returns the unpack root."""
    root = cache_dir() / "unpacked" / f"{package}-{version}"
    marker = root / ".kvgate-complete"
    with locked(root.with_suffix(".lock")):
        if marker.is_file():
            return root
        whl = wheel_path(version, package)
        if root.exists():
            shutil.rmtree(root)
        tmp = root.with_name(root.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        try:
            with zipfile.ZipFile(whl) as zf:
                zf.extractall(tmp)
        except zipfile.BadZipFile as exc:
            raise KvgateError(f"{whl}: not a valid wheel ({exc})") from exc
        tmp.rename(root)
        write_atomic(marker, version)
        return root
