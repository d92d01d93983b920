"""TEST CODE, loaded into a REAL prefill worker of the real tier (never into a deployment kvgate gates).

kvgate's CPU-server `sitecustomize` runs `install(conn)` right after sglang's
`disaggregation/mooncake/conn.py` is imported, when KVGATE_TEST_HOOK names this file
(`tests/real/lifetime_race.py` sets it, with KVGATE_TEST_LATE_WRITE_DIR, on the pairs it provokes).

What it injects into the real transfer path (shared/reference/page-lifetime.md section 3, way (b)): the
first `MooncakeKVManager.send_kvcache` after the test writes `<dir>/arm` returns -1 at once, as
Mooncake's `batch_transfer_sync` does on a timeout "with the batch still running", and the write itself
is performed later, by the real `send_kvcache` with the same arguments (a real Mooncake TCP write into
the decode's KV pool): the late write. It lands right after the first later send that targets any of its
destination pages (those pages were handed to another request), or when the test writes `<dir>/land`
(it does once the next request was answered), whichever comes first: an event either way, never a
clock. `LAND_BOUND_S` only keeps a test that died from parking the write for ever; a write landed by it
is logged with trigger "bound", which the test never takes as a verdict. The -1 also blacklists the
decode session (`failed_sessions`); the hook lifts that at once, since the session is alive (a failure
of one write, not of the peer).

Every step is appended to `<dir>/events.jsonl` (wall-clock `t`; a send is tagged with the phase the test
wrote to `<dir>/phase` before sending), which the test reads. Standard library only: it runs in the
release's own interpreter.
"""

from __future__ import annotations

import json
import os
import threading
import time
from types import ModuleType
from typing import Any

LAND_BOUND_S = 900.0  # outer safety net: the test signals the landing long before (seconds)
LIFT_WITHIN_S = 120.0  # outer safety net: the worker blacklists the session right after the -1


def _pages(indices: Any) -> list[int]:
    return [int(i) for i in list(indices)]


def _span(pages: list[int] | set[int]) -> dict[str, int]:
    """A page set as the log keeps it: how many, the lowest and the highest index."""
    return {"n": len(pages), "lo": min(pages), "hi": max(pages)} if pages else {"n": 0, "lo": -1, "hi": -1}


def install(conn: ModuleType) -> None:
    folder = os.environ["KVGATE_TEST_LATE_WRITE_DIR"]
    manager = conn.MooncakeKVManager
    real_send = manager.send_kvcache
    lock = threading.Lock()
    pending: dict[str, Any] = {}

    def _phase() -> str:
        """Which of its requests the test is sending now (it writes `<dir>/phase` before each)."""
        try:
            with open(os.path.join(folder, "phase")) as f:
                return f.read().strip()
        except FileNotFoundError:
            return ""

    def log(event: str, **fields: Any) -> None:
        line = json.dumps({"t": time.time(), "event": event, **fields})
        with lock, open(os.path.join(folder, "events.jsonl"), "a") as out:
            out.write(line + "\n")

    def deliver(trigger: str, overlap: list[int]) -> None:
        with lock:
            held = pending.pop("write", None)
        if held is None:
            return
        self, args, kwargs, pages = held
        try:
            ret = real_send(self, *args, **kwargs)
        except Exception as exc:  # the late write's own failure is evidence too
            ret = f"raised {type(exc).__name__}: {exc}"
        log("late_write", trigger=trigger, ret=ret, pages=_span(pages), into_later_send=len(overlap))

    def land_when_told() -> None:
        """The test's signal lands the write (unless an overlapping send landed it first)."""
        signal = os.path.join(folder, "land")
        end = time.monotonic() + LAND_BOUND_S
        while not os.path.exists(signal):
            with lock:
                if "write" not in pending:
                    return
            if time.monotonic() >= end:
                deliver("bound", [])
                return
            time.sleep(0.05)
        os.rename(signal, signal + ".taken")
        deliver("signal", [])

    def lift_blacklist(self: Any, session: str) -> None:
        end = time.monotonic() + LIFT_WITHIN_S
        while time.monotonic() < end:
            with self.session_lock:
                if session in self.failed_sessions:
                    self.failed_sessions.discard(session)
                    self.session_failures.pop(session, None)
                    log("blacklist_lifted", session=session)
                    return
            time.sleep(0.005)
        log("blacklist_not_seen", session=session)

    def send_kvcache(
        self: Any,
        mooncake_session_id: str,
        prefill_kv_indices: Any,
        dst_kv_ptrs: Any,
        dst_kv_indices: Any,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        arm = os.path.join(folder, "arm")
        try:
            os.rename(arm, arm + ".taken")
            armed = True
        except FileNotFoundError:
            armed = False
        if armed:
            pages = _pages(dst_kv_indices)
            call = (mooncake_session_id, prefill_kv_indices.copy(), dst_kv_ptrs, dst_kv_indices.copy(), *args)
            with lock:
                pending["write"] = (self, call, kwargs, set(pages))
            log("failed_send", pages=_span(pages), session=mooncake_session_id)
            threading.Thread(target=lift_blacklist, args=(self, mooncake_session_id), daemon=True).start()
            # daemon: a worker stopped before the landing exits at once
            threading.Thread(target=land_when_told, daemon=True).start()
            return -1
        ret = real_send(self, mooncake_session_id, prefill_kv_indices, dst_kv_ptrs, dst_kv_indices, *args, **kwargs)
        with lock:
            held = pending.get("write")
        if held is not None:
            mine = _pages(dst_kv_indices)
            overlap = sorted(held[3].intersection(mine))
            log("send", ret=ret, pages=_span(mine), into_pending=len(overlap), phase=_phase())
            if overlap:
                deliver("overlap", overlap)
        return ret

    manager.send_kvcache = send_kvcache
    log("installed", pid=os.getpid())
