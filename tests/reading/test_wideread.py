"""The wide reader (kvgate/reading/wideread.py) over real loopback sockets: answers framed every
way HTTP/1.1 allows, and hostile peers bounded in time and bytes (a drip, endless headers, a body over
the cap, a malformed chunk, a refused port), TLS included, and the fleet pass's use of it."""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvgate.errors import TransportError
from kvgate.reading.fleetread import judged_facts, read_workers
from kvgate.reading.http11 import MAX_HEAD, Answer, Failure
from kvgate.reading.node import NodeReading, NodeSpec
from kvgate.reading.wideread import get_each
from kvgate.watch import fleetpass
from tests.hostile.net_servers import Request, ScriptedServer, drip, head

CAP = 1 << 16


@pytest.fixture
def serve() -> Iterator[list[ScriptedServer]]:
    started: list[ScriptedServer] = []
    yield started
    for s in started:
        s.stop()


def _start(started: list[ScriptedServer], script: object) -> ScriptedServer:
    s = ScriptedServer(script).start()  # type: ignore[arg-type]
    started.append(s)
    return s


def _raw(data: bytes) -> object:
    def script(req: Request, conn: socket.socket) -> None:
        conn.sendall(data)

    return script


def _each(urls: list[str], path: str) -> list[tuple[str, str]]:
    """One (base URL, path) pair per URL: the same path from each."""
    return [(u, path) for u in urls]


def _read(urls: list[str], path: str = "/server_info", timeout: float = 5.0, **kw: object) -> list[Answer | Failure]:
    return get_each(_each(urls, path), timeout=timeout, deadline=time.monotonic() + 30, width=64, body_cap=CAP, **kw)  # type: ignore[arg-type]


def test_every_framing_is_read_whole_and_in_order(serve: list[ScriptedServer]) -> None:
    body = b'{"a": 1}'
    chunks = b"3;ext=1\r\n" + body[:3] + b"\r\n5\r\n" + body[3:] + b"\r\n0\r\n\r\n"
    chunked = head(extra="Transfer-Encoding: chunked") + chunks
    servers = [
        _start(serve, _raw(head(length=len(body)) + body)),
        _start(serve, _raw(chunked)),
        _start(serve, _raw(head() + body)),  # no length: the body ends when the connection closes
        _start(serve, _raw(head(404, length=0))),
    ]
    got = _read([s.url for s in servers])
    assert got == [Answer(200, body), Answer(200, body), Answer(200, body), Answer(404, b"")]
    assert [s.requests[0].path for s in servers] == ["/server_info"] * 4


def test_a_dripping_peer_ends_at_its_timeout(serve: list[ScriptedServer]) -> None:
    stop = threading.Event()
    s = _start(serve, drip(b"x" * 100, 0.3, stop))
    t0 = time.monotonic()
    (got,) = _read([s.url], timeout=1.0)
    stop.set()
    assert isinstance(got, Failure) and got.reason == f"{s.url}/server_info: no whole answer within 1s (timeout)"
    assert time.monotonic() - t0 < 4.0  # bounded by the timeout, not by the 30 s the drip would take


def test_no_request_starts_after_the_pass_deadline(serve: list[ScriptedServer]) -> None:
    s = _start(serve, _raw(head(length=2) + b"{}"))
    (got,) = get_each(_each([s.url], "/x"), timeout=5, deadline=time.monotonic() - 1, width=4, body_cap=CAP)
    assert isinstance(got, Failure) and "deadline passed" in got.reason
    assert not s.requests


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (head(length=CAP + 1), f"the answer announces {CAP + 1:,} bytes, over kvgate's 64 KiB cap (not read)"),
        (head(length=0).replace(b"Content-Length: 0", b"Content-Length: -1"), "malformed Content-Length '-1'"),
        (head() + b"y" * (CAP + 10), "the answer is larger than kvgate's 64 KiB cap"),
        (head(extra="Transfer-Encoding: chunked") + b"%x\r\n" % (CAP + 1) + b"y" * (CAP + 3), "the answer is"),
        (head(extra="Transfer-Encoding: chunked") + b"zz\r\n", "malformed chunked encoding"),
        (head(extra="Transfer-Encoding: chunked") + b"2\r\nabXX", "malformed chunked encoding"),
        (head(extra="Transfer-Encoding: chunked") + b"1" * 4096, "malformed chunked encoding"),
        (b"HTTP/1.1 200 OK\r\nX-Endless: " + b"a" * (MAX_HEAD + 10), "response headers over 64 KiB"),
        (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.x answer"),
        (head(length=10) + b"{}", "the connection closed before the whole answer arrived"),
    ],
    ids=["length-over-cap", "length-negative", "close-delimited-over-cap", "chunk-over-cap", "chunk-size-not-hex",
         "chunk-not-crlf", "chunk-line-endless", "endless-headers", "not-http", "cut-short"],
)  # fmt: skip
def test_a_hostile_answer_is_a_failure_naming_it(serve: list[ScriptedServer], answer: bytes, reason: str) -> None:
    s = _start(serve, _raw(answer))
    (got,) = _read([s.url])
    assert isinstance(got, Failure) and got.reason.startswith(f"{s.url}/server_info: {reason}"), got


def test_a_refused_port_is_unreachable() -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    (got,) = _read([f"http://127.0.0.1:{port}"])
    assert got == Failure(f"http://127.0.0.1:{port}/server_info: unreachable: ECONNREFUSED")


def test_width_bounds_the_requests_in_flight_and_hooks_run(serve: list[ScriptedServer]) -> None:
    lock, now, most = threading.Lock(), [0], [0]

    def script(req: Request, conn: socket.socket) -> None:
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        time.sleep(0.1)
        with lock:
            now[0] -= 1
        conn.sendall(head(length=2) + b"{}")

    s = _start(serve, script)
    seen: list[int] = []
    sent: list[bool] = []
    got = get_each(
        _each([s.url] * 6, "/p"),
        headers="Authorization: Bearer t0ken-for-the-test\r\n",
        timeout=5,
        deadline=time.monotonic() + 30,
        width=2,
        body_cap=CAP,
        on_answer=lambda i, a: seen.append(i),
        on_sent=lambda: sent.append(True),
    )
    assert got == [Answer(200, b"{}")] * 6 and sorted(seen) == list(range(6)) and sent == [True]
    assert most[0] == 2
    assert all(r.headers["authorization"] == "Bearer t0ken-for-the-test" for r in s.requests)


@pytest.fixture(scope="module")
def tls_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl binary to make a throwaway certificate")  # Debian's openssl package has it
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return d / "cert.pem", d / "key.pem"


def _tls_server(cert: Path, key: Path, answer: bytes) -> tuple[str, threading.Event]:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    sock = socket.create_server(("127.0.0.1", 0))
    sock.settimeout(0.2)
    stop = threading.Event()

    def run() -> None:
        with sock:
            while not stop.is_set():
                try:
                    conn, _ = sock.accept()
                except OSError:
                    continue
                try:
                    with ctx.wrap_socket(conn, server_side=True) as tls:
                        tls.settimeout(5)
                        tls.recv(65536)
                        tls.sendall(answer)
                except (OSError, ssl.SSLError):
                    pass  # the client refused the certificate: what one test is for

    threading.Thread(target=run, daemon=True).start()
    return f"https://127.0.0.1:{sock.getsockname()[1]}", stop


def test_https_is_read_and_an_untrusted_certificate_refused(tls_cert: tuple[Path, Path]) -> None:
    cert, key = tls_cert
    url, stop = _tls_server(cert, key, head(length=9) + b'{"tls":1}')
    try:
        trusting = ssl.create_default_context(cafile=str(cert))
        assert _read([url], ssl_context=trusting) == [Answer(200, b'{"tls":1}')]
        (refused,) = _read([url])  # the system's trust store: a self-signed certificate is refused
        assert isinstance(refused, Failure) and refused.reason.startswith(f"{url}/server_info: TLS: ")
        assert "CERTIFICATE_VERIFY_FAILED" in refused.reason
    finally:
        stop.set()


def test_the_fleet_reader_falls_back_to_the_older_paths_and_names_bad_documents(serve: list[ScriptedServer]) -> None:
    """kvgate/reading/fleetread.py over this wire: every fact's GETs at once, the older path after a 404, and
    every bad answer a TransportError naming the URL, judged as `TargetClient.get_json` judges it."""
    info = {"disaggregation_mode": "prefill", "max_total_num_tokens": 8192, "version": "x", "max_req_input_len": 9}
    models = {"data": [{"id": "m", "max_model_len": 4096}]}

    def old_paths_only(req: Request, conn: socket.socket) -> None:
        doc = {"/get_server_info": info, "/v1/models": models, "/get_model_info": {"architectures": ["A"]}}
        got = doc.get(req.path)
        body = json.dumps(got).encode()
        conn.sendall(head(length=len(body)) + body if got is not None else head(404, length=0))

    old = _start(serve, old_paths_only)
    neither = _start(serve, _raw(head(404, length=0)))
    bad = _start(serve, _raw(head(length=3) + b"{x}"))
    twice = _start(serve, _raw(head(length=16) + b'{"a": 1, "a": 2}'))
    listed = _start(serve, _raw(head(length=2) + b"[]"))
    down = _start(serve, _raw(head(503, length=0)))
    moved = _start(serve, _raw(head(302, length=0, extra="Location: http://elsewhere/")))
    servers = [old, neither, bad, twice, listed, down, moved]
    specs = [NodeSpec("prefill", s.url, i) for i, s in enumerate(servers)]
    read = read_workers(specs, timeout=5, width=8, deadline=time.monotonic() + 30)
    got = {s.url: r for s, r in zip(servers, read, strict=True)}
    reading = got[old.url]
    assert isinstance(reading, NodeReading), reading
    assert (reading.role, reading.max_total_num_tokens, reading.context_length) == ("prefill", 8192, 4096)
    assert reading.info_path == "/get_server_info" and reading.architectures == ("A",)
    assert sorted(r.path for r in old.requests) == sorted(
        ["/server_info", "/get_server_info", "/v1/models", "/model_info", "/get_model_info"]
    )
    assert str(got[neither.url]) == f"{neither.url}: neither /server_info nor /get_server_info exists: " + (
        "not an SGLang worker?"
    )
    assert str(got[bad.url]).startswith(f"{bad.url}/server_info: malformed JSON")
    assert "duplicate key 'a'" in str(got[twice.url])
    assert str(got[listed.url]) == f"{listed.url}/server_info: expected a JSON object, got list"
    assert str(got[down.url]).startswith(f"{down.url}/server_info: HTTP 503")
    assert "redirect to 'http://elsewhere/', not followed" in str(got[moved.url])


def test_a_nan_in_a_document_is_not_a_change_every_pass() -> None:
    from kvgate.reading.node import parse_node

    def view(doc: str) -> fleetpass.FleetView:
        reading = parse_node(NodeSpec("prefill", "u"), "/server_info", json.loads(doc), None, None)
        return fleetpass.FleetView("ok", {}, {"u": fleetpass.WorkerView((), judged_facts(reading), None)})

    a, b = view('{"x": NaN, "max_total_num_tokens": 1}'), view('{"x": NaN, "max_total_num_tokens": 1}')
    assert fleetpass.changes(a, b) == []
    moved = fleetpass.changes(a, view('{"x": 2, "max_total_num_tokens": 1}'))
    assert [(m.fact, m.new) for m in moved] == [("flag x", 2)]


def test_a_name_is_resolved_and_each_of_its_addresses_tried(serve: list[ScriptedServer]) -> None:
    s = _start(serve, _raw(head(length=2) + b"{}"))  # listens on 127.0.0.1 only; localhost may say ::1 first
    port = s.url.rsplit(":", 1)[1]
    assert _read([f"http://localhost:{port}"]) == [Answer(200, b"{}")]
    (got,) = get_each(
        _each(["http://no-such-host.invalid:1"], "/x"), timeout=2, deadline=time.monotonic() + 2, width=1, body_cap=CAP
    )
    assert isinstance(got, Failure) and "unreachable: cannot resolve 'no-such-host.invalid'" in got.reason


def test_a_refused_first_address_falls_through_to_the_next(
    serve: list[ScriptedServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = _start(serve, _raw(head(length=2) + b"{}"))  # bound to 127.0.0.1: 127.0.0.2 refuses the same port
    real = socket.getaddrinfo

    def two_addresses(host: str, *a: object, **kw: object) -> list:
        if host != "two.test":
            return real(host, *a, **kw)  # type: ignore[arg-type]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, 0)) for ip in ("127.0.0.2", "127.0.0.1")]

    monkeypatch.setattr(socket, "getaddrinfo", two_addresses)
    port = s.url.rsplit(":", 1)[1]
    assert _read([f"http://two.test:{port}"]) == [Answer(200, b"{}")]
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        closed = free.getsockname()[1]
    assert _read([f"http://two.test:{closed}"]) == [
        Failure(f"http://two.test:{closed}/server_info: unreachable: ECONNREFUSED")
    ]


def test_a_connection_still_pending_is_waited_for_then_read() -> None:
    """A request is sent as soon as connect returns when the connection is already up; where it is
    not (here: a full accept queue drops the handshake until the server accepts), the reader waits
    for the connection instead of failing, and reads the answer once it comes."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(3):  # fill the accept queue: the next handshake stays unanswered until an accept
        f = socket.socket()
        f.setblocking(False)
        f.connect_ex(("127.0.0.1", port))
        fillers.append(f)
    time.sleep(0.2)
    got: list[Answer | Failure] = []
    reader = threading.Thread(target=lambda: got.extend(_read([f"http://127.0.0.1:{port}"], timeout=20.0)))
    reader.start()
    time.sleep(0.5)
    assert not got, "the reader must still be waiting for its connection"
    for f in fillers:  # their accepted ends then read as closed at once, not as a silence to wait out
        f.close()
    listener.settimeout(20.0)
    for _ in range(10):
        if not reader.is_alive():
            break
        conn, _ = listener.accept()
        conn.settimeout(10.0)
        try:
            data = conn.recv(65536)
        except OSError:  # a filler's late handshake, reset by its closed end
            data = b""
        if data.startswith(b"GET /server_info"):
            conn.sendall(head(length=2) + b"{}")
            reader.join(10.0)
        conn.close()
    reader.join(10.0)
    listener.close()
    assert got == [Answer(200, b"{}")]


def test_judged_facts_keys_are_the_known_ones_and_a_restart_is_a_change() -> None:
    """Every fixed key of judged_facts is listed (the watch's change counter starts each kind at 0), and
    a restart (startup times moved, nothing else) is a `process` change, never volatile."""
    from kvgate.reading.fleetread import JUDGED_KEYS
    from kvgate.reading.node import parse_node
    from tests.assets import sglang_payloads as P

    def read(started: float) -> NodeReading:
        info = P.server_info("0.5.22", mode="prefill", rank_pools=[4096, 4096])
        info["startup_time"] = started
        for state in info["internal_states"]:
            state["startup_time"] = started + 1
        return parse_node(NodeSpec("prefill", "u"), "/server_info", info, None, None)

    facts = judged_facts(read(1.0))
    fixed = {k for k in facts if not k.startswith(("dp0 ", "dp1 ", "problem ", "flag "))}
    assert fixed == set(JUDGED_KEYS), fixed ^ set(JUDGED_KEYS)
    assert facts["process"] == {"startup_time": 1.0, "ranks": [2.0, 2.0]}

    def view(r: NodeReading) -> fleetpass.FleetView:
        return fleetpass.FleetView("ok", {}, {"u": fleetpass.WorkerView((), judged_facts(r), None)})

    moved = fleetpass.changes(view(read(1.0)), view(read(5.0)))
    assert [(m.fact, m.kind) for m in moved] == [("process", "process")], moved


def test_the_bytes_in_flight_are_bounded_and_every_answer_still_arrives(serve: list[ScriptedServer]) -> None:
    """Eight 1 MiB answers under a 1 MiB budget: one answer is granted at a time, the others wait
    unread (their clocks stopped), and every answer arrives whole: no deadlock, nothing cut."""
    body = bytes(range(256)) * 4096

    def script(req: Request, conn: socket.socket) -> None:
        conn.sendall(head(length=len(body)) + body)

    s = _start(serve, script)
    got = get_each(
        _each([s.url] * 8, "/big"),
        timeout=20,
        deadline=time.monotonic() + 60,
        width=8,
        body_cap=2 << 20,
        inflight_bytes=1 << 20,
    )
    assert got == [Answer(200, body)] * 8


@pytest.mark.parametrize("was_on", [True, False])
def test_the_collector_is_off_only_during_a_read_and_as_it_was_after(serve: list[ScriptedServer], was_on: bool) -> None:
    """The fleet reader holds off cyclic collections while it reads (kvgate/reading/fleetread.py): during the read
    the collector is off, after it the process's setting is what it was, a failed read included."""
    import gc

    seen: list[bool] = []

    def answer(req: Request, conn: socket.socket) -> None:
        body = b"{}"
        conn.sendall(head(length=len(body)) + body)

    s = _start(serve, answer)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{free.getsockname()[1]}"
    specs = [NodeSpec("prefill", s.url, 0), NodeSpec("decode", refused, 1)]
    (gc.enable if was_on else gc.disable)()
    try:
        read = read_workers(
            specs, timeout=5, width=8, deadline=time.monotonic() + 30, on_done=lambda: seen.append(gc.isenabled())
        )
        after = gc.isenabled()
    finally:
        gc.enable()
    assert seen == [False, False] and after is was_on
    assert isinstance(read[1], TransportError) and "unreachable" in str(read[1])
