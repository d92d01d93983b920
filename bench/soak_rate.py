"""The soak's client is never the bottleneck: its achieved request rate against a bare loop of the same
requests, side by side in one run, against the simulator on this machine (goal: the soak at 0.9x the
bare loop or better), with the client's own CPU.

Both drive the same simulated 1P1D deployment (real worker processes behind the real router) with the
same concurrency, the same prompt-length mix (the same seeded sequence of buckets and lengths), the
same answer length, streamed. The soak side is kvgate's own load driver (kvgate/soak/load.py: a fresh
sentinel planted in every prompt, every answer searched, every request measured); the bare loop posts
prompts built before it starts and reads each stream to its end, nothing else. No cancellations on
either side (a cancelled request is not a rate). The phases alternate (soak, bare, soak, bare) so
that drift of the machine falls on both; the ratio is of the totals. Client CPU is this process's
(the workers and the router run in their own processes).

    .venv/bin/python bench/soak_rate.py [--seconds 15] [--concurrency 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from dataclasses import replace

import httpx

from kvgate.gates.probes.codec_select import select_codec
from kvgate.gates.probes.plan import limits_from_readings, max_new_tokens_for
from kvgate.gates.probes.settings import ProbeSettings
from kvgate.sim.deploy import SimDeployment
from kvgate.soak.load import Load, bucket_lengths
from kvgate.soak.settings import SoakSettings
from kvgate.watch.fleetpass import read_fleet

GOAL = 0.9


def soak_phase(load: Load, seconds: float) -> tuple[int, float, float]:
    """Requests finished, wall seconds and client CPU seconds of the soak's own driver."""
    done: list[int] = []
    load.record = lambda r: done.append(1)
    stop = threading.Event()
    cpu, t = time.process_time(), time.monotonic()
    load.t0 = t
    runner = threading.Thread(target=load.run, args=(stop, lambda _t: 0))
    runner.start()
    time.sleep(seconds)
    stop.set()
    runner.join()
    return len(done), time.monotonic() - t, time.process_time() - cpu


def bare_phase(
    router: str, bodies: list[bytes], concurrency: int, seconds: float, deadline: float
) -> tuple[int, float, float]:
    """The same requests in a bare loop: post, read the stream to its end, count."""
    http = httpx.Client(timeout=deadline)
    url = router.rstrip("/") + "/generate"
    done = [0]
    lock = threading.Lock()
    stop = threading.Event()

    def worker(i: int) -> None:
        n = i
        while not stop.is_set():
            with http.stream(
                "POST", url, content=bodies[n % len(bodies)], headers={"Content-Type": "application/json"}
            ) as r:
                for _ in r.iter_raw():
                    pass
            n += concurrency
            with lock:
                done[0] += 1

    cpu, t = time.process_time(), time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for th in threads:
        th.start()
    time.sleep(seconds)
    stop.set()
    for th in threads:
        th.join()
    http.close()
    return done[0], time.monotonic() - t, time.process_time() - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=15.0, help="seconds per phase")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    settings = replace(SoakSettings(), concurrency=a.concurrency, ramp_s=0.0, cancel_share=0.0)
    probe = ProbeSettings()
    with SimDeployment(
        emulate="0.5.23", context_length=4096, prefill_pool=16384, decode_pool=16384, page_size=16
    ) as dep:
        assert dep.router_url is not None
        http = httpx.Client(timeout=30)
        snap = read_fleet(dep.router_url, timeout=10, token=None, concurrency=8, deadline_s=30)
        readings = list(snap.readings.values())
        limits, problems = limits_from_readings(readings)
        assert limits is not None, problems
        codec, how = select_codec(http, readings, probe)
        assert codec is not None, how
        load = Load(http, dep.router_url, limits, codec, settings, probe.deadline_s, lambda r: None, seed=7)
        # the bare loop's requests: the same seeded bucket sequence, prompts built before it starts
        rng = random.Random(7)
        lengths = bucket_lengths(limits)
        buckets = list(settings.mix)
        bodies = []
        for i in range(512):
            b = rng.choices(buckets, [settings.mix[k] for k in buckets])[0]
            n = lengths[b]
            ids = [(i * 7 + j) % 200 + 32 for j in range(n)]
            new = max_new_tokens_for(limits, n, settings.max_new_tokens)
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new, "temperature": 0.0}, "stream": True}
            bodies.append(json.dumps(body).encode())
        totals = {"soak": [0, 0.0, 0.0], "bare": [0, 0.0, 0.0]}
        for r in range(a.rounds):
            for name in ("soak", "bare"):
                if name == "soak":
                    got = soak_phase(load, a.seconds)
                else:
                    got = bare_phase(dep.router_url, bodies, a.concurrency, a.seconds, probe.deadline_s)
                for k in range(3):
                    totals[name][k] += got[k]
                print(f"round {r + 1} {name:4}: {got[0] / got[1]:7.1f} requests/s, client CPU {got[2] / got[1]:.0%}")
        http.close()
    rate = {k: v[0] / v[1] for k, v in totals.items()}
    cpu = {k: v[2] / v[1] for k, v in totals.items()}
    ratio = rate["soak"] / rate["bare"]
    print(
        f"concurrency {a.concurrency}, mix {dict(settings.mix)}, lengths {lengths}, {a.rounds} x {a.seconds:g} s each"
    )
    print(f"bare loop : {rate['bare']:.1f} requests/s, client CPU {cpu['bare']:.0%} of one core")
    print(f"soak load : {rate['soak']:.1f} requests/s, client CPU {cpu['soak']:.0%} of one core")
    print(f"ratio soak/bare = {ratio:.2f}x (goal >= {GOAL}x): {'met' if ratio >= GOAL else 'NOT met'}")


if __name__ == "__main__":
    main()
