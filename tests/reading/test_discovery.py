"""Listing a fleet from its router: smg /workers, the older /list_workers, and routers that fail."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.errors import TransportError
from kvgate.exitcodes import ExitStatus
from kvgate.reading.discovery import normalize_url, parse_list_workers, parse_workers
from tests.assets import router_payloads as R
from tests.assets import sglang_payloads as P
from tests.conftest import PayloadServer, Route

runner = CliRunner()
BIG = 2_040_000


def worker(make: Callable[..., PayloadServer], mode: str, pool: int = BIG, **kw: Any) -> PayloadServer:
    return make(
        {
            "/server_info": Route(P.server_info("0.5.22", mode=mode, pool=pool, **kw)),
            "/v1/models": Route(P.v1_models()),
            "/model_info": Route(P.model_info("0.5.22", mode)),
        }
    )


def router(make: Callable[..., PayloadServer], path: str, doc: Any = None, raw: bytes | None = None) -> PayloadServer:
    return make({path: Route(doc, raw=raw), "/readiness": Route({"status": "ready"})})


def check(*args: str) -> Any:
    # Payload servers run no sglang code and --no-probes is an explicit opt-out: both said explicitly.
    return runner.invoke(app, ["check", "--quiet", "--no-probes", "--trust-version", "--no-strict", *args])


def findings(res: Any) -> list[dict[str, Any]]:
    return list(json.loads(res.stdout)["findings"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_parse_smg_dp_aware_entries_group_by_worker() -> None:
    doc = R.smg_workers(
        R.smg_entry(
            "http://p0:30000@0", "prefill", bootstrap_port=8998, dp_base_url="http://p0:30000", dp_rank=0, dp_size=2
        ),
        R.smg_entry(
            "http://p0:30000@1", "prefill", bootstrap_port=8998, dp_base_url="http://p0:30000", dp_rank=1, dp_size=2
        ),
        R.smg_entry("http://d0:30001@0", "decode"),  # an @rank URL without the dp_* keys
    )
    listing = parse_workers("http://router", doc)
    groups = listing.by_base_url()
    assert list(groups) == ["http://p0:30000", "http://d0:30001"]
    assert [w.dp_rank for w in groups["http://p0:30000"]] == [0, 1]
    assert groups["http://d0:30001"][0].dp_rank == 0 and groups["http://p0:30000"][0].dp_size == 2


@pytest.mark.parametrize(
    "doc",
    [[], {"urls": ["http://x"]}, {"workers": {"a": 1}}, {"workers": [{"id": 1}]}, {"workers": [{"url": "ftp://x"}]}],
)
def test_parse_smg_garbage_is_a_transport_error(doc: Any) -> None:
    with pytest.raises(TransportError, match="/workers"):
        parse_workers("http://router", doc)


@pytest.mark.parametrize("doc", [{"workers": []}, {"urls": "http://x"}, {"urls": [1]}, None])
def test_parse_list_workers_garbage_is_a_transport_error(doc: Any) -> None:
    with pytest.raises(TransportError, match="/list_workers"):
        parse_list_workers("http://router", doc)


def test_normalize_url_gives_one_spelling() -> None:
    assert normalize_url("HTTP://Prefill-0:80/") == "http://prefill-0"
    assert normalize_url("https://p:443") == "https://p"
    assert normalize_url("http://p:30000") == "http://p:30000"


def test_list_workers_router_roles_come_from_each_worker(payload_server: Callable[..., PayloadServer]) -> None:
    p, d = worker(payload_server, "prefill"), worker(payload_server, "decode")
    r = router(payload_server, "/list_workers", R.list_workers(d.url, p.url))
    res = check("--router-url", r.url, "--format", "json")
    assert res.exit_code == ExitStatus.PASSED, res.output
    nodes = {n["url"]: n["role"] for n in json.loads(res.stdout)["target"]["nodes"]}
    assert nodes == {p.url: "prefill", d.url: "decode"}
    listed = [f for f in findings(res) if f["check"] == "router-list"]
    assert listed[0]["outcome"] == "passed" and "/list_workers" in listed[0]["summary"]


def test_list_workers_worker_without_a_role_fails_closed(payload_server: Callable[..., PayloadServer]) -> None:
    p = worker(payload_server, "prefill")
    odd = worker(payload_server, "prefill", drop=("disaggregation_mode",), drop_in_states=("disaggregation_mode",))
    r = router(payload_server, "/list_workers", R.list_workers(p.url, odd.url))
    res = check("--router-url", r.url, "--format", "json")
    assert res.exit_code == ExitStatus.GATE_FAILED, res.output
    bad = [f for f in findings(res) if f["outcome"] == "failed"]
    assert [f["check"] for f in bad] == ["router-role"] and odd.url in bad[0]["node"]


@pytest.mark.parametrize(
    "status,healthy,outcome,code",
    [
        ("failed", False, "failed", ExitStatus.GATE_FAILED),
        ("not_ready", False, "failed", ExitStatus.GATE_FAILED),
        ("draining", True, "inconclusive", ExitStatus.INCONCLUSIVE),
        ("pending", True, "inconclusive", ExitStatus.INCONCLUSIVE),
    ],
)
def test_router_state_of_a_worker_is_a_finding(
    payload_server: Callable[..., PayloadServer], status: str, healthy: bool, outcome: str, code: ExitStatus
) -> None:
    p, d, d2 = worker(payload_server, "prefill"), worker(payload_server, "decode"), worker(payload_server, "decode")
    r = router(
        payload_server,
        "/workers",
        R.smg_workers(
            R.smg_entry(p.url, "prefill", bootstrap_port=8998),
            R.smg_entry(d.url, "decode"),
            R.smg_entry(d2.url, "decode", status=status, healthy=healthy),
        ),
    )
    res = check("--router-url", r.url, "--format", "json", "--strict", "--deferred-release")
    states = [f for f in findings(res) if f["check"] == "router-status" and f["outcome"] != "passed"]
    assert len(states) == 1 and states[0]["outcome"] == outcome and d2.url in states[0]["node"]
    assert status in states[0]["summary"]
    assert res.exit_code == code, res.output
    assert d2.url in {n["url"] for n in json.loads(res.stdout)["target"]["nodes"]}  # still read and gated


def test_router_role_differs_from_the_worker_role(payload_server: Callable[..., PayloadServer]) -> None:
    p, d = worker(payload_server, "prefill"), worker(payload_server, "decode")
    r = router(
        payload_server,
        "/workers",
        R.smg_workers(
            R.smg_entry(p.url, "prefill", bootstrap_port=8998), R.smg_entry(d.url, "prefill", bootstrap_port=8998)
        ),
    )
    res = check("--router-url", r.url, "--decode-url", d.url, "--prefill-url", p.url, "--format", "json")
    assert res.exit_code == ExitStatus.GATE_FAILED
    bad = [f for f in findings(res) if f["outcome"] == "failed"]
    assert [(f["check"], d.url in f["node"]) for f in bad] == [("router-role", True)]
    assert "routes it as prefill" in bad[0]["summary"] and "'decode'" in bad[0]["summary"]


def test_unreachable_router_exits_4_and_writes_the_report(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    out = tmp_path / "r.json"
    res = check("--router-url", url, "-f", "json", "-o", str(out))
    assert res.exit_code == ExitStatus.TRANSPORT_ERROR, res.output
    doc = json.loads(out.read_text())
    assert doc["exit_status"] == 4
    assert any(f["check"] == "router-list" and f["outcome"] == "error" and url in f["node"] for f in doc["findings"])


@pytest.mark.parametrize(
    "route",
    [
        Route(raw=b"<html>502 Bad Gateway</html>"),
        Route({"workers": "all of them"}),
        Route({"detail": "boom"}, status=500),
    ],
)
def test_router_garbage_exits_4_and_writes_the_report(
    payload_server: Callable[..., PayloadServer], route: Route, tmp_path: Path
) -> None:
    r = payload_server({"/workers": route})
    out = tmp_path / "r.xml"
    res = check("--router-url", r.url, "-f", "junit", "-o", str(out))
    assert res.exit_code == ExitStatus.TRANSPORT_ERROR, res.output
    text = out.read_text()
    assert "router-list" in text and r.url in text


def test_router_with_no_worker_list_and_an_empty_one_exit_4(payload_server: Callable[..., PayloadServer]) -> None:
    neither = payload_server({"/readiness": Route({"status": "ready"})})
    res = check("--router-url", neither.url)
    assert res.exit_code == ExitStatus.TRANSPORT_ERROR and "neither GET /workers" in res.stdout
    empty = router(payload_server, "/workers", R.smg_workers())
    res = check("--router-url", empty.url)
    assert res.exit_code == ExitStatus.TRANSPORT_ERROR and "lists no workers" in res.stdout


def test_router_get_server_info_is_never_read(payload_server: Callable[..., PayloadServer]) -> None:
    p, d = worker(payload_server, "prefill"), worker(payload_server, "decode")
    r = payload_server(
        {
            "/workers": Route(
                R.smg_workers(R.smg_entry(p.url, "prefill", bootstrap_port=8998), R.smg_entry(d.url, "decode"))
            ),
            # what smg proxies in PD mode: the FIRST prefill's document, not a worker of its own
            "/get_server_info": Route(P.server_info("0.5.22", pool=10)),
            "/server_info": Route(P.server_info("0.5.22", pool=10)),
        }
    )
    res = check("--router-url", r.url, "--format", "json")
    assert res.exit_code == ExitStatus.PASSED, res.output
    assert {n["url"] for n in json.loads(res.stdout)["target"]["nodes"]} == {p.url, d.url}


def test_a_url_judged_twice_reads_the_same_and_only_short_ones_are_remembered() -> None:
    """The two-parser comparison is remembered per URL text (the second look parses the listing again):
    the same answer either way, and a router's long URLs never fill the memory."""
    from kvgate.reading import weburl

    bad = "http://127.0.0.1:9\\@evil.example:80/"
    assert weburl.disagreement(bad) == weburl.disagreement(bad) == weburl._disagreement(bad)
    assert weburl.disagreement(bad) is not None and "backslash" in weburl.disagreement(bad)  # type: ignore[operator]
    before = weburl._remembered.cache_info().currsize
    long = "http://127.0.0.1:9/" + "a" * weburl._CACHED_URL_CHARS
    assert weburl.disagreement(long) is None
    assert weburl._remembered.cache_info().currsize == before
