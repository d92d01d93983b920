"""Runs INSIDE the interpreter that has the target sglang: the short-handoff race at decode's real
commit path, a short (1-token) and a full handoff published with the real `MetadataBuffers.set_buf` and
committed through the real `DecodeTransferQueue._commit_transfer_to_req`.
"""

from __future__ import annotations

from array import array
from typing import Any

from _probe_world import PROMPT_LEN, Recorder, World, _NoSpec, _reason


def hardening(w: World) -> dict[str, Any]:
    import torch

    dutils, decode_mod = w.dutils, w.decode_mod
    kwargs: dict[str, Any] = {"size": 4, "hidden_size": 16, "hidden_states_dtype": torch.float32}
    import inspect

    params = inspect.signature(dutils.MetadataBuffers.__init__).parameters
    if "max_sampling_mask_tokens" in params:
        kwargs["max_sampling_mask_tokens"] = 0
    buffers = dutils.MetadataBuffers(**kwargs)
    cases = []
    for name, prefill_len, expect in (("short_handoff", 1, "ABORTED"), ("full_handoff", PROMPT_LEN, "COMMITTED")):
        log: list[tuple[str, str, Any]] = []
        sched = w.scheduler(log)
        sched.batch_result_processor = Recorder("batch_result_processor", log)
        # Prefill side: what prefill's last chunk publishes (real set_buf), for a prompt of prefill_len.
        p_req = w.req(f"kvgate-probe-{name}-prefill", fake=False)
        p_req.origin_input_ids = array("q", range(1, prefill_len + 1))
        p_req.output_ids = [7]
        p_req.metadata_buffer_index = 1
        buffers.set_buf(p_req)
        # Decode side: the same room, the full prompt reserved; the row arrives as prefill wrote it.
        d_req = w.req(f"kvgate-probe-{name}-decode", fake=False)
        d_req.bootstrap_room = p_req.bootstrap_room
        cls = decode_mod.DecodeTransferQueue
        tq = cls.__new__(cls)
        tq.metadata_buffers = buffers
        tq.scheduler = sched
        tq.tree_cache = sched.tree_cache
        tq.spec_algorithm = _NoSpec()
        receiver = w.fake_receiver_cls(
            mgr=w.kv_manager("DECODE"), bootstrap_addr="10.255.255.1:8998", bootstrap_room=d_req.bootstrap_room
        )
        dreq = decode_mod.DecodeRequest(req=d_req, kv_receiver=receiver)
        dreq.metadata_buffer_index = 1
        tq._commit_transfer_to_req(dreq)
        aborted = d_req.finished_reason is not None and type(d_req.finished_reason).__name__ == "FINISH_ABORT"
        cases.append(
            {
                "name": name,
                "expect": expect,
                "outcome": "ABORTED" if aborted else ("COMMITTED" if d_req.output_ids else "UNKNOWN"),
                "prefill_tokens": prefill_len,
                "decode_reserved": len(d_req.origin_input_ids),
                "output_ids": list(d_req.output_ids),
                "client_error": _reason(d_req.finished_reason),
            }
        )
    return {"status": "ok", "cases": cases}
