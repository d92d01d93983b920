"""Issue 29, case 5: what `kvgate check` judges, `kvgate watch` sees change.

After a passing gate, one prefill DP rank's pool drops below the context, or `/v1/models`' context
grows past the pool. A one-shot check exits 1 naming the check that failed; the watch (a real process,
over real sockets to loopback workers and an smg-shaped router) logs the change old -> new and flips
/verdict within one interval. Once the gate has judged the new values, the change is not logged again,
and what moves on every answer of a healthy fleet (load, clocks, a rank's live memory figures) never
re-gates.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.exitcodes import ExitStatus
from tests.assets import router_payloads as R
from tests.assets import sglang_payloads as P
from tests.conftest import PayloadServer, Route
from tests.watch.helpers import Timeline, WatchProcess

runner = CliRunner()

CONTEXT = 8192
POOL = 40_960
#: seconds between the watch's passes: above the Timeline's one-second slack, so each pass is seen
INTERVAL = 2
GATE_S = 120.0  # a bound on a metadata-only gate on a busy machine (a wait, not an assertion)
#: payload servers run no sglang code and probes are off: both said explicitly, as a pipeline would
OPTS = ["--no-probes", "--trust-version", "--no-strict", "--deferred-release"]


def prefill_routes(rank_pools: list[int], context: int = CONTEXT, **volatile: Any) -> dict[str, Route]:
    info = P.server_info("0.5.22", mode="prefill", context=context, rank_pools=rank_pools)
    for state in info["internal_states"]:  # what moves on every answer of a live worker
        state["last_gen_throughput"] = volatile.get("throughput", 0.0)
        state["memory_usage"]["kvcache"] = volatile.get("kvcache", 40.2)
    info["startup_time"] = volatile.get("startup_time", 1_790_000_000.0)
    return {
        "/server_info": Route(info),
        "/v1/models": Route(P.v1_models(context)),
        "/model_info": Route(P.model_info("0.5.22", "prefill")),
    }


def fleet(make: Callable[..., PayloadServer]) -> tuple[PayloadServer, PayloadServer, PayloadServer]:
    """A DP-2 prefill (listed once per rank, smg's DP-aware shape), a decode, and the router listing them."""
    prefill = make(prefill_routes([POOL, POOL]))
    decode = make(
        {
            "/server_info": Route(P.server_info("0.5.22", mode="decode", context=CONTEXT, pool=POOL)),
            "/v1/models": Route(P.v1_models(CONTEXT)),
            "/model_info": Route(P.model_info("0.5.22", "decode")),
        }
    )
    entries = [
        R.smg_entry(f"{prefill.url}@{i}", "prefill", bootstrap_port=8998, dp_base_url=prefill.url, dp_rank=i, dp_size=2)
        for i in range(2)
    ]
    listing = R.smg_workers(*entries, R.smg_entry(decode.url, "decode"))
    router = make({"/workers": Route(listing), "/readiness": Route({"status": "ready"})})
    return prefill, decode, router


def check(router: str) -> tuple[int, dict[str, Any]]:
    res = runner.invoke(app, ["check", "--router-url", router, *OPTS, "--quiet", "--format", "json"])
    return res.exit_code, json.loads(res.stdout) if res.stdout.startswith("{") else {}


def failed_checks(report: dict[str, Any]) -> list[str]:
    return [f"{f['gate']}.{f['check']}" for f in report["findings"] if f["outcome"] == "failed"]


def gated_on(check_id: str) -> Callable[[Any], bool]:
    return lambda v: v.exit_status == 1 and v.http == 503 and check_id in v.reason


@pytest.mark.parametrize(
    ("change", "mutated", "check_id", "logged"),
    [
        ("rank-pool", lambda: prefill_routes([POOL, 8000]), "pool-context.headroom-dp1", r"dp1 pool 40960 -> 8000"),
        (
            "served-context",
            lambda: prefill_routes([POOL, POOL], context=65536),
            "pool-context.headroom-dp1",
            r"context 8192 -> 65536",
        ),
    ],
)
def test_a_change_check_fails_on_flips_the_watch_within_one_interval(
    payload_server: Callable[..., PayloadServer],
    tmp_path: Path,
    change: str,
    mutated: Callable[[], dict[str, Route]],
    check_id: str,
    logged: str,
) -> None:
    prefill, _, router = fleet(payload_server)
    code, report = check(router.url)
    assert code == ExitStatus.PASSED, [f for f in report.get("findings", []) if f["outcome"] != "passed"]

    w = WatchProcess(["--router-url", router.url, *OPTS, "--interval", str(INTERVAL)], tmp_path / "watch.log")
    try:
        w.wait(lambda: (res := w.get("/verdict")) is not None and res.status_code == 200, GATE_S, "a passing gate")
        with Timeline(w) as tl:
            # What a live worker moves on every answer is no change: several passes, no re-gate (its
            # startup time is not among them: a restart is a new worker, tests/hostile/test_watch_restart.py).
            for n in range(1, 4):
                prefill.routes = prefill_routes([POOL, POOL], throughput=17.0 * n, kvcache=n)
                w.wait(lambda n=n: len(tl.pass_ends) >= 2 * n, INTERVAL * 10 + GATE_S, "passes over a busy fleet")
            assert "change:" not in w.log(), w.log()
            assert len(tl.verdicts) == 1, tl.verdicts  # the start's gate only
            t_changed = time.monotonic()
            prefill.routes = mutated()
            w.wait(
                lambda: any(gated_on(check_id)(v) and v.t > t_changed for v in tl.verdicts),
                INTERVAL * 10 + GATE_S,
                f"a verdict that fails on {check_id}",
            )
            flip = next(v for v in tl.verdicts if gated_on(check_id)(v) and v.t > t_changed)
            # Within one interval: at most the pass in flight when the worker changed and the next one
            # ended before the verdict flipped (the watch's own times, seen through /healthz).
            assert len(tl.passes_between(t_changed, flip.t)) <= 2, (tl.pass_ends, t_changed, flip)
            # The gate judged the new values: later passes log nothing more.
            w.wait(lambda: len(tl.passes_between(flip.t, time.monotonic())) >= 2, INTERVAL * 10, "two more passes")
        log = w.log()
        lines = re.findall(rf"change: {re.escape(prefill.url)}: {logged}", log)
        assert len(lines) == 1, log
        after = log.split(lines[0], 1)[1]
        assert "full gate (change): gate_failed (exit 1)" in after and check_id in after, after
    finally:
        assert w.terminate() == 0
    code, report = check(router.url)
    assert code == ExitStatus.GATE_FAILED and check_id in failed_checks(report), failed_checks(report)
