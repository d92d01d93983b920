"""One parse of a worker URL (issue 40, class 1), against the real router.

The real `smg` (1.13.0) parses a worker URL by WHATWG rules: registered as `http://X\\@D`, the worker
is listed under that very string, health-checked and routed to X (`GET http://X/@D/health`), while
Python's urllib reads the host D. Before this, kvgate read D (a healthy worker nobody routes to) and
passed, and X, the worker taking the traffic, was never named. Now such an entry is refused: it is
not read, and the run blocks naming the URL (`fleet.router-url`). Given on the command line, such a
URL is a usage error (exit 2) naming it.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.deploy.pdstart import DistinctPorts, router_argv
from kvgate.exitcodes import ExitStatus
from kvgate.reading.weburl import disagreement
from tests.assets import sglang_payloads as P
from tests.conftest import PayloadServer, Route

runner = CliRunner()
META_ONLY = ("--no-probes", "--trust-version", "--deferred-release")
BIG = 2_040_000


def worker_routes(mode: str) -> dict[str, Route]:
    return {
        "/server_info": Route(P.server_info("0.5.22", mode=mode, pool=BIG)),
        "/v1/models": Route(P.v1_models()),
        "/model_info": Route(P.model_info("0.5.22", mode)),
        "/health": Route({}),
        "/health_generate": Route({}),
    }


class AnyPrefix(dict):  # type: ignore[type-arg]
    """Routes matched by the path's end, and every path asked kept: a worker that answers whatever
    its URL's path makes the router send (`/@D/health` reaches its `/health`)."""

    def __init__(self, routes: dict[str, Route]) -> None:
        super().__init__(routes)
        self.asked: list[str] = []

    def get(self, path: str, default: Any = None) -> Any:
        self.asked.append(path)
        for suffix, route in self.items():
            if path.endswith(suffix):
                return route
        return default


@pytest.fixture
def smg() -> Iterator[Callable[..., str]]:
    """Start the real smg in PD mode over the given workers; yields its URL once it lists them all."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(prefill: str, decode: str) -> str:
        ports = DistinctPorts()
        port = ports()
        argv = router_argv(
            prefill=[(prefill, 8998)], decode=[decode], host="127.0.0.1", port=port, prometheus_port=ports()
        )
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        url = f"http://127.0.0.1:{port}"
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                workers = httpx.get(url + "/workers", timeout=2).json().get("workers", [])
                if len(workers) == 2 and all(w.get("status") == "ready" for w in workers):
                    return url
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.3)
        raise AssertionError("smg did not list both workers as ready within 60 s")

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=30)


def check(*args: str) -> tuple[int, dict[str, Any], str]:
    res = runner.invoke(app, ["check", "--quiet", *META_ONLY, *args, "--format", "json"])
    doc = json.loads(res.stdout) if res.stdout.startswith("{") else {}
    return res.exit_code, doc, res.stdout + res.stderr


def host(server: PayloadServer) -> str:
    return server.url.split("//", 1)[1]


CASES = {
    # the case: a backslash ends the authority for the router, not for urllib
    "backslash": lambda routed, gated: f"http://{routed}\\@{gated}",
    # a percent-encoded host: the router decodes it (127.0.0.%31 is 127.0.0.1), urllib keeps the text
    "percent-host": lambda routed, gated: f"http://127.0.0.%31:{routed.rsplit(':', 1)[1]}",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_url_the_router_reads_otherwise_is_refused_never_gated_as_another_host(
    payload_server: Callable[..., PayloadServer], smg: Callable[..., str], case: str
) -> None:
    prefill = payload_server(worker_routes("prefill"))
    gated = payload_server(worker_routes("decode"))  # the worker urllib would name: healthy, takes no traffic
    routed = payload_server({})  # the worker the router really reaches
    routed.routes = AnyPrefix(worker_routes("decode"))
    weird = CASES[case](host(routed), host(gated))
    assert disagreement(weird) is not None
    router = smg(prefill.url, weird)

    # What smg does: it lists the URL as registered and health-checks the worker its parser names.
    listed = [w["url"] for w in httpx.get(router + "/workers", timeout=5).json()["workers"]]
    assert weird in listed
    assert any(p.endswith("/health") for p in routed.routes.asked), routed.routes.asked
    assert not gated.seen_headers  # smg never reached the host urllib names
    seen_by_routed = len(routed.routes.asked)

    code, doc, out = check("--router-url", router)
    assert code in (ExitStatus.GATE_FAILED, ExitStatus.INCONCLUSIVE), out
    [refused] = [f for f in doc["findings"] if f"{f['gate']}.{f['check']}" == "fleet.router-url"]
    assert refused["outcome"] == "inconclusive" and refused["blocking"]
    assert weird in refused["node"] and weird in [e["value"] for e in refused["evidence"]]
    assert "WHATWG" in refused["summary"]
    assert not gated.seen_headers  # never gated as a different host
    assert len(routed.routes.asked) == seen_by_routed or all(
        p.endswith(("/health", "/health_generate", "/v1/models", "/model_info", "/metrics", "loads", "server_info"))
        for p in routed.routes.asked
    )
    nodes = [n["url"] for n in doc["target"]["nodes"]]
    assert nodes == [prefill.url]  # only the entry both parsers read alike was read


def test_a_url_given_on_the_command_line_that_parsers_read_otherwise_is_a_usage_error(
    payload_server: Callable[..., PayloadServer],
) -> None:
    prefill = payload_server(worker_routes("prefill"))
    gated = payload_server(worker_routes("decode"))
    weird = f"http://127.0.0.1:1\\@{host(gated)}"
    code, _, out = check("--prefill-url", prefill.url, "--decode-url", weird)
    assert code == ExitStatus.USAGE_ERROR, out
    assert "refused" in out and "backslash" in out
    assert not gated.seen_headers


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:30000",
        "http://127.0.0.1:30000/",
        "https://prefill-0.pd.svc.cluster.local:30000",
        "http://[::1]:30000",
        "http://10.0.0.7:30000/sglang",
    ],
)
def test_plain_worker_urls_are_read_alike(url: str) -> None:
    assert disagreement(url) is None


@pytest.mark.parametrize(
    "url",
    [
        "http://a\\@b:1",
        "http://a:1\\b",
        "http://2130706433:1",
        "http://0x7f.1:1",
        "http://127.0.0.%31:1",
        "http://h\t:1",
        "http://h\n.example:1",
        " http://h:1",
        "http:///h:1",
        "http:\\\\h:1",
        "http://u:p@h:1",
        "http://h:1/a/../b",
        "http://h:1/%2e/b",
        "http://h:1?x=1",
        "http://h:1#x",
        "http://h:99999",
        "http://bücher.example:1",
    ],
)
def test_what_the_two_parsers_read_differently_is_named(url: str) -> None:
    why = disagreement(url)
    assert why is not None and "router" in why
