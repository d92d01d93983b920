"""The soak's load: sentinel prompts of the profile's length mix, streamed, at a concurrency or a rate.

Every load request is a canary too: its prompt is a fresh sentinel planted densely (the watch's and the
gate's own prompts, kvgate.gates.probes.canary.Sender), and its answer is searched for any other
request's sentinel. A share of the requests is dropped by the client shortly after it was sent
(mid-prefill or mid-transfer): the cancellations that leave pages behind in the faulty releases.
Each request is measured as a streamed answer: time to the first token, inter-token latency
((e2e - ttft) / (tokens - 1)), end to end.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from kvgate.gates.probes.canary import Sender
from kvgate.gates.probes.client import GenerateClient
from kvgate.gates.probes.cost import CostMeter
from kvgate.gates.probes.plan import ACCEPT, LengthProbe, ProbeLimits, max_new_tokens_for
from kvgate.gates.probes.sentinels import Sentinel, TokenCodec, owners
from kvgate.gates.probes.under_load import corruption_message
from kvgate.output.progress import NullObserver
from kvgate.output.redact import clip
from kvgate.soak.settings import LONG, MEDIUM, NEAR_LIMIT, SHORT, SoakSettings

#: sentinels of the previous slice a new slice's book starts with (older ones are still caught as
#: whole delimited sentinels of an unknown request)
CARRY_BOOK = 64
#: the most recent sentinels an answer is searched for whole or in part (a leak comes from a request in
#: flight or just finished; any older one is still caught whole); the client's cost per answer stays flat
BOOK = 256


@dataclass(frozen=True)
class RequestRecord:
    """One load request: when it started (seconds since the run began), its slice, what it was, how it went."""

    index: int
    slice: int
    bucket: str
    length: int
    sentinel: str  # the request's own sentinel: what names it in a sighting
    start_s: float
    cancelled: bool
    served: bool
    status: int | None
    error: str | None
    ttft_s: float | None
    e2e_s: float
    tokens: int
    leaks: tuple[str, ...] = ()
    corruption: str | None = None
    #: streamed and measured; False for a request sent to be cancelled (plain, no first-token time),
    #: which counts in the load and the error rate even when it was answered before the cancel
    streamed: bool = True  # the server's own corruption abort (the #17430 room check's message)

    @property
    def itl_s(self) -> float | None:
        if not self.served or self.ttft_s is None or self.tokens < 2:
            return None
        return max(0.0, self.e2e_s - self.ttft_s) / (self.tokens - 1)


def bucket_lengths(limits: ProbeLimits) -> dict[str, int]:
    """Prompt length of each bucket, planned against the deployment's own limits (never over the longest
    accepted prompt: the soak judges service, not the rejection contract, which `check` gates)."""
    top = limits.longest_accepted
    one = min(limits.one_page, top)
    return {
        SHORT: one,
        MEDIUM: max(one, top // 8),
        LONG: max(one, top // 2),
        NEAR_LIMIT: top,
    }


class Load:
    """Drives the load until `stop` is set; every finished request goes to `record` (thread-safe sink)."""

    def __init__(
        self,
        http: httpx.Client,
        router: str,
        limits: ProbeLimits,
        codec: TokenCodec,
        settings: SoakSettings,
        deadline_s: float,
        record: Callable[[RequestRecord], None],
        seed: int = 0,
        allowance_s: Callable[[int], float | None] = lambda _length: None,
    ) -> None:
        self.client = GenerateClient(http, router, deadline_s)
        self.limits = limits
        self.codec = codec
        self.settings = settings
        self.record = record
        #: a request's prefill allowance (slo.Allowance.extra_s): its deadline is the probe deadline plus
        #: that, or a healthy 1M-token prompt sharing the prefill would be called a hang
        self.allowance_s = allowance_s
        self.lengths = bucket_lengths(limits)
        mix = {b: s for b, s in settings.mix.items() if s > 0}
        self._buckets = list(mix)
        self._weights = [mix[b] for b in self._buckets]
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._senders: dict[int, Sender] = {}
        self._count = 0
        self._next_slot = 0.0
        self.t0 = time.monotonic()
        #: why the load stopped on kvgate's own error (None: it did not)
        self.crashed: str | None = None

    # -- pacing -------------------------------------------------------------------------------

    def level(self, now: float) -> float:
        """The share of the full load at `now` (seconds since the start): the ramp, then 1."""
        ramp = self.settings.ramp_s
        return 1.0 if ramp <= 0 else min(1.0, max(0.1, now / ramp))

    def _allowed(self, worker: int, now: float) -> bool:
        """Closed loop: worker `worker` runs once the ramp lets that many requests be in flight."""
        return worker < max(1, math.ceil(self.settings.concurrency * self.level(now)))

    def _slot(self, now: float) -> float:
        """Open loop: the start time of the next request (each slot 1 / the ramped rate after the last)."""
        rate = self.settings.rate_per_s or 1.0
        with self._lock:
            at = max(self._next_slot, now - 1.0 / rate)  # a late client does not burst to catch up
            self._next_slot = at + 1.0 / (rate * self.level(at))
        return at

    # -- requests -------------------------------------------------------------------------------

    def sender(self, index: int) -> Sender:
        """The slice's sender: its own sentinel book, started with the previous slice's last sentinels."""
        with self._lock:
            s = self._senders.get(index)
            if s is None:
                prev = self._senders.pop(index - 1, None)
                carry: list[Sentinel] = prev.book[-CARRY_BOOK:] if prev else []
                s = Sender(self.client, self.codec, CostMeter(context=self.limits.context), NullObserver(), book=carry)
                self._senders[index] = s
            return s

    def _pick(self) -> tuple[int, str, bool]:
        with self._lock:
            self._count += 1
            bucket = self._rng.choices(self._buckets, self._weights)[0]
            cancel = self._rng.random() < self.settings.cancel_share
            return self._count, bucket, cancel

    def one(self, slice_index: int, start_s: float) -> RequestRecord:
        """Send one request of the mix and measure it."""
        n, bucket, cancel = self._pick()
        length = self.lengths[bucket]
        new = max_new_tokens_for(self.limits, length, self.settings.max_new_tokens)
        probe = LengthProbe(f"soak_{bucket}", length, ACCEPT, "none", f"soak {bucket} request", new)
        sender = self.sender(slice_index)
        phase = f"soak-s{slice_index + 1}"
        if cancel:
            rec = sender.one(probe, phase, cancel_after_s=self.settings.cancel_after_s)
        else:
            deadline = self.client.deadline_s + (self.allowance_s(length) or 0.0)
            rec = sender.one(probe, phase, stream=True, deadline_s=deadline)
        res = rec.result
        leaks = tuple(owners(sender.sightings([rec])))
        if len(sender.book) > 2 * BOOK:  # one slice-deletion each: atomic under the GIL
            del sender.book[:-BOOK]
        if len(sender.sent) > BOOK:
            del sender.sent[:-BOOK]
            sender.rids.clear()
        ids = res.output_ids
        ct = res.meta.get("completion_tokens")
        tokens = len(ids) if ids is not None else (ct if isinstance(ct, int) and not isinstance(ct, bool) else 0)
        error = None
        if not res.served and not res.cancelled:
            error = res.transport_error or f"HTTP {res.status}: {clip(res.raw, 160)}"
            if res.timed_out:
                error = f"no answer within the {res.deadline_s or self.client.deadline_s:g} s deadline"
        return RequestRecord(
            n,
            slice_index,
            bucket,
            length,
            rec.sentinel.text,
            round(start_s, 4),
            res.cancelled,
            res.served,
            res.status,
            error,
            res.ttft_s,
            res.elapsed_s,
            tokens,
            leaks,
            corruption_message(res),
            streamed=not cancel,
        )

    def run(self, stop: threading.Event, slice_of: Callable[[float], int]) -> None:
        """Drive until `stop`: `concurrency` threads, each sending one request at a time."""
        threads = [
            threading.Thread(target=self._worker, args=(i, stop, slice_of), name=f"soak-load-{i}", daemon=True)
            for i in range(self.settings.concurrency)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _worker(self, i: int, stop: threading.Event, slice_of: Callable[[float], int]) -> None:
        while not stop.is_set():
            now = time.monotonic() - self.t0
            if self.settings.rate_per_s is not None:
                at = self._slot(now)
                if stop.wait(max(0.0, at - now)):
                    return
                now = time.monotonic() - self.t0
            elif not self._allowed(i, now):
                stop.wait(0.05)
                continue
            try:
                self.record(self.one(slice_of(now), now))
            except Exception as exc:  # noqa: BLE001 - kvgate's own bug: the run must not pass on less load
                self.crashed = self.crashed or f"{type(exc).__name__}: {exc}"
                stop.set()
                return
