"""Cost of gating a whole fleet from its router: 64 workers against 2 (goal <= 1.5x), and 512.

Measured on a 2-core machine shared with other jobs (2026-12-01), 0.3 s per metadata answer, median
of 3: 2 workers 1.0 s; 64 workers 1.23x at the default --concurrency 64 (3.89x at the old pool of
16); 512 workers 10.2x at --concurrency 64 (eight rounds of reads) and 6.4x at --concurrency 512,
where the one-process fleet host and the client's JSON parsing share the two cores.

Fleets of metadata-only simulated workers (kvgate/sim/fleet.py, one process for the whole fleet)
behind the real router (smg), every metadata answer delayed by --delay seconds (0.3 s: a busy or
distant worker). Each run is `kvgate check --router-url URL --no-probes` in-process: list the workers
from the router, read every worker's metadata, run the metadata gates. Measured side by side in one
run, median of --repeat runs per cell, at --concurrency 64 (the default) and at 16 (the old fixed
thread pool, for the "before").

    .venv/bin/python bench/fleet_read.py [--sizes 2,64,512] [--delay 0.3] [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from kvgate.check import run_check
from kvgate.gates.base import CheckOptions
from kvgate.sim.deploy import SimDeployment

GOAL = 1.5
CONCURRENCIES = (16, 64)


def gate_once(router: str, concurrency: int) -> tuple[float, int, str]:
    """One gate run: (wall seconds, workers read, exit status); errors are printed to stderr."""
    options = CheckOptions(
        router_url=router, probes_enabled=False, concurrency=concurrency, timeout=30.0, read_deadline=600.0
    )
    t0 = time.monotonic()
    report = run_check(options)
    wall = time.monotonic() - t0
    for f in report.findings:
        if f.outcome.value == "error":
            print(f"concurrency {concurrency}: {f.test_id} {f.node}: {f.summary}", file=sys.stderr)
    return wall, len(report.target.get("nodes", [])), report.exit_status.name


def measure(size: int, delay: float, repeat: int, concurrencies: tuple[int, ...]) -> dict[str, object]:
    """Start one fleet of `size` workers (half prefill) and time the gate at each concurrency."""
    prefill = max(1, size // 2)
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
    ) as dep:
        assert dep.router_url is not None
        out: dict[str, object] = {"workers": size}
        for c in concurrencies:
            runs = [gate_once(dep.router_url, c) for _ in range(repeat)]
            read = {r[1] for r in runs}
            if read != {size}:
                raise SystemExit(f"{size} workers: a run read {read} workers")
            out[f"c{c}_s"] = round(statistics.median(r[0] for r in runs), 3)
            out[f"c{c}_status"] = runs[0][2]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="2,64,512", help="fleet sizes; the first is the reference")
    ap.add_argument("--delay", type=float, default=0.3, help="seconds every metadata answer takes")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for size in sizes:
        concurrencies = CONCURRENCIES + ((size,) if size > max(CONCURRENCIES) else ())
        rows.append(measure(size, args.delay, args.repeat, concurrencies))
    ref = rows[0]
    ok = True
    for row in rows:
        # Against the reference at the same concurrency; a concurrency the reference did not run
        # (--concurrency N for N workers) against the reference at the default.
        ratios = {
            k.replace("_s", "_ratio"): round(float(v) / float(ref.get(k, ref["c64_s"])), 2)  # type: ignore
            for k, v in row.items()
            if k.endswith("_s")
        }
        row.update(ratios)
        if args.json:
            print(json.dumps(row))
            continue
        cells = ", ".join(
            f"concurrency {k[1:-2]}: {v} s"
            + (f" = {ratios[k.replace('_s', '_ratio')]}x" if k.replace("_s", "_ratio") in ratios else "")
            for k, v in row.items()
            if k.endswith("_s")
        )
        print(f"{row['workers']:>4} workers: {cells}")
    for row in rows:
        if row["workers"] == 64 and "c64_ratio" in row:
            ok = float(row["c64_ratio"]) <= GOAL  # type: ignore[arg-type]
            print(
                f"goal: 64 workers <= {GOAL}x the cost of {ref['workers']} at the default concurrency: "
                f"{row['c64_ratio']}x ({'met' if ok else 'NOT met'}); at the old pool of 16: {row['c16_ratio']}x"
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
