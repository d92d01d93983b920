"""Progress is an observer the CLI plugs in; the library never imports Rich for it."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol, TextIO, cast

from kvgate.output.redact import redact
from kvgate.output.sinks import BoundaryStream, terminal


class Observer(Protocol):
    """Receives progress from long-running gates."""

    def log(self, message: str) -> None:
        """One line of progress."""

    def step(self, description: str, total: float | None = None) -> AbstractContextManager[StepHandle]:
        """A long step; the handle's `advance(n)` reports progress."""


class StepHandle:
    """Handle of a running step."""

    def advance(self, amount: float = 1.0) -> None:
        """Advance the step (no-op unless a progress display is attached)."""


class NullObserver:
    """Drops everything (library default)."""

    def log(self, message: str) -> None:
        pass

    @contextmanager
    def step(self, description: str, total: float | None = None) -> Iterator[StepHandle]:
        yield StepHandle()


class StepRecorder:
    """Passes everything on to `inner` and keeps each step's description, start and duration: the html
    report's timeline of what ran inside the gates (which probe, which read). At most `limit` steps are
    kept; `dropped` counts the rest, so a long run's report stays bounded."""

    def __init__(self, inner: Observer, limit: int = 400) -> None:
        self.inner, self.limit = inner, limit
        self.t0 = time.monotonic()
        self.steps: list[dict[str, object]] = []
        self.dropped = 0
        self._lock = threading.Lock()

    def log(self, message: str) -> None:
        self.inner.log(message)

    @contextmanager
    def step(self, description: str, total: float | None = None) -> Iterator[StepHandle]:
        start = time.monotonic()
        try:
            with self.inner.step(description, total) as handle:
                yield handle
        finally:
            seconds = time.monotonic() - start
            with self._lock:
                if len(self.steps) < self.limit:
                    entry = {"step": redact(description), "start_s": round(start - self.t0, 3)}
                    self.steps.append({**entry, "seconds": round(seconds, 3)})
                else:
                    self.dropped += 1


class LineObserver:
    """Plain timestamped log lines, for CI logs and pipes.

    A step that runs longer than `heartbeat_s` says so every `heartbeat_s` ("still ..."), so a long
    silent step (a first `backport --verify` builds a 2.3 GB environment) never looks hung.
    """

    def __init__(self, stream: TextIO | None = None, heartbeat_s: float = 10.0) -> None:
        self.stream = BoundaryStream(stream or sys.stderr)
        self.heartbeat_s = heartbeat_s
        self._t0 = time.monotonic()
        self._lock = threading.Lock()

    def log(self, message: str) -> None:
        with self._lock:
            self.stream.write(f"[kvgate {time.monotonic() - self._t0:7.1f}s] {terminal(redact(message))}\n")
            self.stream.flush()

    @contextmanager
    def step(self, description: str, total: float | None = None) -> Iterator[StepHandle]:
        self.log(f"{description} ...")
        t = time.monotonic()
        done = threading.Event()

        def beat() -> None:
            while not done.wait(self.heartbeat_s):
                self.log(f"still {description} ({time.monotonic() - t:.0f}s)")

        beater = threading.Thread(target=beat, name="kvgate-progress", daemon=True)
        beater.start()
        try:
            yield StepHandle()
        finally:
            done.set()
            beater.join()
        self.log(f"{description} done in {time.monotonic() - t:.1f}s")


def _plain(text: str) -> str:
    """Text for Rich: redacted, neutralised for the terminal, and never read as Rich markup."""
    from rich.markup import escape

    return escape(terminal(redact(text)))


class RichObserver:
    """Rich progress bars on a TTY."""

    def __init__(self) -> None:
        from rich.console import Console

        # Rich writes its final bytes (wrapped lines, progress frames) through the redacting stream.
        self.console = Console(file=cast(TextIO, BoundaryStream(sys.stderr)), emoji=False)

    def log(self, message: str) -> None:
        self.console.log(_plain(message))

    @contextmanager
    def step(self, description: str, total: float | None = None) -> Iterator[StepHandle]:
        from rich.progress import MofNCompleteColumn, Progress

        # "N/M" next to the bar when the step has a count (e.g. workers read of the fleet).
        columns = [*Progress.get_default_columns(), MofNCompleteColumn()] if total is not None else []
        with Progress(*columns, console=self.console, transient=True) as progress:
            task = progress.add_task(_plain(description), total=total)

            class _Handle(StepHandle):
                def advance(self, amount: float = 1.0) -> None:
                    progress.advance(task, amount)

            yield _Handle()


def terminal_observer(quiet: bool) -> Observer | None:
    """What a command reports progress to: nothing when `quiet`, Rich bars on a TTY, plain lines otherwise."""
    if quiet:
        return None
    return RichObserver() if sys.stderr.isatty() else LineObserver()
