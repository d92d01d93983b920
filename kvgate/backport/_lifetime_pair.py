"""Runs INSIDE the interpreter that has the target sglang: one prefill rank and n decode ranks of the
release's real Mooncake control plane (`MooncakeKVManager` in both roles, with their real threads),
wired in memory by _lifetime_wire.py; the steps a scenario stages on them (admit, start a write held at
its gate, abort, settle, expire a hold).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import types
from collections import defaultdict
from typing import Any

from _lifetime_wire import (
    DECODE_EPS,
    HOLD_BOUND_S,
    PAGE_BYTES,
    PAGES,
    PREFILL_EP,
    SETTLE_ROUNDS,
    STAGE_BOUND_S,
    NotStaged,
    ProbeKVPool,
    ProbeSocket,
    ProbeSocketClosed,
    ProbeWire,
)
from _probe_world import Recorder, World


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Lifetime:
    """The real classes, imported once, and the one-rank gloo group the decode poll all-reduces over."""

    def __init__(self, w: World) -> None:
        import numpy as np
        import torch.distributed as dist
        from sglang.srt.disaggregation.base.conn import KVPoll
        from sglang.srt.disaggregation.common import conn as common_conn
        from sglang.srt.disaggregation.common.utils import TransferKVChunk
        from sglang.srt.disaggregation.mooncake import conn as mc
        from sglang.srt.managers.io_struct import AbortReq

        self.w, self.np, self.KVPoll, self.mc, self.common_conn = w, np, KVPoll, mc, common_conn
        self.TransferKVChunk, self.AbortReq = TransferKVChunk, AbortReq
        if not dist.is_initialized():
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
        self.group = dist.group.WORLD
        self.room = 7_000
        self.thread_errors: list[str] = []  # real sglang threads that died of anything else
        # Threads the probe ends by closing their socket raise ProbeSocketClosed (or the worker's
        # RuntimeError wrapping it): not an error of the code under test.
        previous = threading.excepthook

        def hook(args: Any) -> None:
            exc: BaseException | None = args.exc_value
            while exc is not None:
                if isinstance(exc, ProbeSocketClosed):
                    return
                exc = exc.__context__
            name = args.thread.name if args.thread is not None else "?"
            self.thread_errors.append(f"{name}: {args.exc_type.__name__}: {args.exc_value}"[:300])
            previous(args)

        threading.excepthook = hook

    def next_room(self) -> int:
        self.room += 1
        return self.room


class Pair:
    """One prefill rank and n decode ranks, wired in memory, with real sglang threads running."""

    def __init__(self, lt: Lifetime, n_decode: int = 1) -> None:
        self.lt = lt
        self.t0 = time.monotonic()
        self._errors_before = len(lt.thread_errors)  # thread deaths of earlier pairs are not this one's
        self.wire = ProbeWire(self.t0)
        self.pool = ProbeKVPool(self.t0, PAGES)
        self.writer: dict[str, tuple[str, int, int]] = {}
        self._real_release = lt.w.decode_mod.release_kv_cache
        lt.w.decode_mod.release_kv_cache = self.kvgate_probe_release_kv_cache
        self.gates: dict[int, threading.Event] = {}
        self.write_started: dict[int, threading.Event] = {}
        self.write_done: dict[int, threading.Event] = {}
        self.sockets: list[ProbeSocket] = []
        self.warnings: list[str] = []
        self.prefill = self._prefill()
        self.decodes = [self._decode(ep) for ep in DECODE_EPS[:n_decode]]
        self._log_handler = _Capture(self.warnings)
        logging.getLogger("sglang.srt.disaggregation").addHandler(self._log_handler)

    # -- prefill ---------------------------------------------------------------------------------
    def _prefill(self) -> Any:
        mc, KVPoll = self.lt.mc, self.lt.KVPoll
        P = mc.MooncakeKVManager.__new__(mc.MooncakeKVManager)
        P.disaggregation_mode = self.lt.w.dutils.DisaggregationMode.PREFILL
        P.request_status, P.failure_records, P.failure_lock = {}, {}, threading.Lock()
        P._staging_outstanding = defaultdict(int)
        P._deferred_ack_targets = {}
        P.transfer_infos, P.req_to_decode_prefix_len, P.decode_kv_args_table = {}, {}, {}
        P.session_lock, P.failed_sessions, P.session_failures = threading.Lock(), set(), defaultdict(int)
        P.enable_deferred_decode_kv_release = True
        P.enable_trace = P.enable_staging = False
        P.attn_tp_rank, P.attn_tp_size, P.pp_size, P.pp_rank, P.attn_cp_size, P.attn_cp_rank = 0, 1, 1, 0, 1, 0
        P.enable_all_cp_ranks_for_transfer = False
        P.is_mla_backend = P.is_hybrid_mla_backend = False
        P.kv_args = types.SimpleNamespace(kv_data_ptrs=[0], engine_rank=0)  # non-empty: the worker sends KV
        P.bootstrap_port = PREFILL_EP[1]
        P.server_socket = ProbeSocket("prefill-bootstrap")
        P._send_multipart_locked = lambda endpoint, parts, is_ipv6=False: self.wire.send(endpoint, parts, "prefill")
        P.send_kvcache = self.kvgate_probe_delayed_send_kvcache
        worker_q = ProbeSocket("prefill-transfer-queue")
        P.transfer_queues = [worker_q]
        self.wire.route(PREFILL_EP, P.server_socket)
        self.sockets += [P.server_socket, worker_q]
        P.start_prefill_thread()
        threading.Thread(target=P.transfer_worker, args=(worker_q, None), daemon=True).start()
        del KVPoll
        return P

    def kvgate_probe_delayed_send_kvcache(
        self,
        mooncake_session_id: str,
        prefill_kv_indices: Any,
        dst_kv_ptrs: Any,
        dst_kv_indices: Any,
        *a: Any,
        **k: Any,
    ) -> int:
        """TEST CODE standing in for the RDMA write: park at the gate until the scenario opens it (the
        injected delay), then write the sending request's bytes into the destination pages, whoever owns
        them by then. The bound only keeps a broken scenario from parking the thread for ever; `open_gate`
        finds a write that landed before it opened the gate and calls that unstaged."""
        who, value, room = self.writer[mooncake_session_id]
        self.write_started[room].set()
        self.gates[room].wait(STAGE_BOUND_S)
        self.pool.write([int(p) for p in dst_kv_indices], value, who, kind="late-write-lands")
        self.write_done[room].set()
        return 0

    def alloc(self, who: str) -> list[int]:
        """Decode reserves a request's pages; the pool has one request's worth, so it is free only once
        the previous request's pages came back (a step the scenario staged before)."""
        pages = self.pool.alloc(PAGES, who)
        if pages is None:
            raise NotStaged(f"decode's pool had no free pages for {who}: the previous hold was not released")
        return pages

    def open_gate(self, room: int, tick: Any = None) -> None:
        """The injected delay ends: the parked write lands, then every thread settles."""
        if self.write_done[room].is_set():
            raise NotStaged(f"the write of room {room} landed before the scenario opened its gate")
        self.gates[room].set()
        if not self.write_done[room].wait(STAGE_BOUND_S):
            raise NotStaged(f"the write of room {room} did not land within {STAGE_BOUND_S:g} s of its gate opening")
        self.settle(f"the write of room {room} landing", tick)

    def start_transfer(self, room: int, rid: str, value: int, pages: list[int]) -> int:
        """Prefill side of a request: bootstrapped by every decode rank, one KV chunk enqueued (real
        add_transfer_request) and its write started; returns the room, whose gate holds the write.
        Decode rank 0 receives into `pages`; other ranks' pages are not modelled (no write)."""
        KVPoll, P = self.lt.KVPoll, self.prefill
        P.update_status(room, KVPoll.Bootstrapping)
        infos = {}
        for i, (ip, port) in enumerate(DECODE_EPS[: len(self.decodes)]):
            sess = f"{ip}:{port}"
            infos[sess] = self.lt.mc.TransferInfo(
                room=room,
                endpoint=ip,
                dst_port=port,
                mooncake_session_id=sess,
                dst_kv_indices=self.lt.np.array(pages if i == 0 else [], dtype=self.lt.np.int32),
                dst_aux_index=0,
                dst_state_indices=[],
                required_dst_info_num=len(self.decodes),
                is_dummy=False,
                decode_prefix_len=None,
            )
            P.decode_kv_args_table[sess] = types.SimpleNamespace(
                requires_dcp_relayout=False,
                dst_kv_ptrs=[0],
                dst_attn_tp_size=1,
                dst_kv_item_len=PAGE_BYTES,
                dst_kv_layer_ids=None,
                dst_tp_rank=0,
            )
            self.writer[sess] = (rid, value, room)
        P.transfer_infos[room] = infos
        P.update_status(room, KVPoll.WaitingForInput)
        self.gates[room] = threading.Event()
        self.write_started[room] = threading.Event()
        self.write_done[room] = threading.Event()
        np = self.lt.np
        P.add_transfer_request(room, np.arange(PAGES, dtype=np.int32), slice(0, PAGES), False)
        # The next step (an abort) waits for this event: the write is in flight, parked at its gate.
        # The real worker skips a chunk (no write) where the room is not live, so a write that never
        # starts means the race was not staged; the bound is only the outer safety net.
        if not self.write_started[room].wait(STAGE_BOUND_S):
            self._raise_thread_errors()
            status = P.request_status.get(room, "absent")
            have_infos = "set" if room in P.transfer_infos else "absent"
            raise NotStaged(
                f"the real transfer worker never started the write within {STAGE_BOUND_S:g} s "
                f"(room {room}: prefill status {status}, transfer_infos {have_infos}, "
                f"chunks still queued {self.prefill.transfer_queues[0].q.qsize()}, "
                f"last frames {[e['frames'][:2] for e in self.wire.log[-4:]]})"
            )
        return room

    def write_in_flight(self, d: types.SimpleNamespace, room: int, rid: str, value: int) -> int:
        """Decode admits `rid` on `d` with fresh pages and prefill starts its write, held at its gate."""
        pages = self.alloc(rid)
        self.admit(d, room, rid, pages)
        return self.start_transfer(room, rid, value, pages)

    def clear_prefill_sender(self, room: int) -> None:
        """What prefill does when its request concludes: the real CommonKVSender.clear."""
        mc = self.lt.mc
        sender = mc.MooncakeKVSender.__new__(mc.MooncakeKVSender)
        sender.kv_mgr, sender.bootstrap_room = self.prefill, room
        sender.clear()

    # -- decode ----------------------------------------------------------------------------------
    def _decode(self, ep: tuple[str, int]) -> types.SimpleNamespace:
        lt, w = self.lt, self.lt.w
        mc = lt.mc
        D = mc.MooncakeKVManager.__new__(mc.MooncakeKVManager)
        D.disaggregation_mode = w.dutils.DisaggregationMode.DECODE
        D.request_status, D.failure_records, D.failure_lock = {}, {}, threading.Lock()
        D._deferred_abort_ack_tracker = {}
        D.enable_deferred_decode_kv_release = True
        D.local_ip, D.rank_port = ep
        D.addr_to_rooms_tracker = defaultdict(set)
        D.required_prefill_response_num_table, D.prefill_response_tracker = {}, defaultdict(set)
        D.enable_staging, D._staging_handler = False, None
        D.waiting_timeout = 300
        D.attn_tp_rank, D.pp_size, D.attn_cp_size, D.pp_rank, D.attn_cp_rank = 0, 1, 1, 0, 0
        D.server_socket = ProbeSocket(f"decode-{ep[1]}")
        D._start_heartbeat_checker_thread = lambda: None  # no heartbeats in the probe
        self.wire.route(ep, D.server_socket)
        self.sockets.append(D.server_socket)
        D.start_decode_thread()
        log: list[Any] = []
        sched = w.scheduler(log)
        tq = w.decode_mod.DecodeTransferQueue.__new__(w.decode_mod.DecodeTransferQueue)
        tq.queue, tq.scheduler, tq.tree_cache = [], sched, Recorder("tree_cache", log)
        tq.enable_staging, tq.gloo_group, tq.tp_rank = False, lt.group, 0
        tq.metadata_buffers = types.SimpleNamespace(bootstrap_room=lt.np.zeros((8, 1), dtype=lt.np.int64))
        tq.req_to_metadata_buffer_idx_allocator = w.dutils.ReqToMetadataIdxAllocator(8)
        tq.enable_deferred_kv_release = True
        tq.deferred_kv_release_timeout = HOLD_BOUND_S
        tq._deferred_releases = []
        sched.enable_decode_hicache = False
        sched.metrics_reporter = types.SimpleNamespace(enable_metrics=False)
        sched.chunked_req = sched.mm_receiver = sched.dllm_config = None
        sched.waiting_queue = []
        sched.grammar_manager = Recorder("grammar_manager", log)
        sched.disaggregation_mode = w.dutils.DisaggregationMode.DECODE
        sched.disagg_decode_prealloc_queue = types.SimpleNamespace(queue=[], retracted_queue=[])
        sched.disagg_decode_transfer_queue = tq
        sched.ps = types.SimpleNamespace(pp_size=1)
        sched.collect_inflight_reqs = lambda: []
        return types.SimpleNamespace(mgr=D, tq=tq, sched=sched, ep=ep)

    def admit(self, d: types.SimpleNamespace, room: int, rid: str, pages: list[int]) -> Any:
        """Decode side of a request: pages reserved, receiver bootstrapped (real MooncakeKVReceiver)."""
        lt, w, KVPoll = self.lt, self.lt.w, self.lt.KVPoll
        mc = lt.mc
        R = mc.MooncakeKVReceiver.__new__(mc.MooncakeKVReceiver)
        R.bootstrap_room, R.bootstrap_addr, R.kv_mgr = room, f"{PREFILL_EP[0]}:8998", d.mgr
        R.conclude_state, R.require_staging, R.init_time, R.abort_notified = None, False, time.time(), False
        R._connection_pool_entries, R.session_id = {}, f"{d.ep[0]}:{d.ep[1]}"
        R.bootstrap_infos = [{"rank_ip": PREFILL_EP[0], "rank_port": PREFILL_EP[1], "is_dummy": False}]
        wire = self.wire

        class _BootstrapSock:  # TEST CODE: decode's socket to the prefill bootstrap server
            def send_multipart(self, frames: list[bytes]) -> None:
                wire.send(f"tcp://{PREFILL_EP[0]}:{PREFILL_EP[1]}", frames, f"decode:{d.ep[1]}")

        R._connect_to_bootstrap_server = lambda info: (_BootstrapSock(), threading.Lock())
        d.mgr.addr_to_rooms_tracker[R.bootstrap_addr].add(room)
        d.mgr.update_status(room, KVPoll.Bootstrapping)
        d.mgr.update_status(room, KVPoll.WaitingForInput)
        req = w.req(rid, fake=False)
        req.bootstrap_room = room
        req.kvgate_probe_pages = pages
        dreq = w.decode_mod.DecodeRequest(req=req, kv_receiver=R)
        dreq.metadata_buffer_index = d.tq.req_to_metadata_buffer_idx_allocator.alloc()
        d.tq.queue.append(dreq)
        return req

    def abort(self, d: types.SimpleNamespace, rid: str) -> None:
        """The client aborts: the real Scheduler.abort_request on that decode rank."""
        d.sched.abort_request(self.lt.AbortReq(rid=rid))

    def pump_once(self, on_tick: Any = None) -> None:
        """One round of the decode scheduler loop: the real pop_transferred and resolve_deferred_releases."""
        for d in self.decodes:
            d.tq.pop_transferred()
            d.tq.resolve_deferred_releases()
        if on_tick is not None:
            on_tick()

    def _raise_thread_errors(self) -> None:
        mine = self.lt.thread_errors[self._errors_before :]
        if mine:  # the code under test failed: an error, not an unstaged race
            raise RuntimeError(f"a real sglang thread died: {mine}")

    def _sent(self) -> int:
        return sum(s.sent for s in self.sockets)

    def settle(self, what: str, on_tick: Any = None) -> None:
        """Wait until every sglang thread here has handled everything sent to it, then run one decode
        scheduler round; again until a round sends nothing new. The transfer worker is not waited for
        while a write is parked at its gate (it is inside that write, by design)."""
        worker_q = self.prefill.transfer_queues[0]
        for _ in range(SETTLE_ROUNDS):
            before = self._sent()
            parked = any(not g.is_set() for g in self.gates.values())
            for s in self.sockets:
                if not (parked and s is worker_q):
                    try:
                        s.wait_idle(what)
                    except NotStaged:
                        self._raise_thread_errors()
                        raise
            self.pump_once(on_tick)
            if self._sent() == before:
                return
        raise NotStaged(f"the threads kept sending after {what}: not settled in {SETTLE_ROUNDS} rounds")

    def expire_holds(self, on_tick: Any = None) -> None:
        """Nothing else can happen now: a hold still waiting ends as the real timeout would end it."""
        for d in self.decodes:
            held = d.tq._deferred_releases
            if any(len(h) != 4 for h in held):  # (decode_req, deadline, index, required_acks) in 0.5.19-0.5.20
                raise RuntimeError(f"decode's deferred releases changed shape: {[len(h) for h in held]} fields")
            d.tq._deferred_releases = [(r, float("-inf"), i, n) for r, _, i, n in held]
        self.settle("the holds' timeout", on_tick)

    def kvgate_probe_release_kv_cache(self, req: Any, tree_cache: Any, is_insert: bool = True) -> None:
        """TEST CODE: decode's allocator (not under test) takes the request's pages back."""
        self.pool.release(list(getattr(req, "kvgate_probe_pages", [])), req.rid)

    def close(self) -> None:
        self.lt.w.decode_mod.release_kv_cache = self._real_release
        for g in self.gates.values():
            g.set()
        for s in self.sockets:
            s.close()
        logging.getLogger("sglang.srt.disaggregation").removeHandler(self._log_handler)


class _Capture(logging.Handler):
    def __init__(self, out: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.out = out

    def emit(self, record: logging.LogRecord) -> None:
        self.out.append(record.getMessage()[:160])
