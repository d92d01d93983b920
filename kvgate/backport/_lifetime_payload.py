"""Runs INSIDE the interpreter that has the target sglang (no kvgate import): executes sglang's real
Mooncake PD transfer control plane on CPU and asks, per page-lifetime fix, whether decode frees KV pages
while a prefill write into them may still land. Prints one JSON line prefixed RESULT_TAG.

Real sglang code: `MooncakeKVManager` (prefill and decode roles) with its real ABORT handler thread
(`start_prefill_thread`), ABORT_ACK/status thread (`start_decode_thread`), `transfer_worker` thread,
`add_transfer_request`, `conclude_failure`, the ACK bookkeeping of `CommonKVManager`,
`MooncakeKVReceiver.abort/poll/failure_exception`, `CommonKVSender.clear`, `Scheduler.abort_request`,
`DecodeTransferQueue.pop_transferred/resolve_deferred_releases` and `poll_and_all_reduce` over a real
one-rank gloo group. Managers, receivers and queues are made with `cls.__new__` and given the
attributes their methods read (shared/reference/cpu-sglang.md).

TEST CODE, named as such (the PROBE_* classes and kvgate_probe_* functions):
- ProbeWire / ProbeSocket: the ZMQ links between prefill and decode, in memory (frames logged).
- kvgate_probe_delayed_send_kvcache: stands in for the RDMA write (`send_kvcache`); it blocks on a gate
  (the injected delay), then copies the request's bytes into decode's pages (the late write).
- ProbeKVPool + kvgate_probe_release_kv_cache: decode's page pool and allocator (not under test); a
  freed page goes to the next request at once, like a pool run with a small --max-total-tokens.
Deferred release is switched on (SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE=1, what
kvgate-deferred-release-default makes the default).

Staged by events, never by time (tests must hold on a busy machine): each step (send, write start,
abort, ACK, release) waits for the event before it, which the scenario holds. The write is parked at a
gate inside the patched send until the scenario opens it; `settle` waits until every in-process sglang
thread has handled everything sent to it (it is back waiting on its empty socket or queue), then runs
one decode scheduler round, until a round sends nothing new. Decode's hold timeout (30 s in production)
is set beyond any scenario (HOLD_BOUND_S); a scenario ends a hold that is still waiting, once nothing
else can happen, by expiring its deadline (`expire_holds`): what the real timeout finds. A step that
does not happen within STAGE_BOUND_S (an outer safety net, far above the milliseconds it takes) raises
NotStaged: the scenario is staged again, up to STAGE_TRIES times, and never yields a verdict unstaged
(outcome INCONCLUSIVE, saying what was awaited).

Usage: python _lifetime_payload.py STUB_FILE
"""

from __future__ import annotations

import json
import logging
import os
import queue as _queue
import socket
import sys
import threading
import time
import traceback
import types
from collections import defaultdict
from typing import Any

os.environ["SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"] = "1"

from _probe_payload import RESULT_TAG, Recorder, World, _ensure_torchvision, _error  # noqa: E402

HOLD_BOUND_S = 3600.0  # decode's deferred-release timeout here: never reached, `expire_holds` ends a hold
STAGE_BOUND_S = 120.0  # outer safety net for any one awaited step (each takes milliseconds when staged)
STAGE_TRIES = 3  # how many times a scenario is staged before it is INCONCLUSIVE
SETTLE_ROUNDS = 50  # scheduler rounds `settle` allows before the threads are called restless
PAGES = 4  # per request; the pool has exactly one request's worth, so a freed page is reused at once
PAGE_BYTES = 16
PREFILL_EP = ("10.255.0.1", 17100)
DECODE_EPS = (("10.255.0.2", 17200), ("10.255.0.3", 17201))


class ProbeSocketClosed(Exception):
    """Raised into a real sglang thread loop to end it when a scenario is over (test code)."""


class NotStaged(Exception):
    """A step the scenario waits for did not happen within its outer bound: the race was not staged
    (no verdict; the scenario is staged again)."""


class ProbeSocket:
    """TEST CODE: the receiving end of a ZMQ socket (or the transfer worker's queue), fed by ProbeWire.

    It counts what was sent, taken and handled: the consumer thread has handled an item when it comes
    back for the next one, so `wait_idle` returns once everything sent so far has been handled."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.q: _queue.Queue[Any] = _queue.Queue()
        self.cond = threading.Condition()
        self.sent = self.taken = self.handled = 0

    def _take(self) -> Any:
        with self.cond:
            self.handled = self.taken
            self.cond.notify_all()
        item = self.q.get()
        with self.cond:
            self.taken += 1
        if item is None:
            raise ProbeSocketClosed(self.name)
        return item

    def recv_multipart(self) -> list[bytes]:
        return list(self._take())

    def get(self) -> Any:  # as the transfer worker's queue
        return self._take()

    def put(self, item: Any) -> None:
        with self.cond:
            self.sent += 1
        self.q.put(item)

    def close(self) -> None:
        self.q.put(None)  # not counted: it ends the consumer

    def idle(self) -> bool:
        with self.cond:
            return self.handled >= self.sent

    def wait_idle(self, what: str) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: self.handled >= self.sent, STAGE_BOUND_S):
                raise NotStaged(
                    f"{self.name} did not finish handling {what} within {STAGE_BOUND_S:g} s "
                    f"(sent {self.sent}, taken {self.taken}, handled {self.handled})"
                )


class ProbeWire:
    """TEST CODE: routes frames between the in-process prefill and decode sockets and logs them.

    `hold(pred)` keeps back frames matching pred (a slow link) until `deliver_held()`.
    """

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.routes: dict[tuple[str, int], ProbeSocket] = {}
        self.log: list[dict[str, Any]] = []
        self.held: list[tuple[ProbeSocket, list[bytes]]] = []
        self.hold_pred: Any = None
        self.lock = threading.Lock()

    def route(self, ep: tuple[str, int], sock: ProbeSocket) -> None:
        self.routes[ep] = sock

    def send(self, endpoint: str, frames: list[bytes], src: str) -> None:
        host, port = endpoint.rsplit("//", 1)[-1].rsplit(":", 1)
        dst = (host.strip("[]"), int(port))
        frames = [bytes(f) for f in frames]
        with self.lock:
            held = self.hold_pred is not None and self.hold_pred(frames)
            self.log.append(
                {
                    "t": round(time.monotonic() - self.t0, 3),
                    "src": src,
                    "dst": f"{dst[0]}:{dst[1]}",
                    "frames": [f.decode("ascii", "replace")[:24] for f in frames],
                    "held": held,
                }
            )
            sock = self.routes.get(dst)
            if sock is None:
                return  # nobody listens there: the frame is lost, as on a real network
            if held:
                self.held.append((sock, frames))
            else:
                sock.put(frames)

    def deliver_held(self) -> int:
        with self.lock:
            held, self.held, self.hold_pred = self.held, [], None
        for sock, frames in held:
            sock.put(frames)
        return len(held)

    def frames(self, kind: bytes) -> list[dict[str, Any]]:
        return [e for e in self.log if e["frames"] and e["frames"][0] == kind.decode()]


class ProbeKVPool:
    """TEST CODE: decode's KV pages (bytes per page) and allocator, with a timed event log."""

    def __init__(self, t0: float, pages: int) -> None:
        import numpy as np

        self.t0 = t0
        self.data = np.zeros((pages, PAGE_BYTES), dtype=np.uint8)
        self.free = list(range(pages))
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def _ev(self, kind: str, who: str, pages: list[int]) -> None:
        self.events.append({"t": round(time.monotonic() - self.t0, 3), "event": kind, "req": who, "pages": pages})

    def alloc(self, n: int, who: str) -> list[int] | None:
        with self.lock:
            if len(self.free) < n:
                return None
            got, self.free = self.free[:n], self.free[n:]
            self._ev("alloc", who, got)
            return got

    def release(self, pages: list[int], who: str) -> None:
        with self.lock:
            self.free.extend(pages)
            self._ev("free", who, list(pages))

    def write(self, pages: list[int], value: int, who: str, kind: str = "write") -> None:
        with self.lock:
            for p in pages:
                self.data[p, :] = value
            self._ev(kind, who, list(pages))

    def first(self, kind: str, who: str) -> dict[str, Any] | None:
        return next((e for e in self.events if e["event"] == kind and e["req"] == who), None)


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


# -- the page oracle --------------------------------------------------------------------------------
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


# -- scenarios ---------------------------------------------------------------------------------------
# Each step waits for the one before it (see the module docstring); none waits on the clock.
def _finish(pair: Pair, room: int, tick: Any) -> None:
    """The parked write lands, every thread settles, and a hold still waiting ends on its timeout."""
    pair.open_gate(room, tick)
    pair.expire_holds(tick)


def abort_then_sender_cleared(lt: Lifetime) -> dict[str, Any]:
    """#40645: decode aborts mid-write; prefill clears the sender before the write drains."""
    pair = Pair(lt)
    try:
        d = pair.decodes[0]
        room, a = lt.next_room(), "kvgate-probe-aborted"
        pages = pair.alloc(a)
        pair.admit(d, room, a, pages)
        held = pair.start_transfer(room, a, 0xA1, pages)
        pair.abort(d, a)
        pair.settle("the abort")  # prefill handled the ABORT, decode released or holds the pages
        pair.clear_prefill_sender(room)  # prefill concluded the aborted request
        tick = _victim_ticker(pair, "kvgate-probe-next")
        pair.settle("the sender's clear", tick)
        _finish(pair, held, tick)
        return _verdict(pair, a, 0xA1, tick, [d.ep])
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
        held = pair.start_transfer(room, a, 0xA1, pages)
        for i, d in enumerate(pair.decodes):
            pair.abort(d, a if i == 0 else f"{a}-rank{i}")
        tick = _victim_ticker(pair, "kvgate-probe-next")
        pair.settle("both ranks' aborts", tick)
        _finish(pair, held, tick)
        # A rank whose hold ended on the timeout did not learn of the drain even if its own pages
        # were not the ones written here.
        return _verdict(pair, a, 0xA1, tick, [d.ep for d in pair.decodes])
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
        pages = pair.alloc(a)
        pair.admit(d, room, a, pages)
        held = pair.start_transfer(room, a, 0xA1, pages)
        _prefill_fails_room(pair, room, "kvgate probe: prefill-side failure while a chunk is still being written")
        tick = _victim_ticker(pair, "kvgate-probe-next")
        pair.settle("the prefill-side failure", tick)  # decode read the status, released or holds
        _finish(pair, held, tick)
        return _verdict(pair, a, 0xA1, tick, [d.ep])
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
        pages = pair.alloc(a)  # NotStaged unless hold 1's pages came back
        pair.admit(d, room, a, pages)
        held = pair.start_transfer(room, a, 0xA1, pages)
        pair.abort(d, a)
        pair.settle("the second hold's abort")
        stale = pair.wire.deliver_held()  # the first hold's ACK finally arrives, mid-write
        tick = _victim_ticker(pair, "kvgate-probe-next")
        pair.settle("the stale ACK", tick)
        _finish(pair, held, tick)
        out = _verdict(pair, a, 0xA1, tick, [d.ep])
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


def _staged(scenario: Any, lt: Lifetime) -> dict[str, Any]:
    """Run a scenario until it is staged (up to STAGE_TRIES): a race that was not staged is INCONCLUSIVE
    with what was awaited, never a verdict and never an ERROR; an exception of the code is an ERROR."""
    unstaged: list[str] = []
    for attempt in range(1, STAGE_TRIES + 1):
        try:
            out = scenario(lt)
        except NotStaged as exc:
            unstaged.append(str(exc))
            continue
        except Exception as exc:
            return {"outcome": "ERROR", **_error(exc), "not_staged": unstaged}
        return {**out, "staging_tries": attempt, "not_staged": unstaged}
    return {
        "outcome": "INCONCLUSIVE",
        "why": f"the race was not staged in {STAGE_TRIES} tries (rerun the probe); last: {unstaged[-1]}",
        "not_staged": unstaged,
        "staging_tries": STAGE_TRIES,
    }


def main(argv: list[str]) -> int:
    stub_file = argv[1]
    only = argv[2].split(",") if len(argv) > 2 and argv[2] else list(SCENARIOS)
    started = time.monotonic()
    out: dict[str, Any]
    try:
        stubbed = _ensure_torchvision(stub_file)
        w = World()
        lt = Lifetime(w)
        results = {}
        for name in only:
            t = time.monotonic()
            results[name] = _staged(SCENARIOS[name], lt)
            results[name]["duration_s"] = round(time.monotonic() - t, 2)
        out = {
            "status": "ok",
            "version": w.version,
            "sglang_path": w.path,
            "torchvision_stub": stubbed,
            "scenarios": results,
        }
    except Exception as exc:
        out = _error(exc)
        out["traceback"] = traceback.format_exc(limit=8)
    out["import_and_run_s"] = round(time.monotonic() - started, 2)
    sys.stdout.flush()
    print(RESULT_TAG + json.dumps(out, default=str), flush=True)
    sys.stdout.flush()
    os._exit(0)  # real sglang threads (non-daemon in these releases) must not keep the process alive


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
