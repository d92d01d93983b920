"""A worker that registers during the check is gated like the others (issue 40, class 4), against the
simulator: metadata-only simulated workers (kvgate/sim/fleet.py, real SGLang surfaces on real ports)
behind a loopback router answering smg's `/workers`, whose listing gains a decode after its first read
(so after kvgate listed the fleet and before its second look). A healthy newcomer passes and is shown
read and gated; a newcomer whose pool is shorter than the context, or on the release that leaks
(0.5.19), blocks with exit 1, named.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.exitcodes import ExitStatus
from kvgate.sim.deploy import SimDeployment
from tests.assets import router_payloads as R
from tests.assets.sim_setup import sizes
from tests.conftest import PayloadServer, Route
from tests.hostile.test_fleet_moves import META_ONLY, Switch, stable

CONTEXT, GOOD, SHORT = 4096, 8192, 2048


def smg(dep: SimDeployment, *decodes: str) -> dict[str, Route]:
    entries = [R.smg_entry(dep.prefill_urls[0], "prefill", bootstrap_port=dep.bootstrap_ports[0])]
    entries += [R.smg_entry(u, "decode") for u in decodes]
    return {"/workers": Route(R.smg_workers(*entries)), "/readiness": Route({"status": "ready"})}


@pytest.mark.parametrize("newcomer", ["healthy", "short-pool", "unfixed-release"])
def test_a_worker_that_registers_during_the_check_is_gated(
    deployment: Callable[..., SimDeployment], payload_server: Callable[..., PayloadServer], newcomer: str
) -> None:
    pools = [GOOD, SHORT if newcomer == "short-pool" else GOOD]
    dep = deployment(
        emulate="0.5.22",
        decode=2,
        **sizes(CONTEXT, GOOD, pools),
        light=True,
        router=False,
    )
    late = dep.decode_urls[1]
    if newcomer == "unfixed-release":
        old = deployment(emulate="0.5.19", **sizes(CONTEXT, GOOD, GOOD), light=True, router=False)
        late = old.decode_urls[0]
    first = dep.decode_urls[0]
    router = payload_server({})
    router.routes = Switch(smg(dep, first), smg(dep, first, late), "/workers", 1)

    res = CliRunner().invoke(app, ["check", "--quiet", *META_ONLY, "--router-url", router.url, "--format", "json"])
    doc: dict[str, Any] = json.loads(res.stdout)
    out = res.stdout + res.stderr
    assert router.routes.seen >= 2, "the listing was read once: the newcomer never showed"
    f = stable(doc)
    assert f["outcome"] == "passed" and late in f["summary"] and "joined" in f["summary"], f
    assert late in {n["url"] for n in doc["target"]["nodes"]}, out
    on_late = [g for g in doc["findings"] if late in g["node"]]
    assert any(g["id"] == "target.reachable" and g["outcome"] == "passed" for g in on_late), out
    failed = [g for g in doc["findings"] if g["outcome"] in ("failed", "error")]
    if newcomer == "healthy":
        assert res.exit_code == ExitStatus.PASSED, out
        assert {g["gate"] for g in on_late} >= {"pool-context", "defenses"}, [g["id"] for g in on_late]
    else:
        assert res.exit_code == ExitStatus.GATE_FAILED, out
        assert failed and all(late in g["node"] or late in g["summary"] for g in failed), failed
        gate = "pool-context" if newcomer == "short-pool" else "defenses"
        assert any(g["gate"] == gate for g in failed), [g["id"] for g in failed]
