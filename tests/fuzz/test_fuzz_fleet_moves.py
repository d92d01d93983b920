"""Over fleets that change between reads (members added, removed, replaced, restarted), `check` exits 0
only when the fleet it judged is the fleet at its verdict (issue 40, class 4).

Each example is a real loopback fleet (1-2 prefills, 1-2 decodes) behind a loopback router answering
smg's `/workers`; the listing moves after its first or second read, and any worker may restart (a new
`startup_time`, on the same build or on the release that leaks) after its first or second server_info
read; the newcomer may be healthy or have a pool shorter than the context. kvgate reads the listing and
each worker again before its verdict and judges the fleet again when members moved, so the fleet at the
verdict is whatever each server served last: the report's nodes are exactly the last listing's, each
move it saw is named, and the exit code is that fleet's (0 only when it is whole and healthy).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.exitcodes import ExitStatus
from tests.conftest import PayloadServer
from tests.fuzz.conftest import CLI_EXAMPLES
from tests.hostile.test_fleet_moves import BIG, META_ONLY, Switch, listing, worker_routes

runner = CliRunner()

fleets = st.fixed_dictionaries(
    {
        "prefills": st.integers(1, 2),
        "decodes": st.integers(1, 2),
        "listing": st.sampled_from(["none", "added", "removed", "replaced"]),
        "listing_after": st.integers(1, 2),
        "restarts": st.lists(st.integers(0, 2), min_size=4, max_size=4),  # per worker: 0 none, else after N reads
        "restart_unfixed": st.booleans(),  # a restart lands on 0.5.19 (the release that leaks)
        "newcomer_short": st.booleans(),  # the newcomer's pool is shorter than the context
    }
)


@pytest.fixture
def pool(payload_server: Callable[..., PayloadServer]) -> list[PayloadServer]:
    """Six loopback servers, started once for every example (each example sets their routes afresh)."""
    return [payload_server({}) for _ in range(6)]


@settings(max_examples=CLI_EXAMPLES)
@given(fleet=fleets)
def test_exit_0_only_when_the_fleet_judged_is_the_fleet_at_the_verdict(
    fleet: dict[str, Any], pool: list[PayloadServer], count: Callable[[], None]
) -> None:
    count()
    roles = ["prefill"] * fleet["prefills"] + ["decode"] * fleet["decodes"]
    router, newcomer, *hosts = pool
    workers = []
    restarting: list[tuple[PayloadServer, int]] = []
    for i, role in enumerate(roles):
        srv = hosts[i]
        started = 1_760_000_000.0 + i
        after = fleet["restarts"][i]
        version = "0.5.19" if fleet["restart_unfixed"] else "0.5.22"
        srv.routes = (
            Switch(
                worker_routes(role, started),
                worker_routes(role, started + 500.0, version=version),
                "/server_info",
                after,
            )
            if after
            else worker_routes(role, started)
        )
        if after:
            restarting.append((srv, after))
        workers.append((srv.url, role))
    newcomer.routes = worker_routes("decode", 1_760_000_100.0, pool=4096 if fleet["newcomer_short"] else BIG)
    change = fleet["listing"]
    moved = {
        "none": workers,
        "added": [*workers, (newcomer.url, "decode")],
        "removed": workers[:-1],
        "replaced": [*workers[:-1], (newcomer.url, "decode")],
    }[change]
    router.routes = Switch(listing(*workers), listing(*moved), "/workers", fleet["listing_after"])

    res = runner.invoke(app, ["check", "--quiet", *META_ONLY, "--router-url", router.url, "--format", "json"])
    doc = json.loads(res.stdout)
    [stable] = [f for f in doc["findings"] if f"{f['gate']}.{f['check']}" == "fleet.stable"]
    # The fleet at the verdict: what each server served at its last read.
    final = moved if router.routes.seen > fleet["listing_after"] else workers
    members = {u for u, _ in final}
    assert {n["url"] for n in doc["target"]["nodes"]} == members, (final, doc["target"]["nodes"])
    assert stable["outcome"] == "passed", stable
    listing_moved = change != "none" and router.routes.seen > fleet["listing_after"]
    restarted = [srv.url for srv, after in restarting if srv.routes.seen > after and srv.url in members]
    for url in restarted:
        assert f"{url} restarted" in stable["summary"], stable["summary"]
    if listing_moved or restarted:
        assert "judged again" in stable["summary"], stable["summary"]
    else:
        assert "unchanged" in stable["summary"] and "moved" not in stable["summary"], stable["summary"]
    whole = {r for _, r in final} == {"prefill", "decode"}
    bad = (fleet["newcomer_short"] and newcomer.url in members) or (fleet["restart_unfixed"] and bool(restarted))
    expected = ExitStatus.GATE_FAILED if bad else ExitStatus.PASSED if whole else ExitStatus.INCONCLUSIVE
    assert res.exit_code == expected, (fleet, res.stdout[-3000:])
