"""Fuzz the whole `kvgate check` in-process against real loopback workers serving broken answers.

One mutation per example, on one node: a document field broken (drop, null, retype, negative, zero,
nested wrong, huge), a duplicated key, or an HTTP-level fault on one endpoint (3xx/4xx/5xx, truncated
body, non-UTF-8 bytes, a JSON value that is not an object, a body slower than --timeout).

Invariants: never a traceback; the JSON report is always written and agrees with the exit code; the
exit code is 0, 1, 3 or 4 (2 needs a usage error, 5 a kvgate crash: neither may happen here); never 0
when a field a gate needs is broken; 4 only for an HTTP-level fault or unparseable JSON.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.exitcodes import ExitStatus
from tests.assets import sglang_payloads as P
from tests.conftest import PayloadServer, Route
from tests.fuzz.conftest import CLI_EXAMPLES
from tests.fuzz.mutations import (
    BREAKING,
    KINDS,
    NEEDED_INFO,
    NEEDED_MODELS,
    label,
    mutate,
    paths,
    with_duplicate_key,
)

runner = CliRunner()
# Generous: on a loaded CI machine a loopback answer can take a while; only the "slow" fault exceeds it.
TIMEOUT = 3.0
ENDPOINTS = ("/server_info", "/v1/models", "/model_info")
HTTP_FAULTS = (
    "301",
    "302",
    "307",
    "400",
    "401",
    "403",
    "404",
    "500",
    "502",
    "503",
    "truncated",
    "non_utf8",
    "not_object",
    "slow",
)


def docs(role: str) -> dict[str, Any]:
    return {
        "/server_info": P.server_info("0.5.23", mode=role, pool=2_040_000),
        "/v1/models": P.v1_models(),
        "/model_info": P.model_info("0.5.23", role),
    }


BASE = {"prefill": docs("prefill"), "decode": docs("decode")}
# What a gate needs: gate 1's fields, and the version the defenses gate judges the fixes by.
NEEDED = {
    "/server_info": NEEDED_INFO | {("version",)},
    "/v1/models": NEEDED_MODELS,
    "/model_info": set(),
}


@pytest.fixture(scope="module")
def workers() -> Iterator[dict[str, PayloadServer]]:
    servers = {role: PayloadServer().start() for role in BASE}
    yield servers
    for s in servers.values():
        s.stop()


def _routes(base: dict[str, Any]) -> dict[str, Route]:
    return {path: Route(doc) for path, doc in base.items()}


def _http_fault(doc: Any, fault: str) -> Route:
    body = json.dumps(doc).encode()
    if fault.isdigit():
        return Route(doc, status=int(fault))
    if fault == "truncated":
        return Route(raw=body[: len(body) // 2])
    if fault == "non_utf8":
        return Route(raw=b'{"version": "\xff\xfe\xfa"}')
    if fault == "not_object":
        return Route([doc])
    return Route(doc, delay_s=TIMEOUT * 2)


def _run(workers: dict[str, PayloadServer]) -> tuple[Any, dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        res = runner.invoke(
            app,
            [
                "check",
                "-q",
                "--prefill-url",
                workers["prefill"].url,
                "--decode-url",
                workers["decode"].url,
                "--deferred-release",
                "--timeout",
                str(TIMEOUT),
                "--trust-version",  # payload servers run no sglang code
                "--no-probes",  # payload servers are not a router: gate 1 and the defenses are what is fuzzed
                "-f",
                "json",
                "-o",
                str(out),
            ],
        )
        assert out.is_file(), f"no report written: {res.output}"
        return res, json.loads(out.read_text())


def test_baseline_passes_so_the_invariants_are_not_vacuous(workers: dict[str, PayloadServer]) -> None:
    for role, srv in workers.items():
        srv.routes = _routes(BASE[role])
    res, doc = _run(workers)
    assert res.exit_code == ExitStatus.PASSED, res.output


Mutation = tuple[str, str, str, Any, str]  # (role, endpoint, "doc"|"dup"|"http", path|fault, kind)


@st.composite
def mutation(draw: Callable[..., Any]) -> Mutation:
    role = draw(st.sampled_from(sorted(BASE)))
    endpoint = draw(st.sampled_from(ENDPOINTS))
    what = draw(st.sampled_from(("doc", "doc", "dup", "http")))
    doc = BASE[role][endpoint]
    if what == "http":
        return role, endpoint, what, draw(st.sampled_from(HTTP_FAULTS)), ""
    if what == "dup":
        return role, endpoint, what, (draw(st.sampled_from(sorted(doc))),), "duplicate"
    needed = NEEDED[endpoint]
    choices = [st.sampled_from(list(paths(doc, depth=3)))]
    if needed:
        choices.insert(0, st.sampled_from(sorted(needed, key=str)))
    return role, endpoint, what, draw(st.one_of(*choices)), draw(st.sampled_from(KINDS))


@settings(max_examples=CLI_EXAMPLES)
@given(mutation())
@example(("prefill", "/server_info", "dup", ("max_total_num_tokens",), "duplicate"))
@example(("decode", "/server_info", "doc", ("max_req_input_len",), "zero"))
@example(("prefill", "/server_info", "http", "302", ""))
@example(("decode", "/v1/models", "http", "404", ""))
@example(("prefill", "/model_info", "http", "404", ""))
def test_check_exits_as_documented_on_any_broken_answer(
    count: Callable[[], None], workers: dict[str, PayloadServer], m: Mutation
) -> None:
    count()
    role, endpoint, what, where, kind = m
    for r, srv in workers.items():
        srv.routes = _routes(BASE[r])
    doc = BASE[role][endpoint]
    if what == "doc":
        workers[role].routes[endpoint] = Route(mutate(doc, where, kind))
    elif what == "dup":
        conflict = {"x": 1} if not isinstance(doc[where[0]], dict) else 7
        workers[role].routes[endpoint] = Route(raw=with_duplicate_key(doc, where[0], conflict))
    else:
        workers[role].routes[endpoint] = _http_fault(doc, where)
    res, report = _run(workers)
    code = res.exit_code
    what_broke = f"{role} {endpoint} {what} {label(where) if what != 'http' else where} {kind}"
    assert res.exception is None or isinstance(res.exception, SystemExit), f"{what_broke}: {res.exception!r}"
    assert "Traceback" not in res.output
    assert report["exit_status"] == code, what_broke
    assert code in (0, 1, 3, 4), f"{what_broke}: exit {code}: {res.output[-2000:]}"
    breaking = what == "dup" or (what == "doc" and kind in BREAKING and where in NEEDED[endpoint])
    if what == "http" and endpoint == "/server_info":
        assert code == ExitStatus.TRANSPORT_ERROR, what_broke
    if breaking or (what == "http" and endpoint != "/model_info"):
        assert code != ExitStatus.PASSED, f"{what_broke}: exit 0: {res.output[-3000:]}"
    if code == ExitStatus.TRANSPORT_ERROR:
        assert what in ("http", "dup"), f"{what_broke}: exit 4 without a transport fault: {res.output[-2000:]}"
