"""Green means green (issue 19): a healthy simulated release at `kvgate sim up` defaults passes
`kvgate check` at its defaults, run after run, while the other core is kept busy.

It starts `kvgate sim up` (defaults, except a healthy prefill pool of 1.25 x the context and the
defenses observable: `--expose-env-vars --deferred-release`), a bounded busy-loop process (it ends
on its own after --busy-s, and is stopped at the end), and runs `kvgate check --trust-version` (the
simulator runs no sglang code, so its release label is the evidence) N times through the real CLI.
It prints the pass rate and every non-pass reason. Not a timed test: the figures are what one run saw.

`--e2e-factor 10` (issue 32) emulates a deployment whose answers take ten times their time to the KV end
to end (`kvgate sim up --e2e-factor`: a slow decode; the calibration's one-token requests do not show it),
as a held-out real pair whose victims answered after 0.8 s while its calibrated window was 40-70 ms.

    .venv/bin/python bench/sim_green.py [--runs 20] [--emulate 0.5.22] [--no-busy] [--e2e-factor 10]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

#: The real CLI (its console script's entry point), run by this interpreter.
KVGATE = [sys.executable, "-c", "import sys; from kvgate.cli import main; sys.argv[0] = 'kvgate'; main()"]
BUSY = "import time\nend = time.monotonic() + {limit}\nwhile time.monotonic() < end:\n    pass\n"


def start_sim(emulate: str, log_dir: Path, e2e_factor: float = 0.0) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """`kvgate sim up` at its defaults with a healthy pool; returns the process and its URLs."""
    argv = [*KVGATE, "sim", "up", "--release", emulate, "--prefill-pool", "10240"]
    if e2e_factor:
        argv += ["--e2e-factor", f"{e2e_factor:g}"]
    argv += ["--expose-env-vars", "--deferred-release", "--log-dir", str(log_dir)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"kvgate sim up exited ({proc.wait()}) before printing its URLs")
        if line.startswith("{"):
            return proc, json.loads(line)
    proc.terminate()
    raise SystemExit("kvgate sim up did not come up within 180 s")


def check_once(urls: dict[str, Any], out: Path) -> tuple[int, dict[str, Any]]:
    argv = [*KVGATE, "check", "--quiet", "--trust-version", "--router-url", urls["router"]]
    for u in urls["prefill"]:
        argv += ["--prefill-url", u]
    for u in urls["decode"]:
        argv += ["--decode-url", u]
    argv += ["-f", "json", "-o", str(out)]
    rc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600).returncode
    return rc, json.loads(out.read_text())


def _ev(doc: dict[str, Any], check_id: str) -> dict[str, Any]:
    for f in doc["findings"]:
        if f["id"] == check_id:
            return {e["field"]: e["value"] for e in f["evidence"]}
    return {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--emulate", default="0.5.22")
    ap.add_argument("--no-busy", action="store_true", help="do not keep the other core busy")
    ap.add_argument("--busy-s", type=float, default=1800.0, help="the busy loop ends on its own after this")
    ap.add_argument(
        "--e2e-factor", type=float, default=0.0, help="sim up --e2e-factor: answers take this x their time to KV"
    )
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="kvgate-sim-green-"))
    sim, urls = start_sim(args.emulate, work / "logs", args.e2e_factor)
    busy = None
    if not args.no_busy:
        busy = subprocess.Popen([sys.executable, "-c", BUSY.format(limit=args.busy_s)])
    codes: Counter[int] = Counter()
    reasons: list[str] = []
    try:
        for i in range(args.runs):
            rc, doc = check_once(urls, work / f"run{i:02d}.json")
            codes[rc] += 1
            cal = _ev(doc, "probes.calibration").get("calibration", {})
            abort = _ev(doc, "probes.abort.mid_transfer")
            lat = _ev(doc, "probes.latency.prefill_scaling").get("latency.plan", {})
            print(
                f"run {i + 1:2d}: exit {rc}; noise {cal.get('jitter_ms')} ms, prefill "
                f"{cal.get('prefill_tokens_per_s')} tokens/s; latency {lat.get('samples_per_bucket')} x "
                f"{lat.get('long_tokens')} tokens; abort first cancel at try {abort.get('abort.first_cancel_at_try')} "
                f"of {abort.get('abort.tries')} ({','.join(abort.get('abort.try_outcomes') or [])}; cancel points "
                f"{abort.get('abort.cancel_points_s')} s, answers after {abort.get('abort.answered_after_s')} s); "
                f"probe prefill {doc['cost'].get('probe_prefill_tokens')} tokens, "
                f"probe wall {doc['cost'].get('probe_wall_s')} s",
                flush=True,
            )
            for f in doc["findings"]:
                if f["outcome"] not in ("passed", "info"):
                    reasons.append(f"run {i + 1}: {f['outcome']} {f['id']}: {f['summary']} (fix: {f.get('remedy')})")
                    print("   ", reasons[-1], flush=True)
    finally:
        if busy is not None:
            busy.terminate()
            busy.wait()
        sim.terminate()  # SIGTERM: sim up stops cleanly (SIGINT may be ignored under a background shell)
        try:
            sim.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(sim.pid, signal.SIGKILL)
    passed = codes[0]
    load = "the other core busy" if busy is not None else "no extra load"
    slow = f", --e2e-factor {args.e2e_factor:g}" if args.e2e_factor else ""
    print(
        f"sim up --release {args.emulate}{slow} (healthy pool, defenses exposed), kvgate check at defaults, {load}: "
        f"{passed}/{args.runs} passed; exit codes {dict(sorted(codes.items()))}"
    )
    print("non-pass reasons:", "none" if not reasons else "")
    for r in reasons:
        print("  " + r)
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
