"""Issue 10 route 8: tests that need the real sglang wheels skip only when the index is unreachable.

A "No matching distribution" from an index that answered (wrong pins, unsupported Python) fails the
test; under CI (`CI=true`) even an unreachable index fails the run instead of skipping it.
"""

from __future__ import annotations

import pytest

from kvgate.backport.cpuenv import CpuEnvError
from kvgate.upstream.releases import DownloadError, index_unreachable
from tests.assets.real_sglang import skip_only_if_unreachable

# What pip prints in each case (shapes of pip 24/25 output).
NO_MATCH = (
    "ERROR: Could not find a version that satisfies the requirement sglang==0.5.99 (from versions: 0.5.19, "
    "0.5.20)\nERROR: No matching distribution found for sglang==0.5.99"
)
OFFLINE = (
    "WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection "
    "broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object>: Failed to "
    "establish a new connection: [Errno 101] Network is unreachable')': /simple/sglang/\n" + NO_MATCH
)


def test_pip_output_is_classified() -> None:
    assert index_unreachable(OFFLINE)
    assert not index_unreachable(NO_MATCH)
    assert DownloadError("pip download sglang==0.5.99", NO_MATCH).unreachable is False
    assert DownloadError("pip download sglang==0.5.99", "tail", unreachable=True).unreachable


def test_no_matching_distribution_fails_instead_of_skipping(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(DownloadError):
        skip_only_if_unreachable(DownloadError("pip download sglang==0.5.99", NO_MATCH), "sglang 0.5.99 wheel")
    with pytest.raises(CpuEnvError):
        skip_only_if_unreachable(CpuEnvError("pip install failed:\n" + NO_MATCH), "CPU sglang 0.5.99")


def test_unreachable_index_skips_locally_and_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    exc = DownloadError("pip download sglang==0.5.20", "tail", unreachable=True)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        skip_only_if_unreachable(exc, "sglang 0.5.20 wheel")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception):
        skip_only_if_unreachable(exc, "sglang 0.5.20 wheel")
    with pytest.raises(pytest.fail.Exception):
        skip_only_if_unreachable(CpuEnvError("pip failed:\n" + OFFLINE), "CPU sglang 0.5.20")
