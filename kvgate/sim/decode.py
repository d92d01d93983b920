"""The simulated decode worker: preallocation, bootstrap, receiving KV, decoding with the toy model."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from http import HTTPStatus
from typing import Any

import numpy as np

from kvgate.sim import faults, tokenizer, transfer
from kvgate.sim.config import WorkerConfig
from kvgate.sim.decoderoom import Transfer
from kvgate.sim.engine import BaseEngine
from kvgate.sim.kvpool import PoolExhausted
from kvgate.sim.releases import SimRelease
from kvgate.sim.request import Abort, RequestError, SimReq, TokenSink, logprob_fields, meta_info
from kvgate.sim.toymodel import Context

log = logging.getLogger("kvgate.sim")

#: `disaggregation/utils.py FAKE_BOOTSTRAP_HOST`: health probes on PD workers use it; no KV moves.
FAKE_BOOTSTRAP_HOST = "2.2.2.2"


#: The longest a late write (its room's pages already freed) waits for a request to take those pages.
LATE_WRITE_HOLD_S = 5.0


class DecodeEngine(BaseEngine):
    """Decode side: prealloc at bootstrap, apply page writes, commit, attend, generate."""

    def __init__(self, cfg: WorkerConfig, release: SimRelease) -> None:
        super().__init__(cfg, release)
        self.transfers: dict[str, Transfer] = {}
        self._held: set[asyncio.Task[None]] = set()  # strong refs until done (asyncio keeps weak ones)
        #: Receiving ends of rooms, held until the prefill closes them. In SGLang the decode's whole KV
        #: buffer is registered with the transfer engine once, when the KV manager starts
        #: (`mooncake/conn.py MooncakeKVManager.__init__` -> `register_buffer_to_engine`), so a prefill's
        #: write lands whether or not the request's `KVReceiver` still exists. Without this strong
        #: reference, asyncio keeps only weak references to tasks: once the request returned, the
        #: garbage collector could destroy the receiving task and its socket, silently dropping every
        #: late write (how often depended on allocation pressure, e.g. new requests arriving).
        self._receivers: set[asyncio.Task[None]] = set()
        #: An injected fault (faults.py), not a release behaviour; None on a healthy decode.
        self.fault = faults.from_env()
        #: the gradual drift's state: requests it leaves right, requests counted, when drift began
        self.drift_after = faults.drift_after_from_env()
        self.drift_count = 0
        self.drift_since: float | None = None
        self.stats["drifted"] = 0
        self._meta_free: deque[int] = deque(range(cfg.max_running_requests or 4096))
        self._meta_next = len(self._meta_free)
        #: slot -> (bootstrap_room, first output token): what prefill's metadata write left there
        self._meta_buf: dict[int, tuple[int, int | None]] = {}
        self.stats["fault_collisions"] = 0

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
        n = int(req.input_ids.size)
        # The reservation covers the prompt (what prefill must fill) plus the output tokens, whose KV
        # the decode writes itself; the prefill is told only the prompt's pages.
        lender = self._fault_partner(n + req.max_new_tokens) if self.fault == faults.EARLY_PAGE_REUSE else None
        if lender is not None:
            pages = lender.pages[: self.pool.pages_for(n + req.max_new_tokens)]
        else:
            pages = await self._reserve(req, n + req.max_new_tokens)
        t = Transfer(req, pages, n, asyncio.get_running_loop().create_future())
        if lender is not None:
            t.borrowed = True
            lender.wait_for = t
            self.stats["fault_collisions"] += 1
        self._meta_alloc(t)
        self.transfers[req.rid] = t
        try:
            if req.bootstrap_host == FAKE_BOOTSTRAP_HOST or self.cfg.disaggregation_transfer_backend == "fake":
                t.done.set_result({"type": "done", "claimed_tokens": 0, "fake": True})
            else:
                await self._bootstrap(t)
            await self._wait_transfer(t)
            first = await self._commit_metadata(t)
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
            return await self._run_decode(t, sink, first)
        finally:
            t.written.set()
            self._meta_release(t)
            self.transfers.pop(req.rid, None)
            if not t.release_deferred:
                self._free(t)
            if t.writer is not None and t.done.done() and not t.aborted.is_set():
                t.writer.close()  # the prefill finished writing this room

    async def _reserve(self, req: SimReq, n: int) -> np.ndarray:
        """`DecodePreallocQueue`: reserve pages for the length decode was told; wait while the pool is full."""
        prompt_tokens = int(req.input_ids.size)
        if prompt_tokens > self.max_total_num_tokens:
            # `DecodePreallocQueue` capacity check (normally unreachable: validate_input_length is stricter)
            raise RequestError(
                Abort(
                    f"Request {req.rid} exceeds the maximum number of tokens: "
                    f"{prompt_tokens} > {self.max_total_num_tokens}"
                )
            )
        need = min(self.pool.pages_for(n), self.pool.num_pages)
        deadline = time.time() + self.waiting_timeout
        while True:
            try:
                return self.pool.alloc(need)
            except PoolExhausted:
                if time.time() > deadline:
                    raise RequestError(
                        Abort(
                            f"Decode prealloc timed out for request {req.rid}: {need} pages not free after "
                            f"{self.waiting_timeout:.1f}s",
                            HTTPStatus.SERVICE_UNAVAILABLE,
                            "ServiceUnavailable",
                        )
                    ) from None
                await asyncio.sleep(0.01)  # the pool is full: wait in the prealloc queue

    async def _bootstrap(self, t: Transfer) -> None:
        req = t.req
        host = req.bootstrap_host or "127.0.0.1"
        port = req.bootstrap_port or self.cfg.disaggregation_bootstrap_port
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=2**26), timeout=10)
        except (OSError, asyncio.TimeoutError) as exc:
            self._free(t)
            raise RequestError(
                Abort(
                    f"Decode handshake failed for request rank=0 decode_req.req.rid={req.rid!r} "
                    f"decode_req.req.bootstrap_room={req.bootstrap_room} with exception "
                    f"KVTransferError(bootstrap_room={req.bootstrap_room}): "
                    f"cannot reach bootstrap server {host}:{port}: {exc}",
                    HTTPStatus.INTERNAL_SERVER_ERROR,
                    "InternalServerError",
                )
            ) from None
        t.writer = writer
        prompt_pages = t.pages[: self.pool.pages_for(t.num_tokens)]
        await transfer.send(
            writer,
            {
                "type": "register",
                "room": req.bootstrap_room,
                "rid": req.rid,
                "num_tokens": t.num_tokens,
                "num_pages": int(prompt_pages.size),
            },
            prompt_pages.astype(np.int64).tobytes(),
        )
        t.reader_task = asyncio.create_task(self._receive(t, reader))
        self._receivers.add(t.reader_task)
        t.reader_task.add_done_callback(self._receivers.discard)

    async def _receive(self, t: Transfer, reader: asyncio.StreamReader) -> None:
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
                if t.freed:
                    late = asyncio.create_task(self._land_late(t, dst, content, count))
                    self._held.add(late)
                    late.add_done_callback(self._held.discard)
                    continue
                self.pool.write_pages(dst, content)
                t.pages_received += count
                self.stats["kv_pages_received"] += count
            elif msg.type == "done":
                if not t.done.done():
                    t.done.set_result(msg.header)
            elif msg.type == "abort_ack":
                t.ack.set()

    async def _land_late(self, t: Transfer, dst: np.ndarray, content: np.ndarray, count: int) -> None:
        """A write for a room whose pages were already freed lands in the race's worst order: once a
        request that took some of those pages has its own KV (it reads them next), so what it generates
        shows the write. On real servers that order is one of many the hosts' scheduling allows; staged
        here, a leaking configuration leaks on every cancel that left a write in flight, however busy the
        machine running the simulator is. Held at most LATE_WRITE_HOLD_S (no taker: it lands on free pages)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + LATE_WRITE_HOLD_S
        while loop.time() < until:
            takers = [o for o in self.transfers.values() if o is not t and bool(np.isin(o.pages, dst).any())]
            if takers and all(o.done.done() for o in takers):
                break
            await asyncio.sleep(0.002)
        self.pool.write_pages(dst, content)
        t.pages_received += count
        self.stats["kv_pages_received"] += count
        self.stats["late_pages_received"] += count

    async def _wait_transfer(self, t: Transfer) -> dict[str, Any]:
        """`DecodeTransferQueue.pop_transferred`: wait for transfer-complete, an abort, or
        `CommonKVReceiver._check_waiting_timeout`. No prefill-side rejection is ever signalled here:
        a request the prefill retired (after its forward on 0.5.20, at its door on 0.5.21+) ends by the
        waiting timeout (or an abort), as on the real servers."""
        req = t.req
        start = time.time()
        abort_wait = asyncio.ensure_future(t.aborted.wait())
        waiters: set[asyncio.Future[Any]] = {t.done, abort_wait}
        try:
            done, _ = await asyncio.wait(waiters, timeout=self.waiting_timeout, return_when=asyncio.FIRST_COMPLETED)
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
        raise RequestError(
            Abort(
                f"Decode transfer failed for request rank=0 decode_req.req.rid={req.rid!r} "
                f"decode_req.req.bootstrap_room={req.bootstrap_room} with exception "
                f"KVTransferError(bootstrap_room={req.bootstrap_room}): {reason}",
                HTTPStatus.INTERNAL_SERVER_ERROR,
                "InternalServerError",
            )
        )

    async def _notify_abort(self, t: Transfer) -> None:
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

    async def _release_after_ack(self, t: Transfer) -> None:
        waits = {asyncio.ensure_future(t.ack.wait())}
        if self.release.acks_abort_after_drain():
            # 0.5.21+ keeps the ACK target until writes drain; a closed room has drained too.
            waits.add(asyncio.ensure_future(t.closed.wait()))
        done, pending = await asyncio.wait(
            waits, timeout=self.deferred_release_timeout, return_when=asyncio.FIRST_COMPLETED
        )
        for task in pending:
            task.cancel()
        if not done:
            log.warning(
                "Deferred KV release for room %s timed out after %.1fs",
                t.req.bootstrap_room,
                self.deferred_release_timeout,
            )
        self._free(t)

    def _free(self, t: Transfer) -> None:
        if not t.freed:
            t.freed = True
            if not t.borrowed:
                self.pool.free(t.pages)

    # -- the metadata buffer, and the injected faults that break it (faults.py) ---------------------

    def _fault_partner(self, tokens: int) -> Transfer | None:
        """Under load, an earlier request still waiting for its transfer (the other half of a collision)."""
        if len(self.transfers) < faults.LOAD_MIN:
            return None
        need = self.pool.pages_for(tokens)
        for t in reversed(list(self.transfers.values())):
            if (
                not t.written.is_set()
                and t.wait_for is None
                and not t.slot_shared
                and not t.borrowed
                and t.req.to_finish is None
                and int(t.pages.size) >= need
            ):
                return t
        return None

    def _meta_alloc(self, t: Transfer) -> None:
        """`ReqToMetadataIdxAllocator.alloc()`; with a slot fault, under load, an index another holds."""
        other = (
            self._fault_partner(0)
            if self.fault in (faults.META_SLOT_SHARED, faults.META_SLOT_SHARED_UNCHECKED)
            else None
        )
        if other is not None:
            t.slot, t.slot_shared = other.slot, True
            other.wait_for = t
            self.stats["fault_collisions"] += 1
        elif self._meta_free:
            t.slot = self._meta_free.popleft()
        else:
            t.slot, self._meta_next = self._meta_next, self._meta_next + 1

    def _meta_release(self, t: Transfer) -> None:
        """Free the slot, its room zeroed first (#27374); a shared holder leaves it to its owner."""
        if t.slot >= 0 and not t.slot_shared:
            self._meta_buf.pop(t.slot, None)
            self._meta_free.append(t.slot)
        t.slot = -1

    async def _commit_metadata(self, t: Transfer) -> int | None:
        """`_commit_transfer_to_req`: prefill's metadata write (room, first output token) lands in the
        slot, then the decode reads the slot back and checks the room (#17430, in 0.5.19-0.5.23).
        Returns the first output token the slot holds (None when the toy model reads nothing)."""
        req = t.req
        if self.fault in faults.LOAD_FAULTS:
            await asyncio.sleep(faults.TICK_S)  # the faulty decode commits on a scheduler tick
        sent = t.done.result().get("first_token")
        # The first output token is prefill's, computed on its own KV and sent with the transfer; a
        # request prefill sent none for (the fake bootstrap, a placeholder) is read from the pages.
        first = sent if isinstance(sent, int) else self._context(t, []).next_token()
        room = req.bootstrap_room if req.bootstrap_room is not None else 0
        self._meta_buf[t.slot] = (room, first)
        t.written.set()
        if t.wait_for is not None:
            try:
                await asyncio.wait_for(t.wait_for.written.wait(), faults.PAIR_WAIT_S)
            except asyncio.TimeoutError:
                pass
        actual, first = self._meta_buf.get(t.slot, (room, None))
        if actual != room and self.fault != faults.META_SLOT_SHARED_UNCHECKED:
            log.error(faults.log_message(req.rid, room, actual, t.slot))
            raise RequestError(Abort(faults.ABORT_MESSAGE, HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerError"))
        return first

    async def _run_decode(self, t: Transfer, sink: TokenSink | None, first: int | None = None) -> dict[str, Any]:
        """Commit the transfer and generate. No transferred-length validation exists in 0.5.19-0.5.23
        (#38704 never merged), so a one-page handoff into an eight-page reservation is committed."""
        req = t.req
        header = t.done.result()
        if (
            self.release.validates_transfer_coverage()
            and not header.get("fake")
            and int(header.get("claimed_tokens", -1)) != t.num_tokens
        ):
            raise RequestError(
                Abort(
                    f"KV transfer coverage mismatch for request {req.rid}: prefill claimed "
                    f"{header.get('claimed_tokens')} tokens, decode reserved {t.num_tokens}",
                    HTTPStatus.INTERNAL_SERVER_ERROR,
                    "InternalServerError",
                )
            )
        version_seen = -1
        ctx = Context()
        out: list[int] = []
        delay = 1.0 / self.cfg.sim_decode_tokens_per_s if self.cfg.sim_decode_tokens_per_s > 0 else 0.0
        t0 = time.time()
        # --sim-e2e-factor: the steps after the first token (which came with the KV) share (factor - 1) x
        # the time this request took to get its KV, so its answer takes about factor x that end to end.
        slow = 0.0
        if self.cfg.sim_e2e_factor > 1 and req.max_new_tokens > 1:
            slow = (self.cfg.sim_e2e_factor - 1) * max(0.0, t0 - req.created) / (req.max_new_tokens - 1)
        finish: dict[str, Any] = {"type": "length", "length": req.max_new_tokens}
        drift = self._drifts()
        for step in range(req.max_new_tokens):
            if step and slow:
                await asyncio.sleep(slow)
            if t.aborted.is_set():
                finish = Abort("Abort in running batch.").finish_reason()
                break
            if self.pool.version != version_seen:
                version_seen = self.pool.version
                ctx = self._context(t, out)
            # The first output token is the one prefill computed, read from the metadata slot; every
            # later one is this decode's own step over the pages it received plus what it generated.
            token = first if step == 0 and first is not None else ctx.next_token()
            if token is None:
                finish = {"type": "stop", "matched": None}
                break
            if drift and step:
                token = faults.drifted(token, tokenizer.VOCAB_SIZE)
            out.append(token)
            ctx.feed(token)
            # The output token's KV goes into the reservation after the prompt, so a later tenant
            # that gets these pages finds this request's partial generation there too. It lies outside
            # the attended range [0, num_tokens), so no re-read is needed (no version bump).
            slot = t.num_tokens + step
            page = slot // self.pool.page_size
            if page < t.pages.size:
                self.pool.data[t.pages[page], slot % self.pool.page_size] = token
            if sink is not None:
                await sink(out, tokenizer.decode(out))
            await asyncio.sleep(delay)
        elapsed = max(time.time() - t0, 1e-9)
        self.last_gen_throughput = len(out) / elapsed
        req.finished_reason = finish
        meta = meta_info(
            req,
            prompt_tokens=t.num_tokens if req.to_finish is None else req.caller_tokens,
            completion_tokens=len(out),
            e2e=time.time() - req.created,
        )
        if req.return_logprob:
            meta.update(logprob_fields(out, req.top_logprobs_num))
        return {"text": tokenizer.decode(out), "output_ids": out, "meta_info": meta}

    def _drifts(self) -> bool:
        """Whether this request's decode-computed tokens drift (the gradual fault, past its count)."""
        if self.fault != faults.GRADUAL_DRIFT:
            return False
        self.drift_count += 1
        if self.drift_count <= self.drift_after:
            return False
        if self.drift_since is None:
            self.drift_since = time.time()
        self.stats["drifted"] += 1
        return True

    def _context(self, t: Transfer, out: list[int]) -> Context:
        """The toy model's state over the received prompt pages plus the tokens generated so far. With
        the handoff fault on, the received pages are read in the wrong layout (each page's slots in
        reverse order): what a page-format mismatch between prefill and decode does, the same every time."""
        ctx = self.pool.read_pages(t.pages[: self.pool.pages_for(t.num_tokens)])[: t.num_tokens]
        if self.fault == faults.HANDOFF_LAYOUT:
            # each page's written slots reversed (a partial last page's own slots only: the garbling
            # depends on this request's KV alone, never on what earlier tenants left in the page)
            ps = self.pool.page_size
            ctx = np.concatenate([ctx[i : i + ps][::-1] for i in range(0, ctx.size, ps)]) if ctx.size else ctx
        raw = tokenizer.tensor_to_bytes(ctx)
        return Context(raw + bytes(b if 0 <= b < tokenizer.VOCAB_SIZE else 0xFF for b in out))

    def state(self) -> dict[str, Any]:
        base = super().state()
        base["injected_fault"] = self.fault
        base["drift_after"] = self.drift_after
        base["drift_since"] = self.drift_since
        base["transfers"] = {
            rid: {
                "room": t.req.bootstrap_room,
                "pages": int(t.pages.size),
                "first_page": int(t.pages[0]) if t.pages.size else None,
                "pages_received": t.pages_received,
                "aborted": t.aborted.is_set(),
            }
            for rid, t in self.transfers.items()
        }
        return base
