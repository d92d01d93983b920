"""Abort mid-transfer (gate 4, dynamic; incident.md section 4, item 4).

Start a long request carrying its sentinel densely, cancel it while its KV is in flight, and at once
send canary requests sized to take over the pages it held. With decode-side release before in-flight
writes drain (deferred release off), the late writes land in the canaries' pages and a canary answers
with the cancelled request's content. None may.

The cancel is SGLang's `POST /abort_request {"rid"}` on every decode worker: a decode-initiated abort,
the case deferred release exists for (the router forwards `rid` unchanged). Without decode URLs it
falls back to the client's disconnect, which a router may or may not propagate.

Sizing and timing (`plan_abort`, `abort_search.CancelPoints`): the victim is long enough that its
prefill (the window in which the decode waits for its KV) lasts WINDOW_NOISE calibrated noise units, up
to the longest accepted prompt. Each cancel is timed from the moment the victim's request goes out (its
ids built first: on a text-mode server they come from the worker's /v1/tokenize, which a busy worker
answers late), so it is placed on the victim's own clock, from the router's accept to its answer. The
first cancel aims at the middle of the window the calibration predicts; each try that missed says from
the victim's own answer where it was (`classify`: too early, the decode did not hold it yet or was still
in its handshake; too late, its KV had arrived), and the next cancel bisects what is left of the time the
victim really spent before its answer. The calibration's requests ask for one token, so a deployment
whose victims take far longer end to end (a slow decode of `max_new_tokens`, a different model) is
searched where its requests actually are. Where the bracket between a cancel too early and one too late
closes with none in flight (the window is narrower than the noise), the victim is lengthened (`_widen`:
at most WIDEN_FACTOR times, while WIDEN_TRIES tries of it fit the budget) unless the operator fixed its
length. Tries go on until `abort_attempts` acknowledged cancels in flight were observed or the budget
(max(abort_budget x context, budget_floor_s of measured prefill; where the victim is the longest
accepted prompt, room for WHOLE_CONTEXT_TRIES_PER_ATTEMPT tries per wanted cancel up to
ROOM_CAP_TOKENS) is spent; the finding says how many tries it took, at what lengths. One try never goes
past the budget: the victim is shortened to fit it.

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

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import httpx

from kvgate.gates.probes.abort_search import (
    CANCELLED,
    EARLY,
    HANDSHAKE,
    KIND_WORDS,
    LATE,
    MIN_BISECTIONS,
    UNKNOWN,
    CancelPoints,
    classify,
)
from kvgate.gates.probes.calibrate import ROOM_CAP_TOKENS, Calibration
from kvgate.gates.probes.canary import Sender, Sent
from kvgate.gates.probes.plan import ACCEPT, LengthProbe, ProbeLimits, max_new_tokens_for
from kvgate.gates.probes.sentinels import Sighting, owners
from kvgate.gates.probes.settings import ProbeSettings
from kvgate.results.findings import Evidence, Finding, failed, inconclusive, passed

GATE = "probes"
CHECK = "abort.mid_transfer"


#: The victim's prefill window aimed for, in calibrated noise units (a cancel aimed at its middle
#: then lands inside it despite the noise), and never below MIN_WINDOW_S.
WINDOW_NOISE = 10.0
MIN_WINDOW_S = 0.02
#: However large the budget, at most this many tries per wanted cancel (bounds the wall time).
TRIES_PER_ATTEMPT = 8
#: Where the victim is already the whole (small) context, its window cannot be widened, so only tries
#: help: up to this many per wanted cancel, within ROOM_CAP_TOKENS. A sim 0.5.22 at `sim up` defaults
#: (victims answered in 22 ms) missed all 8 beside a busy core and a full test run (2 in 20 such runs).
WHOLE_CONTEXT_TRIES_PER_ATTEMPT = 16
#: However small the budget, room for this many tries: the first cancel is a guess, the next ones bisect
#: what it showed. A small context's 5% share (409 tokens at 8k) held one try of the smallest victim
#: (16 pages and its canaries: 512 tokens at page 16) where the floor came out small, and a loaded CI
#: host's sim 0.5.22 at `sim up` defaults, its one guess missed, was inconclusive.
MIN_TRIES = 4
#: Share of a one-page round trip spent before the decode knows a request / after its KV arrived.
_LEAD = 0.3


@dataclass(frozen=True)
class AbortPlan:
    """The sizes the abort probe chose, and from what."""

    victim_tokens: int
    canary_tokens: int
    canaries: int
    expected_s: float  # calibrated latency of the victim, end to end
    window_s: float  # calibrated prefill time of the victim beyond a one-page request
    lead_s: float  # before this, the decode may not know the victim yet
    budget_tokens: int
    max_tries: int
    limited_by: str | None

    @property
    def per_try_tokens(self) -> int:
        return self.victim_tokens + self.canary_tokens * self.canaries

    def as_evidence(self) -> dict[str, object]:
        return {
            "victim_tokens": self.victim_tokens,
            "canary_tokens": self.canary_tokens,
            "canaries_per_try": self.canaries,
            "expected_victim_ms": round(self.expected_s * 1000, 2),
            "window_ms": round(self.window_s * 1000, 2),
            "budget_tokens": self.budget_tokens,
            "max_tries": self.max_tries,
            "limited_by": self.limited_by,
        }


def plan_abort(cal: Calibration, limits: ProbeLimits, settings: ProbeSettings) -> AbortPlan:
    """Size the victim, the canaries and the number of tries from the calibration (abort_tokens wins)."""
    page = limits.one_page
    limited: list[str] = []
    if settings.abort_tokens is not None:
        victim = settings.abort_tokens
    else:
        at = cal.tokens_for(max(WINDOW_NOISE * cal.jitter_s, MIN_WINDOW_S))
        victim = at if at is not None else limits.longest_accepted
        if victim > limits.longest_accepted:
            limited.append("the longest accepted prompt")
    victim = max(16 * page, min(victim, limits.longest_accepted))
    victim = min(victim, limits.longest_accepted)
    canaries = settings.abort_canaries
    budget = cal.budget_tokens(settings.abort_budget, limits.context, settings.budget_floor_s)
    if (
        settings.abort_tokens is None
        and MIN_TRIES * (victim + _canary_tokens(victim, page, canaries, limits) * canaries) > budget
    ):
        # MIN_TRIES tries must fit the budget: a shorter victim (a shorter window than the noise asks for),
        # never tries past it. A 1M context whose calibration saw no slope once sized the victim at the
        # whole context, and its one try cost two context-length prefills. (Below the floor's cap this never
        # shortens a victim: the floor, at least 100 noise units of prefill, holds 5 tries of a 10-unit one.)
        victim = max(16 * page, min(victim, (budget // MIN_TRIES - canaries) // 2))
        limited.append(f"the budget ({budget:,} tokens for {MIN_TRIES} tries)")
    per = _canary_tokens(victim, page, canaries, limits)
    per_try = victim + per * canaries
    cap = TRIES_PER_ATTEMPT * settings.abort_attempts
    if settings.abort_tokens is None:
        budget = max(budget, MIN_TRIES * per_try)  # the smallest victim's tries, however small the share
    if settings.abort_tokens is None and victim >= limits.longest_accepted:
        # The victim is the whole context (a small one, against the floor): room for the tries the calibrated
        # window may need, up to ROOM_CAP_TOKENS, spent only as tries miss.
        cap = WHOLE_CONTEXT_TRIES_PER_ATTEMPT * settings.abort_attempts
        budget = max(budget, min(cap * per_try, ROOM_CAP_TOKENS))
    max_tries = max(1, min(budget // per_try, cap))
    if max_tries < cap:
        limited.append(f"the budget ({budget:,} tokens: {max_tries} tries of {per_try:,})")
    expected = cal.expected_s(victim)
    return AbortPlan(
        victim_tokens=victim,
        canary_tokens=per,
        canaries=canaries,
        expected_s=expected,
        window_s=expected - cal.base_s,
        lead_s=_LEAD * cal.base_s,
        budget_tokens=budget,
        max_tries=max_tries,
        limited_by="; ".join(limited) or None,
    )


def _canary_tokens(victim: int, page: int, canaries: int, limits: ProbeLimits) -> int:
    """Each canary's length: the victim's split over the canaries, at least two pages."""
    return min(max(page * 2, -(-victim // canaries)), limits.longest_accepted)


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


def run_abort(
    sender: Sender,
    decode_urls: Sequence[str],
    limits: ProbeLimits,
    settings: ProbeSettings,
    plan: AbortPlan,
    node: str,
) -> Finding:
    """Cancel long requests mid-transfer and check that no canary carries their content."""
    cur = plan  # the victim and budget tries use now: `_widen` lengthens the victim where the window was narrow
    victim_p, canary_p = _probes(cur, limits, settings)
    cancelled: list[Sent] = []
    canaries: list[Sent] = []
    sightings: list[Sighting] = []  # scanned per batch, as it arrives
    notes: list[str] = []
    acknowledged = 0  # cancels a decode worker confirmed with its /abort_request answer
    n = settings.abort_attempts
    tries = 0
    spent = 0  # prompt tokens of the tries so far (victims and canaries)
    first_hit: int | None = None
    kinds: list[str] = []  # what each try showed (`classify`)
    points: list[float] = []
    lengths: list[int] = []  # each try's victim length
    lags: list[float] = []  # each try's seconds from its start to its victim going out (its ids built)
    answers: list[float] = []  # end-to-end seconds of victims that answered
    widened: list[str] = []
    schedule = CancelPoints.start(plan.lead_s, plan.window_s)
    with sender.observer.step(f"abort mid-transfer: {n} cancel(s) of {plan.victim_tokens:,} tokens", total=n) as handle:
        # A try whose request answered before the cancel observed nothing; it does not count.
        while len(cancelled) < n and tries < cur.max_tries and (tries == 0 or _fits(cur, spent)):
            if settings.early_stop and any("abort_victim" in x.source for x in sightings):
                notes.append(f"stopped after {tries} tries: a canary carried a cancelled request's content")
                break
            if schedule.narrow() and (longer := _widen(cur, limits, settings, spent)) is not None:
                extra = cur.window_s * (longer.victim_tokens - cur.victim_tokens) / max(1, cur.victim_tokens)
                schedule.widened(extra)
                widened.append(
                    f"after try {tries}: {cur.victim_tokens:,} -> {longer.victim_tokens:,} tokens (the bracket "
                    "between a cancel too early and one too late closed with none in flight)"
                )
                sender.observer.log(f"abort: victim lengthened {widened[-1]}")
                cur = longer
                victim_p, canary_p = _probes(cur, limits, settings)
            at = schedule.next()
            points.append(at)
            lengths.append(cur.victim_tokens)
            phase = f"abort{tries}"
            tries += 1
            spent += cur.per_try_tokens
            box: list[Sent] = []
            going = threading.Event()
            # Without decode URLs the only cancel left is the client's disconnect.
            disconnect = at if not decode_urls else None
            # This try's box, phase, deadline and event, bound now: a thread outliving its join must not
            # see the next's.
            t = threading.Thread(
                target=lambda box=box, phase=phase, disconnect=disconnect, going=going, probe=victim_p: box.append(
                    sender.one(probe, phase, cancel_after_s=disconnect, on_send=going.set)
                ),
                daemon=True,
            )
            began = time.monotonic()
            t.start()
            # The cancel is timed from the moment the victim goes out, not from the thread's start: building
            # its ids may ask a busy worker's tokenizer first (ServerCodec), and a cancel timed from before
            # that found no request at all (no rid yet), however it was placed.
            while not going.wait(0.005) and t.is_alive() and time.monotonic() - began < settings.deadline_s:
                pass
            lags.append(round(time.monotonic() - began, 4))
            time.sleep(at)
            acked = bool(decode_urls)
            rids = sender.pending_rids(phase)
            for rid in rids:
                answers_, ok = _abort_on_decodes(sender.client.http, decode_urls, rid)
                acked = acked and ok
                if not ok:
                    notes.append(f"try {tries}: /abort_request not acknowledged: {answers_}")
            acked = acked and bool(rids)
            batch = sender.many([canary_p] * cur.canaries, f"{phase}-canary", f"abort canaries after cancel {tries}")
            t.join(timeout=settings.deadline_s + at)
            victim = box[0] if box else None
            # A 200 (even with finish_reason abort) means its KV had arrived: the cancel came too late.
            # With decode URLs the cancel counts only if every decode acknowledged it and the victim's
            # answer shows it; a disconnect alone is counted, as unacknowledged.
            kind = classify(victim.result, at, schedule.tail) if victim is not None else UNKNOWN
            kinds.append(kind)
            hit = victim if (victim is not None and kind == CANCELLED and (acked or not decode_urls)) else None
            schedule.learn(at, kind, victim.result if victim is not None else None)
            if victim is not None:
                if victim.result.served:
                    answers.append(round(victim.result.elapsed_s, 4))
                sender.observer.log(
                    f"abort try {tries}: cancel at {at:.3f} s ({KIND_WORDS[kind]}; HTTP {victim.result.status}, "
                    f"answered after {victim.result.elapsed_s:.3f} s)"
                )
            canaries += batch
            sightings += sender.sightings(batch)
            if hit is not None:
                if not hit.result.cancelled:
                    # aborted, so not counted as served; it was prefilled
                    sender.meter.charge_prefill(cur.victim_tokens)
                cancelled.append(hit)
                acknowledged += acked
                first_hit = first_hit or tries
                handle.advance(1)
            else:
                what = (
                    "no answer"
                    if victim is None
                    else (
                        f"HTTP {victim.result.status}, {victim.result.elapsed_s:.3f} s, "
                        f"timed_out={victim.result.timed_out}, transport_error={victim.result.transport_error}"
                    )
                )
                notes.append(f"try {tries}: no acknowledged abort in flight at {at:.3f} s: {kind} ({what})")
    if len(cancelled) < n and not sightings:
        if tries >= cur.max_tries or not _fits(cur, spent):
            notes.append(
                f"stopped after {tries} tries ({spent:,} tokens): the budget allows {cur.max_tries} tries, "
                f"{cur.budget_tokens:,} tokens"
            )
    la = cur.victim_tokens
    ev = [
        Evidence(node, "abort.cancelled", [c.label for c in cancelled]),
        Evidence(node, "abort.canaries", len(canaries)),
        Evidence(node, "abort.cancel_points_s", points),
        Evidence(node, "abort.try_outcomes", kinds),
        Evidence(node, "abort.answered_after_s", answers),
        Evidence(node, "abort.victim_tokens_per_try", lengths),
        Evidence(node, "abort.send_lag_s", lags, "seconds from each try's start to its victim going out"),
        Evidence(node, "abort.widened", widened),
        Evidence(node, "abort.plan_widened", cur.as_evidence() if widened else None, "the plan the last try ran"),
        Evidence(node, "abort.tries", tries),
        Evidence(node, "abort.first_cancel_at_try", first_hit),
        Evidence(node, "abort.plan", plan.as_evidence()),
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
            "an acknowledged abort in flight): nothing observed; see abort.notes",
            *ev,
            Evidence(node, "abort.notes", notes[:8]),
            remedy=_no_cancel_remedy(cur, limits, settings, tries, kinds),
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
            GATE,
            CHECK,
            node,
            f"{len(lost)} of {len(canaries)} canaries got no answer: {lost[:3]}",
            *ev,
            remedy=f"give each probe more time: --probe-deadline {2 * settings.deadline_s:g}",
        )
    return passed(
        GATE,
        CHECK,
        node,
        f"{acknowledged} request(s) of {la:,} tokens cancelled mid-transfer "
        f"(acknowledged and observed; the first at try {first_hit} of {tries}); "
        f"{len(answered)} canaries sent right after carry only their own content (absence of evidence: "
        "the decode may not have reused those pages yet; the defenses gate's deferred-release check "
        "is what proves page lifetime)",
        *ev,
    )


def _fits(plan: AbortPlan, spent: int) -> bool:
    """Whether one more try of `plan` fits its budget after `spent` tokens."""
    return spent + plan.per_try_tokens <= plan.budget_tokens


def _probes(plan: AbortPlan, limits: ProbeLimits, settings: ProbeSettings) -> tuple[LengthProbe, LengthProbe]:
    """The victim and canary requests of a plan."""
    victim = LengthProbe(
        "abort_victim",
        plan.victim_tokens,
        ACCEPT,
        "none",
        "request cancelled mid-transfer",
        max_new_tokens_for(limits, plan.victim_tokens, settings.max_new_tokens),
    )
    canary = LengthProbe(
        "abort_canary",
        plan.canary_tokens,
        ACCEPT,
        "none",
        "canary after a cancel",
        max_new_tokens_for(limits, plan.canary_tokens, settings.max_new_tokens),
    )
    return victim, canary


#: A victim is lengthened by at most this factor at a time (`_widen`), and only where the budget left holds
#: WIDEN_TRIES tries of the longer one: a bracket that closed says the window is narrower than the noise,
#: and one guess at a longer victim is no search.
WIDEN_FACTOR = 2
WIDEN_TRIES = 2


def _widen(plan: AbortPlan, limits: ProbeLimits, settings: ProbeSettings, spent: int) -> AbortPlan | None:
    """The plan with a longer victim (a longer prefill window to cancel in), or None where none fits.

    Never where the operator fixed the victim's length (probes.abort_tokens) or it is the longest accepted
    prompt already. Up to WIDEN_FACTOR times as long and the longest accepted prompt, as long as WIDEN_TRIES
    tries of it fit what is left of the budget; a victim that becomes the whole (small) context gets the
    room `plan_abort` gives one planned that long (WHOLE_CONTEXT_TRIES_PER_ATTEMPT tries per wanted cancel
    up to ROOM_CAP_TOKENS, spent only as tries miss)."""
    if settings.abort_tokens is not None or plan.victim_tokens >= limits.longest_accepted:
        return None
    page = limits.one_page

    def per_try(v: int) -> int:
        return v + _canary_tokens(v, page, plan.canaries, limits) * plan.canaries

    longer = min(limits.longest_accepted, WIDEN_FACTOR * plan.victim_tokens)
    step = max(page, (longer - plan.victim_tokens) // 16)
    least = plan.victim_tokens + max(page, plan.victim_tokens // 4)
    while longer >= least:
        budget, cap = plan.budget_tokens, plan.max_tries
        if longer >= limits.longest_accepted:
            cap = max(cap, WHOLE_CONTEXT_TRIES_PER_ATTEMPT * settings.abort_attempts)
            budget = max(budget, min(cap * per_try(longer), ROOM_CAP_TOKENS))
        if spent + WIDEN_TRIES * per_try(longer) <= budget:
            return replace(
                plan,
                victim_tokens=longer,
                canary_tokens=_canary_tokens(longer, page, plan.canaries, limits),
                window_s=plan.window_s * longer / max(1, plan.victim_tokens),
                budget_tokens=budget,
                max_tries=cap,
            )
        longer -= step
    return None


def _no_cancel_remedy(
    plan: AbortPlan, limits: ProbeLimits, settings: ProbeSettings, tries: int, kinds: Sequence[str]
) -> str:
    """The action that gives the next run a cancel in flight, from what the tries showed (`classify`):

    - no cancel ever found the request (every try EARLY, its answer normal, over at least
      MIN_BISECTIONS tries, the last ones close to the answers): the /abort_request calls reached decode
      workers that do not serve the router's requests (or were refused);
    - the search bracketed the in-flight window (EARLY and LATE both seen) or found it before its
      earliest cancel (only LATE): the window is narrower than the noise, so a longer victim (a longer
      prefill window), or, at the longest accepted prompt, more tries;
    - anything else (no answer said where the victim was): more tries.
    More tries are the budget's (probes.abort_budget) where it bounded them, else the cap per wanted
    cancel (probes.abort_attempts: one cancel in flight still passes, the cap grows with it).
    """
    seen = set(kinds)
    if seen == {EARLY} and len(kinds) >= MIN_BISECTIONS:
        return (
            "pass with --decode-url every decode worker the router sends requests to (with a token allowed to "
            "call /abort_request): no cancel reached a victim (each answered normally long after its cancel)"
        )
    if LATE in seen and seen <= {EARLY, HANDSHAKE, LATE} and plan.victim_tokens < limits.longest_accepted:
        longer = min(limits.longest_accepted, 4 * plan.victim_tokens)
        return f"set the profile key probes.abort_tokens: {longer} (a longer prefill window to cancel in)"
    want = 2 * max(tries, 1)
    share = min(10.0, math.ceil(100 * want * plan.per_try_tokens / limits.context) / 100)
    if plan.max_tries >= TRIES_PER_ATTEMPT * settings.abort_attempts:
        return (
            f"set the profile keys probes.abort_attempts: {2 * settings.abort_attempts} and probes.abort_budget: "
            f"{max(share, settings.abort_budget):g} (room for up to {want} tries)"
        )
    return f"set the profile key probes.abort_budget: {share:g} (room for up to {want} tries)"
