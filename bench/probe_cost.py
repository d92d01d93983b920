"""Prefill-token cost of the probe gates as a ratio of one context-length prefill (goal <= 1.2).

Measured on simulator runs behind the real router (smg): the worst case is a healthy deployment,
where nothing stops the probes early and the at-limit plant is the longest prompt the target accepts
(SGLang 0.5.22 with a 2.04M-token pool, incident.md section 1's fix). The incident's leaky shape
(0.5.19, pool 681,280) is printed too: there the probes stop at the first confirmed leak.

Prefill tokens: every accepted-length prompt answered with 200, or aborted in flight, counted in full
(an upper bound); rejections and hangs count nothing; over-limit prompts a leaky target "served"
are reported apart (it does not prefill them).

    .venv/bin/python bench/probe_cost.py [--context 1048576] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from kvgate.check import run_check
from kvgate.gates.base import CheckOptions
from kvgate.gates.probes import ProbeGate, ProbeSettings
from kvgate.sim.deploy import SimDeployment

GOAL = 1.2


def measure(emulate: str, context: int, prefill_pool: int, decode_pool: int) -> dict[str, object]:
    """One probe run with default settings; its cost section plus the verdict."""
    t0 = time.monotonic()
    with SimDeployment(
        emulate=emulate, context_length=context, prefill_pool=prefill_pool, decode_pool=decode_pool, page_size=64
    ) as dep:
        options = CheckOptions(
            prefill_urls=tuple(dep.prefill_urls),
            decode_urls=tuple(dep.decode_urls),
            router_url=dep.router_url,
            timeout=30.0,
        )
        report = run_check(options, gates=[ProbeGate(ProbeSettings())])
    failed = sorted(f.test_id for f in report.findings if f.outcome.value == "failed")
    return {
        "emulate": emulate,
        "context": context,
        "prefill_pool": prefill_pool,
        **report.cost,
        "failed_checks": failed,
        "total_wall_s": round(time.monotonic() - t0, 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=1_048_576)
    ap.add_argument("--json", action="store_true", help="one JSON line per run instead of text")
    args = ap.parse_args(argv)
    c = args.context
    runs = [
        ("healthy (worst case)", measure("0.5.22", c, int(c * 1.95), int(c * 2.1))),
        ("incident shape (early stop)", measure("0.5.19", c, int(c * 0.65), int(c * 4.0))),
    ]
    worst = runs[0][1]["probe_prefill_ratio_of_context"]
    for label, r in runs:
        if args.json:
            print(json.dumps({"run": label, **r}))
        else:
            print(
                f"{label}: emulate {r['emulate']}, context {r['context']:,}, prefill pool {r['prefill_pool']:,}: "
                f"prefill tokens {r['probe_prefill_tokens']:,} = {r['probe_prefill_ratio_of_context']:.3f} x one "
                f"context-length prefill; tokens sent {r['probe_tokens_sent']:,}; {r['probe_requests']} requests; "
                f"probe wall {r['probe_wall_s']} s; failed checks {r['failed_checks'] or 'none'}"
            )
    ok = isinstance(worst, (int, float)) and worst <= GOAL
    print(f"probe prefill cost ratio (worst case): {worst:.3f} (goal <= {GOAL}): {'OK' if ok else 'OVER GOAL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
