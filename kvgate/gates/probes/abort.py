"""Abort mid-transfer (gate 4, dynamic; incident.md section 4, item 4).

Start a long request carrying its sentinel densely, cancel it while its KV is in flight, and at once
send canary requests sized to take over the pages it held. With decode-side release before in-flight
writes drain (deferred release off), the late writes land in the canaries' pages and a canary answers
with the cancelled request's content. None may.

The cancel is SGLang's `POST /abort_request {"rid"}` on every decode worker: a decode-initiated abort,
the case deferred release exists for (the router forwards `rid` unchanged). Without decode URLs it
falls back to the client's disconnect, which a router may or may not propagate. When the transfer is in flight
is estimated from the latency probe (median latencies interpolated to the abort length); attempts
cancel at evenly spread points of that window.

What a leak needs, and how the probe arranges it: once the prefill learns of the abort it posts no
more chunks, so what can land late is the write already in flight (one chunk, for at most one chunk's
transfer time). It shows only where a canary holds the page and the canary's own write to it landed
first (otherwise the canary overwrites it) while the canary still reads its context. So the canaries
are small (the victim's length split over `abort_canaries`; keep each well under the chunked-prefill
size, so its whole transfer is shorter than one victim chunk's), together they cover the pages the
victim held, and they go out at once after the cancel. Whether a given cancel meets a write in flight
depends on timing nobody outside the engine sees, so the probe cancels several times (`abort_attempts`
requests really cancelled in flight, within `abort_budget`) and stops at the first cross-request
sighting when `early_stop` is on. A request that still answers 200 (even with finish reason "abort")
had its KV before the cancel and does not count as cancelled.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import httpx

from kvgate.findings import Evidence, Finding, failed, inconclusive, passed
from kvgate.gates.probes.canary import Sender, Sent
from kvgate.gates.probes.client import ProbeResult
from kvgate.gates.probes.latency import LatencyModel
from kvgate.gates.probes.plan import ACCEPT, LengthProbe, ProbeLimits, max_new_tokens_for
from kvgate.gates.probes.sentinels import Sighting, owners
from kvgate.gates.probes.settings import ProbeSettings

GATE = "probes"
CHECK = "abort.mid_transfer"


def abort_length(limits: ProbeLimits, settings: ProbeSettings) -> int:
    want = settings.abort_tokens if settings.abort_tokens is not None else int(0.012 * limits.context)
    return max(16 * limits.one_page, min(want, limits.longest_accepted))


def _abort_on_decodes(http: httpx.Client, decode_urls: Sequence[str], rid: str) -> tuple[list[str], bool]:
    """POST /abort_request to every decode; acknowledged only if every one answered 200 (SGLang's
    `abort_request` answers an empty 200; a 404 or 401 means the cancel never reached the engine)."""
    notes = []
    acked = bool(decode_urls)
    for url in decode_urls:
        try:
            r = http.post(url.rstrip("/") + "/abort_request", json={"rid": rid}, timeout=5.0)
            notes.append(f"{url}: HTTP {r.status_code}")
            acked = acked and r.status_code == 200
        except httpx.HTTPError as exc:
            notes.append(f"{url}: {type(exc).__name__}")
            acked = False
    return notes, acked


def _aborted_in_flight(result: ProbeResult, at: float) -> bool:
    """The victim's own answer shows the abort: the client's disconnect, or an error answer after the cancel
    point that names the abort (SGLang: "... KVTransferError(...): Aborted by AbortReq."). A timeout, a
    transport failure or an unrelated error (a 503 "busy") is no abort."""
    if result.transport_error is not None or result.timed_out:
        return False
    if result.cancelled:
        return True
    return result.status is not None and not result.served and result.elapsed_s >= at and "abort" in result.raw.lower()


def run_abort(
    sender: Sender,
    decode_urls: Sequence[str],
    limits: ProbeLimits,
    settings: ProbeSettings,
    model: LatencyModel | None,
    node: str,
) -> Finding:
    """Cancel long requests mid-transfer and check that no canary carries their content."""
    la = abort_length(limits, settings)
    victim_p = LengthProbe(
        "abort_victim",
        la,
        ACCEPT,
        "none",
        "request cancelled mid-transfer",
        max_new_tokens_for(limits, la, settings.max_new_tokens),
    )
    per = max(limits.one_page * 2, -(-la // settings.abort_canaries))
    per = min(per, limits.longest_accepted)
    canary_p = LengthProbe(
        "abort_canary",
        per,
        ACCEPT,
        "none",
        "canary after a cancel",
        max_new_tokens_for(limits, per, settings.max_new_tokens),
    )
    if model is None:
        cal = sender.one(victim_p, "abort-calibration")
        if not cal.result.served:
            return inconclusive(
                GATE,
                CHECK,
                node,
                f"calibration request of {la:,} tokens failed: "
                f"HTTP {cal.result.status}, timed_out={cal.result.timed_out}",
            )
        expected = cal.result.elapsed_s
    else:
        expected = model.expected_s(la)
    cancelled: list[Sent] = []
    canaries: list[Sent] = []
    sightings: list[Sighting] = []  # scanned per batch, as it arrives
    notes: list[str] = []
    acknowledged = 0  # cancels a decode worker confirmed with its /abort_request answer
    n = settings.abort_attempts
    tries = 0
    points: list[float] = []
    per_try = la + canary_p.length * settings.abort_canaries
    budget = settings.abort_budget * limits.context
    with sender.observer.step(f"abort mid-transfer: {n} cancel(s) of {la:,} tokens", total=n) as handle:
        # A try whose request answered before the cancel observed nothing; it does not count.
        while len(cancelled) < n and tries < 2 * n:
            if settings.early_stop and any("abort_victim" in x.source for x in sightings):
                notes.append(f"stopped after {tries} tries: a canary carried a cancelled request's content")
                break
            if tries and (tries + 1) * per_try > budget:
                notes.append(f"stopped after {tries} tries: abort_budget ({settings.abort_budget:g} x context) spent")
                break
            k = len(cancelled)
            at = max(0.005, expected * (k + 1) / (n + 1))
            points.append(round(at, 4))
            phase = f"abort{tries}"
            tries += 1
            box: list[Sent] = []
            # Without decode URLs the only cancel left is the client's disconnect.
            disconnect = at if not decode_urls else None
            # This try's box, phase and deadline, bound now: a thread outliving its join must not see the next's.
            t = threading.Thread(
                target=lambda box=box, phase=phase, disconnect=disconnect: box.append(
                    sender.one(victim_p, phase, cancel_after_s=disconnect)
                ),
                daemon=True,
            )
            t.start()
            time.sleep(at)
            acked = bool(decode_urls)
            rids = sender.pending_rids(phase)
            for rid in rids:
                answers, ok = _abort_on_decodes(sender.client.http, decode_urls, rid)
                acked = acked and ok
                if not ok:
                    notes.append(f"try {tries}: /abort_request not acknowledged: {answers}")
            acked = acked and bool(rids)
            batch = sender.many(
                [canary_p] * settings.abort_canaries, f"{phase}-canary", f"abort canaries after cancel {tries}"
            )
            t.join(timeout=settings.deadline_s + at)
            victim = box[0] if box else None
            # A 200 (even with finish_reason abort) means its KV had arrived: the cancel came too late.
            # With decode URLs the cancel counts only if every decode acknowledged it and the victim's
            # answer shows it; a disconnect alone is counted, as unacknowledged.
            hit = (
                victim
                if (victim is not None and _aborted_in_flight(victim.result, at) and (acked or not decode_urls))
                else None
            )
            if victim is not None:
                sender.observer.log(
                    f"abort try {tries}: cancel at {at:.3f} s of ~{expected:.3f} s expected; victim "
                    f"{'aborted in flight' if hit is not None else 'answered first'} "
                    f"(HTTP {victim.result.status}, {victim.result.elapsed_s:.3f} s)"
                )
            canaries += batch
            sightings += sender.sightings(batch)
            if hit is not None:
                if not hit.result.cancelled:
                    sender.meter.charge_prefill(la)  # aborted, so not counted as served; it was prefilled
                cancelled.append(hit)
                acknowledged += acked
                handle.advance(1)
            else:
                what = (
                    "no answer"
                    if victim is None
                    else (
                        f"HTTP {victim.result.status}, timed_out={victim.result.timed_out}, "
                        f"transport_error={victim.result.transport_error}"
                    )
                )
                notes.append(f"try {tries}: no acknowledged abort in flight at {at:.3f} s ({what})")
                if victim is not None and victim.result.served:
                    # it was faster than expected: aim the next cancels inside what was observed
                    expected = min(expected, victim.result.elapsed_s)
    ev = [
        Evidence(node, "abort.cancelled", [c.label for c in cancelled]),
        Evidence(node, "abort.canaries", len(canaries)),
        Evidence(node, "abort.cancel_points_s", points),
        Evidence(node, "abort.tries", tries),
        Evidence(node, "abort.acknowledged", acknowledged, "every counted cancel acknowledged by /abort_request"),
    ]
    if sightings:
        ev.append(Evidence(node, "abort.sightings", owners(sightings), "no canary carries another request's content"))
        from_cancelled = [s for s in sightings if "abort_victim" in s.source]
        leaked = owners(from_cancelled or sightings)
        return failed(
            GATE,
            CHECK,
            node,
            f"cross-request content after an abort mid-transfer: {leaked[0]}"
            + (f" (+{len(leaked) - 1} more)" if len(leaked) > 1 else ""),
            *ev,
            remedy="enable deferred decode KV release (SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE=1, "
            "default from 0.5.21) and upgrade to 0.5.22+",
        )
    answered = [c for c in canaries if c.result.status == 200]
    if not cancelled:
        return inconclusive(
            GATE,
            CHECK,
            node,
            f"no request could be cancelled mid-transfer in {tries} tries (none was "
            "an acknowledged abort in flight): nothing observed; see abort.notes, raise abort_tokens "
            "or abort_budget",
            *ev,
            Evidence(node, "abort.notes", notes[:6]),
        )
    if not acknowledged:
        how = (
            "no --decode-url: cancelled by client disconnect only, which a router may not propagate"
            if not decode_urls
            else "no /abort_request was acknowledged by every decode"
        )
        return inconclusive(
            GATE,
            CHECK,
            node,
            f"{len(cancelled)} request(s) ended after the cancel, but {how}: the abort itself was not observed",
            *ev,
            Evidence(node, "abort.notes", notes[:6]),
            remedy="pass every decode worker with --decode-url (and a token allowed to call /abort_request)",
        )
    if len(answered) < len(canaries):
        lost = [f"{c.label}: HTTP {c.result.status}" for c in canaries if c.result.status != 200]
        return inconclusive(
            GATE, CHECK, node, f"{len(lost)} of {len(canaries)} canaries got no answer: {lost[:3]}", *ev
        )
    return passed(
        GATE,
        CHECK,
        node,
        f"{acknowledged} request(s) of {la:,} tokens cancelled mid-transfer "
        "(acknowledged and observed); "
        f"{len(answered)} canaries sent right after carry only their own content (absence of evidence: "
        "the decode may not have reused those pages yet; the defenses gate's deferred-release check "
        "is what proves page lifetime)",
        *ev,
    )
