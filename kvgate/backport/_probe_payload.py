"""Runs INSIDE the interpreter that has the target sglang (no kvgate import): executes sglang's real
PD admission doors and decode commit path on CPU and prints one JSON line prefixed RESULT_TAG.

Real throughout: `Req`, `set_finish_with_abort`, `PrefillBootstrapQueue.add`, `DecodePreallocQueue.add`,
the fake transfer backend's manager/sender/receiver, `ReqToMetadataIdxAllocator`, `MetadataBuffers`,
`DecodeTransferQueue._commit_transfer_to_req` and the `Scheduler` methods the doors call. Only the
objects those methods hand work to (output streamer, beam coordinator, tree cache) are recorders, and
the queues are made with `cls.__new__` and given the attributes their methods read (see
shared/reference/cpu-sglang.md). A missing attribute or import is reported as an error naming it.

Usage: python _probe_payload.py admission|hardening STUB_FILE

One file by necessity (over 500 lines): it is shipped as a single script into the target interpreter,
which has no kvgate to import from.
"""

from __future__ import annotations

import gc
import json
import sys
import time
import traceback
from array import array
from typing import Any

RESULT_TAG = "KVGATE-PROBE-RESULT:"
PROMPT_LEN = 8
MAX_INPUT = 4
REJECT_MSG = f"Input length ({PROMPT_LEN} tokens) exceeds the maximum allowed length ({MAX_INPUT} tokens)."


def _ensure_torchvision(stub_file: str) -> bool:
    """Use the real torchvision if it loads; else install kvgate's labelled STUB. Returns True if stubbed."""
    try:
        import torchvision  # noqa: F401

        return bool(getattr(torchvision, "__kvgate_stub__", False))
    except Exception:
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        code = compile(open(stub_file).read(), stub_file, "exec")
        exec(code, {"__name__": "kvgate_torchvision_stub"})
        return True


class Recorder:
    """Stands in for a collaborator the doors hand work to; records every call."""

    def __init__(self, name: str, log: list[tuple[str, str, Any]]) -> None:
        self._name = name
        self._log = log

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)

        def call(*args: Any, **kwargs: Any) -> Any:
            self._log.append((self._name, attr, args))
            return None

        return call


def _reason(reason: Any) -> dict[str, Any] | None:
    if reason is None:
        return None
    out: dict[str, Any] = {"type": type(reason).__name__}
    for key in ("message", "status_code", "err_type"):
        if hasattr(reason, key):
            val = getattr(reason, key)
            out[key] = int(val) if key == "status_code" and val is not None else val
    return out


class World:
    """The real sglang classes, imported once, plus recorders for the collaborators."""

    def __init__(self) -> None:
        import sglang

        self.version = getattr(sglang, "__version__", None)
        self.path = sglang.__file__
        from sglang.srt.disaggregation import decode as decode_mod
        from sglang.srt.disaggregation import prefill as prefill_mod
        from sglang.srt.disaggregation import utils as dutils
        from sglang.srt.disaggregation.base.conn import KVArgs
        from sglang.srt.managers import schedule_batch as sb
        from sglang.srt.managers.scheduler import Scheduler
        from sglang.srt.sampling.sampling_params import SamplingParams

        self.decode_mod, self.prefill_mod, self.dutils, self.sb = decode_mod, prefill_mod, dutils, sb
        self.KVArgs, self.Scheduler, self.SamplingParams = KVArgs, Scheduler, SamplingParams
        self.get_parallel = _get_parallel()
        self.fake_sender_cls = dutils.get_kv_class(dutils.TransferBackend.FAKE, dutils.KVClassType.SENDER)
        self.fake_receiver_cls = dutils.get_kv_class(dutils.TransferBackend.FAKE, dutils.KVClassType.RECEIVER)
        self.room = 1000
        self.published_config = _publish_launch_config()

    # -- real objects -------------------------------------------------------------------------
    def req(self, rid: str, fake: bool = True) -> Any:
        self.room += 1
        return self.sb.Req(
            rid=rid,
            origin_input_text="",
            origin_input_ids=array("q", range(1, PROMPT_LEN + 1)),
            sampling_params=self.SamplingParams(max_new_tokens=4),
            bootstrap_host=self.dutils.FAKE_BOOTSTRAP_HOST if fake else "10.255.255.1",
            bootstrap_port=8998,
            bootstrap_room=self.room,
            vocab_size=32000,
        )

    def reject(self, req: Any) -> None:
        # Without the TP-rank override, set_finish_with_abort asserts that no TP group exists.
        with self.get_parallel().override(tp_rank=0):
            req.set_finish_with_abort(REJECT_MSG)

    def kv_manager(self, mode: str) -> Any:
        mgr_cls = self.dutils.get_kv_class(self.dutils.TransferBackend.FAKE, self.dutils.KVClassType.MANAGER)
        return mgr_cls(self.KVArgs(), getattr(self.dutils.DisaggregationMode, mode), None)

    def scheduler(self, log: list[tuple[str, str, Any]]) -> Any:
        sched = self.Scheduler.__new__(self.Scheduler)
        streamed: list[Any] = []

        class Streamer:
            def stream_output(self, reqs: list[Any], return_logprob: bool, *a: Any, **k: Any) -> None:
                for r in reqs:
                    streamed.append({"rid": r.rid, "finished": r.finished(), "reason": _reason(r.finished_reason)})
                log.append(("output_streamer", "stream_output", tuple(r.rid for r in reqs)))

        sched.output_streamer = Streamer()
        sched.streamed = streamed
        sched.beam_coordinator = Recorder("beam_coordinator", log)
        sched.tree_cache = Recorder("tree_cache", log)
        sched.enable_hicache_storage = False
        sched.enable_hisparse = False
        sched.enable_priority_scheduling = False
        return sched

    def prefill_queue(self, sched: Any) -> Any:
        cls = self.prefill_mod.PrefillBootstrapQueue
        q = cls.__new__(cls)
        q.scheduler = sched
        q.queue = []
        q.kv_manager = self.kv_manager("PREFILL")
        q.transfer_backend = self.dutils.TransferBackend.FAKE
        q.tp_rank = 0
        q.pp_rank = 0
        q.bootstrap_port = 8998
        q.max_total_num_tokens = 1 << 20
        q.max_input_len = 1 << 20
        q.req_to_metadata_buffer_idx_allocator = self.dutils.ReqToMetadataIdxAllocator(4)
        q.token_to_kv_pool_allocator = _PageSize(1)
        sched.token_to_kv_pool_allocator = q.token_to_kv_pool_allocator
        return q

    def decode_queue(self, sched: Any) -> Any:
        cls = self.decode_mod.DecodePreallocQueue
        q = cls.__new__(cls)
        q.scheduler = sched
        q.queue = []
        q.pending_reqs = []
        q.retracted_queue = []
        q.kv_manager = self.kv_manager("DECODE")
        q.transfer_backend = self.dutils.TransferBackend.FAKE
        q.max_total_num_tokens = 1 << 20
        q.token_to_kv_pool_allocator = _PageSize(1)
        q.token_to_kv_pool = _PlainKVPool()  # not SWA / DSv4: no tail preallocation
        q.num_reserved_decode_tokens = 0
        q.req_to_metadata_buffer_idx_allocator = self.dutils.ReqToMetadataIdxAllocator(4)
        q.tree_cache = sched.tree_cache
        return q


class _PageSize:
    """A token-to-KV allocator reduced to what the doors read of it (page size, no SWA)."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.size_swa = 0

    def get_kvcache(self) -> _PlainKVPool:
        # 0.5.22+: the decode door asks the allocator for its pool (a DSv4 pool forces a re-bootstrap).
        return _PlainKVPool()

    def prealloc_ceiling_fits(self, full_tokens: int, swa_tokens: int) -> bool | None:
        # 0.5.21+: a plain (non-SWA) pool has no ceiling of its own, as sglang's base allocator says.
        return None


class _PlainKVPool:
    """A KV pool of none of the special classes the decode door checks for."""


def _publish_launch_config() -> list[str]:
    """From 0.5.21 the doors read launch config (`get_memory()`), which a server publishes at start.

    Publish only the leaves the doors read, with launch defaults, and only where nothing is published;
    this is configuration, not code under test. Returns what was published.
    """
    try:
        from sglang.srt import runtime_context as rc
    except ImportError:
        return []
    ctx = getattr(rc, "_CONTEXT", None)
    bag_cls = getattr(rc, "_ConfigBag", None)
    if ctx is None or bag_cls is None or not hasattr(ctx, "is_config_namespace_published"):
        return []
    defaults = {
        "memory": {"disable_radix_cache": False},
        "spec": {"speculative_algorithm": None},
        "disagg": {"disaggregation_decode_allocation_policy": "early"},
    }
    bags = dict(ctx._config_bags or {})
    published = []
    for ns, leaves in defaults.items():
        if ns in bags:
            continue
        bag = bag_cls(ns)
        for leaf, value in leaves.items():
            bag._fields[leaf] = value
            object.__setattr__(bag, leaf, value)
            published.append(f"{ns}.{leaf}={value}")
        bags[ns] = bag
    ctx._config_bags = bags
    return published


def _get_parallel() -> Any:
    try:
        from sglang.srt.runtime_context import get_parallel
    except ImportError:
        from sglang.srt.server_args import get_parallel  # type: ignore[no-redef]
    return get_parallel


def _count(cls: type) -> int:
    return sum(1 for o in gc.get_objects() if type(o) is cls)


# -- admission --------------------------------------------------------------------------------
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


# -- hardening: the real decode commit path -------------------------------------------------------
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


class _NoSpec:
    def is_none(self) -> bool:
        return True

    def is_eagle(self) -> bool:
        return False


# -- after the forward: is an aborted request's final prefill result retired or handed off? -------------
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


MODES = {"admission": admission, "hardening": hardening, "retire_results": retire_results}


def _error(exc: BaseException) -> dict[str, Any]:
    # AttributeError/ImportError name what is missing; anything else still is an error, never a verdict.
    missing = getattr(exc, "name", None) if isinstance(exc, (AttributeError, ImportError)) else None
    return {
        "status": "error",
        "error": f"{type(exc).__name__}: {exc}",
        "missing": missing,
        "traceback": traceback.format_exc(limit=6),
    }


def _run_mode(name: str, world: World) -> dict[str, Any]:
    started = time.monotonic()
    try:
        out = MODES[name](world)
    except Exception as exc:
        out = _error(exc)
    out["duration_s"] = round(time.monotonic() - started, 2)
    return out


def main(argv: list[str]) -> int:
    """argv: MODE STUB_FILE; MODE is one of MODES or "all" (every probe on one import of sglang)."""
    mode, stub_file = argv[1], argv[2]
    started = time.monotonic()
    out: dict[str, Any]
    try:
        stubbed = _ensure_torchvision(stub_file)
        world = World()
        if mode == "all":
            out = {"status": "ok", "suite": {name: _run_mode(name, world) for name in MODES}}
        else:
            out = _run_mode(mode, world)
        out.update(
            version=world.version,
            sglang_path=world.path,
            torchvision_stub=stubbed,
            published_config=world.published_config,
        )
    except Exception as exc:
        out = _error(exc)
    out["import_and_run_s"] = round(time.monotonic() - started, 2)
    sys.stdout.flush()
    print(RESULT_TAG + json.dumps(out, default=str), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
