"""A prefill that refuses the DP rank the router chose (real 0.5.22 behind smg --dp-aware without the
rank query: HTTP 500 "follow_bootstrap_room conflict", tests/real/test_dp_real.py's README row) fails the
contract probe it hit, and the finding's remedy names that cause and its setting, not the incident's
upgrade. Played by a proxy in front of the simulator's router, on the longest accepted prompts only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.exitcodes import ExitStatus
from kvgate.gates.probes.judging import REMEDY_DP_RANK, REMEDY_REJECT
from kvgate.upstream.admission import max_req_input_len
from kvgate.upstream.releases import DP_RANK_CONFLICT_MARK, FORCE_QUERY_PREFILL_DP_RANK
from tests.hostile.net_servers import MutatingProxy, Request, head

pytestmark = pytest.mark.slow
CONTEXT, POOL = 8192, 16_384
LIMIT = max_req_input_len(CONTEXT, POOL)


def rank_conflict(req: Request) -> bytes | None:
    """smg's 500 for a prefill that refused its rank, for the prompts just under the limit."""
    if req.method != "POST" or req.path != "/generate":
        return None
    n = len(req.json().get("input_ids") or [])
    if not LIMIT - 4 <= n < LIMIT:
        return None
    inner = f"Prefill bootstrap failed for request rank=0: {DP_RANK_CONFLICT_MARK}: dispatched to dp_rank 0"
    body = json.dumps({"error": {"type": "server_error", "code": "prefill_internal_error", "message": inner}}).encode()
    return head(500, "application/json", len(body)) + body


@pytest.fixture
def proxied(deployment: Any) -> Iterator[tuple[Any, MutatingProxy]]:
    dep = deployment(emulate="0.5.22", context_length=CONTEXT, prefill_pool=POOL, decode_pool=POOL)
    proxy = MutatingProxy(dep.router_url, rank_conflict).start()
    yield dep, proxy
    proxy.stop()


def test_a_refused_dp_rank_fails_with_its_own_remedy(proxied: tuple[Any, MutatingProxy], tmp_path: Path) -> None:
    dep, proxy = proxied
    out = tmp_path / "r.json"
    args = ["check", "--router-url", proxy.url, "-q", "--tenants", "8", "-f", "json", "-o", str(out)]
    args += ["--prefill-url", dep.prefill_urls[0], "--decode-url", dep.decode_urls[0]]
    args += ["--trust-version", "--deferred-release", "--no-strict"]
    res = CliRunner().invoke(app, args)
    assert out.is_file(), res.output
    assert proxy.mutated, "no prompt just under the limit reached the proxy: the test proved nothing"
    report = json.loads(out.read_text())
    assert res.exit_code == ExitStatus.GATE_FAILED, [(f["id"], f["outcome"]) for f in report["findings"]]
    hit = [
        f
        for f in report["findings"]
        if f["gate"] == "probes" and f["outcome"] == "failed" and f["summary"].startswith("server_error")
    ]
    assert hit, [(f["id"], f["outcome"], f["summary"][:160]) for f in report["findings"]]
    assert all(f["remedy"] == REMEDY_DP_RANK for f in hit), [f["remedy"] for f in hit]
    assert FORCE_QUERY_PREFILL_DP_RANK in REMEDY_DP_RANK and REMEDY_DP_RANK != REMEDY_REJECT
