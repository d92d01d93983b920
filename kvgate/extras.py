"""Optional extras: what a command needs beyond the core, and one clear message when it is missing.

The core (and the single-file build, dist/kvgate) carries typer, rich, httpx, gitpython, pyyaml and
packaging. The simulator needs the `sim` extra in the interpreter that runs kvgate.
"""

from __future__ import annotations

import importlib.util
import os

from kvgate.errors import UsageError

SIM_MODULES = ("numpy", "fastapi", "uvicorn")


#: set by the single file's launcher (tools/binary_main.py) to the file's path
SINGLE_FILE_ENV = "KVGATE_SINGLE_FILE"


def refuse_in_single_file(command: str) -> None:
    """The single file carries the core only: what starts simulator processes (each a fresh interpreter
    that imports kvgate from an installation, or from whatever checkout it runs in) is refused here."""
    path = os.environ.get(SINGLE_FILE_ENV)
    if path:
        raise UsageError(
            f"{command} runs the simulator, which is not in the single-file build ({path}): install kvgate "
            "with its extras to run it: pip install 'kvgate[sim,router]'"
        )


def require_sim(command: str) -> None:
    """Raise a usage error naming the missing modules when the simulator cannot run here."""
    refuse_in_single_file(command)
    missing = [m for m in SIM_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(
            f"{command} runs the simulator, which needs the 'sim' and 'router' extras (missing here: "
            f"{', '.join(missing)}): pip install 'kvgate[sim,router]' (the single-file build carries the core only)"
        )


WATCH_MODULES = ("prometheus_client",)


def require_watch(command: str) -> None:
    """Raise a usage error when `kvgate watch`'s metrics library is missing here."""
    missing = [m for m in WATCH_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(
            f"{command} serves Prometheus metrics, which needs the 'watch' extra (missing here: "
            f"{', '.join(missing)}): pip install 'kvgate[watch]'"
        )
