"""A stable fleet or no verdict (issue 40, class 4).

The router's listing was read once: a worker that registered while kvgate read the others (listed by
the router when kvgate printed PASSED) was never read. Now the listing and each worker (server_info,
/v1/models, /model_info) are read again before the verdict. Members that moved (added, removed,
replaced, restarted) are judged again on the fleet as it then stands, and looked at again: a bad
newcomer blocks, a healthy one passes and is shown gated; a fleet still moving after the re-gates, a
worker whose served state changed within one process, or one that cannot be read again is a blocking
inconclusive naming it (`fleet.stable`). Real loopback routers and workers answering smg's and SGLang's
shapes; each answer switches after a chosen number of reads, so the change lands between kvgate's
first read and its second, or after both (then the fleet read is the fleet at the verdict).
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


def worker_routes(
    mode: str,
    started: float = 1_760_000_000.0,
    *,
    version: str = "0.5.22",
    pool: int = BIG,
    served: str = "glm-5.3",
    weights: str = "zai-org/GLM-5.3",
) -> dict[str, Route]:
    info = P.server_info(version, mode=mode, pool=pool)
    info["startup_time"] = started
    info["model_path"] = weights
    models = P.v1_models()
    models["data"][0]["id"] = served
    return {
        "/server_info": Route(info),
        "/v1/models": Route(models),
        "/model_info": Route(P.model_info(version, mode)),
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
    if change == "removed":  # a second decode leaves: the fleet at the verdict is still a whole PD pair
        base = listing((p.url, "prefill"), (d.url, "decode"), (newcomer.url, "decode"))
    after = {
        "added": listing((p.url, "prefill"), (d.url, "decode"), (newcomer.url, "decode")),
        "removed": listing((p.url, "prefill"), (d.url, "decode")),
        "replaced": listing((p.url, "prefill"), (newcomer.url, "decode")),
    }[change]
    r.routes = Switch(base, after, "/workers", reads)
    return r, newcomer.url


def nodes(doc: dict[str, Any]) -> set[str]:
    return {n["url"] for n in doc["target"]["nodes"]}


def reached(doc: dict[str, Any], url: str) -> dict[str, Any]:
    [f] = [f for f in doc["findings"] if f["id"] == "target.reachable" and url in f["node"]]
    return f


@pytest.mark.parametrize("change", ["added", "removed", "replaced", "restarted"])
def test_a_fleet_that_moves_during_the_check_is_judged_again_as_it_stands(payload_server: Fleet, change: str) -> None:
    router, named = moved_fleet(payload_server, change, reads=1)
    code, doc, out = check(router.url)
    assert code == ExitStatus.PASSED, out
    f = stable(doc)
    assert f["outcome"] == "passed", f
    assert named in f["summary"] and "judged again 1 time(s)" in f["summary"], f["summary"]
    assert {"added": "joined", "removed": "left", "replaced": "joined", "restarted": "restarted"}[change] in f[
        "summary"
    ]
    # The verdict's fleet is the fleet as it stood: a newcomer read and gated, a leaver no longer judged.
    if change in ("added", "replaced"):
        assert named in nodes(doc) and reached(doc, named)["outcome"] == "passed"
        assert any(g["gate"] == "pool-context" and named in g["node"] for g in doc["findings"]), out
    if change == "removed":
        assert named not in nodes(doc) and len(nodes(doc)) == 2
        assert not [f for f in doc["findings"] if named in f["node"]]  # judged no more: not in the fleet now
    assert len([f for f in doc["findings"] if f["id"] == "fleet.stable"]) == 1


def test_a_bad_newcomer_blocks(payload_server: Fleet) -> None:
    """A decode with a pool shorter than the context registers after the first read: it is gated, and fails."""
    p = payload_server(worker_routes("prefill"))
    d = payload_server(worker_routes("decode"))
    short = payload_server(worker_routes("decode", pool=4096))
    r = payload_server({})
    r.routes = Switch(
        listing((p.url, "prefill"), (d.url, "decode")),
        listing((p.url, "prefill"), (d.url, "decode"), (short.url, "decode")),
        "/workers",
        1,
    )
    code, doc, out = check(r.url)
    assert code == ExitStatus.GATE_FAILED, out
    failed = [f for f in doc["findings"] if f["outcome"] == "failed"]
    assert failed and all(short.url in f["node"] or short.url in f["summary"] for f in failed), failed
    assert short.url in stable(doc)["summary"] and short.url in nodes(doc)


def test_a_restart_onto_an_unfixed_release_blocks(payload_server: Fleet) -> None:
    """The decode restarts on 0.5.19 (the release that leaks) between the first read and the second look."""
    p = payload_server(worker_routes("prefill"))
    d = payload_server({})
    d.routes = Switch(
        worker_routes("decode"), worker_routes("decode", 1_760_000_999.0, version="0.5.19"), "/server_info", 1
    )
    r = payload_server(listing((p.url, "prefill"), (d.url, "decode")))
    code, doc, out = check(r.url)
    assert code == ExitStatus.GATE_FAILED, out
    failed = [f for f in doc["findings"] if f["outcome"] == "failed"]
    assert any(f["gate"] == "defenses" and d.url in f["node"] for f in failed), failed
    assert "restarted" in stable(doc)["summary"] and d.url in stable(doc)["summary"]


class Growing(dict):  # type: ignore[type-arg]
    """A router whose listing gains one more worker at every read: a fleet that never holds still."""

    def __init__(self, first: list[tuple[str, str]], more: list[str]) -> None:
        super().__init__()
        self.first, self.more, self.seen = first, more, 0

    def get(self, path: str, default: Any = None) -> Any:
        if path == "/readiness":
            return Route({"status": "ready"})
        if path != "/workers":
            return default
        self.seen += 1
        joined = [(u, "decode") for u in self.more[: self.seen - 1]]
        return listing(*self.first, *joined)["/workers"]


def test_a_fleet_that_keeps_moving_is_inconclusive(payload_server: Fleet) -> None:
    from kvgate.pipeline.stability import MAX_REGATES

    p = payload_server(worker_routes("prefill"))
    d = payload_server(worker_routes("decode"))
    more = [payload_server(worker_routes("decode")).url for _ in range(MAX_REGATES + 2)]
    r = payload_server({})
    r.routes = Growing([(p.url, "prefill"), (d.url, "decode")], more)
    code, doc, out = check(r.url)
    assert code == ExitStatus.INCONCLUSIVE, out
    f = stable(doc)
    assert f["outcome"] == "inconclusive" and f["blocking"], f
    assert f"still moving after {MAX_REGATES} re-gate(s)" in f["summary"]
    assert more[MAX_REGATES] in f["summary"] and "joined" in f["summary"]
    assert r.routes.seen == MAX_REGATES + 2  # the first read, then one look per re-gate and the last


@pytest.mark.parametrize(
    "path,after,named",
    [
        ("/server_info", {"weights": "zai-org/GLM-5.3-other"}, "model_path"),
        ("/v1/models", {"served": "glm-5.3-canary"}, "served_model"),
    ],
    ids=["weights-path", "served-model"],
)
def test_a_worker_that_changes_what_it_serves_without_restarting_is_inconclusive(
    payload_server: Fleet, path: str, after: dict[str, Any], named: str
) -> None:
    """Same process (same startup_time), other weights or another served model between the first read
    and the second look: an in-place update in progress, not a new member to judge."""
    p = payload_server(worker_routes("prefill"))
    d = payload_server({})
    d.routes = Switch(worker_routes("decode"), worker_routes("decode", **after), path, 1)
    r = payload_server(listing((p.url, "prefill"), (d.url, "decode")))
    code, doc, out = check(r.url)
    assert code == ExitStatus.INCONCLUSIVE, out
    f = stable(doc)
    assert f["outcome"] == "inconclusive" and f["blocking"], f
    assert d.url in f["summary"] and "without restarting" in f["summary"] and named in f["summary"], f["summary"]
    assert next(iter(after.values())) in f["summary"]


def test_a_worker_that_stops_answering_before_the_verdict_is_inconclusive(payload_server: Fleet) -> None:
    p = payload_server(worker_routes("prefill"))
    d = payload_server({})
    gone = {k: Route({"detail": "down"}, status=503) for k in worker_routes("decode")}
    d.routes = Switch(worker_routes("decode"), gone, "/server_info", 1)
    r = payload_server(listing((p.url, "prefill"), (d.url, "decode")))
    code, doc, out = check(r.url)
    assert code == ExitStatus.INCONCLUSIVE, out
    f = stable(doc)
    assert f["blocking"] and d.url in f["summary"] and "could not be read again" in f["summary"], f


@pytest.mark.parametrize("change", ["added", "removed", "replaced", "restarted"])
def test_a_change_after_the_verdict_leaves_the_fleet_read_the_fleet_judged(payload_server: Fleet, change: str) -> None:
    router, _ = moved_fleet(payload_server, change, reads=2)  # both reads see the first fleet
    code, doc, out = check(router.url)
    assert code == ExitStatus.PASSED, out
    assert stable(doc)["outcome"] == "passed"
