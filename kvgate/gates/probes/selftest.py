"""The positive control's verdict (`kvgate check --self-test`): did the probes see a known leak?

The control is composed by the pipeline (`kvgate.pipeline.check.run_self_test`): it starts the simulator
emulating SGLang 0.5.19 behind the real router, in the incident's shape scaled down (prefill pool well
below the context, decode pool large), and runs the probe gate against it. This module holds only what
the gate knows: the shape, the settings the control runs with, and the verdict on what it saw.

The operator asked for this evidence, so a control that does not pass blocks whatever the strictness:
one that ran and did not see the known leak fails (the probes are blind), one that could not run is a
blocking inconclusive (exit 3). Never a pass (style.md, "Peers' lessons").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from kvgate.gates.probes.settings import ProbeSettings
from kvgate.results.findings import Evidence, Finding, Outcome, failed, inconclusive, passed

GATE = "probes"
CHECK = "selftest.positive_control"
NODE = "self-test (simulated SGLang 0.5.19 behind smg)"
# The incident's ratio (681,280 / 1,048,576 = 0.65) at 1/16 scale, so it runs in seconds.
SELFTEST_SHAPE: dict[str, Any] = {
    "emulate": "0.5.19",
    "context_length": 65_536,
    "prefill_pool": 42_580,
    "decode_pool": 262_144,
    "page_size": 16,
}


#: runs of the control before it calls the probes blind: a run under a load spike can miss the leak
#: (its over-limit probes unanswered), and a second look cannot turn blindness into a pass, since a
#: pass needs a foreign sentinel actually seen
ATTEMPTS = 2


def control_settings(settings: ProbeSettings) -> ProbeSettings:
    """The operator's probe settings as the control runs them.

    The simulator has no /v1/tokenize; its byte-level tokenizer is recognised in "auto" mode.
    """
    return dataclasses.replace(settings, tokenizer="auto")


def not_started(exc: BaseException) -> list[Finding]:
    """The control could not start: nothing was controlled, so it blocks (inconclusive, blocking)."""
    return [
        dataclasses.replace(
            inconclusive(
                GATE,
                CHECK,
                NODE,
                f"could not start the simulator: {type(exc).__name__}: {exc}"
                "; the positive control did not run, so no probe verdict can be trusted",
                remedy="install kvgate[sim,router] (numpy, fastapi, uvicorn, smg==1.13.0)",
            ),
            blocking=True,
        )
    ]


def judge(findings: Sequence[Finding], wall_s: float, attempt: int = 1, earlier: str | None = None) -> list[Finding]:
    """The verdict on the probe findings of control run `attempt`: PASSED only if they saw the leak.

    `earlier`: what the run before this one concluded, if there was one (said in this verdict)."""
    probe_findings = [f for f in findings if f.gate == GATE]
    leaks = [f for f in probe_findings if f.outcome == Outcome.FAILED and f.check.startswith("canary.")]
    served = [
        f
        for f in probe_findings
        if f.outcome == Outcome.FAILED and f.check.startswith("contract.") and f.summary.startswith("served_over_limit")
    ]
    ev = [
        Evidence(NODE, "shape", SELFTEST_SHAPE),
        Evidence(NODE, "attempt", f"{attempt} of {ATTEMPTS}"),
        Evidence(NODE, "probe_findings", {f.test_id: f.outcome.value for f in probe_findings}),
        # what the over-limit and canary probes got, for whoever must tell blindness from a bad moment
        Evidence(
            NODE,
            "what_the_leak_probes_got",
            {
                f.test_id: f"{f.outcome.value}: {f.summary[:240]}"
                for f in probe_findings
                if f.check.startswith(("contract.", "canary."))
            },
        ),
        Evidence(NODE, "wall_s", wall_s),
    ]
    before = f" (run {attempt}; run {attempt - 1} saw nothing: {earlier[:160]})" if earlier else ""
    if leaks:
        return [
            passed(
                GATE,
                CHECK,
                NODE,
                f"the probes see the known leak of emulated 0.5.19{before}: {leaks[0].summary}",
                *ev,
                Evidence(NODE, "detected_by", [f.test_id for f in leaks + served]),
            )
        ]
    return [
        failed(
            GATE,
            CHECK,
            NODE,
            "the probes did NOT see the known leak of emulated 0.5.19 "
            f"({len(served)} over-limit 200s, no foreign sentinel; run {attempt} of {ATTEMPTS}): they are blind, "
            "their 'no leak' cannot be trusted",
            *ev,
            remedy="check probe settings (tokenizer, max_new_tokens, tenants)",
        )
    ]
