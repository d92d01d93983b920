"""The one way kvgate starts a PD deployment: worker processes, then the real router in front of them.

`kvgate.deploy.launch` (real SGLang workers, or the simulator's, from a `PDLaunchPlan`) and
`kvgate.sim.deploy` (the simulator's own knobs, light fleets) each build a `PDLayout`: which processes
to start and which worker URLs each serves. `start_pd` runs the sequence for both:

1. start every worker process and wait until each of its URLs answers /health;
2. only then start the router: smg gives up on a worker that is not healthy within its start-up
   timeout and never retries it, and a loaded machine can start workers slowly;
3. wait for the router's /readiness (200 once one prefill and one decode are healthy), then until its
   /workers lists every worker ready;
4. optionally, until it has served one short request: smg answers 503 "No prefill workers available"
   for a few seconds after /readiness (measured on CPU, cpu-sglang.md).

The router is the real one from PyPI (`smg` 1.13.0, or `sglang-router` 0.3.2's `smg` script); kvgate
only builds its command line (sglang-surface.md section 3).
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from kvgate.deploy.supervisor import Supervisor, SupervisorError, free_port, http_ok
from kvgate.errors import UsageError
from kvgate.upstream.releases import HEALTH_CHECK_TIMEOUT_S

#: Upper bounds on the router's own waits, whatever the workers' deadline (real workers may need 30 min).
ROUTER_READY_CAP_S = 300.0
SERVE_CHECK_CAP_S = 120.0
# A worker's /health read: real SGLang answers only after its first 1 s poll (upstream.HEALTH_CHECK_TIMEOUT_S),
# so a short read timeout misses healthy answers and the start waits for a lucky one.
HEALTH_READ_TIMEOUT_S = HEALTH_CHECK_TIMEOUT_S + 5.0


def find_smg() -> str:
    """The `smg` script of this environment (next to the interpreter first, then PATH)."""
    local = Path(sys.executable).with_name("smg")
    if local.is_file():
        return str(local)
    found = shutil.which("smg")
    if found:
        return found
    raise UsageError("the real SGLang router is not installed: pip install 'kvgate[router]' (smg==1.13.0)")


def router_argv(
    *,
    prefill: Sequence[tuple[str, int]],
    decode: Sequence[str],
    host: str,
    port: int,
    prometheus_port: int,
    prefill_policy: str = "round_robin",
    decode_policy: str = "round_robin",
    request_timeout_s: int = 1800,
    smg: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """`smg launch --pd-disaggregation --prefill URL BOOTSTRAP_PORT ... --decode URL ...`.

    Start-up checks every second (default 30 s), no retries and no circuit breaker (a simulated
    failure must reach the client as it happened, not be retried away), a short shutdown grace
    (default 180 s) so teardown is quick.
    """
    argv = [smg or find_smg(), "launch", "--pd-disaggregation"]
    for url, bootstrap_port in prefill:
        argv += ["--prefill", url, str(bootstrap_port)]
    for url in decode:
        argv += ["--decode", url]
    argv += [
        "--host",
        host,
        "--port",
        str(port),
        "--prometheus-port",
        str(prometheus_port),
        "--prometheus-host",
        "127.0.0.1",
        "--prefill-policy",
        prefill_policy,
        "--decode-policy",
        decode_policy,
        "--worker-startup-check-interval",
        "1",
        "--worker-startup-timeout-secs",
        "120",
        "--disable-retries",
        "--disable-circuit-breaker",
        "--shutdown-grace-period-secs",
        "1",
        "--request-timeout-secs",
        str(request_timeout_s),
        "--log-level",
        "warn",
    ]
    return argv + list(extra)


class DistinctPorts:
    """Free ports, never the same one twice: free_port() may hand out a port again once its probe
    socket is closed, and a fleet of hundreds draws enough ports for that to happen."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.used: set[int] = set()

    def __call__(self) -> int:
        while True:
            port = free_port(self.host)
            if port not in self.used:
                self.used.add(port)
                return port


@dataclass(frozen=True)
class WorkerProcess:
    """One process to start and the worker URLs it serves: one, or every worker of a light fleet."""

    name: str
    argv: tuple[str, ...]
    urls: tuple[str, ...]


@dataclass(frozen=True)
class PDLayout:
    """What to start, and the workers the router fronts, in order."""

    processes: tuple[WorkerProcess, ...]
    prefill: tuple[tuple[str, int], ...]  # (URL, bootstrap port)
    decode: tuple[str, ...]


@dataclass(frozen=True)
class StartedPD:
    """A deployment `start_pd` brought up: its supervisor (which stops it), layout and router."""

    supervisor: Supervisor
    layout: PDLayout
    router_url: str | None


def start_pd(
    build: Callable[[DistinctPorts], PDLayout],
    new_supervisor: Callable[[], Supervisor],
    *,
    host: str,
    env: Mapping[str, str],
    ready_deadline_s: float,
    poll_s: float = 0.1,
    router: bool = True,
    router_args: Sequence[str] = (),
    serve_check: bool = False,
    attempts: int = 1,
) -> StartedPD:
    """Build the layout on fresh ports and run the start sequence (module docstring) under a new
    supervisor; every process is stopped if any step fails.

    Ports are picked free just before the children bind them; if another process takes one in between
    (another test run on the machine), up to `attempts` starts are made, each with fresh ports.
    """
    for attempt in range(1, attempts + 1):
        sup = new_supervisor()
        try:
            ports = DistinctPorts(host)
            layout = build(ports)
            router_url = _run_sequence(
                sup,
                layout,
                ports,
                host=host,
                env=env,
                ready_deadline_s=ready_deadline_s,
                poll_s=poll_s,
                router=router,
                router_args=router_args,
                serve_check=serve_check,
            )
            return StartedPD(sup, layout, router_url)
        except SupervisorError as exc:
            sup.stop()
            if attempt == attempts or "in use" not in str(exc).lower():
                raise
        except BaseException:
            sup.stop()
            raise
    raise AssertionError("unreachable")


def _run_sequence(
    sup: Supervisor,
    layout: PDLayout,
    ports: DistinctPorts,
    *,
    host: str,
    env: Mapping[str, str],
    ready_deadline_s: float,
    poll_s: float,
    router: bool,
    router_args: Sequence[str],
    serve_check: bool,
) -> str | None:
    serves: dict[str, tuple[str, ...]] = {}
    procs = []
    for p in layout.processes:
        procs.append(sup.start(p.name, p.argv, env=env))
        serves[p.name] = p.urls
    sup.wait_ready(
        procs,
        deadline_s=ready_deadline_s,
        poll_s=poll_s,
        check=lambda proc: all(http_ok(u + "/health", timeout=HEALTH_READ_TIMEOUT_S) for u in serves[proc.name]),
    )
    if not router:
        return None
    rport = ports()
    router_url = f"http://{host}:{rport}"
    proc = sup.start(
        "router",
        router_argv(
            prefill=layout.prefill,
            decode=layout.decode,
            host=host,
            port=rport,
            prometheus_port=ports(),
            extra=router_args,
        ),
        ready_url=router_url + "/readiness",
    )
    router_deadline_s = min(ROUTER_READY_CAP_S, ready_deadline_s)
    sup.wait_ready([proc], deadline_s=router_deadline_s, poll_s=poll_s)
    _wait_router_lists_all(router_url, len(layout.prefill) + len(layout.decode), router_deadline_s, poll_s)
    if serve_check:
        _wait_serving(router_url, min(SERVE_CHECK_CAP_S, ready_deadline_s), poll_s, sup.log_dir)
    return router_url


def _wait_router_lists_all(router_url: str, want: int, deadline_s: float, poll_s: float) -> None:
    """smg's /readiness turns 200 with one healthy prefill and decode; wait until it knows every worker."""
    end = time.monotonic() + deadline_s
    last = "never answered"
    while time.monotonic() < end:
        try:
            doc = httpx.get(f"{router_url}/workers", timeout=2.0).json()
            # A DP worker is listed once per rank (smg --dp-aware): count workers, not entries.
            seen = len(
                {w.get("dp_base_url") or w.get("url") for w in doc.get("workers", []) if w.get("status") == "ready"}
            )
            if seen >= want:
                return
            last = f"lists {seen} ready workers of {want}"
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            last = f"could not be read ({type(exc).__name__}: {exc})"
        time.sleep(poll_s)
    raise SupervisorError(f"the router's {router_url}/workers {last} after {deadline_s:.0f}s")


def _wait_serving(router_url: str, deadline_s: float, poll_s: float, log_dir: Path) -> None:
    """Until one short request is served through the router."""
    body = {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 1}}
    end = time.monotonic() + deadline_s
    last = ""
    while time.monotonic() < end:
        try:
            resp = httpx.post(f"{router_url}/generate", json=body, timeout=30.0)
            if resp.status_code == 200:
                return
            last = f"HTTP {resp.status_code}"
        except httpx.HTTPError as exc:
            last = str(exc)
        time.sleep(poll_s)
    raise SupervisorError(
        f"the router at {router_url} did not serve a request within {deadline_s:g} s ({last}); see {log_dir}"
    )
