"""Over fleets that change between reads (members added, removed, replaced, restarted), `check` exits 0
only when the fleet it read is the fleet at its verdict (issue 40, class 4).

Each example is a real loopback fleet (1-2 prefills, 1-2 decodes) behind a loopback router answering
smg's `/workers`; the listing moves after its first or second read, and any worker may restart (a new
`startup_time`) after its first or second server_info read. kvgate reads each twice (the first read,
then the second look before the verdict), so a change after the first read is one the verdict must
not pass over, and a change after the second is the fleet's next state, not the one judged.
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
from tests.hostile.test_fleet_moves import META_ONLY, Switch, listing, worker_routes

runner = CliRunner()

fleets = st.fixed_dictionaries(
    {
        "prefills": st.integers(1, 2),
        "decodes": st.integers(1, 2),
        "listing": st.sampled_from(["none", "added", "removed", "replaced"]),
        "listing_after": st.integers(1, 2),
        "restarts": st.lists(st.integers(0, 2), min_size=4, max_size=4),  # per worker: 0 none, else after N reads
    }
)


@pytest.fixture
def pool(payload_server: Callable[..., PayloadServer]) -> list[PayloadServer]:
    """Seven loopback servers, started once for every example (each example sets their routes afresh)."""
    return [payload_server({}) for _ in range(7)]


@settings(max_examples=CLI_EXAMPLES)
@given(fleet=fleets)
def test_exit_0_only_when_the_fleet_read_is_the_fleet_at_the_verdict(
    fleet: dict[str, Any], pool: list[PayloadServer], count: Callable[[], None]
) -> None:
    count()
    roles = ["prefill"] * fleet["prefills"] + ["decode"] * fleet["decodes"]
    router, newcomer, *hosts = pool
    workers = []
    for i, role in enumerate(roles):
        srv = hosts[i]
        started = 1_760_000_000.0 + i
        after = fleet["restarts"][i]
        srv.routes = (
            Switch(worker_routes(role, started), worker_routes(role, started + 500.0), "/server_info", after)
            if after
            else worker_routes(role, started)
        )
        workers.append((srv.url, role))
    newcomer.routes = worker_routes("decode", 1_760_000_100.0)
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
    seen_moving = (change != "none" and fleet["listing_after"] == 1) or any(
        r == 1 for r in fleet["restarts"][: len(roles)]
    )
    [stable] = [f for f in doc["findings"] if f"{f['gate']}.{f['check']}" == "fleet.stable"]
    if seen_moving:
        assert res.exit_code != ExitStatus.PASSED, res.stdout
        assert stable["outcome"] == "inconclusive" and stable["blocking"], stable
    else:
        assert res.exit_code == ExitStatus.PASSED, res.stdout
        assert stable["outcome"] == "passed", stable
