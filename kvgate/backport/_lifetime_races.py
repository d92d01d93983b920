"""Runs INSIDE the interpreter that has the target sglang: a scenario per page-lifetime race (each the
race one patch closes) and the page oracle that judges what decode did with the pages.

Each step waits for the one before it (see _lifetime_payload.py's docstring); none waits on the clock.
"""

from __future__ import annotations

from typing import Any

from _lifetime_pair import Lifetime, Pair
from _lifetime_wire import PAGES, NotStaged

VICTIM_VALUE = 0x5A


def _victim_ticker(pair: Pair, victim: str) -> Any:
    """The next request decode admits takes the first free pages and receives its own KV (test code)."""
    state: dict[str, Any] = {"pages": None}

    def tick() -> None:
        if state["pages"] is None:
            got = pair.pool.alloc(PAGES, victim)
            if got is not None:
                state["pages"] = got
                pair.pool.write(got, VICTIM_VALUE, victim, kind="victim-own-kv")

    tick.state = state  # type: ignore[attr-defined]
    return tick


def _verdict(
    pair: Pair, aborted: str, value: int, victim_tick: Any, ack_targets: list[tuple[str, int]]
) -> dict[str, Any]:
    pool = pair.pool
    freed = [e for e in pool.events if e["event"] == "free" and e["req"] == aborted]
    write = pool.first("late-write-lands", aborted)
    victim_pages = victim_tick.state["pages"]
    overwritten = sorted(p for p in victim_pages if int(pool.data[p, 0]) == value) if victim_pages is not None else []
    timed_out = [m for m in pair.warnings if "timed out" in m and "releasing anyway" in m]
    acks = pair.wire.frames(b"ABORT_ACK")
    acked_eps = {a["dst"] for a in acks if not a["held"]}
    missing_ack = [f"{ip}:{port}" for ip, port in ack_targets if f"{ip}:{port}" not in acked_eps]
    # The pool logs under its lock, so the order of its events is the order they happened (times can tie).
    early = bool(freed and write and pool.events.index(freed[0]) < pool.events.index(write))
    if write is None:
        outcome, why = "INCONCLUSIVE", "the delayed write never landed: nothing observed"
    elif not freed:
        outcome, why = "INCONCLUSIVE", "decode never released the aborted request's pages within the probe"
    elif early or overwritten:
        outcome = "EXPOSED"
        why = f"pages freed at {freed[0]['t']}s before the late write landed at {write['t']}s" + (
            f"; the next request's pages {overwritten} now hold the aborted request's bytes" if overwritten else ""
        )
    elif timed_out or missing_ack:
        outcome = "UNPROVEN"
        why = "released on the hold timeout, not on a drain ACK" + (
            f"; no drain ACK reached {missing_ack}" if missing_ack else ""
        )
    else:
        outcome, why = (
            "SAFE",
            f"released at {freed[-1]['t']}s on the drain ACK, after the write landed at {write['t']}s",
        )
    return {
        "outcome": outcome,
        "why": why,
        "pool_events": pool.events,
        "abort_acks": [{k: a[k] for k in ("t", "dst", "frames", "held")} for a in acks],
        "aborts": [{k: a[k] for k in ("t", "src", "frames")} for a in pair.wire.frames(b"ABORT")],
        "timeout_warnings": len(timed_out),
        "victim_pages_overwritten": overwritten,
    }


WRITE_VALUE = 0xA1  # the bytes the aborted (or failed) request's late write puts in decode's pages


def _judged(pair: Pair, room: int, rid: str, what: str, ack_targets: list[tuple[str, int]]) -> dict[str, Any]:
    """The shared end of every race: the next request is admitted as soon as pages are free, every
    thread settles after `what`, the parked write lands, a hold still waiting ends on its timeout, and
    the page oracle judges the pages of `rid`."""
    tick = _victim_ticker(pair, "kvgate-probe-next")
    pair.settle(what, tick)
    pair.open_gate(room, tick)
    pair.expire_holds(tick)
    return _verdict(pair, rid, WRITE_VALUE, tick, ack_targets)


def abort_then_sender_cleared(lt: Lifetime) -> dict[str, Any]:
    """#40645: decode aborts mid-write; prefill clears the sender before the write drains."""
    pair = Pair(lt)
    try:
        d = pair.decodes[0]
        room, a = lt.next_room(), "kvgate-probe-aborted"
        held = pair.write_in_flight(d, room, a, WRITE_VALUE)
        pair.abort(d, a)
        pair.settle("the abort")  # prefill handled the ABORT, decode released or holds the pages
        pair.clear_prefill_sender(room)  # prefill concluded the aborted request
        return _judged(pair, held, a, "the sender's clear", [d.ep])
    finally:
        pair.close()


def two_decode_ranks_abort(lt: Lifetime) -> dict[str, Any]:
    """#41402: prefill TP 1 < decode TP 2: both decode ranks abort the room mid-write."""
    pair = Pair(lt, n_decode=2)
    try:
        room, a = lt.next_room(), "kvgate-probe-aborted"
        pages = pair.alloc(a)
        for i, d in enumerate(pair.decodes):
            pair.admit(d, room, a if i == 0 else f"{a}-rank{i}", pages if i == 0 else [])
        held = pair.start_transfer(room, a, WRITE_VALUE, pages)
        for i, d in enumerate(pair.decodes):
            pair.abort(d, a if i == 0 else f"{a}-rank{i}")
        # A rank whose hold ended on the timeout did not learn of the drain even if its own pages
        # were not the ones written here.
        return _judged(pair, held, a, "both ranks' aborts", [d.ep for d in pair.decodes])
    finally:
        pair.close()


def _prefill_fails_room(pair: Pair, room: int, reason: str) -> None:
    """Prefill concludes the room Failed and tells decode, as its transfer worker does on an error:
    `conclude_failure` from 0.5.20 (#36612); 0.5.19's worker records the failure, marks the room Failed
    and calls `sync_status_to_decode_endpoint` per decode endpoint."""
    P = pair.prefill
    if hasattr(P, "conclude_failure"):
        P.conclude_failure(bootstrap_room=room, failure_reason=reason)
        return
    P.record_failure(room, reason)
    P.update_status(room, pair.lt.KVPoll.Failed)
    for info in list(P.transfer_infos.get(room, {}).values()):
        if not info.is_dummy:
            P.sync_status_to_decode_endpoint(info.endpoint, info.dst_port, room, pair.lt.KVPoll.Failed, 0)


def prefill_side_failure(lt: Lifetime) -> dict[str, Any]:
    """#41404: prefill concludes the room Failed (a failure decode did not initiate) while a write is
    still in flight; decode learns it from the real status message."""
    pair = Pair(lt)
    try:
        d = pair.decodes[0]
        room, a = lt.next_room(), "kvgate-probe-failed"
        held = pair.write_in_flight(d, room, a, WRITE_VALUE)
        _prefill_fails_room(pair, room, "kvgate probe: prefill-side failure while a chunk is still being written")
        # Settling after the failure: decode read the status, released or holds the pages.
        return _judged(pair, held, a, "the prefill-side failure", [d.ep])
    finally:
        pair.close()


def stale_ack_reused_room(lt: Lifetime) -> dict[str, Any]:
    """ack-generations: the drain ACK of an earlier hold of a room arrives late (a slow link) while a
    newer request on the same room (a re-bootstrap) is aborted mid-write."""
    pair = Pair(lt)
    try:
        d = pair.decodes[0]
        room, first, a = lt.next_room(), "kvgate-probe-first", "kvgate-probe-aborted"
        # Hold 1: aborted before any write; prefill acks at once, the link holds that ACK back.
        pair.wire.hold_pred = lambda frames: frames[0] == b"ABORT_ACK"
        pages = pair.alloc(first)
        pair.admit(d, room, first, pages)
        lt_kvpoll = lt.KVPoll
        pair.prefill.update_status(room, lt_kvpoll.Bootstrapping)
        pair.prefill.update_status(room, lt_kvpoll.WaitingForInput)
        pair.abort(d, first)
        pair.settle("the first hold's abort")  # prefill acked (the link holds it); decode holds
        if not pair.wire.held:
            raise NotStaged("prefill sent no ACK for the first hold: there is no stale ACK to deliver late")
        pair.expire_holds()  # hold 1 ends on its timeout (the ACK is stuck)
        pair.clear_prefill_sender(room)
        pair.warnings.clear()
        # Hold 2: the same room, bootstrapped again, aborted while its write is in flight.
        held = pair.write_in_flight(d, room, a, WRITE_VALUE)  # NotStaged unless hold 1's pages came back
        pair.abort(d, a)
        pair.settle("the second hold's abort")
        stale = pair.wire.deliver_held()  # the first hold's ACK finally arrives, mid-write
        out = _judged(pair, held, a, "the stale ACK", [d.ep])
        out["stale_acks_delivered"] = stale
        return out
    finally:
        pair.close()


SCENARIOS = {
    "kvgate-preserve-abort-ack": abort_then_sender_cleared,
    "kvgate-ack-fanout": two_decode_ranks_abort,
    "kvgate-force-arm-on-failure": prefill_side_failure,
    "kvgate-ack-generations": stale_ack_reused_room,
}
