"""The simulator answers to the real server: one probe set, both targets, the same outcome classes.

For each real pair the simulator is started with the same release, context, pools, page size and
server mode, and kvgate's exact-length probes (its own plan from the workers' readings: beyond the
context, at the context, at and inside the pool bound, the longest accepted prompt, a short one) go
to both routers, non-streaming and streaming, one at a time. Compared per probe: the contract class,
the status family, the finish reason's type, the streaming frame kind, which output keys the answer
carries, and whether a rejection came promptly. Where they differ the real server is right and the
simulator was changed (see kvgate/sim/__init__.py, section "What the real server showed").

A probe that hangs hangs on both: the simulator runs with the real pair's decode waiting timeout
(conftest.WAITING_TIMEOUT_S, 45 s), beyond REJECT_DEADLINE_S, so a streaming over-pool request on a short
0.5.20+ pair is `hang` on each side.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from kvgate.gates.probes.client import GenerateClient, ProbeResult
from kvgate.gates.probes.contract import classify
from kvgate.gates.probes.plan import ACCEPT, LengthProbe, limits_from_readings, plan_length_probes
from kvgate.reading.node import DECODE, PREFILL, NodeReading, NodeSpec
from kvgate.reading.target import TargetClient
from kvgate.sim.deploy import SimDeployment
from tests.real.conftest import WAITING_TIMEOUT_S, RealPair

pytestmark = [pytest.mark.slow, pytest.mark.real]
REJECT_WITHIN_S = 10.0
# An accepted prompt of up to 8k tokens on a loaded 2-core CI machine gets a minute; a rejection is
# "prompt" within REJECT_WITHIN_S, so waiting twice that tells a hang from a late rejection at a
# third of the cost (0.5.20+ with a short pool hang on every streaming over-limit probe, real and simulated).
DEADLINE_S = 60.0
REJECT_DEADLINE_S = 2 * REJECT_WITHIN_S


def _frame(res: ProbeResult) -> str:
    if not res.stream:
        return "plain"
    doc = res.document
    if doc is None:
        return "none"
    if "error" in doc:
        return "error-event"
    return "abort-chunk" if res.finish_abort is not None else "chunks"


def outcome(probe: LengthProbe, res: ProbeResult, numbers: set[int]) -> dict[str, Any]:
    """The comparable class of one answer (no values that legitimately differ, like token ids)."""
    c = classify(probe, res, limit_numbers=numbers, reject_within_s=REJECT_WITHIN_S)
    fr = res.meta.get("finish_reason")
    doc = res.document or {}
    return {
        "verdict": c.verdict.value,
        "status": None if res.status is None else f"{res.status // 100}xx",
        "finish": fr.get("type") if isinstance(fr, dict) else fr,
        "frame": _frame(res),
        "keys": sorted(k for k in ("text", "output_ids", "meta_info", "error") if k in doc),
        # Promptness is part of a rejection's contract only (an accepted prefill's time is the machine's).
        "prompt": None
        if probe.expect == ACCEPT or res.timed_out or res.status is None
        else res.elapsed_s < REJECT_WITHIN_S,
    }


def probe_set(prefill: str, decode: str) -> tuple[list[LengthProbe], set[int]]:
    with TargetClient(timeout=30.0) as client:
        readings = [client.read_node(NodeSpec(PREFILL, prefill)), client.read_node(NodeSpec(DECODE, decode))]
    assert all(isinstance(r, NodeReading) for r in readings)
    limits, problems = limits_from_readings(readings)
    assert limits is not None, problems
    probes = plan_length_probes(limits, 8)
    probes.append(LengthProbe("short", 64, ACCEPT, "none", "a short accepted prompt", 8))
    # Accepted lengths first: on real 0.5.20+ a rejected STREAMING request keeps its decode reservation
    # until SGLANG_DISAGGREGATION_WAITING_TIMEOUT (conftest.WAITING_TIMEOUT_S here), so with a small decode
    # pool every accepted request after it queues that long. The simulator starves the same way (README, "What the real
    # server showed"), but this test compares each probe's own outcome class, not the queueing.
    probes.sort(key=lambda p: p.expect != ACCEPT)
    return probes, {limits.context, limits.max_req_input_len} | set(limits.named_limits)


def run_set(router: str, probes: list[LengthProbe], numbers: set[int]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    with httpx.Client() as http:
        accepting = GenerateClient(http, router, DEADLINE_S)
        rejecting = GenerateClient(http, router, REJECT_DEADLINE_S)
        for p in probes:
            client = accepting if p.expect == ACCEPT else rejecting
            for stream in (False, True):
                # Byte-range ids are valid in both vocabularies (the simulator's bytes, the tiny model's 1,024).
                res = client.generate(p.name, [65 + (i % 26) for i in range(p.length)], p.max_new_tokens, stream=stream)
                out[f"{p.name}{'/stream' if stream else ''}"] = outcome(p, res, numbers)
    return out


def test_simulator_matches_the_real_server(real_pair: RealPair) -> None:
    spec = real_pair.spec
    probes, numbers = probe_set(real_pair.prefill, real_pair.decode)
    # The two targets share nothing, so the real set runs while the simulator starts and answers: most of
    # each set is waiting (a hang waits out its deadline on both sides), and this test is on the real
    # tier's critical path.
    with ThreadPoolExecutor(max_workers=1) as pool:
        real_run = pool.submit(run_set, real_pair.router, probes, numbers)
        with SimDeployment(
            emulate=spec.release,
            context_length=spec.context,
            prefill_pool=spec.prefill_pool,
            decode_pool=spec.decode_pool,
            page_size=1,
            skip_tokenizer_init=spec.skip_tokenizer_init,
            waiting_timeout=WAITING_TIMEOUT_S,
        ) as sim:
            sim_probes, sim_numbers = probe_set(sim.prefill_urls[0], sim.decode_urls[0])
            assert [(p.name, p.length) for p in sim_probes] == [(p.name, p.length) for p in probes]
            simulated = run_set(sim.router_url or "", probes, sim_numbers)
        real = real_run.result()
    diffs = {k: {"real": real[k], "sim": simulated.get(k)} for k in real if real[k] != simulated.get(k)}
    assert not diffs, f"{spec.id}: the simulator differs from the real server: {diffs}"
