"""Run a command beside N CPU hogs, as on a shared CI host where another job keeps cores busy.

    python tools/busy_run.py --hogs 1 [--repeat K] -- .venv/bin/pytest -p no:xdist tests/backport/test_lifetime_probe.py

Each hog is a separate process spinning a busy loop (one core each while it can get one). The command
runs K times in a row beside them; the hogs are stopped when the last run ends, however it ends. Each
run prints one line: its number, exit status, wall time and the 1-minute load average at its end; the
exit status is the first nonzero one of the runs (0 when all passed). Standard library only.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone


def _spin(parent: int) -> None:
    """The hog: a busy loop until it is terminated, or until its parent is gone (never an orphan)."""
    while True:
        for _ in range(1_000_000):
            pass
        if os.getppid() != parent:
            return


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hogs", type=int, default=1, help="busy-loop processes to run beside the command")
    ap.add_argument("--repeat", type=int, default=1, help="how many times to run the command")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.hogs < 0 or args.repeat < 1:
        ap.error("give --hogs >= 0, --repeat >= 1 and a command after --")
    # SIGTERM ends this process through `finally`, which stops the hogs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    hogs = [mp.get_context("spawn").Process(target=_spin, args=(os.getpid(),), daemon=True) for _ in range(args.hogs)]
    for h in hogs:
        h.start()
    status = 0
    try:
        print(f"busy_run: {args.hogs} hog(s) on {os.cpu_count()} cores, started {_now()}", flush=True)
        for i in range(1, args.repeat + 1):
            t = time.monotonic()
            rc = subprocess.run(command).returncode
            wall = time.monotonic() - t
            load1 = os.getloadavg()[0]
            print(f"busy_run: run {i}/{args.repeat} exit {rc} wall {wall:.0f}s load1 {load1:.1f} {_now()}", flush=True)
            status = status or rc
    finally:
        for h in hogs:
            h.terminate()
        for h in hogs:
            h.join(5)
    return status


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


if __name__ == "__main__":
    sys.exit(main())
