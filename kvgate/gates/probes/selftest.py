"""The positive control (`kvgate check --self-test`): prove the probes can see a known leak.

Starts the simulator emulating SGLang 0.5.19 behind the real router, in the incident's shape scaled
down (prefill pool well below the context, decode pool large), runs the same probe gate against it
and demands that it fails with cross-request content. The operator asked for this evidence, so a
control that does not pass blocks whatever the strictness: one that ran and did not see the known
leak fails (the probes are blind), one that could not run is a blocking inconclusive (exit 3).
Never a pass (style.md, "Peers' lessons").
"""

from __future__ import annotations

import dataclasses
import time

from dataclasses import replace

from kvgate.findings import Evidence, Finding, Outcome, failed, inconclusive, passed
from kvgate.gates.base import CheckOptions
from kvgate.gates.probes.gate import ProbeGate
from kvgate.gates.probes.settings import ProbeSettings
from kvgate.progress import NullObserver, Observer

GATE = "probes"
CHECK = "selftest.positive_control"
# The incident's ratio (681,280 / 1,048,576 = 0.65) at 1/16 scale, so it runs in seconds.
SELFTEST_SHAPE = {"emulate": "0.5.19", "context_length": 65_536, "prefill_pool": 42_580, "decode_pool": 262_144,
                  "page_size": 16}


def run_self_test(settings: ProbeSettings, observer: Observer | None = None) -> list[Finding]:
    """Run the probes against a simulated leaky 0.5.19 deployment; PASSED only if they see the leak."""
    from kvgate.check import run_check  # late: kvgate.check imports the gates
    from kvgate.sim.deploy import SimDeployment

    observer = observer or NullObserver()
    node = "self-test (simulated SGLang 0.5.19 behind smg)"
    # The simulator has no /v1/tokenize; its byte-level tokenizer is recognised in "auto" mode.
    probe_settings = dataclasses.replace(settings, tokenizer="auto")
    t0 = time.monotonic()
    try:
        with observer.step("self-test: starting the simulated 0.5.19 deployment"):
            dep = SimDeployment(**SELFTEST_SHAPE).start()  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 - any start failure means nothing was controlled
        return [replace(inconclusive(GATE, CHECK, node, f"could not start the simulator: {type(exc).__name__}: {exc}"
                                     "; the positive control did not run, so no probe verdict can be trusted",
                                     remedy="install kvgate[sim,router] (torch, fastapi, uvicorn, smg==1.13.0)"),
                        blocking=True)]
    try:
        options = CheckOptions(prefill_urls=tuple(dep.prefill_urls), decode_urls=tuple(dep.decode_urls),
                               router_url=dep.router_url, timeout=30.0)
        report = run_check(options, observer=observer, gates=[ProbeGate(probe_settings)])
    finally:
        dep.stop()
    probe_findings = [f for f in report.findings if f.gate == GATE]
    leaks = [f for f in probe_findings if f.outcome == Outcome.FAILED and f.check.startswith("canary.")]
    served = [f for f in probe_findings if f.outcome == Outcome.FAILED and f.check.startswith("contract.")
              and f.summary.startswith("served_over_limit")]
    ev = [Evidence(node, "shape", SELFTEST_SHAPE),
          Evidence(node, "probe_findings", {f.test_id: f.outcome.value for f in probe_findings}),
          Evidence(node, "wall_s", round(time.monotonic() - t0, 2))]
    if leaks:
        return [passed(GATE, CHECK, node, "the probes see the known leak of emulated 0.5.19: "
                       f"{leaks[0].summary}", *ev, Evidence(node, "detected_by", [f.test_id for f in leaks + served]))]
    return [failed(GATE, CHECK, node, "the probes did NOT see the known leak of emulated 0.5.19 "
                   f"({len(served)} over-limit 200s, no foreign sentinel): they are blind, their 'no leak' cannot "
                   "be trusted", *ev, remedy="check probe settings (tokenizer, max_new_tokens, tenants)")]
