"""`kvgate watch` against the REAL server: on the 0.5.22 pairs of the tier (the fixture's, no new pair),
the short pool gives `kvgate_verdict 1` and a 503 from /verdict, the healthy one 0 and 200.

The watch runs as its own process with the `cpu-tiny` profile and reads the code the workers run
(`--site-packages`), as test_verdicts.py's check does; its probe budget is small (the CPU server is
slow). Restarting a real worker with a smaller pool is not done here: a real worker takes a minute to
start, and the tier keeps one pair per release kind; the simulator's test covers the flip.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.real.conftest import RealPair
from tests.watch.helpers import WatchProcess

pytestmark = [pytest.mark.slow, pytest.mark.real]
RELEASE = "0.5.22"
GATE_S = 600.0  # a bound on one full gate of the real pair on 2 cores (a wait, not an assertion)


def test_watch_gives_the_real_pair_its_verdict(real_pair: RealPair, tmp_path: Path) -> None:
    if real_pair.spec.release != RELEASE:
        pytest.skip(f"watch is checked on the {RELEASE} pairs only (one release pair, as the issue asks)")
    args = [
        "--router-url",
        real_pair.router,
        "--profile",
        "cpu-tiny",
        "--site-packages",
        real_pair.deployment.code_sources()["*"]["site_packages"],
        "--interval",
        "10",
        "--requests-per-min",
        "4",
        "--prefill-tokens-per-min",
        "4096",
    ]
    w = WatchProcess(args, tmp_path / "watch.log")
    try:
        w.wait(w.verdict_settled, GATE_S, "a first full gate")
        res = w.get("/verdict")
        assert res is not None
        doc = res.json()
        if real_pair.spec.kind == "short":
            assert w.metric("kvgate_verdict") == 1, doc["reason"]
            assert res.status_code == 503 and "pool-context.headroom" in doc["reason"]
        else:
            assert w.metric("kvgate_verdict") == 0, doc["reason"]
            assert res.status_code == 200 and doc["passed"] is True
        metrics = w.get("/metrics")
        assert metrics is not None and 'kvgate_worker_kv_pool_context_ratio{role="prefill"' in metrics.text
    finally:
        assert w.terminate() == 0
    assert "watch stopped" in w.log()
