"""The one PD start sequence (kvgate.deploy.pdstart), with plain HTTP servers standing in for workers.

The router steps run against the real smg in tests/deploy/test_launch.py and the simulator's tests.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kvgate.deploy.pdstart import (
    DistinctPorts,
    PDLayout,
    StartedPD,
    WorkerProcess,
    _wait_router_lists_all,
    router_argv,
    start_pd,
)
from kvgate.deploy.supervisor import Supervisor, SupervisorError, http_ok, pid_alive

pytestmark = pytest.mark.slow


def _web(name: str, root: Path, port: int) -> WorkerProcess:
    """A worker stand-in whose /health answers 200 (a file named `health` under `root`)."""
    code = (
        "import functools, http.server; "
        f"h = functools.partial(http.server.SimpleHTTPRequestHandler, directory={str(root)!r}); "
        f"http.server.ThreadingHTTPServer(('127.0.0.1', {port}), h).serve_forever()"
    )
    return WorkerProcess(name, (sys.executable, "-c", code), (f"http://127.0.0.1:{port}",))


def _failing(name: str, message: str) -> WorkerProcess:
    code = f"import sys; print({message!r}); sys.exit(1)"
    return WorkerProcess(name, (sys.executable, "-c", code), ("http://127.0.0.1:9",))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "health").write_text("ok")
    return tmp_path / "www"


def _start(
    tmp_path: Path, build: Callable[[DistinctPorts], PDLayout], sups: list[Supervisor], attempts: int = 1
) -> StartedPD:
    def new_supervisor() -> Supervisor:
        sups.append(Supervisor(log_dir=tmp_path / "logs", grace_s=1.0))
        return sups[-1]

    return start_pd(
        build, new_supervisor, host="127.0.0.1", env={}, ready_deadline_s=30.0, router=False, attempts=attempts
    )


def test_every_worker_answers_health_when_start_returns(tmp_path: Path, root: Path) -> None:
    def build(ports: DistinctPorts) -> PDLayout:
        p, d = _web("prefill0", root, ports()), _web("decode0", root, ports())
        return PDLayout((p, d), ((p.urls[0], ports()),), (d.urls[0],))

    started = _start(tmp_path, build, [])
    try:
        assert started.router_url is None
        assert all(http_ok(w.urls[0] + "/health") for w in started.layout.processes)
    finally:
        started.supervisor.stop()
    assert not any(pid_alive(pid) for pid in started.supervisor.pids())


def test_a_worker_that_dies_stops_every_process(tmp_path: Path, root: Path) -> None:
    sups: list[Supervisor] = []

    def build(ports: DistinctPorts) -> PDLayout:
        p = _web("prefill0", root, ports())
        return PDLayout((p, _failing("decode0", "boom")), ((p.urls[0], ports()),), ("http://127.0.0.1:9",))

    with pytest.raises(SupervisorError, match="decode0 exited"):
        _start(tmp_path, build, sups, attempts=3)
    assert len(sups) == 1  # not a port race: no retry
    assert sups[0].pids() and not any(pid_alive(pid) for pid in sups[0].pids())


def test_a_port_taken_in_between_is_retried_on_fresh_ports(tmp_path: Path, root: Path) -> None:
    drawn: list[DistinctPorts] = []
    sups: list[Supervisor] = []

    def build(ports: DistinctPorts) -> PDLayout:
        drawn.append(ports)
        p = _web("prefill0", root, ports())
        taken = _failing("decode0", "OSError: [Errno 98] Address already in use")
        return PDLayout((p, taken) if len(drawn) == 1 else (p,), ((p.urls[0], ports()),), ())

    started = _start(tmp_path, build, sups, attempts=2)
    try:
        assert len(drawn) == 2 and drawn[0] is not drawn[1]
        assert started.supervisor is sups[1] and not any(pid_alive(pid) for pid in sups[0].pids())
    finally:
        started.supervisor.stop()


def test_distinct_ports_never_repeat() -> None:
    ports = DistinctPorts()
    drawn = [ports() for _ in range(200)]
    assert len(set(drawn)) == len(drawn)


def test_router_argv_lists_every_worker_in_order() -> None:
    argv = router_argv(
        prefill=[("http://p0", 1), ("http://p1", 2)],
        decode=["http://d0"],
        host="127.0.0.1",
        port=3,
        prometheus_port=4,
        smg="smg",
        extra=["--dp-aware"],
    )
    assert argv[:3] == ["smg", "launch", "--pd-disaggregation"]
    assert argv[3:12] == [
        "--prefill",
        "http://p0",
        "1",
        "--prefill",
        "http://p1",
        "2",
        "--decode",
        "http://d0",
        "--host",
    ]
    assert argv[-1] == "--dp-aware"


def test_router_listing_is_waited_for_and_a_short_one_is_named(tmp_path: Path, root: Path) -> None:
    # A router stand-in whose /workers lists one ready worker and one still starting.
    (root / "workers").write_text(
        '{"workers": [{"url": "http://p0", "status": "ready"}, {"url": "http://d0", "status": "starting"}]}'
    )
    sups: list[Supervisor] = []

    def build(ports: DistinctPorts) -> PDLayout:
        return PDLayout((_web("router", root, ports()),), (), ())

    started = _start(tmp_path, build, sups)
    router = started.layout.processes[0].urls[0]
    try:
        _wait_router_lists_all(router, 1, deadline_s=5.0, poll_s=0.1)
        with pytest.raises(SupervisorError, match=r"/workers lists 1 ready workers of 2 after"):
            _wait_router_lists_all(router, 2, deadline_s=0.5, poll_s=0.1)
    finally:
        started.supervisor.stop()
    with pytest.raises(SupervisorError, match=r"/workers could not be read \(ConnectError"):
        _wait_router_lists_all(router, 1, deadline_s=0.5, poll_s=0.1)
