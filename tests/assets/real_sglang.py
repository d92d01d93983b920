"""The real sglang wheels and CPU environments for tests.

A test that needs them skips only when the package index cannot be reached at all, and not under CI
(`CI=true`), where such a skip fails the run: a suite that silently skipped its ground truth is no
pass. Any other download failure ("No matching distribution": wrong pins, unsupported Python) is a
real failure of the test.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import pytest

from kvgate.backport.cpuenv import CpuEnv, CpuEnvError, cpu_env
from kvgate.upstream.releases import DownloadError, index_unreachable, unpacked_wheel


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def skip_only_if_unreachable(exc: DownloadError | CpuEnvError, what: str) -> NoReturn:
    """Skip when the index is unreachable (fail instead under CI); re-raise anything else."""
    unreachable = exc.unreachable if isinstance(exc, DownloadError) else index_unreachable(str(exc))
    if not unreachable:
        raise exc
    if under_ci():
        pytest.fail(f"CI=true and the package index is unreachable, so {what} cannot be checked: {exc}")
    pytest.skip(f"package index unreachable, no {what}: {exc}")


def wheel_or_skip(version: str) -> Path:
    """The unpacked real sglang wheel of `version`."""
    try:
        return unpacked_wheel(version)
    except DownloadError as exc:
        skip_only_if_unreachable(exc, f"sglang {version} wheel")


if TYPE_CHECKING:
    from kvgate.cpuserver.env import ServerEnv


def cpu_env_or_skip(version: str) -> CpuEnv:
    """The cached CPU environment of `version`; a build failure that is not the network fails the test."""
    try:
        return cpu_env(version)
    except (DownloadError, CpuEnvError) as exc:
        skip_only_if_unreachable(exc, f"CPU sglang {version}")


def server_env_or_skip(version: str) -> ServerEnv:
    """The real server's CPU environment of `version` (plus Mooncake and its system libraries) and
    kvgate's tiny model; same skip rule as `cpu_env_or_skip`."""
    from kvgate.cpuserver.env import server_env
    from kvgate.cpuserver.model import tiny_model

    cpu_env_or_skip(version)
    try:
        env = server_env(version)
    except (DownloadError, CpuEnvError) as exc:
        skip_only_if_unreachable(exc, f"CPU sglang server {version}")
    tiny_model()
    return env
