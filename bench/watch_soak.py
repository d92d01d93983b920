"""Memory of `kvgate watch` over an hour of simulated time against the simulator (goal: RSS growth < 5%).

One Watcher (kvgate/watch/loop.py) drives a simulated 1P1D deployment (0.5.22, real worker processes
behind the real router) interval by interval, as `kvgate watch` does, but on a simulated clock: the
waits between probe slots and to the end of each interval advance the clock instead of sleeping, so
an hour (--hours) of 30 s intervals runs in minutes. Every interval runs the metadata pass, its share
of the probe budget (sent for real) and scrapes /metrics and /verdict over HTTP; a full gate runs at
the start and every --regate-every simulated seconds. RSS is read from /proc after a warm-up of
--warmup intervals and at the end, after a garbage collection each time.

    .venv/bin/python bench/watch_soak.py [--hours 1] [--interval 30] [--regate-every 900]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from typing import Any

import httpx

from kvgate.gates.base import CheckOptions
from kvgate.sim.deploy import OBSERVABLE_PREFILL_TOKENS_PER_S, SimDeployment
from kvgate.watch.heap import limit_arenas
from kvgate.watch.loop import Watcher
from kvgate.watch.settings import WatchSettings

GOAL_PCT = 5.0


class SimClock:
    """The watch's schedule clock: real time plus every wait, so the waits take no real time."""

    def __init__(self) -> None:
        self.skipped = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.skipped


class SimStop:
    """Stands in for the watch's stop event: a wait advances the simulated clock and returns at once."""

    def __init__(self, clock: SimClock) -> None:
        self.clock = clock
        self.waited = 0.0

    def wait(self, timeout: float | None = None) -> bool:
        step = max(0.0, timeout or 0.0)
        self.clock.skipped += step
        self.waited += step
        return False

    def is_set(self) -> bool:
        return False


def rss_kib() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--interval", type=float, default=30.0)
    ap.add_argument("--regate-every", type=float, default=900.0)
    ap.add_argument("--warmup", type=int, default=10)
    args = ap.parse_args(argv)
    intervals = int(args.hours * 3600 / args.interval)
    limit_arenas()  # as `kvgate watch` does before anything starts a thread (the Watcher does it again)
    settings = WatchSettings(
        interval_s=args.interval,
        requests_per_min=12,
        prefill_tokens_per_min=65536,
        regate_every_s=args.regate_every,
        max_age_s=max(args.interval, 2 * args.regate_every),
    )
    with SimDeployment(
        emulate="0.5.22",
        context_length=8192,
        prefill_pool=16384,
        decode_pool=32768,
        prefill_tokens_per_s=OBSERVABLE_PREFILL_TOKENS_PER_S,
    ) as dep:
        assert dep.router_url is not None
        options = CheckOptions(
            router_url=dep.router_url,
            probes={"tenants": 4, "latency_long_tokens": 2000},
            defenses={"trust_version": True, "deferred_release_env": True},
        )
        clock = SimClock()
        w = Watcher(options, settings, listen=("127.0.0.1", 0), clock=clock)
        stop = SimStop(clock)
        w.endpoint.start()
        base = "http://{}:{}".format(*w.endpoint.address)
        regate_every = max(1, int(args.regate_every / args.interval))
        t0 = clock()
        real0 = time.monotonic()
        start_rss = 0
        series: list[int] = []  # RSS at the end of every regate cycle
        try:
            for i in range(intervals):
                if i and i % regate_every == 0:
                    w.pending = "schedule"
                w.interval(stop)  # type: ignore[arg-type]
                httpx.get(base + "/metrics", timeout=10).raise_for_status()
                httpx.get(base + "/verdict", timeout=10)
                if i + 1 == args.warmup:
                    gc.collect()
                    start_rss = rss_kib()
                if (i + 1) % regate_every == 0:
                    gc.collect()
                    series.append(rss_kib())
            gc.collect()
            end_rss = rss_kib()
        finally:
            w.endpoint.stop()
            w.http.close()
    growth = 100.0 * (end_rss - start_rss) / start_rss
    ok = growth < GOAL_PCT
    b = w.budget
    gates = int(sum(v for m in w.metrics.registry.collect() for v in _values(m, "kvgate_full_gates_total")))
    verdict = w.report.exit_status.name.lower() if w.report else "none"
    print(
        f"{intervals} intervals of {args.interval:g} s ({(clock() - t0) / 3600:.2f} h on the watch's clock) in "
        f"{time.monotonic() - real0:.0f} s of real time: {b.requests_total} probes "
        f"({b.prefill_tokens_total:,} prefill tokens; the most in any minute {b.peak_requests} requests and "
        f"{b.peak_tokens:,} tokens, budget {b.requests_per_min} and {b.prefill_tokens_per_min:,}), "
        f"{gates} full gates, verdict {verdict}"
    )
    print(
        f"RSS after {args.warmup} intervals {start_rss / 1024:.1f} MiB, at the end {end_rss / 1024:.1f} MiB: "
        f"growth {growth:+.2f}% (goal < {GOAL_PCT:g}%: {'met' if ok else 'NOT met'})"
    )
    cycles = ", ".join(f"{kib / 1024:.1f}" for kib in series)
    print(f"RSS (MiB) at the end of each {args.regate_every:g} s regate cycle: {cycles}")
    return 0 if ok else 1


def _values(metric: Any, name: str) -> list[float]:
    return [float(s.value) for s in metric.samples if s.name == name]


if __name__ == "__main__":
    sys.exit(main())
