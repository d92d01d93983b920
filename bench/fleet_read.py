"""Cost of reading a whole fleet from its router, `kvgate check` and `kvgate watch`'s pass side by side
with the bare-socket floor: 1,024 workers against 2 (goal <= 1.5x for each).

Fleets of metadata-only simulated workers (kvgate/sim/fleet.py, one process for the whole fleet)
behind the real router (smg), every metadata answer delayed by --delay seconds (0.3 s: a busy or
distant worker). On each fleet, in one run, interleaved, median of --repeat runs each:

- check: `kvgate check --router-url URL --no-probes` in-process at the default --concurrency: list the
  workers from the router, read every worker's facts (kvgate/reading/fleetread.py: server_info with every DP
  rank's internal_states, /v1/models, /model_info), run the metadata gates, build the report;
- watch: `kvgate watch`'s per-interval metadata pass (kvgate/watch/fleetpass.py: the same reader and
  facts, the router's listing overlapped with the reads of the last pass's workers), after one warm-up
  pass, as in a running watch;
- floor: bare non-blocking sockets sending the same GETs to every worker at once (each as soon as its
  connection is up) and reading the answers whole, nothing parsed and no listing: the least a read can
  cost on this machine. On a 2-core machine the one-process fleet host and the client share the
  cores, so part of any 1,024-worker read is the host's accepting and answering; the floor shows how
  much. At most check's own in-flight count at once (--concurrency x the three facts: the whole fleet
  at 1,024 workers, a window over 10,240).

- two-read floor: the floor run twice in a row, the second when the first has ended: check's own shape,
  which reads the fleet whole and then (issue 40's second look, kvgate/pipeline/stability.py) reads the listing
  and every worker whole again before its verdict. At 2 workers check is two slow answers, the floor one.

From --stand-in-from workers up (10,240 by default) the fleet is listed by a stand-in router (a process
answering smg's `/workers` and `/readiness` shapes for the fleet's workers, tests/assets/router_payloads.py),
not smg: with 10,240 workers answering in 0.3 s, smg never became ready within 300 s (its per-worker
metadata discovery timed out over and over). The workers are the same simulated fleet; each row says
which router listed it.

Each size runs in a forked child, whose own peak RSS (check, the watch's pass and the floor in one
process; the fleet host and the router are processes of their own) is printed beside its ratios. The
open-file limit is raised to the hard one first (the fleet host's 10,240 listening sockets and each
side's sockets in flight count against it).

    .venv/bin/python bench/fleet_read.py [--sizes 2,1024,10240] [--stand-in-from 10240] [--delay 0.3]
                                         [--repeat 5] [--json]
    .venv/bin/python bench/fleet_read.py --rss 1024,10240 [--near-cap-max 1024]

`--rss SIZES` prints, instead, the peak RSS of a whole `kvgate check --no-probes` (a child process:
its own ru_maxrss from wait4) over a fleet of that many listed workers (tests/assets/bulk_fleet.py:
one host process, real sockets, workers under path prefixes), healthy beside each worker answering a
server_info near the 16 MiB cap (up to --near-cap-max workers: 1,024 near-cap answers are 16 GiB read
twice, minutes on a small machine). The bound the tests hold is 1 GiB (tests/hostile/test_fleet_memory.py).

Before the one reader (2026-12-01..04): check read with a thread per worker over httpx, three GETs in
a row each, 64 workers at once: 512 workers 10.2x the pass over 2 (6.4x at --concurrency 512); the
watch's pass read server_info only, 1,024 workers at 1.25-1.54x (the floor 1.15-1.54x).
Measured figures since: docs/reference.md ("bench/fleet_read.py").
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import selectors
import socket
import statistics
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kvgate.defaults import DEFAULT_CONCURRENCY
from kvgate.gates.base import CheckOptions
from kvgate.pipeline.check import run_check
from kvgate.reading.fleetread import READS
from kvgate.sim.deploy import SimDeployment
from kvgate.watch.fleetpass import read_fleet
from kvgate.watch.settings import WatchSettings

GOAL = 1.5
FLOOR_GOAL = 1.2


def gate_once(router: str, concurrency: int) -> tuple[float, float, int, str]:
    """One check run: (wall s, client CPU s, workers read, exit status); errors go to stderr."""
    options = CheckOptions(
        router_url=router, probes_enabled=False, concurrency=concurrency, timeout=30.0, read_deadline=600.0
    )
    c0, t0 = time.process_time(), time.monotonic()
    report = run_check(options)
    wall, cpu = time.monotonic() - t0, time.process_time() - c0
    for f in report.findings:
        if f.outcome.value == "error":
            print(f"check: {f.test_id} {f.node}: {f.summary}", file=sys.stderr)
    return wall, cpu, len(report.target.get("nodes", [])), report.exit_status.name


def _serve_listing(sock: socket.socket, bodies: dict[str, bytes]) -> None:
    """The stand-in router's process: each GET answered from `bodies` by path (404 else), one thread per
    connection (check sends it a handful of requests per run)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            body = bodies.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", "application/json")
            data = body if body is not None else b'{"detail": "Not Found"}'
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(sock.getsockname(), Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.serve_forever()


def stand_in_router(dep: SimDeployment) -> tuple[Any, str]:
    """A process answering smg's `/workers` (smg 1.13's entry shape, tests/assets/router_payloads.py) and
    `/readiness` for the fleet's workers, as the real router lists them; (process, its URL)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the router's shapes live in tests/assets
    from tests.assets import router_payloads as R

    entries = [
        R.smg_entry(url, "prefill", bootstrap_port=bport)
        for url, bport in zip(dep.prefill_urls, dep.bootstrap_ports, strict=True)
    ]
    entries += [R.smg_entry(url, "decode") for url in dep.decode_urls]
    n = len(entries)
    bodies = {
        "/workers": json.dumps(R.smg_workers(*entries)).encode(),
        "/readiness": json.dumps({"status": "ready", "healthy_workers": n, "total_workers": n}).encode(),
        "/health": b"{}",
    }
    sock = socket.create_server(("127.0.0.1", 0), backlog=128)
    port = sock.getsockname()[1]
    proc = multiprocessing.get_context("fork").Process(target=_serve_listing, args=(sock, bodies), daemon=True)
    proc.start()
    sock.close()  # the child listens on it; connections queue in the backlog until it serves
    return proc, f"http://127.0.0.1:{port}"


def measure(size: int, delay: float, repeat: int, concurrency: int, stand_in: bool) -> dict[str, object]:
    """Start one fleet of `size` workers (half prefill) behind the real router, or (`stand_in`) behind a
    stand-in answering the listing; time check, the watch's pass and the floors on it."""
    width = WatchSettings().pass_concurrency
    prefill = max(1, size // 2)
    router_proc = None
    with SimDeployment(
        emulate="0.5.22",
        prefill=prefill,
        decode=size - prefill,
        context_length=4096,
        prefill_pool=8192,
        decode_pool=8192,
        light=True,
        metadata_delay_s=delay,
        ready_deadline_s=300.0,
        router=not stand_in,
    ) as dep:
        if stand_in:
            router_proc, router = stand_in_router(dep)
        else:
            assert dep.router_url is not None
            router = dep.router_url
        snap = read_fleet(router, timeout=30.0, token=None, concurrency=width, deadline_s=120.0)  # warm-up
        expected = snap.specs
        gate_once(router, concurrency)  # warm-up: the gates' modules load on the first run
        checks, check_cpus, passes, pass_cpus, floors, floors2 = [], [], [], [], [], []
        status = ""
        try:
            for _ in range(repeat):
                wall, cpu, read, status = gate_once(router, concurrency)
                if read != size:
                    raise SystemExit(f"{size} workers: a check read {read} workers")
                checks.append(wall)
                check_cpus.append(cpu)
                c0 = time.process_time()
                snap = read_fleet(
                    router, timeout=30.0, token=None, concurrency=width, deadline_s=120.0, expected=expected
                )
                pass_cpus.append(time.process_time() - c0)
                if len(snap.readings) != size:
                    raise SystemExit(
                        f"{size} workers: a pass read {len(snap.readings)}: {list(snap.errors.values())[:2]}"
                    )
                expected = snap.specs
                passes.append(snap.elapsed_s)
                urls = [s.url for s in expected]
                floors.append(floor_pass(urls, concurrency * len(READS)))
                t0 = time.monotonic()  # check's own shape: the fleet read whole, then read whole again
                floor_pass(urls, concurrency * len(READS))
                floor_pass(urls, concurrency * len(READS))
                floors2.append(time.monotonic() - t0)
        finally:
            if router_proc is not None:
                router_proc.terminate()
                router_proc.join(10)
    med = statistics.median
    return {
        "workers": size,
        "router": "stand-in (lists the fleet)" if stand_in else "smg",
        "floor2_s": round(med(floors2), 3),
        "check_s": round(med(checks), 3),
        "check_cpu_s": round(med(check_cpus), 3),
        "check_status": status,
        "pass_s": round(med(passes), 3),
        "pass_cpu_s": round(med(pass_cpus), 3),
        "floor_s": round(med(floors), 3),
    }


def floor_pass(urls: list[str], width: int, paths: tuple[str, ...] = tuple(r[0] for r in READS)) -> float:
    """Seconds for bare non-blocking sockets to GET every one of `paths` from every URL, at most `width`
    at once (check's own in-flight count: --concurrency x the facts; the whole fleet at 1,024 workers),
    each sent as soon as its connection is up, and read each answer to its end: the least a read can
    cost on this machine (no parsing, no listing, no deadlines)."""
    sel = selectors.DefaultSelector()
    todo = [(url, path) for url in urls for path in paths]
    todo.reverse()
    t0 = time.monotonic()

    def start() -> None:
        url, path = todo.pop()
        parts = urlsplit(url)
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex((parts.hostname or "", parts.port or 80))
        request = f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n\r\n".encode()
        try:  # sent at once where the connection is already up (a near peer's is), as the reader does
            sock.send(request)
            sel.register(sock, selectors.EVENT_READ)
        except BlockingIOError:
            sel.register(sock, selectors.EVENT_WRITE, request)

    while todo and len(sel.get_map()) < width:
        start()
    while sel.get_map():
        for key, mask in sel.select():
            sock = key.fileobj  # type: ignore[assignment]
            if mask & selectors.EVENT_WRITE:
                sock.send(key.data)
                sel.modify(sock, selectors.EVENT_READ)
            elif not sock.recv(1 << 18):
                sel.unregister(sock)
                sock.close()
                if todo:
                    start()
    return time.monotonic() - t0


def raise_fd_limit() -> int:
    """The soft open-file limit raised to the hard one (the fleet host, its children, inherit it): 10,240
    workers are 10,240 listening sockets in the host, and each read in flight one socket on each side."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def measure_apart(size: int, delay: float, repeat: int, concurrency: int, stand_in: bool) -> dict[str, object]:
    """`measure` in a forked child, so each size's peak RSS is its own (the client's: check, the watch's
    pass and the floor, in one process; the fleet host and the router are processes of their own)."""
    ctx = multiprocessing.get_context("fork")
    q: Any = ctx.Queue()

    def child() -> None:
        try:
            row = measure(size, delay, repeat, concurrency, stand_in)
            row["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
            q.put(row)
        except BaseException as exc:  # noqa: BLE001 - said by the parent, whatever it was
            q.put({"workers": size, "error": f"{type(exc).__name__}: {exc}"})

    proc = ctx.Process(target=child)
    proc.start()
    row: dict[str, object] = q.get()
    proc.join()
    return row


def rss_rows(sizes: list[int], near_cap_max: int) -> int:
    """Peak RSS of check over healthy and near-cap fleets of each size, side by side."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the bulk fleet host lives in tests/assets
    from tests.assets.bulk_fleet import NEAR_CAP, peak_rss_of_check

    for size in sizes:
        line = f"{size:>6} workers: check peak RSS"
        for name, pad in (("healthy", 0), ("near the cap", NEAR_CAP)):
            if pad and size > near_cap_max:
                line += f"; {name}: not run (over --near-cap-max)"
                continue
            t0 = time.monotonic()
            code, rss, err = peak_rss_of_check(size, pad)
            line += f"; {name}: {rss / (1 << 20):,.0f} MiB (exit {code}, {time.monotonic() - t0:.0f} s)"
            if code not in (0, 1, 3):
                print(err, file=sys.stderr)
        print(line, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rss", default="", help="print check's peak RSS over these fleet sizes instead")
    ap.add_argument("--near-cap-max", type=int, default=1024, help="largest --rss fleet read near the cap")
    ap.add_argument("--sizes", default="2,1024,10240", help="fleet sizes; the first is the reference")
    ap.add_argument("--delay", type=float, default=0.3, help="seconds every metadata answer takes")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="check's --concurrency")
    ap.add_argument(
        "--stand-in-from",
        type=int,
        default=10240,
        help="sizes from this one up are listed by a stand-in router, not smg (smg is not ready with 10,240)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.rss:
        return rss_rows([int(s) for s in args.rss.split(",")], args.near_cap_max)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"open-file limit {raise_fd_limit()}", file=sys.stderr)
    rows = []
    for size in sizes:
        stand_in = size >= args.stand_in_from
        row = measure_apart(size, args.delay, max(args.repeat, 1), args.concurrency, stand_in)
        if "error" in row:  # said, and the sizes measured still printed
            print(f"{size:>5} workers: not measured: {row['error']}", flush=True)
            continue
        rows.append(row)
        print(f"measured: {json.dumps(row)}", file=sys.stderr, flush=True)  # a size may take long: said as it ends
    if not rows:
        return 1
    ref = rows[0]
    ok = True
    for row in rows:
        for k in ("check", "pass", "floor"):
            row[f"{k}_ratio"] = round(float(row[f"{k}_s"]) / float(ref[f"{k}_s"]), 2)  # type: ignore[arg-type]
        if args.json:
            print(json.dumps(row))
            continue
        print(
            f"{row['workers']:>5} workers: check {row['check_s']} s = {row['check_ratio']}x "
            f"(client CPU {row['check_cpu_s']} s, {row['check_status']}); watch pass {row['pass_s']} s = "
            f"{row['pass_ratio']}x (client CPU {row['pass_cpu_s']} s); bare-socket floor {row['floor_s']} s "
            f"= {row['floor_ratio']}x; check / floor {float(row['check_s']) / float(row['floor_s']):.2f}x; "  # type: ignore[arg-type]
            f"two-read floor {row['floor2_s']} s, check / it {float(row['check_s']) / float(row['floor2_s']):.2f}x; "  # type: ignore[arg-type]
            f"client peak RSS {row['peak_rss_mib']} MiB; router: {row['router']}"
        )
    for row in rows[1:]:
        for k, what in (("check", "check --router-url --no-probes"), ("pass", "the watch's pass")):
            met = float(row[f"{k}_ratio"]) <= GOAL  # type: ignore[arg-type]
            ok = ok and met
            budget = GOAL * float(ref[f"{k}_s"])  # type: ignore[arg-type]
            print(
                f"goal: {what} over {row['workers']} workers <= {GOAL}x the same over {ref['workers']}: "
                f"{row[f'{k}_ratio']}x ({'met' if met else 'NOT met'}; the floor itself is {row['floor_ratio']}x; "
                f"the goal allows {budget:.3f} s of wall time, kvgate's client CPU alone is {row[f'{k}_cpu_s']} s)"
            )
    for row in rows[1:]:  # issue 40's goal: check's read within 1.2x of the floor's over the same fleet
        over = float(row["check_s"]) / float(row["floor_s"])  # type: ignore[arg-type]
        met = over <= FLOOR_GOAL
        ok = ok and met
        over2 = float(row["check_s"]) / float(row["floor2_s"])  # type: ignore[arg-type]
        print(
            f"goal: check over {row['workers']} workers <= {FLOOR_GOAL}x the bare-socket floor over the same "
            f"fleet: {over:.2f}x ({'met' if met else 'NOT met'}; client peak RSS {row['peak_rss_mib']} MiB; "
            f"router: {row['router']}); against the two-read floor (check reads every worker twice, the second "
            f"look): {over2:.2f}x ({'within' if over2 <= FLOOR_GOAL else 'over'} {FLOOR_GOAL}x)"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
