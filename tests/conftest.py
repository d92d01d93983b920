"""Shared fixtures: a real loopback HTTP server that serves SGLang-shaped documents.

And two checks on every report any test renders: its JSON validates against the published schema
(`kvgate schema`), and every finding the CLI reports has a page in docs/checks.md.

Under `pytest -n 2` (the README's test command) the real tier is one unit of work, queued first, run by one
worker pair after pair (each pair started once) while the other runs the rest of the suite;
tests/real/schedule.py can cut it into lanes of whole pairs (REAL_LANES: see there why it does not).
"""

from __future__ import annotations

import json
import os
import resource
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from tests.assets.loopback import LoopbackServer

_report_problems: list[str] = []

# The tests' heavy cache (real sglang wheels, the releases' CPU environments, the tiny models: about 6
# minutes to build, 4 GB) is the user's, outside the checkout, unless KVGATE_CACHE_DIR names one: a clean
# clone's run reuses what an earlier run on this machine built (issue 44). Every entry is keyed by what it
# is built from (release, recipe digest, model spec and writer digest), so a changed recipe builds anew
# beside the old one. Set here, before any test imports kvgate.paths, so the xdist workers and every
# server process the tests start inherit it.
TEST_CACHE_DIR = os.environ.setdefault(
    "KVGATE_CACHE_DIR", str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvgate")
)


def pytest_report_header(config: pytest.Config) -> str:
    return f"kvgate cache (KVGATE_CACHE_DIR): {TEST_CACHE_DIR}"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduling with the units of tests/real/schedule.py, the costliest queued first.

    Not the `xdist_group` mark: pytest 9.2 no longer lets xdist 3.8 rename node ids, which that mark
    relies on, so the mark is silently ignored and one pair's tests could start it on both workers.
    """
    from xdist.scheduler import LoadScopeScheduling

    from tests.real.schedule import cost_s, grouped, lanes, unit_of

    class RealPairsFirst(LoadScopeScheduling):
        _ordered = False
        _lane_of: dict[str, str] | None = None

        def schedule(self) -> None:
            if self._lane_of is None and self.collection_is_completed:
                self._lane_of = lanes(list(next(iter(self.registered_collections.values()))))
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid, self._lane_of)

        def _assign_work_unit(self, node: Any) -> None:
            if not self._ordered:  # the queue is complete at the first assignment: order it once
                self._ordered = True
                units = sorted(self.workqueue.items(), key=lambda u: -cost_s(u[0], len(u[1])))  # stable
                self.workqueue.clear()
                for scope, work in units:  # a lane sends its tests to the worker grouped by piece
                    self.workqueue[scope] = {nodeid: work[nodeid] for nodeid in grouped(list(work))}
            super()._assign_work_unit(node)

    return RealPairsFirst(config, log)


_span: list[float] = []  # this process's first test start and last test end (wall clock, for the tail)
_cpu_at: dict[str, float] = {}  # a running test's CPU clock at its start
_cpu_of: list[tuple[float, str]] = []  # the controller's: (CPU s, test) of every test run
#: How many of the costliest tests by CPU the summary lists (pytest's --durations lists them by wall time).
CPU_SLOWEST = 20


def _cpu_now() -> float:
    """CPU seconds (user + system) of this process and of every process it has reaped: a test's servers
    and subprocesses count once they are stopped, to the test that stopped them."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    if not _span:
        _span.append(time.time())
    _cpu_at[nodeid] = _cpu_now()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """The test's CPU seconds ride on its teardown report (to the xdist controller, and into junit's
    properties as `cpu_s`): where the suite's time goes is CPU on this 2-core machine, not only waits."""
    if call.when == "teardown" and item.nodeid in _cpu_at:
        item.user_properties.append(("cpu_s", round(_cpu_now() - _cpu_at.pop(item.nodeid), 2)))
    return (yield)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    cpu = dict(report.user_properties).get("cpu_s") if report.when == "teardown" else None
    if isinstance(cpu, (int, float)) and not os.environ.get("PYTEST_XDIST_WORKER"):
        _cpu_of.append((float(cpu), report.nodeid))


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    del _span[1:]
    _span.append(time.time())


def pytest_sessionfinish(session: pytest.Session) -> None:
    """An xdist worker leaves its span in the run's folder for the controller's summary."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and len(_span) == 2:
        run_dir = session.config._tmp_path_factory.getbasetemp().parent
        (run_dir / f"span-{worker}.json").write_text(json.dumps(_span))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Which real pairs this run started, where and for how long (tests/real/conftest.py logs each), and
    under xdist when each worker ended its last test: the idle tail is how long one waited for the other."""
    from tests.real.schedule import STARTS_LOG

    factory = getattr(config, "_tmp_path_factory", None)
    if factory is None or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    run_dir = factory.getbasetemp()
    log = run_dir / STARTS_LOG
    if log.is_file():
        lines = log.read_text().splitlines()
        terminalreporter.write_sep("-", f"real pairs started: {len(lines)}")
        for line in lines:
            terminalreporter.write_line(line)
    if _cpu_of:
        total = sum(c for c, _ in _cpu_of)
        terminalreporter.write_sep("-", f"CPU of the tests: {total:,.0f} s in all; the {CPU_SLOWEST} costliest")
        for cpu, nodeid in sorted(_cpu_of, reverse=True)[:CPU_SLOWEST]:
            terminalreporter.write_line(f"{cpu:8.1f} s  {nodeid}")
    spans = {p.stem[5:]: json.loads(p.read_text()) for p in sorted(run_dir.glob("span-*.json"))}
    if len(spans) > 1:
        t0 = min(s[0] for s in spans.values())
        ends = {w: s[1] - t0 for w, s in spans.items()}
        terminalreporter.write_sep("-", f"idle tail: {max(ends.values()) - min(ends.values()):.0f} s")
        terminalreporter.write_line(", ".join(f"{w} ended its last test at {e:.0f} s" for w, e in ends.items()))


def _validator() -> Any:
    try:
        import jsonschema
    except ImportError:  # tests/formats/test_schema.py fails loudly instead; keep the rest running
        return None
    from kvgate.formats.json_report import schema_text

    cls = jsonschema.Draft202012Validator
    return cls(json.loads(schema_text()), format_checker=cls.FORMAT_CHECKER)


@pytest.fixture(autouse=True)
def _every_report_is_checked(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Validate every JSON report against the schema and every emitted check ID against docs/checks.md."""
    import kvgate.formats.reporting
    from kvgate.formats.checkdocs import doc_for
    from kvgate.formats.json_report import JsonFormatter

    validator = _validator()
    render, emit = JsonFormatter.render, kvgate.formats.reporting.emit
    _report_problems.clear()

    def checked_render(self: JsonFormatter, report: Any) -> str:
        text = render(self, report)
        if validator is not None:
            for err in validator.iter_errors(json.loads(text)):
                _report_problems.append(f"JSON report breaks the schema at {list(err.absolute_path)}: {err.message}")
        return text

    def checked_emit(report: Any, *args: Any, **kwargs: Any) -> Any:
        for f in report.findings:
            if doc_for(f.test_id) is None:
                _report_problems.append(f"check ID {f.test_id} has no page in docs/checks.md")
        return emit(report, *args, **kwargs)

    monkeypatch.setattr(JsonFormatter, "render", checked_render)
    monkeypatch.setattr(kvgate.formats.reporting, "emit", checked_emit)
    yield
    problems, _report_problems[:] = list(dict.fromkeys(_report_problems)), []
    assert not problems, "\n".join(problems)


@dataclass
class Route:
    """What one path answers: a JSON document, or raw bytes with a status, or a delay first."""

    body: Any = None
    status: int = 200
    raw: bytes | None = None
    delay_s: float = 0.0


@dataclass
class PayloadServer:
    """A threaded HTTP server on 127.0.0.1; `routes` may be changed while it runs."""

    routes: dict[str, Route] = field(default_factory=dict)
    seen_headers: list[dict[str, str]] = field(default_factory=list)
    url: str = ""
    _server: LoopbackServer | None = None

    def start(self) -> PayloadServer:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                owner.seen_headers.append(dict(self.headers))
                route = owner.routes.get(self.path.split("?")[0])
                if route is None:
                    self.send_response(404)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(b'{"detail":"Not Found"}')
                    return
                if route.delay_s:
                    time.sleep(route.delay_s)
                data = route.raw if route.raw is not None else json.dumps(route.body).encode()
                try:
                    self.send_response(route.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self._server = LoopbackServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()


@pytest.fixture
def payload_server() -> Iterator[Callable[..., PayloadServer]]:
    """Factory: `payload_server({"/server_info": Route(doc), ...})` -> a running server."""
    servers: list[PayloadServer] = []

    def make(routes: dict[str, Route] | None = None) -> PayloadServer:
        srv = PayloadServer(routes=dict(routes or {})).start()
        servers.append(srv)
        return srv

    yield make
    for s in servers:
        s.stop()


@pytest.fixture
def deployment() -> Iterator[Callable[..., Any]]:
    """Factory: `deployment(emulate=..., ...)` -> a started simulator deployment, stopped after the test."""
    from kvgate.sim.deploy import SimDeployment

    started: list[SimDeployment] = []

    def make(**kwargs: Any) -> SimDeployment:
        dep = SimDeployment(**kwargs).start()
        started.append(dep)
        return dep

    yield make
    for dep in started:
        dep.stop()
