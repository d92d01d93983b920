"""`kvgate watch` against the REAL server, on the 0.5.22 pairs of the tier (the fixture's, no new pair):
the short pool gives `kvgate_verdict 1` and a 503 from /verdict; on the healthy pair the watch's
verdict is the exit status `kvgate check` gives the same pair with the same profile, and /verdict is
200 exactly when that is 0.

The watch runs as its own process with no profile, reading the code the workers run
(`--site-packages`), with a small probe budget (the CPU server is slow); it is stopped before the
check runs, so their probes do not meet. The healthy pair must pass (0 and 200) at the defaults.

On the healthy pair, a second test restarts the real prefill with half the context as its pool while a
watch runs: the change is logged with the old and new pool and the verdict flips to 1 and 503 in the
interval of the first pass that reads the restarted worker (issue 22's done-when, as
tests/watch/test_watch_sim.py has it on the simulator).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from tests.real.conftest import RealPair, report_of
from tests.watch.helpers import Timeline, WatchProcess, on_pool, worker_pool

pytestmark = [pytest.mark.slow, pytest.mark.real]
RELEASE = "0.5.22"
GATE_S = 600.0  # a bound on one full gate of the real pair on 2 cores (a wait, not an assertion)
INTERVAL = 10
runner = CliRunner()


def test_watch_gives_the_real_pair_its_verdict(real_pair: RealPair, tmp_path: Path) -> None:
    if real_pair.spec.release != RELEASE:
        pytest.skip(f"watch is checked on the {RELEASE} pairs only (one release, as the issue asks)")
    site = real_pair.deployment.code_sources()["*"]["site_packages"]
    args = ["--router-url", real_pair.router, "--site-packages", site]  # no profile, as test_verdicts
    budget = ["--interval", "10", "--requests-per-min", "4", "--prefill-tokens-per-min", "4096"]
    w = WatchProcess(args + budget, tmp_path / "watch.log")
    try:
        w.wait(w.verdict_settled, GATE_S, "a first full gate")
        res = w.get("/verdict")
        assert res is not None
        doc = res.json()
        verdict = w.metric("kvgate_verdict")
        metrics = w.get("/metrics")
        assert metrics is not None and 'kvgate_worker_kv_pool_context_ratio{role="prefill"' in metrics.text
    finally:
        assert w.terminate() == 0
    assert "watch stopped" in w.log()
    if real_pair.spec.kind == "short":
        assert verdict == 1, doc["reason"]
        # The gate's own report, not the reason line: a router that marks the starved decode not_ready
        # while the watch runs (smg's health rules; a clean clone beside a busy core, 2026-12-05) is a
        # change the watch re-gates on, and the reason then says "re-gating" over the same failed report.
        failed = [f["id"] for f in doc["report"]["findings"] if f["outcome"] == "failed"]
        assert res.status_code == 503 and any(i.startswith("pool-context.headroom") for i in failed), doc["reason"]
        return
    out = tmp_path / "check.json"
    check = runner.invoke(app, ["check", *args, "-q", "-f", "json", "-o", str(out)])
    assert out.is_file(), check.output
    # The findings' whole summaries, not the reason line (cut short): a stall's own words must reach the
    # failure text for conftest's STALL_SIGNATURES rerun to see them.
    said = [f["summary"] for f in doc["report"]["findings"] if f["outcome"] != "passed"]
    assert verdict == check.exit_code == report_of(out)["exit_status"], (said, check.output[-2000:])
    assert (res.status_code == 200) == (check.exit_code == 0) and doc["passed"] is (check.exit_code == 0)
    assert not [f for f in doc["report"]["findings"] if f["outcome"] == "failed"], said
    assert verdict == 0 and res.status_code == 200, said  # a healthy 0.5.22 passes at the defaults


HEALTHY = "0.5.22-healthy-ids-8k-qwen2"
SMALL_POOL = 4096  # half the 8,192 context: the incident's shape, under any headroom


def _listed(router: str, url: str) -> object:
    """How the router lists `url`: (status, is_healthy), 'absent', or why /workers could not be read."""
    try:
        doc = httpx.get(router + "/workers", timeout=3).json()
    except (httpx.HTTPError, ValueError) as exc:
        return type(exc).__name__
    entry = next((w for w in doc.get("workers", []) if w.get("url") == url), None)
    return "absent" if entry is None else (entry.get("status"), entry.get("is_healthy"))


def test_a_real_prefill_restarted_with_a_smaller_pool_flips_the_watch(real_pair: RealPair, tmp_path: Path) -> None:
    """Issue 22's done-when on the real tier: with the watch running on the healthy 0.5.22 pair (verdict
    0, 200), the real prefill is stopped and started again on the same URL and ports with a pool of half
    the context. The real smg router keeps listing the URL throughout (observed and asserted) and keeps
    routing to it while it is down, so the gate in between is already blocking (asserted: no pass). The
    watch logs the change with the old and the new pool, and the first metadata pass that could read the
    restarted worker re-gates at once: the verdict is 1 and /verdict 503 on pool-context.headroom, with
    at most two passes ended between the worker answering and that verdict (the pass in flight then, and
    the first one begun after), counted from the watch's own /healthz and /verdict times, not from a
    wall-clock budget (that gate alone takes about two minutes here).

    The pair is the session's: a pair of its own would cost another start and first gate on every run,
    and restoring it here another 45 s on every run. The test leaves it altered and RealPair.restore()
    (tests/real/conftest.py) restarts both workers as planned before any later test of the pair; in the
    default order this is the pair's last test, so nothing is paid for it.
    """
    if real_pair.spec.id != HEALTHY:
        pytest.skip(f"the restart is checked on {HEALTHY} only (one real pair, as the issue asks)")
    prefill, planned = real_pair.prefill, real_pair.spec.prefill_pool
    site = real_pair.deployment.code_sources()["*"]["site_packages"]
    args = ["--router-url", real_pair.router, "--site-packages", site]
    budget = ["--interval", str(INTERVAL), "--requests-per-min", "4", "--prefill-tokens-per-min", "4096"]
    w = WatchProcess(args + budget, tmp_path / "watch.log")
    probes = {"pool": lambda: worker_pool(prefill), "listed": lambda: _listed(real_pair.router, prefill)}
    try:
        w.wait(w.verdict_settled, GATE_S, "a first full gate")
        res = w.get("/verdict")
        assert res is not None and res.status_code == 200 and w.metric("kvgate_verdict") == 0, res and res.text[:2000]
        with Timeline(w, probes) as tl:
            t_restart = time.monotonic()
            real_pair.restart_with_pool("prefill", 0, SMALL_POOL)
            t_ready = time.monotonic()

            def flipped() -> bool:
                return any(on_pool(v) and v.t > t_restart for v in tl.verdicts)

            w.wait(flipped, 2 * INTERVAL + GATE_S, "a verdict that fails on the smaller pool")
            time.sleep(1)  # one more sample of everything after the flip
        res = w.get("/verdict")
        assert res is not None
        doc = res.json()
        verdict = w.metric("kvgate_verdict")
        metrics = w.get("/metrics")
    finally:
        assert w.terminate() == 0
    log = w.log()
    t_up = tl.first("pool", lambda v: v == SMALL_POOL, after=t_restart)
    flip = next(v for v in tl.verdicts if on_pool(v) and v.t > t_restart)
    after_restart = [v for v in tl.verdicts if v.t > t_restart]
    listed = [v for t, n, v in tl.values if n == "listed" and t >= t_restart]
    figures = {
        "restart_s": round(t_ready - t_restart, 1),
        "worker_answered_after_s": t_up and round(t_up - t_restart, 1),
        "flip_after_worker_answered_s": t_up and round(flip.t - t_up, 1),
        "passes_ended_between": t_up and len(tl.passes_between(t_up, flip.t)),
        "verdicts_after_restart": [(v.exit_status, v.http, v.reason[:160]) for v in after_restart],
        "router_listing_of_prefill": listed,
        "pool_values": [v for t, n, v in tl.values if n == "pool" and t >= t_restart],
    }
    (tmp_path / "figures.json").write_text(json.dumps(figures, indent=1, default=str))
    print("restart figures:", json.dumps(figures, default=str))

    # The real router kept the URL listed while the worker was down and after it came back.
    assert listed and all(v != "absent" and not isinstance(v, str) for v in listed), figures
    # The change is logged with the old and the new pool; the gate it triggered failed on the pool.
    change = re.search(rf"change: {re.escape(prefill)}: pool {planned} -> {SMALL_POOL}\n", log)
    assert change, log[-4000:]
    after = log[change.end() :]
    assert re.match(
        r"(\[kvgate[^\]]*\] change: [^\n]*\n)*\[kvgate[^\]]*\] full gate \(change\): gate_failed \(exit 1\)", after
    ), after[:2000]
    assert "pool-context.headroom" in after.split("full gate (change)", 1)[1][:4000]
    # The flip: 1 and 503, the first pass begun after the worker answered re-gated at once.
    assert verdict == 1 and res.status_code == 503 and "pool-context.headroom" in doc["reason"], doc["reason"]
    # The sampler saw the restarted worker's pool; when it saw it is only an upper bound on when the
    # worker first answered (a starved sampler samples late), so the order against the flip is not
    # asserted: the log above shows the change read before the gate it triggered (issue 33).
    assert t_up is not None, figures
    assert len(tl.passes_between(t_up, flip.t)) <= 2, figures
    # Fail closed in between: once the watch saw the worker go, no verdict passed (the real router keeps
    # sending requests to the stopped prefill: its 502s fail the probes and the gate is 1, not 4).
    assert after_restart and all(v.exit_status != 0 and v.http == 503 for v in after_restart), figures
    assert metrics is not None and 'kvgate_full_gates_total{reason="schedule"} 0.0' in metrics.text
