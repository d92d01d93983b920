"""The simulated prefill worker: admission door, bootstrap server, chunked forward, KV sends."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import numpy as np

from kvgate.sim import transfer
from kvgate.sim.config import WorkerConfig
from kvgate.sim.engine import BaseEngine
from kvgate.sim.kvpool import PoolExhausted
from kvgate.sim.releases import SimRelease
from kvgate.sim.request import Abort, RequestError, SimReq, meta_info
from kvgate.sim.toymodel import context_of


@dataclass
class _Room:
    """A decode's registration on this prefill's bootstrap server."""

    room: int
    rid: str
    num_tokens: int
    dst_pages: np.ndarray
    writer: asyncio.StreamWriter
    peer_aborted: bool = False
    #: pages of posted KV writes not yet landed (nor skipped): what is "in flight" for this room
    pages_in_flight: int = 0
    #: posted transfer work, delivered in order by `sender` (a write is "in flight" while queued)
    outbox: asyncio.Queue[tuple[dict[str, Any], bytes, float] | None] | None = None
    sender: asyncio.Task[None] | None = None


class PrefillEngine(BaseEngine):
    """Prefill side: bootstrap server, chunked forward (requests interleave per chunk), KV sender queue."""

    def __init__(self, cfg: WorkerConfig, release: SimRelease) -> None:
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
        self._server = await asyncio.start_server(
            self._serve_conn, self.cfg.host, self.cfg.disaggregation_bootstrap_port, limit=2**26
        )

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
        dst = transfer.unpack_pages(msg.payload, count)[0] if count else np.zeros(0, dtype=np.int64)
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
        base["rooms"] = {
            str(r.room): {"rid": r.rid, "peer_aborted": r.peer_aborted, "pages_in_flight": r.pages_in_flight}
            for r in self.rooms.values()
        }
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
            raise RequestError(
                Abort(
                    f"Prefill bootstrap failed for request rank=0 req.rid={req.rid!r} "
                    f"req.bootstrap_room={req.bootstrap_room} "
                    f"with exception KVTransferError(bootstrap_room={req.bootstrap_room}): "
                    f"Request {req.bootstrap_room} "
                    f"timed out after {elapsed:.1f}s in KVPoll.Bootstrapping",
                    HTTPStatus.INTERNAL_SERVER_ERROR,
                    "InternalServerError",
                )
            ) from None

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
        n = int(tokens.size)
        own = await self._alloc_wait(self.pool.pages_for(n))
        chunk = max(ps, (self.cfg.chunked_prefill_size // ps) * ps)
        tps = self.cfg.sim_prefill_tokens_per_s
        sent_pages = 0
        retired = False
        t0 = time.time()
        try:
            for start in range(0, n, chunk):
                piece = tokens[start : start + chunk]
                p0, p1 = start // ps, -(-(start + piece.size) // ps)
                async with self._gpu:
                    if tps > 0:
                        await asyncio.sleep(piece.size / tps)  # the forward pass of this chunk
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
                dst = room.dst_pages[p0 : min(p1, room.dst_pages.size)]
                if dst.size:
                    content = self.pool.read_pages(own[p0 : p0 + dst.size])
                    await self._send_kv(room, dst, content)
                    sent_pages += int(dst.size)
                if req.rid in self._aborted:
                    break  # aborted on this prefill (abort_request / client gone): no further chunks
            if retired:
                assert req.to_finish is not None
                abort = req.to_finish
                req.finished_reason, req.to_finish = abort.finish_reason(), None
                self.rooms.pop(room.room, None)
                raise RequestError(abort, value_error=True)
            if req.rid in self._aborted:
                raise RequestError(
                    Abort("Aborted by AbortReq.", HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerError")
                )
            if not room.peer_aborted or not self.release.stops_late_chunks_after_abort():
                # Transfer-complete with what prefill claims (`KVPoll.Success`). Pre-0.5.20 this is
                # sent even for a request whose decode aborted (late results are not retired).
                await self._send_done(room, n, sent_pages, self._first_token(own, n))
            if room.peer_aborted:
                if self.release.acks_abort_after_drain():
                    await self._send(room, {"type": "abort_ack", "room": room.room})
                raise RequestError(
                    Abort(
                        f"Prefill transfer failed for request rank=0 req.rid={req.rid!r} "
                        f"req.bootstrap_room={room.room} "
                        f"with exception KVTransferError(bootstrap_room={room.room}): Aborted by the decode peer",
                        HTTPStatus.INTERNAL_SERVER_ERROR,
                        "InternalServerError",
                    )
                )
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
        return {
            "text": "",
            "output_ids": [],
            "meta_info": meta_info(req, prompt_tokens=n, completion_tokens=0, e2e=time.time() - req.created),
        }

    async def _alloc_wait(self, num_pages: int) -> np.ndarray:
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

    async def _send_kv(self, room: _Room, dst: np.ndarray, content: np.ndarray) -> None:
        bw = self.cfg.sim_transfer_tokens_per_s
        delay = content.size / bw if bw > 0 else 0.0
        room.pages_in_flight += int(dst.size)
        await self._send(
            room, {"type": "kv", "room": room.room, "count": int(dst.size)}, transfer.pack_pages(dst, content), delay
        )

    def _first_token(self, own: np.ndarray, n: int) -> int | None:
        """The first output token, computed on this prefill's own KV (SGLang sends it in the metadata
        buffer with the transfer); None when the prompt holds nothing the toy model reads."""
        return context_of(self.pool, own, n).next_token()

    async def _send_done(
        self, room: _Room, claimed_tokens: int, claimed_pages: int, first_token: int | None = None
    ) -> None:
        await self._send(
            room,
            {
                "type": "done",
                "room": room.room,
                "claimed_tokens": claimed_tokens,
                "claimed_pages": claimed_pages,
                "first_token": first_token,
            },
        )
