"""Issue 30, case 7, end to end: the real `kvgate watch` process never decodes a gzip bomb.

The router's /generate (the path of the watch's scheduled probes) answers every request with about
1 MiB of gzip that decodes to 1 GiB. The watch runs as its own process over real loopback sockets,
probes on (scheduled probes are planned after every full gate, passed or not). What it must do: send
its scheduled probes (the router sees them, told apart by their `-watch-` request id), refuse each
compressed answer unread (a probe failure in /metrics and a log line naming the compressed answer),
keep answering /verdict, stay up, and keep its peak RSS (VmHWM) far below the bomb.
"""

from __future__ import annotations

import json
import socket
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

from kvgate.exitcodes import ExitStatus
from tests.assets import router_payloads as RP
from tests.assets import sglang_payloads as P
from tests.conftest import PayloadServer, Route
from tests.hostile.net_servers import Request, ScriptedServer, head
from tests.watch.helpers import WatchProcess

MIB = 1 << 20
#: what the bomb decodes to
DECODED = 1 << 30
#: the watch's peak RSS bound: a quarter of the decoded size (an httpx that decoded the answer would
#: hold at least the whole GiB; the watch itself needs well under 200 MiB)
RSS_BOUND = DECODED // 4
GATE_S = 240.0  # a bound on the first full gate plus a scheduled probe on a busy machine (a wait)
OPTS = ["--trust-version", "--no-strict", "--deferred-release", "--interval", "2"]


def gzip_of_zeros(mib: int) -> bytes:
    """A gzip member holding `mib` MiB of zeros, built from one fully flushed deflate piece repeated
    (each full flush resets the window, so every MiB compresses to the very same bytes)."""
    zeros = bytes(MIB)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    piece = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    assert c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH) == piece
    crc = 0
    for _ in range(mib):
        crc = zlib.crc32(zeros, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    return header + piece * mib + c.flush() + struct.pack("<II", crc, (mib * MIB) & 0xFFFFFFFF)


def test_gzip_of_zeros_is_what_it_says() -> None:
    small = gzip_of_zeros(3)
    d = zlib.decompressobj(31)
    assert d.decompress(small) == bytes(3 * MIB) and d.eof  # CRC and size checked by zlib


def vm_hwm(pid: int) -> int:
    """Peak resident set of `pid`, in bytes (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def failures(w: WatchProcess) -> float:
    """kvgate_probe_failures_total summed over prompt lengths (0 while unreadable)."""
    res = w.get("/metrics")
    if res is None:
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in res.text.splitlines()
        if line.startswith("kvgate_probe_failures_total{")
    )


def test_7_the_real_watch_refuses_a_gzip_bomb_from_its_scheduled_probes(
    payload_server: Callable[..., PayloadServer], tmp_path: Path
) -> None:
    bomb = gzip_of_zeros(DECODED // MIB)
    assert len(bomb) < 2 * MIB

    def worker(mode: str) -> PayloadServer:
        return payload_server(
            {
                "/server_info": Route(P.server_info("0.5.22", mode=mode, pool=2_040_000)),
                "/v1/models": Route(P.v1_models(1_048_576)),
                "/model_info": Route(P.model_info("0.5.22", mode)),
            }
        )

    prefill, decode = worker("prefill"), worker("decode")
    listing = json.dumps(RP.smg_workers(RP.smg_entry(prefill.url, "prefill"), RP.smg_entry(decode.url, "decode")))

    def router(req: Request, conn: socket.socket) -> None:
        path = req.path.split("?", 1)[0]
        if path == "/generate":
            conn.sendall(head(length=len(bomb), extra="Content-Encoding: gzip") + bomb)
        elif path == "/workers":
            conn.sendall(head(length=len(listing)) + listing.encode())
        elif path == "/readiness":
            conn.sendall(head(length=19) + b'{"status": "ready"}')
        else:
            conn.sendall(head(404, length=2) + b"{}")

    srv = ScriptedServer(router).start()

    def scheduled() -> list[str]:
        rids = []
        for r in list(srv.requests):
            if r.path.startswith("/generate"):
                try:
                    rid = r.json().get("rid", "")
                except ValueError:
                    continue
                if "-watch-watch_" in rid:
                    rids.append(rid)
        return rids

    w = WatchProcess(["--router-url", srv.url, *OPTS], tmp_path / "watch.log")
    try:
        # The scheduled probes ran (the router saw them) and each came back a failure, twice over
        # (the one-page and the long bucket), with the watch still up (wait asserts it each turn).
        w.wait(lambda: len(scheduled()) >= 2 and failures(w) >= 2, GATE_S, "two failed scheduled probes")
        assert {rid.split("-watch-")[1].rsplit("-", 1)[0] for rid in scheduled()} >= {"watch_one_page", "watch_long"}
        verdict = w.get("/verdict")
        assert verdict is not None and verdict.status_code in (200, 503), verdict
        assert "passed" in verdict.json()
        # Why a scheduled probe failed is said (the full gate's own probe findings say it too: this
        # line is the scheduled probe's, naming the refused compressed answer).
        said = [ln for ln in w.log().splitlines() if "scheduled one_page probe not served:" in ln]
        assert said and "compressed (Content-Encoding 'gzip')" in said[0], w.log()
        peak = vm_hwm(w.proc.pid)
        assert peak < RSS_BOUND, f"peak RSS {peak / MIB:.0f} MiB, against a {DECODED // MIB} MiB bomb"
        assert w.proc.poll() is None, w.log()
    finally:
        code = w.terminate()
        srv.stop()
    assert code == ExitStatus.PASSED, w.log()
    assert "Traceback" not in w.log(), w.log()
