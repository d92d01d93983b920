"""`kvgate watch` against the simulator (real worker processes behind the real router), as a real process.

The simulated workers prefill at the observable speed; the full gates run with 4 canary tenants,
`--trust-version` (the simulator runs no sglang code to read) and `--deferred-release` (what an
operator of 0.5.22 states: its default is on), and the profile makes the long latency sample 2,000
tokens: at the defaults the simulator's healthy release may come out inconclusive on the latency probe
(issue 19), which would make a healthy verdict 3, not 0. The profile's `watch:` section sets the
interval and the probe budget.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from kvgate.formats.json_report import schema_text
from kvgate.sim.deploy import SimDeployment
from tests.watch.helpers import Timeline, WatchProcess, on_pool, worker_pool

pytestmark = pytest.mark.slow

#: a prefill slow enough that the watch's two latency buckets differ well beyond scheduling noise (the
#: watch does not calibrate; its buckets are fixed lengths)
OBSERVABLE_PREFILL_TOKENS_PER_S = 100_000

INTERVAL = 3
GATE_S = 240.0  # a bound on one full gate with probes on a busy machine (a wait, not an assertion)


PROFILE = f"""
name: watch-sim
probes:
  latency_long_tokens: 2000
watch:
  interval_s: {INTERVAL}
  requests_per_min: 30
  prefill_tokens_per_min: 20000
"""


def _args(router: str, tmp: Path) -> list[str]:
    profile = tmp / "watch-sim.yaml"
    profile.write_text(PROFILE)
    return [
        "--router-url",
        router,
        "--profile",
        str(profile),
        "--trust-version",
        "--deferred-release",
        "--tenants",
        "4",
    ]


def test_leaky_release_is_verdict_1_and_503(tmp_path: Path) -> None:
    with SimDeployment(
        emulate="0.5.19",
        context_length=4096,
        prefill_pool=2048,
        decode_pool=16384,
        prefill_tokens_per_s=OBSERVABLE_PREFILL_TOKENS_PER_S,
    ) as dep:
        assert dep.router_url
        w = WatchProcess(_args(dep.router_url, tmp_path), tmp_path / "watch.log")
        try:
            w.wait(w.verdict_settled, GATE_S, "a first full gate")
            assert w.metric("kvgate_verdict") == 1
            res = w.get("/verdict")
            assert res is not None and res.status_code == 503
            doc = res.json()
            assert doc["passed"] is False and doc["exit_status"] == 1 and "pool-context.headroom" in doc["reason"]
            assert doc["report"]["verdict"] == "gate_failed" and doc["report"]["command"] == "watch"
            jsonschema = pytest.importorskip("jsonschema")
            jsonschema.validate(doc["report"], json.loads(schema_text()))  # the document check -f json writes
            metrics = w.get("/metrics")
            assert metrics is not None
            assert re.search(r'kvgate_worker_kv_pool_context_ratio\{role="prefill",worker="[^"]+"\} 0\.5', metrics.text)
            assert 'kvgate_check_outcome{check="pool-context.headroom"' in metrics.text
            h = w.get("/healthz")
            assert h is not None and h.status_code == 200
        finally:
            assert w.terminate() == 0
        assert "watch stopped" in w.log()


def test_healthy_release_passes_and_a_smaller_pool_flips_it(tmp_path: Path) -> None:
    with SimDeployment(
        emulate="0.5.22",
        context_length=4096,
        prefill_pool=8192,
        decode_pool=16384,
        prefill_tokens_per_s=OBSERVABLE_PREFILL_TOKENS_PER_S,
    ) as dep:
        assert dep.router_url
        w = WatchProcess(_args(dep.router_url, tmp_path), tmp_path / "watch.log")
        try:
            w.wait(w.verdict_settled, GATE_S, "a first full gate")
            res = w.get("/verdict")
            assert res is not None
            assert res.status_code == 200, res.json()["reason"]
            assert w.metric("kvgate_verdict") == 0 and res.json()["passed"] is True
            # Scheduled probes ran and stayed within the budget, measured.
            w.wait(lambda: (w.metric("kvgate_probe_prefill_tokens_total") or 0) > 0, 60, "a scheduled probe")
            peak = w.metric("kvgate_budget_peak_window_requests")
            assert peak is not None and 0 < peak <= 30
            peak_tokens = w.metric("kvgate_budget_peak_window_prefill_tokens")
            assert peak_tokens is not None and 0 < peak_tokens <= 20000

            prefill = dep.prefill_urls[0]
            with Timeline(w, {"pool": lambda: worker_pool(prefill)}) as tl:
                t_restart = time.monotonic()
                dep.restart_worker("prefill", 0, pool=2048)
                # The worker is back with a quarter of its pool: the next pass sees it, logs the old and
                # new value, and the change-triggered gate fails on pool vs context (a gate while the
                # worker was down, if a pass caught it down, failed too: fail closed).
                change = re.compile(r"change: http://\S+: pool 8192 -> 2048")
                w.wait(lambda: change.search(w.log()), INTERVAL + 60, "the pool change in the log")
                w.wait(
                    lambda: any(on_pool(v) and v.t > t_restart for v in tl.verdicts),
                    INTERVAL + GATE_S,
                    "a verdict that fails on the smaller pool",
                )
            assert w.metric("kvgate_verdict") == 1
            # Within one interval: the first pass begun after the worker answered re-gated (at most
            # that pass and the one in flight when it answered ended before the flip; the watch's times).
            t_up = tl.first("pool", lambda v: v == 2048, after=t_restart)
            flip = next(v for v in tl.verdicts if on_pool(v) and v.t > t_restart)
            assert t_up is not None and len(tl.passes_between(t_up, flip.t)) <= 2, (tl.pass_ends, t_up, flip)
            after = w.log().split(change.search(w.log()).group(0), 1)[1]  # type: ignore[union-attr]
            assert "full gate (change): gate_failed (exit 1)" in after and "pool 2,048 < 5,120 required" in after
            metrics = w.get("/metrics")
            assert metrics is not None and 'kvgate_full_gates_total{reason="schedule"} 0.0' in metrics.text
            assert re.search(r'kvgate_worker_kv_pool_context_ratio\{role="prefill",worker="[^"]+"\} 0\.5', metrics.text)
        finally:
            assert w.terminate() == 0
