"""Running `kvgate watch` as a real process and reading its endpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from kvgate.deploy.supervisor import free_port

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


@dataclass(frozen=True)
class VerdictSeen:
    """One full gate's verdict as /verdict served it: when the report was made (this process's monotonic
    clock), the HTTP status, the exit status and the reason."""

    t: float
    http: int
    exit_status: int | None
    reason: str


class Timeline:
    """What a running watch did, sampled every `every_s` in a thread on this process's monotonic clock:
    when each metadata pass ended (/healthz's `last_pass_age_s`), each full gate's verdict (one per
    report, told apart by the report's own start and finish times; /verdict's `age_s` dates it), and
    the value of each of `probes` whenever it changes.

    A pass or a report is placed to within one sample's HTTP round trip; passes closer than
    `PASS_SLACK_S` are one pass (a watch's passes are an interval apart, or a full gate apart)."""

    PASS_SLACK_S = 1.0

    def __init__(
        self, w: WatchProcess, probes: Mapping[str, Callable[[], object]] | None = None, every_s: float = 0.25
    ) -> None:
        self.w = w
        self.probes = dict(probes or {})
        self.every_s = every_s
        self.pass_ends: list[float] = []
        self.verdicts: list[VerdictSeen] = []
        self._last_gate: tuple[object, ...] = ()
        self.values: list[tuple[float, str, object]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watch-timeline", daemon=True)

    def __enter__(self) -> Timeline:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        last: dict[str, object] = {}
        while not self._stop.wait(self.every_s):
            now = time.monotonic()
            h = self.w.get("/healthz")
            age = h.json().get("last_pass_age_s") if h is not None else None
            if isinstance(age, (int, float)) and (
                not self.pass_ends or now - age - self.pass_ends[-1] > self.PASS_SLACK_S
            ):
                self.pass_ends.append(now - age)
            now = time.monotonic()
            v = self.w.get("/verdict")
            doc = v.json() if v is not None else {}
            if v is not None and isinstance(doc.get("age_s"), (int, float)):
                made = now - doc["age_s"]
                # One gate is one report: its own times name it. `made` moves by each sample's round trip
                # (over a second apart on a loaded host), so it only dates the report.
                rep = doc.get("report") or {}
                gate = (rep.get("started_at"), rep.get("finished_at"), doc.get("exit_status"))
                if not self.verdicts or gate != self._last_gate:
                    self._last_gate = gate
                    self.verdicts.append(
                        VerdictSeen(made, v.status_code, doc.get("exit_status"), doc.get("reason", ""))
                    )
            for name, probe in self.probes.items():
                value = probe()
                if name not in last or last[name] != value:
                    last[name] = value
                    self.values.append((time.monotonic(), name, value))

    def first(self, name: str, pred: Callable[[object], bool], after: float = 0.0) -> float | None:
        """When probe `name` was first seen with a value `pred` accepts (after `after`)."""
        return next((t for t, n, v in self.values if n == name and t >= after and pred(v)), None)

    def passes_between(self, a: float, b: float) -> list[float]:
        """The passes that ended in (a, b]."""
        return [t for t in self.pass_ends if a < t <= b]


def worker_pool(url: str) -> object:
    """The worker's pool as its /server_info says, or the name of what kept it from being read."""
    try:
        return httpx.get(url + "/server_info", timeout=3).json().get("max_total_num_tokens")
    except (httpx.HTTPError, ValueError) as exc:
        return type(exc).__name__


def on_pool(v: VerdictSeen) -> bool:
    """A verdict that failed on pool vs context (1 and 503, pool-context.headroom among its reasons)."""
    return v.exit_status == 1 and v.http == 503 and "pool-context.headroom" in v.reason
