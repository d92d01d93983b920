"""The simulated scheduler of one PD worker: admission, bootstrap, prefill forward, KV transfer, decode.

One asyncio event loop per worker process. The prefill runs one forward at a time, chunk by chunk
(`--chunked-prefill-size` tokens per chunk, `--sim-prefill-tokens-per-s` of compute), and requests
interleave per chunk like continuous batching; each chunk's pages are posted to the room's sender
queue (delivered after `--sim-transfer-tokens-per-s` transfer time). The decode preallocates pages at
bootstrap, applies whatever page writes arrive, and "attends" over the prompt slots it reserved at
every decode step, writing its output tokens' KV after them.

The toy model (decode side): the attended context is read from the pool (pad token 0 skipped), cut
into lines, and reduced to its distinct lines in order of first appearance (at most 64 KiB); output
token t is byte t (cyclically) of that digest. A healthy request therefore echoes its own prompt's
distinct lines; a request attending stale pages echoes the earlier tenants' lines, so a sentinel on
its own line in an earlier prompt shows up in the text. Content is re-read whenever the pool changed
since the previous step, so a late write that lands mid-generation changes the following tokens.
Everything is deterministic: the same inputs in the same order give the same bytes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import torch

from kvgate.sim import tokenizer, transfer
from kvgate.sim.config import WorkerConfig, env_bool, env_float
from kvgate.sim.kvpool import KVPool, PoolExhausted
from kvgate.sim.releases import Release0519

log = logging.getLogger("kvgate.sim")

#: `disaggregation/utils.py FAKE_BOOTSTRAP_HOST`: health probes on PD workers use it; no KV moves.
FAKE_BOOTSTRAP_HOST = "2.2.2.2"
DIGEST_LIMIT = 65536

@dataclass
class Abort:
    """A pending or final abort (`FINISH_ABORT(message, status_code, err_type)`)."""

    message: str
    status_code: int = HTTPStatus.BAD_REQUEST
    err_type: str = "BadRequestError"

    def finish_reason(self) -> dict[str, Any]:
        return {"type": "abort", "message": self.message, "status_code": int(self.status_code),
                "err_type": self.err_type}


class RequestError(Exception):
    """A request that ends with an error response instead of a result."""

    def __init__(self, abort: Abort, *, value_error: bool = False, output_ids: list[int] | None = None) -> None:
        super().__init__(abort.message)
        self.abort = abort
        #: Tokens generated before the abort took effect (a streaming client still sees them).
        self.output_ids = list(output_ids or [])
        #: True for tokenizer-stage / scheduler 400s, which SGLang raises as ValueError.
        self.value_error = value_error


@dataclass
class SimReq:
    """One request as a worker sees it. Mirrors the `Req` fields that matter for isolation."""

    rid: str
    input_ids: torch.Tensor
    max_new_tokens: int
    bootstrap_host: str | None
    bootstrap_port: int | None
    bootstrap_room: int | None
    #: `Req.to_finish`: a pending abort that `finished()` does not see.
    to_finish: Abort | None = None
    #: `Req.finished_reason`.
    finished_reason: dict[str, Any] | None = None
    #: how many tokens the caller sent (before any placeholder replacement)
    caller_tokens: int = 0
    created: float = field(default_factory=time.time)

    def finished(self) -> bool:
        """`Req.finished()`: reads `finished_reason` only, never `to_finish`."""
        return self.finished_reason is not None


TokenSink = Callable[[list[int], str], Awaitable[None]]


class BaseEngine:
    """What prefill and decode share: pool, limits, tokenizer-stage and scheduler-stage checks."""

    def __init__(self, cfg: WorkerConfig, release: Release0519) -> None:
        self.cfg = cfg
        self.release = release
        self.pool = KVPool(cfg.max_total_tokens or cfg.DEFAULT_POOL, cfg.page_size)
        self.started = time.time()
        self.waiting_timeout = env_float("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300.0)
        self.bootstrap_timeout = env_float("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 300.0)
        self.deferred_release = env_bool("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE",
                                         release.deferred_release_default)
        self.deferred_release_timeout = env_float("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT", 30.0)
        self.stats: dict[str, int] = {"requests": 0, "rejected": 0, "kv_pages_sent": 0, "kv_pages_received": 0,
                                      "late_pages_received": 0}
        self.last_gen_throughput = 0.0

    @property
    def max_total_num_tokens(self) -> int:
        """The pool capacity in tokens (`Scheduler.get_init_info` -> `max_total_num_tokens`)."""
        return self.pool.capacity_tokens

    @property
    def max_req_input_len(self) -> int:
        """`managers/tp_worker.py get_worker_info`: min(context_len - 1, capacity - 1) - 5."""
        return min(self.cfg.effective_context - 1, self.max_total_num_tokens - 1) - 5

    def tokenizer_stage(self, input_ids: torch.Tensor, max_new_tokens: int | None) -> torch.Tensor:
        """`managers/tokenizer_manager.py TokenizerManager._validate_one_request` (ValueError -> 400)."""
        n = int(input_ids.numel())
        ctx = self.cfg.effective_context
        if n >= ctx:
            if self.cfg.allow_auto_truncate:
                return input_ids[:ctx]
            raise RequestError(Abort(
                f"The input ({n} tokens) is longer than the model's context length ({ctx} tokens)."),
                value_error=True)
        if max_new_tokens is not None and n + max_new_tokens > ctx:
            raise RequestError(Abort(
                f"Requested token count exceeds the model's maximum context length of {ctx} tokens. "
                f"You requested a total of {n + max_new_tokens} tokens: {n} tokens from the input messages "
                f"and {max_new_tokens} tokens for the completion. Please reduce the number of tokens in the "
                f"input messages or the completion to fit within the limit."), value_error=True)
        return input_ids

    def scheduler_stage(self, req: SimReq) -> None:
        """`Scheduler.handle_generate_request`: PD room check, then `validate_input_length`.

        A too-long input gets `Req.set_finish_with_abort` semantics (`managers/schedule_batch.py`):
        `to_finish = FINISH_ABORT(...)` and `origin_input_ids = [0]`; `finished()` stays False.
        """
        if req.bootstrap_room is None and self.cfg.disaggregation_transfer_backend == "fake":
            req.bootstrap_room = -1  # a synthetic room: no KV moves ("synthetic decode benchmarks")
        if req.bootstrap_room is None:
            raise RequestError(Abort(
                f"Invalid request: Disaggregated request received without bootstrap room id. req.rid={req.rid!r}"))
        n = int(req.input_ids.numel())
        limit = self.max_req_input_len
        if n >= limit:
            if self.cfg.allow_auto_truncate:
                req.input_ids = req.input_ids[:limit]
                return
            req.to_finish = Abort(
                f"Input length ({n} tokens) exceeds the maximum allowed length ({limit} tokens). "
                f"Use a shorter input or enable --allow-auto-truncate.")
            req.input_ids = torch.zeros(1, dtype=torch.int32)
            self.stats["rejected"] += 1

    def state(self) -> dict[str, Any]:
        """Simulator-only introspection (`GET /sim/state`)."""
        return {"mode": self.cfg.mode, "emulate": self.release.version, "free_pages": self.pool.free_pages,
                "num_pages": self.pool.num_pages, "page_size": self.pool.page_size,
                "deferred_release": self.deferred_release, "waiting_timeout": self.waiting_timeout,
                "stats": dict(self.stats)}

    # What each role implements (the HTTP server drives an engine through these).

    async def start(self) -> None:
        """Start the role's background services (the prefill's bootstrap server)."""
        raise NotImplementedError

    async def stop(self) -> None:
        """Stop them."""
        raise NotImplementedError

    async def generate(self, req: SimReq) -> dict[str, Any]:
        """Run one request to its end (an error is a RequestError)."""
        raise NotImplementedError

    def abort(self, rid: str | None, abort_all: bool = False) -> int:
        """`/abort_request`: abort `rid` (or every request); how many were aborted."""
        raise NotImplementedError


# ----------------------------------------------------------------------------------------- prefill


@dataclass
class _Room:
    """A decode's registration on this prefill's bootstrap server."""

    room: int
    rid: str
    num_tokens: int
    dst_pages: torch.Tensor
    writer: asyncio.StreamWriter
    peer_aborted: bool = False
    #: pages of posted KV writes not yet landed (nor skipped): what is "in flight" for this room
    pages_in_flight: int = 0
    #: posted transfer work, delivered in order by `sender` (a write is "in flight" while queued)
    outbox: asyncio.Queue[tuple[dict[str, Any], bytes, float] | None] | None = None
    sender: asyncio.Task[None] | None = None


class PrefillEngine(BaseEngine):
    """Prefill side: bootstrap server, chunked forward (requests interleave per chunk), KV sender queue."""

    def __init__(self, cfg: WorkerConfig, release: Release0519) -> None:
        super().__init__(cfg, release)
        self.rooms: dict[int, _Room] = {}
        self._room_waiters: dict[int, asyncio.Future[_Room]] = {}
        #: rooms that a prefill request waits for (bootstrap) or forwards; a decode's abort for any
        #: other room finds nothing in flight and is acknowledged at once
        self._claimed: set[int] = set()
        #: one forward at a time; requests interleave chunk by chunk (FIFO), like continuous batching
        self._gpu = asyncio.Lock()
        self.running: dict[str, SimReq] = {}
        self._aborted: set[str] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        """Listen on the bootstrap port (`--disaggregation-bootstrap-port`, bound on `--host`)."""
        self._server = await asyncio.start_server(self._serve_conn, self.cfg.host,
                                                  self.cfg.disaggregation_bootstrap_port, limit=2**26)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        msg = await transfer.recv(reader)
        if msg is None or msg.type != "register":
            writer.close()
            return
        room_id = int(msg.header["room"])
        count = int(msg.header.get("num_pages", 0))
        dst = transfer.unpack_pages(msg.payload, count)[0].clone() if count else torch.zeros(0, dtype=torch.int64)
        room = _Room(room_id, str(msg.header.get("rid")), int(msg.header["num_tokens"]), dst, writer)
        # Registered whether or not a prefill request for the room exists. A request this prefill
        # retired at its door (0.5.21+) never claims it: nobody tells the decode, which waits for KV
        # until its waiting timeout, as the real 0.5.21 and 0.5.23 servers did.
        self.rooms[room_id] = room
        fut = self._room_waiters.setdefault(room_id, asyncio.get_running_loop().create_future())
        if not fut.done():
            fut.set_result(room)
        while True:
            msg = await transfer.recv(reader)
            if msg is None:
                break
            if msg.type == "abort":
                room.peer_aborted = True
                if room_id not in self._claimed:
                    await self._ack_idle_abort(room)
                    break

    def state(self) -> dict[str, Any]:
        base = super().state()
        base["running"] = sorted(self.running)
        base["aborted"] = sorted(self._aborted)
        base["rooms"] = {str(r.room): {"rid": r.rid, "peer_aborted": r.peer_aborted,
                                       "pages_in_flight": r.pages_in_flight}
                         for r in self.rooms.values()}
        return base

    async def _ack_idle_abort(self, room: _Room) -> None:
        """A decode's abort for a room no prefill request claimed (nothing posted, nothing in flight).

        Every release's Mooncake bootstrap thread acknowledges such an abort at once (`mooncake/conn.py`,
        the "ABORT" branch: "Concluded/unknown AND quiescent: ack now", or `_maybe_ack_drained_abort`
        with nothing outstanding), so a deferring decode frees its pages without the hold timeout. The
        registration is then forgotten and the connection closed: no write can follow.
        """
        try:
            await transfer.send(room.writer, {"type": "abort_ack", "room": room.room})
        except (ConnectionError, RuntimeError):
            pass
        if self.rooms.get(room.room) is room:
            del self.rooms[room.room]
        self._room_waiters.pop(room.room, None)
        room.writer.close()

    async def _await_bootstrap(self, req: SimReq) -> _Room:
        """`PrefillBootstrapQueue.pop_bootstrapped`: wait for decode's registration of the room."""
        assert req.bootstrap_room is not None
        loop = asyncio.get_running_loop()
        fut = self._room_waiters.setdefault(req.bootstrap_room, loop.create_future())
        start = time.time()
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout=self.bootstrap_timeout)
        except asyncio.TimeoutError:
            self._room_waiters.pop(req.bootstrap_room, None)
            elapsed = time.time() - start
            raise RequestError(Abort(
                f"Prefill bootstrap failed for request rank=0 req.rid={req.rid!r} "
                f"req.bootstrap_room={req.bootstrap_room} "
                f"with exception KVTransferError(bootstrap_room={req.bootstrap_room}): Request {req.bootstrap_room} "
                f"timed out after {elapsed:.1f}s in KVPoll.Bootstrapping",
                HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerError")) from None

    async def generate(self, req: SimReq) -> dict[str, Any]:
        """Run one PD request on the prefill; returns SGLang's non-stream result or raises RequestError."""
        self.stats["requests"] += 1
        self.scheduler_stage(req)
        if req.to_finish is not None and self.release.admission_door_rejects(aborted=True, holds_resources=False):
            # 0.5.21+ `PrefillBootstrapQueue.add` -> `Scheduler.retire_unadmitted_request`: the original
            # 400 before bootstrap, metadata buffer or sender creation.
            return await self._retire_at_door(req)
        assert req.bootstrap_room is not None
        self._claimed.add(req.bootstrap_room)
        try:
            room = await self._await_bootstrap(req)
            self.running[req.rid] = req
            try:
                return await self._forward_and_send(req, room)
            finally:
                self.running.pop(req.rid, None)
                self._aborted.discard(req.rid)
        finally:
            self._claimed.discard(req.bootstrap_room)

    def abort(self, rid: str | None, abort_all: bool = False) -> int:
        """`/abort_request` (or a client disconnect): the request stops after the chunk in flight."""
        hits = [r for r in self.running if abort_all or r == rid]
        self._aborted.update(hits)
        return len(hits)

    async def _retire_at_door(self, req: SimReq) -> dict[str, Any]:
        assert req.to_finish is not None and req.bootstrap_room is not None
        abort = req.to_finish
        req.finished_reason, req.to_finish = abort.finish_reason(), None  # update_finish_state()
        # Nothing is sent to the decode (no sender exists for the room): a decode that admitted the
        # request keeps its reservation and waits for KV until SGLANG_DISAGGREGATION_WAITING_TIMEOUT.
        raise RequestError(abort, value_error=True)

    async def _forward_and_send(self, req: SimReq, room: _Room) -> dict[str, Any]:
        ps = self.pool.page_size
        tokens = req.input_ids
        n = int(tokens.numel())
        own = await self._alloc_wait(self.pool.pages_for(n))
        chunk = max(ps, (self.cfg.chunked_prefill_size // ps) * ps)
        tps = self.cfg.sim_prefill_tokens_per_s
        sent_pages = 0
        retired = False
        t0 = time.time()
        try:
            for start in range(0, n, chunk):
                piece = tokens[start:start + chunk]
                p0, p1 = start // ps, -(-(start + piece.numel()) // ps)
                async with self._gpu:
                    if tps > 0:
                        await asyncio.sleep(piece.numel() / tps)  # the forward pass of this chunk
                    self.pool.write_tokens(own[p0:p1], piece)
                last = start + chunk >= n
                if last and req.to_finish is not None and self.release.retires_aborted_result_after_forward():
                    # 0.5.20+ `_retire_aborted_prefill_result`: nothing is sent for the final result.
                    retired = True
                    break
                if room.peer_aborted and self.release.stops_late_chunks_after_abort():
                    # The room failed: this chunk is not posted (`mooncake/conn.py
                    # MooncakeKVManager.add_transfer_request` returns for a KVPoll.Failed room); only
                    # writes already in flight still land (see `_deliver`).
                    break
                dst = room.dst_pages[p0:min(p1, room.dst_pages.numel())]
                if dst.numel():
                    content = self.pool.read_pages(own[p0:p0 + dst.numel()])
                    await self._send_kv(room, dst, content)
                    sent_pages += int(dst.numel())
                if req.rid in self._aborted:
                    break  # aborted on this prefill (abort_request / client gone): no further chunks
            if retired:
                assert req.to_finish is not None
                abort = req.to_finish
                req.finished_reason, req.to_finish = abort.finish_reason(), None
                self.rooms.pop(room.room, None)
                raise RequestError(abort, value_error=True)
            if req.rid in self._aborted:
                raise RequestError(Abort("Aborted by AbortReq.", HTTPStatus.INTERNAL_SERVER_ERROR,
                                         "InternalServerError"))
            if not room.peer_aborted or not self.release.stops_late_chunks_after_abort():
                # Transfer-complete with what prefill claims (`KVPoll.Success`). Pre-0.5.20 this is
                # sent even for a request whose decode aborted (late results are not retired).
                await self._send_done(room, n, sent_pages)
            if room.peer_aborted:
                if self.release.acks_abort_after_drain():
                    await self._send(room, {"type": "abort_ack", "room": room.room})
                raise RequestError(Abort(
                    f"Prefill transfer failed for request rank=0 req.rid={req.rid!r} req.bootstrap_room={room.room} "
                    f"with exception KVTransferError(bootstrap_room={room.room}): Aborted by the decode peer",
                    HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerError"))
        finally:
            # Source pages are held until the posted writes drained (no reuse under an in-flight read).
            await self._drain_and_close(room)
            self.pool.free(own)
            self.rooms.pop(room.room, None)
            self._room_waiters.pop(room.room, None)
        elapsed = max(time.time() - t0, 1e-9)
        self.last_gen_throughput = n / elapsed
        if req.finished_reason is None:
            # `process_disagg_prefill_inflight_queue`: FINISH_LENGTH(0) on KVPoll.Success. In 0.5.19
            # this overwrites nothing: the pending `to_finish` abort is simply never looked at.
            req.finished_reason = {"type": "length", "length": 0}
        return {"text": "", "output_ids": [],
                "meta_info": _meta(req, prompt_tokens=n, completion_tokens=0, e2e=time.time() - req.created)}

    async def _alloc_wait(self, num_pages: int) -> torch.Tensor:
        """Wait in the queue until the prefill pool has room (requests in flight hold pages)."""
        while True:
            try:
                return self.pool.alloc(num_pages)
            except PoolExhausted:
                await asyncio.sleep(0.01)

    async def _send(self, room: _Room, header: dict[str, Any], payload: bytes = b"", delay: float = 0.0) -> None:
        """Post a message on the room's transfer queue (the KV sender). It is delivered in order after
        `delay` (transfer time); the forward does not wait for it, as with RDMA writes."""
        if room.outbox is None:
            room.outbox = asyncio.Queue()
            room.sender = asyncio.create_task(self._deliver(room))
        await room.outbox.put((header, payload, delay))

    async def _deliver(self, room: _Room) -> None:
        assert room.outbox is not None
        broken = False
        while True:
            item = await room.outbox.get()
            pages = 0
            try:
                if item is None:
                    return
                header, payload, delay = item
                pages = int(header["count"]) if header["type"] == "kv" else 0
                if pages and room.peer_aborted and self.release.stops_late_chunks_after_abort():
                    # `mooncake/conn.py MooncakeKVManager.transfer_worker` checks the room's status when
                    # it dequeues a chunk and skips it once the room failed; the write it had already
                    # started (below, `delay` long, like `batch_transfer_sync`) still lands.
                    continue
                if delay > 0:
                    await asyncio.sleep(delay)
                if not broken:
                    try:
                        await transfer.send(room.writer, header, payload)
                        if pages:
                            self.stats["kv_pages_sent"] += pages
                    except (ConnectionError, RuntimeError):
                        broken = True
            finally:
                room.pages_in_flight -= pages
                room.outbox.task_done()

    async def _drain_and_close(self, room: _Room) -> None:
        """Wait until every posted write has been delivered, then close the room's connection."""
        if room.outbox is not None:
            await room.outbox.put(None)
            await room.outbox.join()
        room.writer.close()

    async def _send_kv(self, room: _Room, dst: torch.Tensor, content: torch.Tensor) -> None:
        bw = self.cfg.sim_transfer_tokens_per_s
        delay = content.numel() / bw if bw > 0 else 0.0
        room.pages_in_flight += int(dst.numel())
        await self._send(room, {"type": "kv", "room": room.room, "count": int(dst.numel())},
                         transfer.pack_pages(dst, content), delay)

    async def _send_done(self, room: _Room, claimed_tokens: int, claimed_pages: int) -> None:
        await self._send(room, {"type": "done", "room": room.room, "claimed_tokens": claimed_tokens,
                                "claimed_pages": claimed_pages})


# ------------------------------------------------------------------------------------------ decode


@dataclass
class _Transfer:
    """The decode side of one room: reservation, bootstrap connection and what arrived."""

    req: SimReq
    pages: torch.Tensor
    num_tokens: int
    done: asyncio.Future[dict[str, Any]]
    ack: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    aborted: asyncio.Event = field(default_factory=asyncio.Event)
    writer: asyncio.StreamWriter | None = None
    reader_task: asyncio.Task[None] | None = None
    pages_received: int = 0
    freed: bool = False
    release_deferred: bool = False


class DecodeEngine(BaseEngine):
    """Decode side: prealloc at bootstrap, apply page writes, commit, attend, generate."""

    def __init__(self, cfg: WorkerConfig, release: Release0519) -> None:
        super().__init__(cfg, release)
        self.transfers: dict[str, _Transfer] = {}
        self._held: set[asyncio.Task[None]] = set()  # strong refs until done (asyncio keeps weak ones)
        #: Receiving ends of rooms, held until the prefill closes them. In SGLang the decode's whole KV
        #: buffer is registered with the transfer engine once, when the KV manager starts
        #: (`mooncake/conn.py MooncakeKVManager.__init__` -> `register_buffer_to_engine`), so a prefill's
        #: write lands whether or not the request's `KVReceiver` still exists. Without this strong
        #: reference, asyncio keeps only weak references to tasks: once the request returned, the
        #: garbage collector could destroy the receiving task and its socket, silently dropping every
        #: late write (how often depended on allocation pressure, e.g. new requests arriving).
        self._receivers: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def abort(self, rid: str | None, abort_all: bool = False) -> int:
        """`/abort_request`: mark matching requests aborted; returns how many."""
        hits = [t for r, t in self.transfers.items() if abort_all or r == rid]
        for t in hits:
            t.aborted.set()
        return len(hits)

    async def generate(self, req: SimReq, sink: TokenSink | None = None) -> dict[str, Any]:
        """Run one PD request on the decode; returns SGLang's result or raises RequestError."""
        self.stats["requests"] += 1
        self.scheduler_stage(req)
        if req.to_finish is not None and self.release.admission_door_rejects(aborted=True, holds_resources=False):
            # 0.5.21+ `DecodePreallocQueue.add`: retired before prealloc and receiver creation.
            raise RequestError(req.to_finish, value_error=True)
        n = int(req.input_ids.numel())
        # The reservation covers the prompt (what prefill must fill) plus the output tokens, whose KV
        # the decode writes itself; the prefill is told only the prompt's pages.
        pages = await self._reserve(req, n + req.max_new_tokens)
        t = _Transfer(req, pages, n, asyncio.get_running_loop().create_future())
        self.transfers[req.rid] = t
        try:
            if req.bootstrap_host == FAKE_BOOTSTRAP_HOST or self.cfg.disaggregation_transfer_backend == "fake":
                t.done.set_result({"type": "done", "claimed_tokens": 0, "fake": True})
            else:
                await self._bootstrap(t)
            await self._wait_transfer(t)
            if req.to_finish is not None:
                # <= 0.5.20 decode-side reject: admitted with the placeholder and run for one step (over
                # the placeholder's own KV) before `update_finish_state` turns `to_finish` into the
                # abort. Real 0.5.19 streams that token with finish_reason abort 400 and prompt_tokens 1.
                req.max_new_tokens = 1
                ran = await self._run_decode(t, None)
                # The toy model reads nothing from a pad placeholder; a real model always emits its one
                # token, so the simulator emits the placeholder's own id (SIMULATOR CHOICE).
                step = list(ran["output_ids"])[:1] or [int(req.input_ids[0])]
                raise RequestError(req.to_finish, value_error=True, output_ids=step)
            return await self._run_decode(t, sink)
        finally:
            self.transfers.pop(req.rid, None)
            if not t.release_deferred:
                self._free(t)
            if t.writer is not None and t.done.done() and not t.aborted.is_set():
                t.writer.close()  # the prefill finished writing this room

    async def _reserve(self, req: SimReq, n: int) -> torch.Tensor:
        """`DecodePreallocQueue`: reserve pages for the length decode was told; wait while the pool is full."""
        prompt_tokens = int(req.input_ids.numel())
        if prompt_tokens > self.max_total_num_tokens:
            # `DecodePreallocQueue` capacity check (normally unreachable: validate_input_length is stricter)
            raise RequestError(Abort(f"Request {req.rid} exceeds the maximum number of tokens: "
                                     f"{prompt_tokens} > {self.max_total_num_tokens}"))
        need = min(self.pool.pages_for(n), self.pool.num_pages)
        deadline = time.time() + self.waiting_timeout
        while True:
            try:
                return self.pool.alloc(need)
            except PoolExhausted:
                if time.time() > deadline:
                    raise RequestError(Abort(
                        f"Decode prealloc timed out for request {req.rid}: {need} pages not free after "
                        f"{self.waiting_timeout:.1f}s", HTTPStatus.SERVICE_UNAVAILABLE, "ServiceUnavailable")) from None
                await asyncio.sleep(0.01)  # the pool is full: wait in the prealloc queue

    async def _bootstrap(self, t: _Transfer) -> None:
        req = t.req
        host = req.bootstrap_host or "127.0.0.1"
        port = req.bootstrap_port or self.cfg.disaggregation_bootstrap_port
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=2**26), timeout=10)
        except (OSError, asyncio.TimeoutError) as exc:
            self._free(t)
            raise RequestError(Abort(
                f"Decode handshake failed for request rank=0 decode_req.req.rid={req.rid!r} "
                f"decode_req.req.bootstrap_room={req.bootstrap_room} with exception "
                f"KVTransferError(bootstrap_room={req.bootstrap_room}): "
                f"cannot reach bootstrap server {host}:{port}: {exc}",
                HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerError")) from None
        t.writer = writer
        prompt_pages = t.pages[: self.pool.pages_for(t.num_tokens)]
        await transfer.send(writer, {"type": "register", "room": req.bootstrap_room, "rid": req.rid,
                                     "num_tokens": t.num_tokens, "num_pages": int(prompt_pages.numel())},
                            transfer.tensor_bytes(prompt_pages.to(torch.int64)))
        t.reader_task = asyncio.create_task(self._receive(t, reader))
        self._receivers.add(t.reader_task)
        t.reader_task.add_done_callback(self._receivers.discard)

    async def _receive(self, t: _Transfer, reader: asyncio.StreamReader) -> None:
        """The receiving end of the room's writes. Like RDMA, a page write lands on the pages it names,
        whether or not this request still owns them."""
        while True:
            msg = await transfer.recv(reader)
            if msg is None:
                t.closed.set()  # the prefill closed the room: it will never write again
                if t.writer is not None:
                    t.writer.close()
                return
            if msg.type == "kv":
                count = int(msg.header["count"])
                dst, content = transfer.unpack_pages(msg.payload, count)
                self.pool.write_pages(dst, content)
                t.pages_received += count
                self.stats["kv_pages_received"] += count
                if t.freed:
                    self.stats["late_pages_received"] += count
            elif msg.type == "done":
                if not t.done.done():
                    t.done.set_result(msg.header)
            elif msg.type == "abort_ack":
                t.ack.set()

    async def _wait_transfer(self, t: _Transfer) -> dict[str, Any]:
        """`DecodeTransferQueue.pop_transferred`: wait for transfer-complete, an abort, or
        `CommonKVReceiver._check_waiting_timeout`. No prefill-side rejection is ever signalled here:
        a request the prefill retired (after its forward on 0.5.20, at its door on 0.5.21+) ends by the
        waiting timeout (or an abort), as on the real servers."""
        req = t.req
        start = time.time()
        abort_wait = asyncio.ensure_future(t.aborted.wait())
        waiters: set[asyncio.Future[Any]] = {t.done, abort_wait}
        try:
            done, _ = await asyncio.wait(waiters, timeout=self.waiting_timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            abort_wait.cancel()
        if t.done.done():
            return t.done.result()
        if t.aborted.is_set():
            reason = "Aborted by AbortReq."
        else:
            waited = time.time() - start
            reason = f"Request {req.bootstrap_room} timed out after {waited:.1f}s in KVPoll.WaitingForInput"
            t.aborted.set()
        await self._notify_abort(t)
        raise RequestError(Abort(
            f"Decode transfer failed for request rank=0 decode_req.req.rid={req.rid!r} "
            f"decode_req.req.bootstrap_room={req.bootstrap_room} with exception "
            f"KVTransferError(bootstrap_room={req.bootstrap_room}): {reason}",
            HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerError"))

    async def _notify_abort(self, t: _Transfer) -> None:
        """Decode-initiated abort: tell prefill, then free now or defer until the drain ACK.

        `decode.py DecodeTransferQueue.pop_transferred` / `_defer_release`: with deferred release the
        pages are held until prefill ACKs that its in-flight writes drained, or until
        SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT; without it they are freed at once and
        a late write lands on whoever gets them next.
        """
        if t.writer is not None:
            try:
                await transfer.send(t.writer, {"type": "abort", "room": t.req.bootstrap_room})
            except (ConnectionError, RuntimeError):
                pass
        if self.deferred_release:
            t.release_deferred = True
            task = asyncio.create_task(self._release_after_ack(t))
            self._held.add(task)
            task.add_done_callback(self._held.discard)
        else:
            self._free(t)

    async def _release_after_ack(self, t: _Transfer) -> None:
        waits = {asyncio.ensure_future(t.ack.wait())}
        if self.release.acks_abort_after_drain():
            # 0.5.21+ keeps the ACK target until writes drain; a closed room has drained too.
            waits.add(asyncio.ensure_future(t.closed.wait()))
        done, pending = await asyncio.wait(waits, timeout=self.deferred_release_timeout,
                                           return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        if not done:
            log.warning("Deferred KV release for room %s timed out after %.1fs", t.req.bootstrap_room,
                        self.deferred_release_timeout)
        self._free(t)

    def _free(self, t: _Transfer) -> None:
        if not t.freed:
            t.freed = True
            self.pool.free(t.pages)

    async def _run_decode(self, t: _Transfer, sink: TokenSink | None) -> dict[str, Any]:
        """Commit the transfer and generate. No transferred-length validation exists in 0.5.19-0.5.23
        (#38704 never merged), so a one-page handoff into an eight-page reservation is committed."""
        req = t.req
        header = t.done.result()
        if (self.release.validates_transfer_coverage() and not header.get("fake")
                and int(header.get("claimed_tokens", -1)) != t.num_tokens):
            raise RequestError(Abort(
                f"KV transfer coverage mismatch for request {req.rid}: prefill claimed "
                f"{header.get('claimed_tokens')} tokens, decode reserved {t.num_tokens}",
                HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerError"))
        version_seen = -1
        digest = b""
        out: list[int] = []
        delay = 1.0 / self.cfg.sim_decode_tokens_per_s if self.cfg.sim_decode_tokens_per_s > 0 else 0.0
        t0 = time.time()
        finish: dict[str, Any] = {"type": "length", "length": req.max_new_tokens}
        for step in range(req.max_new_tokens):
            if t.aborted.is_set():
                finish = Abort("Abort in running batch.").finish_reason()
                break
            if self.pool.version != version_seen:
                version_seen = self.pool.version
                digest = attend(self.pool, t.pages, t.num_tokens)
            if not digest:
                finish = {"type": "stop", "matched": None}
                break
            token = digest[step % len(digest)]
            out.append(token)
            # The output token's KV goes into the reservation after the prompt, so a later tenant
            # that gets these pages finds this request's partial generation there too. It lies outside
            # the attended range [0, num_tokens), so no re-read is needed (no version bump).
            slot = t.num_tokens + step
            page = slot // self.pool.page_size
            if page < t.pages.numel():
                self.pool.data[t.pages[page], slot % self.pool.page_size] = token
            if sink is not None:
                await sink(out, tokenizer.decode(out))
            await asyncio.sleep(delay)
        elapsed = max(time.time() - t0, 1e-9)
        self.last_gen_throughput = len(out) / elapsed
        req.finished_reason = finish
        return {"text": tokenizer.decode(out), "output_ids": out,
                "meta_info": _meta(req, prompt_tokens=t.num_tokens if req.to_finish is None else req.caller_tokens,
                                   completion_tokens=len(out), e2e=time.time() - req.created)}

    def state(self) -> dict[str, Any]:
        base = super().state()
        base["transfers"] = {rid: {"room": t.req.bootstrap_room, "pages": int(t.pages.numel()),
                                   "first_page": int(t.pages[0]) if t.pages.numel() else None,
                                   "pages_received": t.pages_received, "aborted": t.aborted.is_set()}
                             for rid, t in self.transfers.items()}
        return base


def attend(pool: KVPool, pages: torch.Tensor, num_tokens: int) -> bytes:
    """The toy model's read of its context: every reserved slot, pad skipped, distinct lines in order."""
    ctx = pool.read_pages(pages)[:num_tokens]
    raw = tokenizer.tensor_to_bytes(ctx).replace(b"\x00", b"")
    seen: set[bytes] = set()
    out = bytearray()
    for line in raw.split(b"\n"):
        if line in seen or not line:
            continue
        seen.add(line)
        out += line[: DIGEST_LIMIT - len(out)] + b"\n"
        if len(out) >= DIGEST_LIMIT:
            break
    return bytes(out)


def _meta(req: SimReq, *, prompt_tokens: int, completion_tokens: int, e2e: float) -> dict[str, Any]:
    return {"id": req.rid, "finish_reason": req.finished_reason, "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens, "cached_tokens": 0, "reasoning_tokens": 0,
            "weight_version": "default", "num_retractions": 0, "e2e_latency": round(e2e, 6)}
