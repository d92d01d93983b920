"""What a server says never escapes into an output raw, nor costs unbounded memory or time (issue 30).

The issue's ten cases, rebuilt from its description with small fake servers on real loopback sockets,
the real CLI (in-process, or as a process where the job log itself is under test) and the real watch
process. None ends with exit 5.

1. --write-baseline: a worker echoing the token in a server_info field; the baseline file holds no fragment.
2. watch /metrics: a router putting the token in worker URLs; no fragment in any label (nor /verdict).
3. A token in a URL host, lowercased by URL normalisation: no fragment of the lowercased form anywhere.
4. A CR in a version: the step summary gets no forged "PASSED" heading and no unclosed comment.
5. A LF in a version: no line of the gate step's output is a workflow command (`::`, `##[`).
6. Control characters: none reach the terminal; the JUnit XML stays well-formed.
7. A gzip bomb to watch's probe client: refused unread (the bounded client), not decoded.
8. Slow clients at the watch endpoint: /verdict and /healthz answer within 1 s under 500 half-open
   connections; excess connections are refused at once; a half-sent request is cut at its deadline.
9. A "billion laughs" profile: refused at once (exit 2), with a short message.
10. Deeply nested JSON: a transport finding for that node; the run reports everything else (exit 4).
"""

from __future__ import annotations

import datetime
import gzip
import json
import os
import re
import resource
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from markdown_it import MarkdownIt
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.exitcodes import ExitStatus
from kvgate.output import redact as R
from tests.assets import router_payloads as RP
from tests.assets import sglang_payloads as P
from tests.conftest import PayloadServer, Route
from tests.hostile.net_servers import Request, ScriptedServer
from tests.output.test_sinks import workflow_commands
from tests.watch.helpers import WatchProcess

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
# Mixed case, hostname-safe: its lowercased and uppercased forms differ from it.
TOKEN = "Kv9TokenAbCdEfGhIjKlMnOpQrStUvWx"
_C0C1 = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@pytest.fixture(autouse=True)
def _forget_secrets() -> Iterator[None]:
    with R.scope():
        yield


def fragments(text: str, secret: str = TOKEN) -> list[str]:
    """8-character pieces of the secret found in `text`, in any case."""
    s, t = secret.lower(), text.lower()
    return [s[i : i + 8] for i in range(len(s) - 7) if s[i : i + 8] in t]


def worker(
    make: Callable[..., PayloadServer], version: str = "0.5.22", mode: str = "prefill", **kw: Any
) -> PayloadServer:
    return make(
        {
            "/server_info": Route(P.server_info(version, mode=mode, context=1_048_576, pool=2_040_000, **kw)),
            "/v1/models": Route(P.v1_models(1_048_576)),
            "/model_info": Route(P.model_info(version, mode)),
        }
    )


def cli(*args: str, env: dict[str, str] | None = None) -> Any:
    return runner.invoke(app, list(args), env={"KVGATE_TEST_TOKEN": TOKEN, **(env or {})})


def cli_process(args: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    """The real CLI as its own process (stdout and stderr are what a CI job's log gets)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KVGATE_TEST_TOKEN": TOKEN, "COLUMNS": "100"}
    return subprocess.run(  # noqa: S603 - our own CLI
        [sys.executable, "-c", "from kvgate.cli import main; main()", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp,
        timeout=300,  # a safety net: the run ends on its own well before
        errors="surrogateescape",
    )


# -- 1. the baseline file ------------------------------------------------------------------------


def test_1_baseline_holds_no_echoed_token(payload_server: Callable[..., PayloadServer], tmp_path: Path) -> None:
    w = worker(payload_server, backend=f"mooncake-{TOKEN}")
    base = tmp_path / "baseline.json"
    # A run that passes (only such a run writes a baseline): payload servers run no sglang code, so
    # their version string is taken as evidence, explicitly; the backend the token rides in is not one
    # deferred release supports, a failure waived for this test.
    expires = (datetime.date.today() + datetime.timedelta(days=30)).isoformat()
    profile = tmp_path / "profile.yaml"
    profile.write_text(
        "schema: 1\nname: t\nwaivers:\n  - check: defenses.deferred-release\n"
        f"    reason: the test's backend name carries the token\n    expires: {expires}\n"
    )
    res = cli("check", "-q", "--no-probes", "--prefill-url", w.url, "--token-env", "KVGATE_TEST_TOKEN",
              "--trust-version", "--deferred-release", "--no-strict", "--profile", str(profile),
              "--write-baseline", str(base), "--format", "json")  # fmt: skip
    assert res.exit_code == ExitStatus.PASSED, res.output
    text = base.read_text()
    assert "mooncake-" in text  # the field was recorded ...
    assert fragments(text) == [], text  # ... without the token
    assert fragments(res.stdout) == []


# -- 2. watch's /metrics labels --------------------------------------------------------------------


def _router_with_token_urls(make: Callable[..., PayloadServer]) -> PayloadServer:
    w = worker(make)
    entries = [
        RP.smg_entry(f"{w.url}/{TOKEN}", "prefill"),
        RP.smg_entry(f"http://127.0.0.1:9/{TOKEN.lower()}", "decode"),
    ]
    return make({"/workers": Route(RP.smg_workers(*entries)), "/readiness": Route({"status": "ready"})})


def _watch(router: str, tmp: Path, *extra: str) -> WatchProcess:
    os.environ["KVGATE_TEST_TOKEN"] = TOKEN  # inherited by the watch process
    return WatchProcess(
        ["--router-url", router, "--token-env", "KVGATE_TEST_TOKEN", "--no-probes", "--interval", "5", *extra],
        tmp / "watch.log",
    )


def test_2_metrics_labels_hold_no_token(payload_server: Callable[..., PayloadServer], tmp_path: Path) -> None:
    router = _router_with_token_urls(payload_server)
    w = _watch(router.url, tmp_path)
    try:
        w.wait(w.verdict_settled, 120, "a first full gate")
        metrics = w.get("/metrics")
        verdict = w.get("/verdict")
        assert metrics is not None and verdict is not None
        assert "kvgate_check_outcome{" in metrics.text
        assert fragments(metrics.text) == [], metrics.text
        assert fragments(verdict.text) == []
        assert fragments(w.log()) == []
    finally:
        assert w.terminate() != ExitStatus.INTERNAL_ERROR, w.log()


# -- 3. a token in a URL host, lowercased by normalisation ----------------------------------------


def test_3_a_lowercased_token_in_a_host_is_masked(payload_server: Callable[..., PayloadServer], tmp_path: Path) -> None:
    """The router lists a worker whose host holds the token; kvgate normalises the URL (lowercasing the
    host) and names the node by it in every output."""
    entry = RP.smg_entry(f"http://{TOKEN}.invalid:8000", "prefill")
    router = payload_server({"/workers": Route(RP.smg_workers(entry)), "/readiness": Route({"status": "ready"})})
    res = cli("check", "-q", "--no-probes", "--router-url", router.url, "--token-env", "KVGATE_TEST_TOKEN",
              "--timeout", "3", "--format", "json", "--output", str(tmp_path / "r.json"),
              "--format", "markdown", "--output", str(tmp_path / "r.md"), "--format", "table")  # fmt: skip
    assert res.exit_code == ExitStatus.TRANSPORT_ERROR, res.output
    report = (tmp_path / "r.json").read_text()
    assert ".invalid:8000" in report  # the node is named ...
    for text in (res.stdout, res.stderr, report, (tmp_path / "r.md").read_text()):
        assert fragments(text) == [], text  # ... without the token, in any case


# -- 4. a CR in a version, through the Markdown report into the step summary ---------------------------


def test_4_a_carriage_return_forges_no_heading_in_the_step_summary(
    payload_server: Callable[..., PayloadServer], tmp_path: Path
) -> None:
    w = worker(payload_server, version="0.5.20\r## kvgate check: PASSED (exit 0)\r<!-- ")
    res = cli("check", "-q", "--no-probes", "--prefill-url", w.url, "--format", "json", "--output",
              str(tmp_path / "k.json"), "--format", "markdown", "--output", str(tmp_path / "k.md"))  # fmt: skip
    assert res.exit_code not in (ExitStatus.PASSED, ExitStatus.INTERNAL_ERROR), res.output
    summary = tmp_path / "summary.md"
    subprocess.run(  # noqa: S603 - the action's report step
        [sys.executable, str(ROOT / "tools" / "gha_report.py"), str(tmp_path / "k.json"), str(tmp_path / "k.md")],
        env={**os.environ, "GITHUB_STEP_SUMMARY": str(summary)},
        check=True,
        timeout=60,
    )
    text = summary.read_bytes().decode()
    assert "\r" not in text
    headings = [ln for ln in text.split("\n") if ln.startswith("#")]
    assert headings[0] == f"## kvgate check: {headings[0].split(': ', 1)[1]}"
    assert all("PASSED" not in h for h in headings), headings
    html = MarkdownIt("commonmark").enable("table").render(text)  # as GitHub renders the summary
    assert "<!--" not in html and "&lt;!--" in html  # the comment is shown as text, hiding nothing


# -- 5. a LF in a version, into the gate step's output ----------------------------------------------


def test_5_no_line_of_the_gate_step_output_is_a_workflow_command(
    payload_server: Callable[..., PayloadServer], tmp_path: Path
) -> None:
    forged = "0.5.20\n::add-mask::x\n  ::error title=forged::x\n::stop-commands::tok\n##[group]x\r::warning::y"
    w = worker(payload_server, version=forged)
    proc = cli_process(["check", "--no-probes", "--prefill-url", w.url, "--verbose"], tmp_path)
    assert proc.returncode not in (ExitStatus.PASSED, ExitStatus.INTERNAL_ERROR), proc.stderr
    assert "add-mask" in proc.stdout  # the text is shown ...
    assert workflow_commands(proc.stdout) == [] and workflow_commands(proc.stderr) == []  # ... as text


# -- 6. control characters: terminal and JUnit ----------------------------------------------------


def test_6_control_characters_reach_no_terminal_and_junit_stays_well_formed(
    payload_server: Callable[..., PayloadServer], tmp_path: Path
) -> None:
    w = worker(payload_server, version="0.5.20\x1b]0;pwned\x07\x1b[2J\x00\x9b31m\u202e")
    junit = ["--format", "junit", "--output", str(tmp_path / "k.xml"), "--format", "table"]
    proc = cli_process(["check", "--no-probes", "--prefill-url", w.url, "--verbose", *junit], tmp_path)
    assert proc.returncode not in (ExitStatus.PASSED, ExitStatus.INTERNAL_ERROR), proc.stderr
    assert not _C0C1.search(proc.stdout) and not _C0C1.search(proc.stderr), repr(proc.stdout)
    assert "\\x1b" in proc.stdout  # shown as an escape
    root = ET.parse(tmp_path / "k.xml").getroot()
    assert root.tag == "testsuites"


# -- 7. a gzip bomb to watch's probe client -------------------------------------------------------


def test_7_watch_probe_client_refuses_a_compressed_answer(tmp_path: Path) -> None:
    from kvgate.gates.base import CheckOptions
    from kvgate.reading.httpbounds import OverCap
    from kvgate.watch.loop import Watcher
    from kvgate.watch.settings import WatchSettings

    bomb = gzip.compress(b"\0" * (64 << 20))  # 64 MiB of zeros in about 64 KiB

    def script(req: Request, conn: socket.socket) -> None:
        head = f"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {len(bomb)}\r\n\r\n"
        conn.sendall(head.encode() + bomb)

    srv = ScriptedServer(script).start()
    w = Watcher(CheckOptions(router_url=srv.url), WatchSettings(), listen=("127.0.0.1", 0))
    try:
        with pytest.raises(OverCap, match="compressed"):
            w.http.post(srv.url + "/generate", json={"input_ids": [1]}).read()
        assert w.http.headers["accept-encoding"] == "identity"
    finally:
        w.http.close()
        w.endpoint.stop()


# -- 8. the watch endpoint under slow clients ------------------------------------------------------


def _fd_room(want: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.skip(f"this process may open only {hard} descriptors; the flood needs {want}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def _half_open(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"GET /verdict HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        socks.append(s)
    return socks


def test_8_verdict_answers_within_1s_under_500_half_open_connections(
    payload_server: Callable[..., PayloadServer], tmp_path: Path
) -> None:
    _fd_room(2048)
    router = payload_server({"/workers": Route(RP.smg_workers()), "/readiness": Route({"status": "ready"})})
    w = _watch(router.url, tmp_path)
    socks: list[socket.socket] = []
    try:
        w.wait(lambda: w.get("/healthz"), 120, "the endpoint")
        socks = _half_open(w.port, 500)
        worst = 0.0
        for path in ("/verdict", "/healthz", "/metrics", "/verdict", "/healthz"):
            t0 = time.monotonic()
            res = httpx.get(w.base + path, timeout=1.0)  # the bound: an answer within 1 s
            worst = max(worst, time.monotonic() - t0)
            assert res.status_code in (200, 503), res.text
            assert path != "/verdict" or "passed" in res.json()
        assert w.proc.poll() is None, w.log()
        print(f"500 half-open connections: slowest answer {worst * 1000:.0f} ms")
    finally:
        for s in socks:
            s.close()
        code = w.terminate()
    assert code != ExitStatus.INTERNAL_ERROR and "Too many open files" not in w.log(), w.log()


def test_8_excess_connections_are_refused_and_half_sent_requests_cut() -> None:
    from kvgate.watch.endpoint import Answer, Endpoint

    ep = Endpoint(
        "127.0.0.1", 0, {"/healthz": lambda: Answer(200, "text/plain", b"ok")}, max_connections=8, header_deadline_s=1.0
    ).start()
    try:
        port = ep.address[1]
        held = _half_open(port, 8)
        extra = socket.create_connection(("127.0.0.1", port), timeout=10)
        assert extra.recv(1) == b""  # refused: closed without an answer (the 10 s timeout is a safety net)
        extra.close()
        for s in held:  # each half-sent request is cut at its 1 s header deadline
            s.settimeout(30)
            assert s.recv(1) == b""
            s.close()
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).text == "ok"  # and the slots are free again
        big = socket.create_connection(("127.0.0.1", port), timeout=10)
        big.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: " + b"a" * (64 << 10) + b"\r\n\r\n")
        assert big.recv(64).startswith(b"HTTP/1.1 431")  # a head over the cap: refused
        big.close()
        assert ep.refused == 1
    finally:
        ep.stop()


# -- 9. a billion laughs profile -----------------------------------------------------------------------

# `name` must be a string: the old message repr()'d its 9**7-element expansion.
LAUGHS = """schema: 1
description: [&a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"],
 &b [*a,*a,*a,*a,*a,*a,*a,*a,*a], &c [*b,*b,*b,*b,*b,*b,*b,*b,*b],
 &d [*c,*c,*c,*c,*c,*c,*c,*c,*c], &e [*d,*d,*d,*d,*d,*d,*d,*d,*d],
 &f [*e,*e,*e,*e,*e,*e,*e,*e,*e], &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]]
name: *g
"""


def test_9_a_billion_laughs_profile_is_refused_with_a_short_message(tmp_path: Path) -> None:
    profile = tmp_path / "laughs.yaml"
    profile.write_text(LAUGHS)
    assert len(LAUGHS.encode()) < 400
    proc = cli_process(["check", "--profile", str(profile), "--prefill-url", "http://127.0.0.1:9"], tmp_path)
    assert proc.returncode == ExitStatus.USAGE_ERROR, proc.stderr
    assert "anchors and aliases" in proc.stderr
    assert len(proc.stderr) < 4000 and len(proc.stdout) < 4000


# -- 10. deeply nested JSON ----------------------------------------------------------------------------


def test_10_deep_json_is_a_transport_finding_and_the_run_goes_on(payload_server: Callable[..., PayloadServer]) -> None:
    good = worker(payload_server, mode="decode")
    deep = {}
    for depth, path in ((100_000, "/server_info"), (900, "/server_info")):
        doc = "[" * depth + "]" * depth
        deep[depth] = payload_server({path: Route(raw=doc.encode()), "/get_server_info": Route(raw=doc.encode())})
    res = cli("check", "-q", "--no-probes", "--prefill-url", deep[100_000].url, "--prefill-url", deep[900].url,
              "--decode-url", good.url, "--format", "json")  # fmt: skip
    assert res.exit_code == ExitStatus.TRANSPORT_ERROR, res.output
    doc = json.loads(res.stdout)
    errors = {f["node"] for f in doc["findings"] if f["outcome"] == "error"}
    assert any(deep[100_000].url in n for n in errors) and any(deep[900].url in n for n in errors), errors
    assert any(good.url in f["node"] and f["outcome"] != "error" for f in doc["findings"])  # the rest is reported


def test_10_deep_json_through_the_router_ends_no_run(payload_server: Callable[..., PayloadServer]) -> None:
    """The probes' answers (the router's /v1/tokenize here) are depth-limited too: the run reports."""
    p, d = worker(payload_server), worker(payload_server, mode="decode")
    listing = json.dumps(RP.smg_workers(RP.smg_entry(p.url, "prefill"), RP.smg_entry(d.url, "decode"))).encode()
    deep = b"[" * 100_000 + b"]" * 100_000
    shallow_deep = b'{"tokens": ' + b"[" * 900 + b"]" * 900 + b"}"

    def script(req: Request, conn: socket.socket) -> None:
        body = {"/workers": listing, "/readiness": b'{"status": "ready"}'}.get(req.path.split("?")[0])
        if body is None:
            body = deep if req.path.startswith("/v1/") else shallow_deep
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
        conn.sendall(body)

    router = ScriptedServer(script).start()
    res = cli("check", "-q", "--router-url", router.url, "--timeout", "5", "--format", "json")
    assert res.exit_code not in (ExitStatus.PASSED, ExitStatus.INTERNAL_ERROR), res.output
    doc = json.loads(res.stdout)
    assert any(p.url in f["node"] for f in doc["findings"]), json.dumps(doc["findings"], indent=1)[
        :6000
    ]  # every other finding is reported
