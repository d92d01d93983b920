"""Running `kvgate watch` as a real process and reading its endpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from kvgate.supervisor import free_port

ROOT = Path(__file__).resolve().parents[2]


class WatchProcess:
    """`kvgate watch ARGS --listen 127.0.0.1:PORT` in its own process, its log in a file."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(  # noqa: S603 - our own CLI
            [
                sys.executable,
                "-c",
                "from kvgate.cli import main; main()",
                "watch",
                *args,
                "--listen",
                f"127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log.open("w"),
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )

    def get(self, path: str) -> httpx.Response | None:
        try:
            return httpx.get(self.base + path, timeout=5)
        except httpx.HTTPError:
            return None

    def metric(self, name: str) -> float | None:
        """The value of an unlabelled metric, or None while it cannot be read."""
        res = self.get("/metrics")
        if res is None:
            return None
        for line in res.text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, pred: Callable[[], Any], deadline_s: float, what: str) -> Any:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            assert self.proc.poll() is None, f"kvgate watch exited {self.proc.returncode}:\n{self.log()}"
            got = pred()
            if got:
                return got
            time.sleep(0.5)
        raise AssertionError(f"{what}: not within {deadline_s:g}s\n{self.log()[-4000:]}")

    def terminate(self) -> int:
        """SIGTERM, and the exit status (a bounded wait)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise

    def verdict_settled(self) -> bool:
        res = self.get("/verdict")
        return res is not None and res.json().get("report") is not None
