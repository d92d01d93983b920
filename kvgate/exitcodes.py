"""Exit statuses. They are API: pipelines branch on them."""

from __future__ import annotations

from enum import IntEnum


class ExitStatus(IntEnum):
    """Process exit codes of every kvgate command."""

    PASSED = 0
    GATE_FAILED = 1
    USAGE_ERROR = 2
    INCONCLUSIVE = 3
    # The target could not be reached or read (a worker, the router, a --python command), or, for
    # `kvgate backport`, written (disk full, permissions): the run broke on the target's side.
    TRANSPORT_ERROR = 4
    # kvgate itself broke (a bug, not the target): the report says what raised; never a pass.
    INTERNAL_ERROR = 5
    # Ctrl-C or SIGTERM before the verdict (128 + SIGINT, as shells and HTTPie report it): never a pass.
    INTERRUPTED = 130
