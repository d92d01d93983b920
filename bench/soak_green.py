"""Green means green for the soak: a healthy simulated release passes `kvgate soak` at its defaults
(every setting but the duration and the slice, shortened so that N runs fit), run after run, while the
other core is kept busy.

It starts `kvgate sim up` (its defaults, a healthy prefill pool of 1.25 x the context), a bounded
busy-loop process (it ends on its own after --busy-s, and is stopped at the end), and runs `kvgate soak`
N times through the real CLI. It prints the pass rate and every non-pass finding. Not a timed test:
the figures are what one run saw.

    .venv/bin/python bench/soak_green.py [--runs 10] [--duration 30] [--slice 10] [--emulate 0.5.23] [--no-busy]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from sim_green import BUSY, KVGATE, start_sim  # bench/ is on the path when run as a script


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--slice", type=float, default=10.0)
    ap.add_argument("--emulate", default="0.5.23")
    ap.add_argument("--no-busy", action="store_true", help="do not keep the other core busy")
    ap.add_argument("--busy-s", type=float, default=1800.0, help="the busy loop ends on its own after this")
    args = ap.parse_args(argv)
    busy = None if args.no_busy else subprocess.Popen([sys.executable, "-c", BUSY.format(limit=args.busy_s)])
    reasons: Counter[str] = Counter()
    codes: Counter[int] = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        sim, urls = start_sim(args.emulate, Path(tmp))
        try:
            for i in range(args.runs):
                out = Path(tmp) / f"soak{i}.json"
                cmd = [*KVGATE, "soak", "--quiet", "--router-url", urls["router"], "--duration", f"{args.duration:g}"]
                cmd += ["--slice", f"{args.slice:g}", "-f", "json", "-o", str(out)]
                rc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900).returncode
                codes[rc] += 1
                doc = json.loads(out.read_text())
                for f in doc["findings"]:
                    if f["outcome"] != "passed":
                        reasons[f"{f['check_id'] if 'check_id' in f else f['check']}: {f['summary'][:160]}"] += 1
                print(f"run {i + 1}: exit {rc}", flush=True)
        finally:
            sim.terminate()
            sim.wait()
            if busy is not None:
                busy.terminate()
                busy.wait()
    load = "the other core busy" if busy is not None else "no extra load"
    print(
        f"{codes[0]}/{args.runs} passed ({args.emulate}, {args.duration:g} s soaks in {args.slice:g} s slices, {load})"
    )
    print(f"exit codes: {dict(codes)}; load average now {os.getloadavg()[0]:.1f}")
    for reason, n in reasons.most_common():
        print(f"  {n} x {reason}")
    return 0 if codes[0] == args.runs else 1


if __name__ == "__main__":
    raise SystemExit(main())
