"""Issue 46's held-out shape, run after run: a REAL Qwen2 pair at context 4,096 in text mode behind the real
smg router, `kvgate check` at the defaults (no profile) N times beside one busy core.

It starts the pair of one release as the real tier starts it (tests/real/conftest.py's SHAPE_SPECS: a
healthy pool of 1.25 x the context on both sides, no TEST hook; kvgate's own launcher, device cpu), a
busy-loop process (one core), and runs the real CLI N times against the pair started once. Each run
prints its exit status, the abort probe's outcome, its tries, each try's cancel point, outcome and
victim length, the send lag, and every other finding that did not pass; then the tally. Not a timed
test: the figures are what one run saw. Hold the shared real-server lock around it:

    flock /tmp/kvgate-real.lock .venv/bin/python bench/abort_heldout.py --release 0.5.22 [--runs 5] [--no-busy]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from kvgate.cpuserver.model import TINY_MODELS, tiny_model
from kvgate.deploy.launch import PDDeployment, PDLaunchPlan

KVGATE = [sys.executable, "-c", "import sys; from kvgate.cli import main; sys.argv[0] = 'kvgate'; main()"]
BUSY = "import time\nend = time.monotonic() + {limit}\nwhile time.monotonic() < end:\n    pass\n"
CONTEXT = 4096
POOL = int(CONTEXT * 1.25)  # tests/real/conftest.py HEALTHY_FACTOR


def start_pair(release: str, logs: Path) -> PDDeployment:
    """The held-out pair: text mode, 4k, the tiny Qwen2, healthy pools (tests/real/conftest.py plan_for)."""
    plan = PDLaunchPlan(
        model_path=str(tiny_model(TINY_MODELS["qwen2"])),
        engine="sglang",
        device="cpu",
        release=release,
        context_length=CONTEXT,
        prefill_max_total_tokens=POOL,
        decode_max_total_tokens=POOL,
        skip_tokenizer_init=False,
        ready_deadline_s=600.0,
        env={"SGLANG_EXPOSE_OWN_ENV_VARS": "1"},
    )
    return PDDeployment(plan, log_dir=logs).start()


def check_once(dep: PDDeployment, out: Path) -> tuple[int, dict[str, Any], float]:
    """`kvgate check` at the defaults through the real CLI; its exit status, JSON report and wall time."""
    assert dep.router_url is not None
    cmd = [*KVGATE, "check", "--prefill-url", dep.prefill_urls[0], "--decode-url", dep.decode_urls[0]]
    cmd += ["--router-url", dep.router_url, "--site-packages", dep.code_sources()["*"]["site_packages"]]
    cmd += ["-f", "json", "-o", str(out), "-q"]
    began = time.monotonic()
    rc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1200).returncode
    wall = time.monotonic() - began
    return rc, (json.loads(out.read_text()) if out.is_file() else {"findings": []}), wall


def abort_line(report: dict[str, Any]) -> tuple[str, str]:
    """The abort finding's outcome and a line of its tries (cancel points, outcomes, lengths, lags)."""
    found = [f for f in report["findings"] if f["check"] == "abort.mid_transfer"]
    if not found:
        return "absent", "no abort.mid_transfer finding"
    f = found[0]
    ev = {e["field"]: e["value"] for e in f.get("evidence", [])}
    points = [f"{p * 1000:.0f}" for p in ev.get("abort.cancel_points_s") or []]
    plan = ev.get("abort.plan") or {}
    return f["outcome"], (
        f"tries {ev.get('abort.tries')}, first cancel at try {ev.get('abort.first_cancel_at_try')}, "
        f"cancel points ms {points}, outcomes {ev.get('abort.try_outcomes')}, "
        f"victim tokens {ev.get('abort.victim_tokens_per_try')}, send lag s {ev.get('abort.send_lag_s')}, "
        f"answered after s {ev.get('abort.answered_after_s')}, expected victim ms {plan.get('expected_victim_ms')}, "
        f"window ms {plan.get('window_ms')}, acknowledged {ev.get('abort.acknowledged')}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--release", required=True, help="0.5.19 .. 0.5.23")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-busy", action="store_true", help="do not keep a core busy")
    ap.add_argument("--busy-s", type=float, default=1800.0, help="the busy loop ends on its own after this")
    args = ap.parse_args(argv)
    codes: Counter[int] = Counter()
    outcomes: Counter[str] = Counter()
    with tempfile.TemporaryDirectory(prefix="abort-heldout-") as tmp:
        began = time.monotonic()
        dep = start_pair(args.release, Path(tmp) / "logs")
        print(f"{args.release}-healthy-text-4k-qwen2 started in {time.monotonic() - began:.0f} s", flush=True)
        busy = None if args.no_busy else subprocess.Popen([sys.executable, "-c", BUSY.format(limit=args.busy_s)])
        try:
            for i in range(args.runs):
                rc, report, wall = check_once(dep, Path(tmp) / f"check{i}.json")
                outcome, line = abort_line(report)
                codes[rc] += 1
                outcomes[outcome] += 1
                print(
                    f"run {i + 1}: exit {rc}, {wall:.0f} s, load1 {os.getloadavg()[0]:.1f}; abort {outcome}: {line}",
                    flush=True,
                )
                for f in report["findings"]:
                    if f["outcome"] not in ("passed", "info") and f["check"] != "abort.mid_transfer":
                        print(f"    {f['outcome']} {f['gate']}.{f['check']}: {f['summary'][:300]}", flush=True)
                    elif f["check"] == "abort.mid_transfer" and f["outcome"] != "passed":
                        print(f"    abort: {f['summary'][:600]}", flush=True)
        finally:
            if busy is not None:
                busy.terminate()
                busy.wait()
            dep.stop()
    load = "beside one busy core" if not args.no_busy else "no extra load"
    print(
        f"{args.release} text 4k qwen2, {args.runs} checks {load}: exits {dict(sorted(codes.items()))}, "
        f"abort outcomes {dict(outcomes)}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
