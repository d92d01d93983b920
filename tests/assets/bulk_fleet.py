"""A whole fleet and its router in one process, for memory and cost measurements over real sockets.

`python -m tests.assets.bulk_fleet --workers N --pad BYTES` listens on one loopback port and prints
it. Worker i lives under the path `/w{i}` (its URL `http://127.0.0.1:PORT/w{i}`), half prefill, half
decode, each answering `/server_info`, `/v1/models` and `/model_info` with SGLang's shapes
(tests/assets/sglang_payloads.py); the root answers smg's `/workers` and `/readiness`. With `--pad`,
every server_info carries a `padding` key of that many bytes (a worker answering near kvgate's
16 MiB cap: the pad is one shared buffer, sent by reference, so the host stays small however large
the fleet's answers). One thread, non-blocking sockets: thousands of connections at once.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import socket
import subprocess
import sys
from pathlib import Path

from tests.assets import router_payloads as R
from tests.assets import sglang_payloads as P

POOL = 2_040_000
#: a server_info this close to kvgate's 16 MiB metadata cap (its JSON around the padding takes the rest)
NEAR_CAP = (16 << 20) - 80_000
ROOT = Path(__file__).resolve().parents[2]


def _answer(body: list[bytes | memoryview]) -> list[memoryview]:
    size = sum(len(b) for b in body)
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n"
    return [memoryview(head.encode())] + [memoryview(b) for b in body]


def build(workers: int, pad: int, port: int) -> dict[str, list[bytes | memoryview]]:
    """path -> the body's pieces."""
    shared = memoryview(b"x" * pad)
    out: dict[str, list[bytes | memoryview]] = {}
    entries = []
    for i in range(workers):
        mode = "prefill" if i < max(1, workers // 2) else "decode"
        info = P.server_info("0.5.22", mode=mode, pool=POOL)
        info["port"] = 40_000 + i
        info["startup_time"] = 1_760_000_000.0 + i
        base = f"/w{i}"
        if pad:
            text = json.dumps(info)
            out[base + "/server_info"] = [(text[:-1] + ', "padding": "').encode(), shared, b'"}']
        else:
            out[base + "/server_info"] = [json.dumps(info).encode()]
        out[base + "/v1/models"] = [json.dumps(P.v1_models()).encode()]
        out[base + "/model_info"] = [json.dumps(P.model_info("0.5.22", mode)).encode()]
        url = f"http://127.0.0.1:{port}{base}"
        entries.append(R.smg_entry(url, mode, bootstrap_port=8998) if mode == "prefill" else R.smg_entry(url, mode))
    out["/workers"] = [json.dumps(R.smg_workers(*entries)).encode()]
    out["/readiness"] = [b'{"status": "ready"}']
    return out


def serve(workers: int, pad: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4096)
    lsock.setblocking(False)
    port = lsock.getsockname()[1]
    bodies = build(workers, pad, port)
    missing = _answer([b'{"detail": "Not Found"}'])
    missing[0] = memoryview(bytes(missing[0]).replace(b"200 OK", b"404 Not Found"))
    sel = selectors.DefaultSelector()
    sel.register(lsock, selectors.EVENT_READ, None)
    state: dict[socket.socket, list] = {}  # type: ignore[type-arg]
    print(port, flush=True)
    while True:
        for key, _ in sel.select():
            if key.data is None:
                try:
                    conn, _ = lsock.accept()
                except BlockingIOError:
                    continue
                conn.setblocking(False)
                state[conn] = [bytearray(), None]
                sel.register(conn, selectors.EVENT_READ, "read")
                continue
            conn = key.fileobj  # type: ignore[assignment]
            st = state[conn]
            try:
                if st[1] is None:
                    data = conn.recv(65536)
                    if not data:
                        raise ConnectionError
                    st[0] += data
                    if b"\r\n\r\n" not in st[0]:
                        continue
                    path = bytes(st[0]).split(b" ", 2)[1].decode()
                    st[1] = list(_answer(bodies[path])) if path in bodies else list(missing)
                    sel.modify(conn, selectors.EVENT_WRITE, "write")
                while st[1]:
                    sent = conn.send(st[1][0])
                    if sent < len(st[1][0]):
                        st[1][0] = st[1][0][sent:]
                        break
                    st[1].pop(0)
                if not st[1]:
                    raise ConnectionError
            except BlockingIOError:
                continue
            except OSError:
                sel.unregister(conn)
                conn.close()
                del state[conn]


def peak_rss_of_check(workers: int, pad: int) -> tuple[int, int, str]:
    """(exit status, peak RSS in bytes, stderr tail) of `kvgate check --no-probes` over a bulk fleet."""
    host = subprocess.Popen(
        [sys.executable, "-m", "tests.assets.bulk_fleet", "--workers", str(workers), "--pad", str(pad)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert host.stdout is not None
        port = int(host.stdout.readline())
        argv = [
            str(Path(sys.executable).with_name("kvgate")),
            "check",
            "--quiet",
            "--router-url",
            f"http://127.0.0.1:{port}",
            "--no-probes",
            "--trust-version",
            "--deferred-release",
            "--timeout",
            "120",
            "--read-deadline",
            "3000",
            "--format",
            "json",
            "--output",
            os.devnull,
        ]
        child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert child.stderr is not None
        err = child.stderr.read()  # read before waiting: a full pipe must not stall the child
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        return child.returncode, usage.ru_maxrss * 1024, err.decode(errors="replace")[-2000:]
    finally:
        host.terminate()
        host.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--pad", type=int, default=0)
    args = ap.parse_args(argv)
    serve(args.workers, args.pad)
    return 0


if __name__ == "__main__":
    sys.exit(main())
