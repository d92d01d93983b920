"""Bounded property-based runs: KVGATE_FUZZ_EXAMPLES examples per property (default 200), counted and
printed at the end of the session so CI logs show how much was tried.

Counterexamples hypothesis found are kept as `@example(...)` regressions on each property; no example
database is written (runs are reproducible from the code alone).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest

from tests.assets.real_sglang import under_ci

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # the `test` extra brings it; without it only these suites are left out, loudly
    if under_ci():
        raise
    import warnings

    warnings.warn(
        "hypothesis is not installed (pip install -e '.[test]'): the fuzz suites in tests/fuzz are NOT run",
        stacklevel=1,
    )
    collect_ignore_glob = ["test_*.py"]
    HealthCheck = settings = None  # type: ignore[assignment,misc]

EXAMPLES = int(os.environ.get("KVGATE_FUZZ_EXAMPLES", "200"))
# Properties that start a whole CLI run per example (real sockets) get a smaller share.
CLI_EXAMPLES = max(10, EXAMPLES // 2)

if settings is not None:
    settings.register_profile(
        "kvgate-fuzz",
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    settings.load_profile("kvgate-fuzz")

COUNTS: Counter[str] = Counter()


@pytest.fixture
def count(request: pytest.FixtureRequest) -> Any:
    """Call once per example: counts the examples this property really ran."""

    def tick() -> None:
        COUNTS[request.node.nodeid] += 1

    return tick


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not COUNTS:
        return
    terminalreporter.write_sep("-", f"kvgate fuzz: examples run (KVGATE_FUZZ_EXAMPLES={EXAMPLES})")
    for nodeid, n in sorted(COUNTS.items()):
        terminalreporter.write_line(f"{n:6d}  {nodeid}")
