"""The process supervisor: own process groups, per-process logs, readiness deadline, no orphans."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kvgate.deploy.supervisor import Stopped, Supervisor, SupervisorError, free_port, pid_alive, stop_on_sigterm

pytestmark = pytest.mark.slow

# A parent that starts a grandchild (which ignores SIGTERM) and prints its pid.
FAMILY = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
print(child.pid, flush=True)
time.sleep(600)
"""


def _grandchild_pid(log: Path) -> int:
    for _ in range(200):
        text = log.read_text().strip()
        if text:
            return int(text.splitlines()[0])
        time.sleep(0.05)
    raise AssertionError("grandchild pid never logged")


def test_teardown_kills_the_whole_group_including_sigterm_ignoring_grandchildren(tmp_path: Path) -> None:
    with Supervisor(log_dir=tmp_path, grace_s=0.5) as sup:
        proc = sup.start("family", [sys.executable, "-c", FAMILY])
        grandchild = _grandchild_pid(proc.log_path)
        assert pid_alive(proc.pid) and pid_alive(grandchild)
    assert not pid_alive(proc.pid)
    deadline = time.monotonic() + 10
    while pid_alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)  # reaped by init once killed
    assert not pid_alive(grandchild)


def test_wait_ready_polls_http_until_the_service_answers(tmp_path: Path) -> None:
    port = free_port()
    script = (
        "import time, http.server; time.sleep(0.5); "
        f"http.server.test(HandlerClass=http.server.SimpleHTTPRequestHandler, port={port}, bind='127.0.0.1')"
    )
    with Supervisor(log_dir=tmp_path) as sup:
        proc = sup.start("web", [sys.executable, "-c", script], ready_url=f"http://127.0.0.1:{port}/", cwd=tmp_path)
        sup.wait_ready(deadline_s=30)
        assert proc.alive()
    # The child's stderr went to its own log: the readiness request is in it.
    assert '"GET / HTTP/1.1" 200' in (tmp_path / "web.log").read_text()


def test_wait_ready_reports_an_early_exit_with_the_log_tail(tmp_path: Path) -> None:
    with Supervisor(log_dir=tmp_path) as sup:
        sup.start(
            "broken",
            [sys.executable, "-c", "print('boom: bad flag'); raise SystemExit(3)"],
            ready_url=f"http://127.0.0.1:{free_port()}/",
        )
        with pytest.raises(SupervisorError, match="boom: bad flag"):
            sup.wait_ready(deadline_s=30)


def test_wait_ready_deadline(tmp_path: Path) -> None:
    with Supervisor(log_dir=tmp_path, grace_s=0.5) as sup:
        sup.start(
            "silent",
            [sys.executable, "-c", "import time; time.sleep(60)"],
            ready_url=f"http://127.0.0.1:{free_port()}/",
        )
        with pytest.raises(SupervisorError, match="not ready within"):
            sup.wait_ready(deadline_s=0.5)


def test_a_service_that_cannot_bind_and_hangs_fails_at_once_not_at_the_deadline(tmp_path: Path) -> None:
    # What a real SGLang worker does when its port was taken between pick and bind: uvicorn logs the
    # bind error and the process hangs in shutdown instead of exiting.
    hang = (
        'import sys, time; print("ERROR:    [Errno 98] error while attempting to bind on address '
        "('127.0.0.1', 30000): address already in use\", flush=True); time.sleep(600)"
    )
    with Supervisor(log_dir=tmp_path, grace_s=0.5) as sup:
        sup.start("worker", [sys.executable, "-c", hang], ready_url=f"http://127.0.0.1:{free_port()}/")
        with pytest.raises(SupervisorError, match="worker cannot become ready, its port is in use") as err:
            sup.wait_ready(deadline_s=600)
    assert "not ready within" not in str(err.value)  # the log said so; the 600 s deadline did not


def test_children_die_with_a_killed_supervisor(tmp_path: Path) -> None:
    """Even a SIGKILLed supervisor leaves no orphan when die_with_parent is on (Linux)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux-only")
    import subprocess

    script = (
        "import sys, time; from pathlib import Path; from kvgate.deploy.supervisor import Supervisor\n"
        f"sup = Supervisor(log_dir=Path({str(tmp_path)!r}), die_with_parent=True)\n"
        "p = sup.start('sleeper', [sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print(p.pid, flush=True); time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert pid_alive(child)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(child)


def test_watch_names_the_process_that_exited(tmp_path: Path) -> None:
    with Supervisor(log_dir=tmp_path, grace_s=0.5) as sup:
        sup.start("steady", [sys.executable, "-c", "import time; time.sleep(60)"])
        sup.start("quitter", [sys.executable, "-c", "raise SystemExit(1)"])
        with pytest.raises(SupervisorError, match=r"^quitter exited unexpectedly"):
            sup.watch(poll_s=0.05)


def test_sigterm_unwinds_like_ctrl_c_and_the_previous_handler_comes_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt) as caught:  # Stopped is one: one path for Ctrl-C and SIGTERM
        with stop_on_sigterm():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises here, long before this ends
    assert isinstance(caught.value, Stopped)
    assert signal.getsignal(signal.SIGTERM) == before


def test_stop_on_sigterm_is_a_no_op_outside_the_main_thread() -> None:
    """A command run from a worker thread (an embedding pipeline) must not crash on signal.signal."""
    import signal
    import threading

    from kvgate.deploy.supervisor import stop_on_sigterm

    before = signal.getsignal(signal.SIGTERM)
    ran: list[bool] = []

    def body() -> None:
        with stop_on_sigterm():
            ran.append(True)

    t = threading.Thread(target=body)
    t.start()
    t.join(10)
    assert ran == [True] and signal.getsignal(signal.SIGTERM) is before


def test_free_port_is_below_the_ephemeral_range_and_bindable(tmp_path: Path, monkeypatch: Any) -> None:
    """A port picked for a service never comes from the range outgoing connections take their local ports
    from (one took a simulated worker's port between pick and bind); where there is no room below that
    range, or it cannot be read, the OS picks."""
    import socket

    from kvgate.deploy import supervisor

    real_low = supervisor._ephemeral_low()
    fake = tmp_path / "ip_local_port_range"
    fake.write_text("12000\t60999\n")
    monkeypatch.setattr(supervisor, "_EPHEMERAL_RANGE", fake)
    for _ in range(20):
        port = free_port()
        assert supervisor.LISTEN_PORTS_FROM <= port < 12000
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    # less than 1,024 ports of room, or no range to read: the OS's pick, from its real ephemeral range
    fake.write_text("10500\t60999\n")
    assert free_port() >= (real_low or 1024)
    monkeypatch.setattr(supervisor, "_EPHEMERAL_RANGE", tmp_path / "absent")
    assert free_port() >= (real_low or 1024)
