"""Wall time of one 1,048,000-token PD request end to end through the simulator and the real router.

Deployment: context 1,048,576, prefill and decode pools 2,097,152 tokens (the incident's fix: a pool
about twice the context), page size 16, prefill compute set to "instant" so the number measures the
simulator's own overhead: HTTP + JSON of a 1M-token body through smg to both workers, tokenizer and
admission checks, a 1M-token write into the prefill pool, the KV transfer of 65,500 pages over the
loopback bootstrap socket, decode commit, and attention over the whole reservation.

Floor (defined honestly): the time this machine needs just to move the request body through the
same path without any simulation: json-encode the 1M ids once, POST it to a trivial local HTTP
sink twice in parallel (prefill and decode each receive a copy), and json-decode it on the receiving
side. Nothing can be faster than that on the same stack; the ratio says how much the simulator adds.

    .venv/bin/python bench/sim_1m_request.py [--text] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

from kvgate.sim.deploy import SimDeployment

CONTEXT = 1_048_576
POOL = 2_097_152
PROMPT = 1_048_000
GOAL_S = 2.0


def _floor(body: bytes) -> float:
    """POST the same body to a local sink that json-decodes it, twice concurrently."""

    class Sink(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            data = self.rfile.read(int(self.headers["Content-Length"]))
            json.loads(data)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/"
    t0 = time.perf_counter()
    threads = [
        threading.Thread(target=httpx.post, args=(url,), kwargs={"content": body, "timeout": 60}) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    srv.shutdown()
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--text", action="store_true", help="send a text prompt instead of input_ids")
    ap.add_argument("--emulate", default="0.5.22")
    args = ap.parse_args()

    if args.text:
        payload = {"text": ("kvgate-bench line\n" * (PROMPT // 18 + 1))[:PROMPT]}
    else:
        payload = {"input_ids": [ord("a") + (i % 26) if i % 64 else 10 for i in range(PROMPT)]}
    payload["sampling_params"] = {"max_new_tokens": 16}
    t_encode = time.perf_counter()
    body = json.dumps(payload).encode()
    t_encode = time.perf_counter() - t_encode

    floors = [t_encode + _floor(body) for _ in range(args.runs)]
    with SimDeployment(
        emulate=args.emulate,
        context_length=CONTEXT,
        prefill_pool=POOL,
        decode_pool=POOL,
        page_size=16,
        prefill_tokens_per_s=0,
    ) as dep:
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            r = httpx.post(
                dep.router_url + "/generate",
                content=json.dumps(payload).encode(),
                headers={"Content-Type": "application/json"},
                timeout=120,
            )
            times.append(time.perf_counter() - t0)
            r.raise_for_status()
            meta = r.json()["meta_info"]
            assert meta["prompt_tokens"] == PROMPT, meta
    best, floor = min(times), min(floors)
    print(f"1M-token PD request ({PROMPT} tokens, {len(body) / 1e6:.1f} MB body, emulate {args.emulate}):")
    print(
        f"  end to end through smg: best {best:.3f} s, median {statistics.median(times):.3f} s "
        f"(goal < {GOAL_S:.1f} s: {'met' if best < GOAL_S else 'NOT met'})"
    )
    print(f"  floor (encode + 2 parallel POSTs to a json-decoding sink): {floor:.3f} s")
    print(f"  ratio to floor: {best / floor:.2f}x")


if __name__ == "__main__":
    main()
