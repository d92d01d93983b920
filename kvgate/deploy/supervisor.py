"""A small process supervisor: start services, wait until they answer, tear all of them down.

Generic on purpose: the simulator uses it for its workers and the real router, and launching real
SGLang deployments reuses it. Each child runs in its own session (so it leads its own process group),
writes to its own log file, and is stopped by signalling the whole group: SIGTERM first, SIGKILL
after a grace period, so grandchildren (uvicorn workers, a router's helpers) do not survive as orphans.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType

from kvgate.errors import KvgateError

#: Log lines that mean a service can never become ready: it could not bind its port (uvicorn's words,
#: which SGLang's and the simulator's servers print; the Rust router's). A real SGLang worker that
#: lost its port this way does not exit, it hangs in shutdown, so only its log says so in time.
BIND_FAILURE_MARKERS = ("error while attempting to bind on address", "address already in use (os error 98)")


class SupervisorError(KvgateError):
    """A supervised process failed to start, exited early, or never became ready."""


class Stopped(KeyboardInterrupt):
    """SIGTERM arrived while a long-running command held its deployment up: unwind into the teardown.

    A KeyboardInterrupt, so Ctrl-C and SIGTERM take one path and no `except Exception` swallows it.
    """


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    raise Stopped()


@contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """The one SIGTERM handler of long-running commands: inside the block SIGTERM raises `Stopped`
    (in the main thread), so `finally` tears the deployment down; the previous handler comes back after.
    Outside the main thread (a command run from a worker thread) Python cannot take signals: no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


#: Ports for services to listen on are drawn from here up to the kernel's ephemeral range, not from it:
#: every outgoing connection on the machine takes its local port from that range, and one once took a
#: port picked for a simulated worker in the seconds before the worker bound it (tests/sim under two
#: xdist workers, 2026-12-04: "[Errno 98] address already in use").
LISTEN_PORTS_FROM = 10_000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int | None:
    """The first port of the kernel's ephemeral range (None where it cannot be read: not Linux)."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now for a service to listen on: below the ephemeral range where there is
    room, else one the OS picks (a race with another binder is possible; callers retry on bind errors)."""
    low = _ephemeral_low()
    if low is not None and low - LISTEN_PORTS_FROM >= 1024:
        rng = random.SystemRandom()
        for _ in range(64):
            port = rng.randrange(LISTEN_PORTS_FROM, low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """True when GET `url` answers 2xx."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback URLs we built
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


@dataclass
class ManagedProcess:
    """One supervised child: its name, command, log file and (once started) Popen handle."""

    name: str
    argv: list[str]
    log_path: Path
    ready_url: str | None = None
    popen: subprocess.Popen[bytes] | None = None
    stopped: bool = False
    log_seen: int = 0  # bytes of the log already searched for BIND_FAILURE_MARKERS

    @property
    def pid(self) -> int:
        """The child's pid (also its process-group id, since it leads its own session)."""
        if self.popen is None:
            raise SupervisorError(f"{self.name}: not started")
        return self.popen.pid

    def alive(self) -> bool:
        """True while the child has not exited."""
        return self.popen is not None and self.popen.poll() is None

    def bind_failure(self) -> str | None:
        """The first new log line saying the process could not bind its port, if one has appeared."""
        start = max(0, self.log_seen - 256)  # a marker may straddle the last read's end
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(start)
                new = fh.read(4 << 20)
        except OSError:
            return None
        self.log_seen = start + len(new)
        text = new.decode("utf-8", "replace")
        for line in text.splitlines():
            if any(m in line.lower() for m in BIND_FAILURE_MARKERS):
                return line.strip()[:300]
        return None

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the child's log, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class Supervisor:
    """Starts processes, waits for readiness, and stops every process group it started.

    Use as a context manager: leaving the block (normally, on an exception or on KeyboardInterrupt)
    stops everything. `stop()` is idempotent.
    """

    log_dir: Path
    grace_s: float = 5.0
    #: Linux: children get SIGTERM if the thread that started them dies (even by SIGKILL), so a killed
    #: supervisor leaves no orphans. Only safe when that thread lives as long as the children.
    die_with_parent: bool = False
    processes: list[ManagedProcess] = field(default_factory=list)

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        ready_url: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> ManagedProcess:
        """Start `argv` in a new session with stdout+stderr going to `<log_dir>/<name>.log`."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        proc = ManagedProcess(name=name, argv=list(argv), log_path=log_path, ready_url=ready_url)
        with open(log_path, "ab") as log:
            try:
                proc.popen = subprocess.Popen(  # noqa: S603 - argv is built by kvgate, never a shell string
                    proc.argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=full_env,
                    cwd=str(cwd) if cwd else None,
                    start_new_session=True,
                    preexec_fn=_die_with_parent if self.die_with_parent and sys.platform == "linux" else None,
                )
            except OSError as exc:
                raise SupervisorError(f"{name}: cannot start {argv[0]}: {exc}") from exc
        self.processes.append(proc)
        return proc

    def wait_ready(
        self,
        procs: Sequence[ManagedProcess] | None = None,
        *,
        deadline_s: float = 60.0,
        poll_s: float = 0.1,
        check: Callable[[ManagedProcess], bool] | None = None,
    ) -> None:
        """Poll each process's `ready_url` (or `check`) until all answer, one shared deadline.

        Raises SupervisorError naming the process (with its log tail) if one exits, says in its log that
        it cannot bind its port (BIND_FAILURE_MARKERS: at once, not at the deadline), or the deadline passes.
        """
        pending = [
            p for p in (procs if procs is not None else self.processes) if p.ready_url is not None or check is not None
        ]
        end = time.monotonic() + deadline_s
        next_log_look = time.monotonic() + 1.0
        while pending:
            look = time.monotonic() >= next_log_look
            if look:
                next_log_look = time.monotonic() + 1.0
            for proc in list(pending):
                if not proc.alive():
                    code = proc.popen.returncode if proc.popen else None
                    raise SupervisorError(
                        f"{proc.name} exited with status {code} before it was ready; log {proc.log_path}:\n"
                        f"{proc.log_tail()}"
                    )
                if look and (line := proc.bind_failure()) is not None:
                    raise SupervisorError(
                        f"{proc.name} cannot become ready, its port is in use (its log: {line!r}); "
                        f"log {proc.log_path}:\n{proc.log_tail()}"
                    )
                ok = check(proc) if check is not None else http_ok(str(proc.ready_url), timeout=1.0)
                if ok:
                    pending.remove(proc)
            if not pending:
                return
            if time.monotonic() > end:
                names = ", ".join(p.name for p in pending)
                tails = "\n".join(f"--- {p.name} ({p.log_path})\n{p.log_tail()}" for p in pending)
                raise SupervisorError(f"not ready within {deadline_s:.0f}s: {names}\n{tails}")
            time.sleep(poll_s)

    def stop(self) -> None:
        """SIGTERM every process group (newest first), wait up to `grace_s`, then SIGKILL the rest."""
        self.stop_processes(list(reversed(self.processes)))

    def stop_processes(self, procs: Sequence[ManagedProcess]) -> None:
        """Stop these process groups as `stop()` stops all of them; the others keep running."""
        # Idempotent: a group whose leader was already reaped here is never signalled again (its
        # pid, and so its group id, may belong to another process by now).
        live = [p for p in procs if p.popen is not None and not p.stopped]
        for proc in live:
            _signal_group(proc.pid, signal.SIGTERM)
        end = time.monotonic() + self.grace_s
        for proc in live:
            assert proc.popen is not None
            try:
                proc.popen.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in live:
            # Also kill the group when the leader is gone: a grandchild may still hold it.
            _signal_group(proc.pid, signal.SIGKILL)
            assert proc.popen is not None
            try:
                proc.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover - unkillable (D state)
                continue
            proc.stopped = True

    def watch(self, poll_s: float = 0.5) -> None:
        """Block while every process runs; raise SupervisorError naming the first ones to exit."""
        while True:
            time.sleep(poll_s)
            dead = [p.name for p in self.processes if not p.alive() and not p.stopped]  # stopped: on purpose
            if dead:
                raise SupervisorError(f"{', '.join(dead)} exited unexpectedly; see {self.log_dir}")

    def pids(self) -> list[int]:
        """The pids of every started process."""
        return [p.pid for p in self.processes if p.popen is not None]

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _die_with_parent() -> None:
    """In the child before exec: PR_SET_PDEATHSIG(SIGTERM)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def pid_alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie (used by tests to prove there are no orphans)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (FileNotFoundError, IndexError):
        return False
