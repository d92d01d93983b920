"""How a simulator process runs: until its server ends or SIGTERM/SIGINT cancels it."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any


def run_until_signalled(main: Coroutine[Any, Any, None]) -> None:
    """Run `main`; SIGTERM or SIGINT cancels it and the process exits cleanly (the supervisor's stop)."""

    async def runner() -> None:
        task = asyncio.ensure_future(main)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            pass

    asyncio.run(runner())
