"""The real sglang CPU environments for tests: skip only when the package index is unreachable."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kvgate.backport.cpuenv import CpuEnv, CpuEnvError, cpu_env
from kvgate.upstream import DownloadError

if TYPE_CHECKING:
    from kvgate.cpuserver.env import ServerEnv


def cpu_env_or_skip(version: str) -> CpuEnv:
    """The cached CPU environment of `version`; a build failure that is not the network fails the test."""
    try:
        return cpu_env(version)
    except DownloadError as exc:
        pytest.skip(f"package index unreachable, no CPU sglang {version}: {exc}")
    except CpuEnvError as exc:
        if "ConnectionError" in str(exc) or "Network is unreachable" in str(exc):
            pytest.skip(f"package index unreachable, no CPU sglang {version}: {exc}")
        raise


def server_env_or_skip(version: str) -> "ServerEnv":
    """The real server's CPU environment of `version` (plus Mooncake and its system libraries) and
    kvgate's tiny model; same skip rule as `cpu_env_or_skip`."""
    from kvgate.cpuserver.env import server_env
    from kvgate.cpuserver.model import tiny_model

    cpu_env_or_skip(version)
    try:
        env = server_env(version)
    except DownloadError as exc:
        pytest.skip(f"package index unreachable, no CPU sglang server {version}: {exc}")
    tiny_model()
    return env
