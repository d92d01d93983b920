"""Sending sentinel-carrying requests and scanning every answer for foreign sentinels."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kvgate.gates.probes.client import GenerateClient, ProbeResult
from kvgate.gates.probes.cost import CostMeter
from kvgate.gates.probes.plan import ACCEPT, LengthProbe
from kvgate.gates.probes.sentinels import (
    Sentinel,
    Sighting,
    TokenCodec,
    TokenSpaceCodec,
    new_sentinel,
    plant_ids,
    scan,
)
from kvgate.output.progress import Observer


@dataclass(frozen=True)
class Sent:
    """One request of this run: its probe, where it ran, its sentinel and what came back."""

    probe: LengthProbe
    phase: str
    sentinel: Sentinel
    result: ProbeResult

    @property
    def label(self) -> str:
        return f"{self.probe.label} [{self.phase}]"


@dataclass
class Sender:
    """Builds dense sentinel prompts, sends them (concurrently when asked), keeps the sentinel book."""

    client: GenerateClient
    codec: TokenCodec
    meter: CostMeter
    observer: Observer
    run_id: str = field(default_factory=lambda: secrets.token_hex(4))
    book: list[Sentinel] = field(default_factory=list)
    sent: list[Sent] = field(default_factory=list)
    rids: dict[str, list[str]] = field(default_factory=dict)
    transport_failures: int = 0
    #: after this many accepted-length requests in a row got no answer at all before their deadline,
    #: send nothing more (0: never stop); `stalled` then says why
    stall_after: int = 0
    stalled: str | None = None
    _unanswered: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def sentinel(self, owner: str) -> Sentinel:
        s = new_sentinel(owner)
        with self._lock:
            self.book.append(s)
        return s

    def rid(self, probe: LengthProbe, phase: str) -> str:
        return f"kvgate-{self.run_id}-{phase}-{probe.name}-{secrets.token_hex(3)}"

    def one(
        self,
        probe: LengthProbe,
        phase: str,
        *,
        cancel_after_s: float | None = None,
        stream: bool = False,
        sentinel: Sentinel | None = None,
        top_logprobs: int = 0,
        on_send: Callable[[], None] | None = None,
        deadline_s: float | None = None,
    ) -> Sent:
        """Send one probe carrying a sentinel densely (every token belongs to a sentinel copy): a fresh
        one, or `sentinel` again (the same length then sends the very same ids). `on_send` is called once
        the ids are built and the rid is registered, right before the request goes out: building them may
        ask the server's tokenizer (`ServerCodec`), which a busy worker answers late. `deadline_s`: this
        request's own deadline instead of the client's (a long prompt under a soak's load)."""
        s = sentinel or self.sentinel(f"{probe.label} [{phase}]")
        if self.stalled is not None:
            rec = Sent(
                probe,
                phase,
                s,
                ProbeResult(
                    probe.name, probe.length, probe.max_new_tokens, None, 0.0, stream=stream, not_sent=self.stalled
                ),
            )
            with self._lock:
                self.sent.append(rec)
            return rec
        ids = plant_ids(self.codec, s, probe.length)
        rid = self.rid(probe, phase)
        with self._lock:
            self.rids.setdefault(phase, []).append(rid)
        if on_send is not None:
            on_send()
        res = self.client.generate(
            probe.name,
            ids,
            probe.max_new_tokens,
            rid=rid,
            cancel_after_s=cancel_after_s,
            stream=stream,
            **({"top_logprobs": top_logprobs} if top_logprobs else {}),
            **_deadline(deadline_s),
        )
        del ids
        self.meter.add(res, accepted_length=probe.expect == ACCEPT)
        rec = Sent(probe, phase, s, res)
        with self._lock:
            self.sent.append(rec)
            if res.transport_error is not None:
                self.transport_failures += 1
            if probe.expect == ACCEPT and cancel_after_s is None:
                self._note_answer(res)
        return rec

    def send_ids(
        self,
        name: str,
        ids: list[int],
        max_new_tokens: int,
        phase: str,
        top_logprobs: int = 0,
        rid: str | None = None,
    ) -> ProbeResult:
        """Send an accepted-length prompt of the caller's own ids (no sentinel), metered like the rest; once
        the deployment stopped answering (`stalled`), not sent, as `one` does. `rid`: the caller's own."""
        with self._lock:
            if self.stalled is not None:
                return ProbeResult(name, len(ids), max_new_tokens, None, 0.0, not_sent=self.stalled)
            rid = rid or f"kvgate-{self.run_id}-{phase}-{name}-{secrets.token_hex(3)}"
            self.rids.setdefault(phase, []).append(rid)
        res = self.client.generate(name, ids, max_new_tokens, rid=rid, top_logprobs=top_logprobs)
        self.meter.add(res, accepted_length=True)
        with self._lock:
            if res.transport_error is not None:
                self.transport_failures += 1
            self._note_answer(res)
        return res

    def _note_answer(self, res: ProbeResult) -> None:
        """Count accepted-length requests left unanswered in a row (caller holds the lock). A decode that
        holds a hung request's reservation, or a wedged worker, leaves every later request waiting out
        its whole deadline: past `stall_after` of them nothing more is sent."""
        if res.timed_out and not res.generated:
            self._unanswered += 1
        elif res.status is not None:
            self._unanswered = 0
        if self.stall_after and self._unanswered >= self.stall_after and self.stalled is None:
            self.stalled = (
                f"{self._unanswered} accepted-length requests in a row got no answer within the "
                f"{self.client.deadline_s:g} s probe deadline"
            )

    def pending_rids(self, phase: str) -> list[str]:
        """Request ids sent (or being sent) in `phase`."""
        with self._lock:
            return list(self.rids.get(phase, []))

    def many(
        self, probes: Sequence[LengthProbe], phase: str, description: str, streamed: Sequence[LengthProbe] = ()
    ) -> list[Sent]:
        """Send all probes at once (concurrent tenants), `streamed` ones as streaming requests too;
        progress advances per answer."""
        out: list[Sent] = []
        jobs = [(p, phase, False) for p in probes] + [(p, f"{phase}-stream", True) for p in streamed]
        with self.observer.step(description, total=len(jobs)) as handle:
            with ThreadPoolExecutor(max_workers=max(1, min(64, len(jobs)))) as pool:
                futures = [pool.submit(self.one, p, ph, stream=st) for p, ph, st in jobs]
                for f in futures:
                    out.append(f.result())
                    handle.advance(1)
        return out

    def readable(self, res: ProbeResult) -> str:
        """The generated text of an answer: its `text`, else its `output_ids` decoded when this codec can
        decode ids locally (the simulator's bytes), else "" (ids only: nothing a sentinel can be read in).
        In token space the ids are what the sentinels were planted as: they are read whatever the text."""
        ids = res.output_ids
        if isinstance(self.codec, TokenSpaceCodec):
            return "\n".join(x for x in (res.text, self.codec.decode(ids or [])) if x)
        if res.text:
            return res.text
        decode = getattr(self.codec, "decode", None)
        return decode(ids) if decode is not None and ids else ""

    def sightings(self, records: Sequence[Sent]) -> list[Sighting]:
        """Foreign sentinels in the given answers (against every sentinel of this run so far): in the
        generated text and in the whole raw body (error messages can carry content too)."""
        with self._lock:
            book = list(self.book)
        out: list[Sighting] = []
        for r in records:
            out.extend(scan(r.label, r.sentinel, r.result.searchable + "\n" + self.readable(r.result), book))
        return out


def _deadline(deadline_s: float | None) -> dict[str, Any]:
    """The generate keyword for a request's own deadline, only when it has one."""
    return {} if deadline_s is None else {"deadline_s": deadline_s}
