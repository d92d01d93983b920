"""The check pipeline's progress: one step over the fleet read, advanced once per worker."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from kvgate.defaults import DEFAULT_CONCURRENCY
from kvgate.gates.base import CheckOptions
from kvgate.output.progress import StepHandle
from kvgate.pipeline.check import run_check
from tests.assets import sglang_payloads as P
from tests.conftest import PayloadServer, Route


class Recorder:
    """An Observer that records steps and their advances."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, float | None]] = []
        self.advanced = 0

    def log(self, message: str) -> None:
        pass

    @contextmanager
    def step(self, description: str, total: float | None = None) -> Iterator[StepHandle]:
        self.steps.append((description, total))
        owner = self

        class Handle(StepHandle):
            def advance(self, amount: float = 1.0) -> None:
                owner.advanced += int(amount)

        yield Handle()


def test_the_fleet_read_reports_n_of_m(payload_server: Callable[..., PayloadServer]) -> None:
    urls = [
        payload_server(
            {
                "/server_info": Route(P.server_info("0.5.22", mode="decode", pool=2_040_000)),
                "/v1/models": Route(P.v1_models()),
            }
        ).url
        for _ in range(5)
    ]
    urls.append("http://127.0.0.1:9")  # an unreachable one counts as done too
    rec = Recorder()
    run_check(CheckOptions(decode_urls=tuple(urls), timeout=2.0), observer=rec)
    assert rec.steps == [(f"reading metadata of 6 worker(s), {DEFAULT_CONCURRENCY} at a time", 6)]
    assert rec.advanced == 6
