"""Runs INSIDE the interpreter that has the target sglang: after the forward, is an aborted request's
final prefill result retired or handed off (the real `process_batch_result_disagg_prefill`)?
"""

from __future__ import annotations

from typing import Any

from _probe_world import Recorder, World, _NoSpec


def retire_results(w: World) -> dict[str, Any]:
    """Feed one final prefill result through the real `process_batch_result_disagg_prefill`.

    The request was admitted (sender created, handshake done, metadata slot taken) and its rejection
    is pending in `to_finish`. `send_kv_chunk` (the KV transport) is observed, not run: a call means
    the handoff would go out.
    """
    import types

    import torch
    from sglang.srt.disaggregation.base.conn import KVPoll

    cases = []
    for name, aborted, expect in (
        ("aborted_final_result", True, "RETIRED"),
        ("valid_final_result", False, "HANDED_OFF"),
    ):
        log: list[tuple[str, str, Any]] = []
        sched = w.scheduler(log)
        q = w.prefill_queue(sched)
        req = w.req(f"kvgate-probe-{name}")
        q.create_sender(req, 8) if hasattr(q, "create_sender") else q.add(req, 8)
        q.queue[:] = []
        req.metadata_buffer_index = q.req_to_metadata_buffer_idx_allocator.alloc()
        req.pending_bootstrap = False
        if aborted:
            w.reject(req)
        sends: list[Any] = []
        sched.send_kv_chunk = lambda r, last_chunk=False, end_idx=None: sends.append(  # noqa: B023 - called in this case only
            (r.rid, last_chunk)
        )
        sched.req_to_metadata_buffer_idx_allocator = q.req_to_metadata_buffer_idx_allocator
        sched.batch_result_processor = Recorder("batch_result_processor", log)
        sched.metrics_reporter = Recorder("metrics_reporter", log)
        sched.spec_algorithm = _NoSpec()
        sched.disagg_prefill_inflight_queue = []
        sched.disagg_prefill_pending_chunk_rids = set()
        sched.chunked_req = None
        sched.enable_overlap = False
        sched.return_health_check_ipcs = None
        result = types.SimpleNamespace(
            logits_output=None,
            next_token_ids=torch.tensor([7]),
            extend_input_len_per_req=None,
            extend_logprob_start_len_per_req=None,
            copy_done=None,
            auxiliary_host_output=None,
            routed_experts_output=None,
            indexer_topk_output=None,
            next_draft_input=None,
            can_run_cuda_graph=False,
        )
        batch = types.SimpleNamespace(reqs=[req], spec_info=None, prefill_stats=None, dp_cooperation_info=None)
        free_before = q.req_to_metadata_buffer_idx_allocator.available_size()
        sched.process_batch_result_disagg_prefill(batch, result)
        handed_off = any(rid == req.rid and last for rid, last in sends) or req in sched.disagg_prefill_inflight_queue
        retired = not handed_off and bool(sched.streamed) and req.finished()
        cases.append(
            {
                "name": name,
                "door": "prefill-result",
                "expect": expect,
                "outcome": "HANDED_OFF" if handed_off else "RETIRED" if retired else "DROPPED",
                "kv_chunks_sent": len(sends),
                "in_inflight_queue": req in sched.disagg_prefill_inflight_queue,
                "metadata_slots_released": q.req_to_metadata_buffer_idx_allocator.available_size() - free_before,
                "sender_aborted": req.disagg_kv_sender.poll() == KVPoll.Failed,
                "streamed": len(sched.streamed),
                "client_error": next((x["reason"] for x in sched.streamed if x["rid"] == req.rid), None),
            }
        )
    return {"status": "ok", "cases": cases}
