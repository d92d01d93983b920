"""Launching the REAL SGLang router (`smg` 1.13.0, or `sglang-router` 0.3.2's `smg` script) in PD mode.

Nothing here routes: kvgate only builds the command line of the router from PyPI, and waits for its
`/readiness` (200 once at least one prefill and one decode worker are healthy; sglang-surface.md
section 3).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from kvgate.errors import UsageError


def find_smg() -> str:
    """The `smg` script of this environment (next to the interpreter first, then PATH)."""
    local = Path(sys.executable).with_name("smg")
    if local.is_file():
        return str(local)
    found = shutil.which("smg")
    if found:
        return found
    raise UsageError("the real SGLang router is not installed: pip install 'kvgate[router]' (smg==1.13.0)")


def router_argv(
    *,
    prefill: list[tuple[str, int]],
    decode: list[str],
    host: str,
    port: int,
    prometheus_port: int,
    prefill_policy: str = "round_robin",
    decode_policy: str = "round_robin",
    request_timeout_s: int = 1800,
    smg: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """`smg launch --pd-disaggregation --prefill URL BOOTSTRAP_PORT ... --decode URL ...`.

    Start-up checks every second (default 30 s), no retries and no circuit breaker (a simulated
    failure must reach the client as it happened, not be retried away), a short shutdown grace
    (default 180 s) so teardown is quick.
    """
    argv = [smg or find_smg(), "launch", "--pd-disaggregation"]
    for url, bootstrap_port in prefill:
        argv += ["--prefill", url, str(bootstrap_port)]
    for url in decode:
        argv += ["--decode", url]
    argv += [
        "--host",
        host,
        "--port",
        str(port),
        "--prometheus-port",
        str(prometheus_port),
        "--prometheus-host",
        "127.0.0.1",
        "--prefill-policy",
        prefill_policy,
        "--decode-policy",
        decode_policy,
        "--worker-startup-check-interval",
        "1",
        "--worker-startup-timeout-secs",
        "120",
        "--disable-retries",
        "--disable-circuit-breaker",
        "--shutdown-grace-period-secs",
        "1",
        "--request-timeout-secs",
        str(request_timeout_s),
        "--log-level",
        "warn",
    ]
    return argv + list(extra)
