"""Abort mid-transfer (gate 4, dynamic; incident.md section 4, item 4).

Start a long request carrying its sentinel densely, cancel it while its KV is in flight, and at once
send canary requests sized to take over the pages it held. With decode-side release before in-flight
writes drain (deferred release off), the late writes land in the canaries' pages and a canary answers
with the cancelled request's content. None may.

The cancel is both a client disconnect (what a real client does; the router drops its upstream
requests) and SGLang's `POST /abort_request {"rid"}` on every decode worker, so the decode-side
abort happens even where a router does not propagate the disconnect. When the transfer is in flight
is estimated from the latency probe (median latencies interpolated to the abort length); attempts
cancel at evenly spread points of that window.
"""

from __future__ import annotations

import threading
import time
from typing import Sequence

import httpx

from kvgate.findings import Evidence, Finding, failed, inconclusive, passed
from kvgate.gates.probes.canary import Sender, Sent
from kvgate.gates.probes.latency import LatencyModel
from kvgate.gates.probes.plan import ACCEPT, LengthProbe, ProbeLimits
from kvgate.gates.probes.sentinels import owners
from kvgate.gates.probes.settings import ProbeSettings

GATE = "probes"
CHECK = "abort.mid_transfer"


def abort_length(limits: ProbeLimits, settings: ProbeSettings) -> int:
    want = settings.abort_tokens if settings.abort_tokens is not None else int(0.02 * limits.context)
    return max(16 * limits.one_page, min(want, limits.longest_accepted))


def _abort_on_decodes(http: httpx.Client, decode_urls: Sequence[str], rid: str) -> list[str]:
    notes = []
    for url in decode_urls:
        try:
            r = http.post(url.rstrip("/") + "/abort_request", json={"rid": rid}, timeout=5.0)
            notes.append(f"{url}: HTTP {r.status_code}")
        except httpx.HTTPError as exc:
            notes.append(f"{url}: {type(exc).__name__}")
    return notes


def run_abort(sender: Sender, http: httpx.Client, decode_urls: Sequence[str], limits: ProbeLimits,
              settings: ProbeSettings, model: LatencyModel | None, node: str) -> Finding:
    """Cancel long requests mid-transfer and check that no canary carries their content."""
    la = abort_length(limits, settings)
    victim_p = LengthProbe("abort_victim", la, ACCEPT, "none", "request cancelled mid-transfer",
                           max(1, min(settings.max_new_tokens, limits.context - la)))
    per = max(limits.one_page * 2, -(-la // settings.abort_canaries))
    per = min(per, limits.longest_accepted)
    canary_p = LengthProbe("abort_canary", per, ACCEPT, "none", "canary after a cancel",
                           max(1, min(settings.max_new_tokens, limits.context - per)))
    if model is None:
        cal = sender.one(victim_p, "abort-calibration")
        if cal.result.status != 200:
            return inconclusive(GATE, CHECK, node, f"calibration request of {la:,} tokens failed: "
                                f"HTTP {cal.result.status}, timed_out={cal.result.timed_out}")
        expected = cal.result.elapsed_s
    else:
        expected = model.expected_s(la)
    cancelled: list[Sent] = []
    canaries: list[Sent] = []
    notes: list[str] = []
    n = settings.abort_attempts
    with sender.observer.step(f"abort mid-transfer: {n} cancel(s) of {la:,} tokens", total=n) as handle:
        for k in range(n):
            at = max(0.005, expected * (k + 1) / (n + 1))
            phase = f"abort{k}"
            box: list[Sent] = []
            rid_holder: list[str] = []

            def victim() -> None:
                box.append(sender.one(victim_p, phase, cancel_after_s=at))

            # The rid is chosen inside Sender.one; read it back from the first request of this phase.
            t = threading.Thread(target=victim, daemon=True)
            t.start()
            time.sleep(at)
            rid_holder.extend(s for s in sender.pending_rids(phase))
            for rid in rid_holder:
                notes += _abort_on_decodes(http, decode_urls, rid)
            canaries += sender.many([canary_p] * settings.abort_canaries, f"{phase}-canary",
                                    f"abort canaries {k + 1}/{n}")
            t.join(timeout=settings.deadline_s + at)
            if box:
                sender.observer.log(f"abort attempt {k + 1}: cancel at {at:.3f} s of ~{expected:.3f} s expected; "
                                    f"victim {'cancelled' if box[0].result.cancelled else 'answered'} "
                                    f"(HTTP {box[0].result.status}, {box[0].result.elapsed_s:.3f} s)")
            if box and box[0].result.cancelled:
                cancelled.append(box[0])
            elif box:
                notes.append(f"attempt {k}: the request answered (HTTP {box[0].result.status}) before the "
                             f"cancel at {at:.3f} s")
            handle.advance(1)
    sightings = sender.sightings(canaries)
    ev = [Evidence(node, "abort.cancelled", [c.label for c in cancelled]),
          Evidence(node, "abort.canaries", len(canaries)),
          Evidence(node, "abort.cancel_points_s", [round(expected * (k + 1) / (n + 1), 4) for k in range(n)])]
    if sightings:
        ev.append(Evidence(node, "abort.sightings", owners(sightings), "no canary carries another request's content"))
        from_cancelled = [s for s in sightings if "abort_victim" in s.source]
        what = owners(from_cancelled or sightings)
        return failed(GATE, CHECK, node, f"cross-request content after an abort mid-transfer: {what[0]}"
                      + (f" (+{len(what) - 1} more)" if len(what) > 1 else ""), *ev,
                      remedy="enable deferred decode KV release (SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE=1, "
                             "default from 0.5.21) and upgrade to 0.5.22+")
    answered = [c for c in canaries if c.result.status == 200]
    if not cancelled:
        return inconclusive(GATE, CHECK, node, "no request could be cancelled mid-transfer (each answered first): "
                            "nothing observed; raise abort_tokens", *ev, Evidence(node, "abort.notes", notes[:6]))
    if len(answered) < len(canaries):
        lost = [f"{c.label}: HTTP {c.result.status}" for c in canaries if c.result.status != 200]
        return inconclusive(GATE, CHECK, node, f"{len(lost)} of {len(canaries)} canaries got no answer: {lost[:3]}",
                            *ev)
    return passed(GATE, CHECK, node, f"{len(cancelled)} request(s) of {la:,} tokens cancelled mid-transfer; "
                  f"{len(answered)} canaries sent right after carry only their own content", *ev)
