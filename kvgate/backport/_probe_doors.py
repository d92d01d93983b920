"""Runs INSIDE the interpreter that has the target sglang: the admission race, a rejected, a valid and
re-entering requests pushed through sglang's real PD doors (`PrefillBootstrapQueue.add`,
`DecodePreallocQueue.add`), judged by what each door did (endpoints created, queued, answered).
"""

from __future__ import annotations

import gc
from typing import Any

from _probe_world import World, _reason


def _count(cls: type) -> int:
    return sum(1 for o in gc.get_objects() if type(o) is cls)


def _prefill_case(w: World, name: str, req: Any, expect: str) -> dict[str, Any]:
    log: list[tuple[str, str, Any]] = []
    sched = w.scheduler(log)
    q = w.prefill_queue(sched)
    alloc = q.req_to_metadata_buffer_idx_allocator
    free_before = alloc.available_size()
    senders_before = _count(w.fake_sender_cls)
    q.add(req, 8)
    senders = _count(w.fake_sender_cls) - senders_before
    handshake_ready = False
    queued = [r.rid for r in q.queue]
    sender = getattr(req, "disagg_kv_sender", None)
    if sender is not None and req in q.queue:
        from sglang.srt.disaggregation.base.conn import KVPoll

        handshake_ready = sender.poll() == KVPoll.WaitingForInput
        if handshake_ready and hasattr(q, "finalize_bootstrap"):
            q.finalize_bootstrap(req)  # what pop_bootstrapped does once the handshake is ready
        elif handshake_ready and req.metadata_buffer_index < 0:
            req.metadata_buffer_index = alloc.alloc()  # 0.5.19's pop_bootstrapped allocates inline
    return _case(
        name,
        "prefill",
        expect,
        req,
        queued,
        senders,
        alloc.available_size(),
        free_before,
        sched.streamed,
        log,
        extra={"handshake_ready": handshake_ready},
    )


def _decode_case(w: World, name: str, req: Any, expect: str, **add_kwargs: Any) -> dict[str, Any]:
    log: list[tuple[str, str, Any]] = []
    sched = w.scheduler(log)
    q = w.decode_queue(sched)
    receivers_before = _count(w.fake_receiver_cls)
    q.add(req, **add_kwargs)
    receivers = _count(w.fake_receiver_cls) - receivers_before
    queued = [d.req.rid for d in q.queue] + [d.req.rid for d in q.pending_reqs] + [r.rid for r in q.retracted_queue]
    # Decode takes its metadata slot later (pop_preallocated); nothing to count at the door.
    return _case(
        name,
        "decode",
        expect,
        req,
        queued,
        receivers,
        0,
        0,
        sched.streamed,
        log,
        extra={"retracted_queue": len(q.retracted_queue)},
    )


def _case(
    name: str,
    door: str,
    expect: str,
    req: Any,
    queued: list[str],
    endpoints: int,
    free_after: int,
    free_before: int,
    streamed: list[Any],
    log: list[Any],
    extra: dict[str, Any],
) -> dict[str, Any]:
    in_queue = req.rid in queued
    if in_queue or endpoints:
        outcome = "ADMITTED"
    elif streamed:
        outcome = "RETIRED"
    else:
        outcome = "DROPPED"  # neither queued nor answered: the client would wait forever
    return {
        "name": name,
        "door": door,
        "expect": expect,
        "outcome": outcome,
        "queued": in_queue,
        "transfer_endpoints_created": endpoints,
        "metadata_slots_taken": free_before - free_after,
        "streamed": len([s for s in streamed if s["rid"] == req.rid]),
        "client_error": next((s["reason"] for s in streamed if s["rid"] == req.rid), None),
        "finished_reason": _reason(req.finished_reason),
        "to_finish": _reason(req.to_finish),
        "calls": sorted({f"{a}.{b}" for a, b, _ in log}),
        **extra,
    }


def admission(w: World) -> dict[str, Any]:
    cases = []
    r = w.req("kvgate-probe-rejected-prefill")
    w.reject(r)
    pre = {"finished": r.finished(), "to_finish": _reason(r.to_finish), "input_len": len(r.origin_input_ids)}
    cases.append(_prefill_case(w, "rejected", r, "RETIRED"))
    r = w.req("kvgate-probe-rejected-decode")
    w.reject(r)
    cases.append(_decode_case(w, "rejected", r, "RETIRED"))
    cases.append(_prefill_case(w, "valid", w.req("kvgate-probe-valid-prefill"), "ADMITTED"))
    cases.append(_decode_case(w, "valid", w.req("kvgate-probe-valid-decode"), "ADMITTED"))
    # A running request marked for abort ("abort method 3") that re-enters holding resources: its queue
    # owns their release, so a door must keep it.
    r = w.req("kvgate-probe-reentry-prefill")
    r.kv.req_pool_idx = 3
    r.metadata_buffer_index = 2
    w.reject(r)
    cases.append(_prefill_case(w, "reentry_holding_resources", r, "ADMITTED"))
    r = w.req("kvgate-probe-reentry-decode")
    r.kv.req_pool_idx = 3
    w.reject(r)
    r.is_retracted = True
    cases.append(_decode_case(w, "reentry_retracted", r, "ADMITTED", is_retracted=True))
    return {"status": "ok", "after_set_finish_with_abort": pre, "cases": cases}
