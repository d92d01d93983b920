"""A stable fleet or no verdict (issue 40, class 4).

The router's listing was read once: a worker that registered while kvgate read the others (listed by
the router when kvgate printed PASSED) was never read. Now the listing and each worker's server_info
are read again before the verdict; any change (a member added, removed, replaced, or restarted) is a
blocking inconclusive naming it (`fleet.stable`). Real loopback routers and workers answering smg's
and SGLang's shapes; each answer switches after a chosen number of reads, so the change lands between
kvgate's first read and its second, or after both (then the fleet read is the fleet at the verdict).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.exitcodes import ExitStatus
from tests.assets import router_payloads as R
from tests.assets import sglang_payloads as P
from tests.conftest import PayloadServer, Route

runner = CliRunner()
META_ONLY = ("--no-probes", "--trust-version", "--deferred-release")
BIG = 2_040_000


class Switch(dict):  # type: ignore[type-arg]
    """Routes that answer `before` for the first `reads` GETs of `path`, then `after` (a worker that
    restarts, or a router whose listing moves, at a chosen moment of the run)."""

    def __init__(self, before: dict[str, Route], after: dict[str, Route], path: str, reads: int) -> None:
        super().__init__(before)
        self.after, self.path, self.reads = after, path, reads
        self.seen = 0
        self.lock = threading.Lock()

    def get(self, path: str, default: Any = None) -> Any:
        with self.lock:
            if path == self.path:
                self.seen += 1
                if self.seen > self.reads:
                    return self.after.get(path, default)
        return super().get(path, default)


def worker_routes(mode: str, started: float = 1_760_000_000.0) -> dict[str, Route]:
    info = P.server_info("0.5.22", mode=mode, pool=BIG)
    info["startup_time"] = started
    return {
        "/server_info": Route(info),
        "/v1/models": Route(P.v1_models()),
        "/model_info": Route(P.model_info("0.5.22", mode)),
    }


def listing(*workers: tuple[str, str]) -> dict[str, Route]:
    entries = [
        R.smg_entry(url, role, bootstrap_port=8998) if role == "prefill" else R.smg_entry(url, role)
        for url, role in workers
    ]
    return {"/workers": Route(R.smg_workers(*entries)), "/readiness": Route({"status": "ready"})}


def check(router: str) -> tuple[int, dict[str, Any], str]:
    res = runner.invoke(app, ["check", "--quiet", *META_ONLY, "--router-url", router, "--format", "json"])
    doc = json.loads(res.stdout) if res.stdout.startswith("{") else {}
    return res.exit_code, doc, res.stdout + res.stderr


def stable(doc: dict[str, Any]) -> dict[str, Any]:
    [f] = [f for f in doc["findings"] if f"{f['gate']}.{f['check']}" == "fleet.stable"]
    return f


Fleet = Callable[..., PayloadServer]


def moved_fleet(payload_server: Fleet, change: str, reads: int) -> tuple[PayloadServer, str]:
    """A healthy prefill+decode fleet whose `change` lands after the router's (or the worker's) `reads`-th
    read; returns the router and the URL the change names."""
    p = payload_server(worker_routes("prefill"))
    d = payload_server(worker_routes("decode"))
    r = payload_server({})
    base = listing((p.url, "prefill"), (d.url, "decode"))
    if change == "restarted":
        d.routes = Switch(
            worker_routes("decode"), worker_routes("decode", started=1_760_000_999.0), "/server_info", reads
        )
        r.routes = base
        return r, d.url
    newcomer = payload_server(worker_routes("decode"))
    after = {
        "added": listing((p.url, "prefill"), (d.url, "decode"), (newcomer.url, "decode")),
        "removed": listing((p.url, "prefill")),
        "replaced": listing((p.url, "prefill"), (newcomer.url, "decode")),
    }[change]
    r.routes = Switch(base, after, "/workers", reads)
    return r, {"added": newcomer.url, "removed": d.url, "replaced": newcomer.url}[change]


@pytest.mark.parametrize("change", ["added", "removed", "replaced", "restarted"])
def test_a_fleet_that_moves_during_the_check_blocks_naming_the_change(payload_server: Fleet, change: str) -> None:
    router, named = moved_fleet(payload_server, change, reads=1)
    code, doc, out = check(router.url)
    assert code == ExitStatus.INCONCLUSIVE, out
    f = stable(doc)
    assert f["outcome"] == "inconclusive" and f["blocking"]
    assert named in f["summary"]
    assert {"added": "joined", "removed": "left", "replaced": "joined", "restarted": "restarted"}[change] in f[
        "summary"
    ]


@pytest.mark.parametrize("change", ["added", "removed", "replaced", "restarted"])
def test_a_change_after_the_verdict_leaves_the_fleet_read_the_fleet_judged(payload_server: Fleet, change: str) -> None:
    router, _ = moved_fleet(payload_server, change, reads=2)  # both reads see the first fleet
    code, doc, out = check(router.url)
    assert code == ExitStatus.PASSED, out
    assert stable(doc)["outcome"] == "passed"
