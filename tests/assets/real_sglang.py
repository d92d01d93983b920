"""The real sglang CPU environments for tests: skip only when the package index is unreachable."""

from __future__ import annotations

import pytest

from kvgate.backport.cpuenv import CpuEnv, CpuEnvError, cpu_env
from kvgate.upstream import DownloadError


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
