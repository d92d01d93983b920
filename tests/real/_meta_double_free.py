"""TEST CODE, loaded into a REAL decode worker of the real tier (never into a deployment kvgate gates).

kvgate's CPU-server `sitecustomize` runs `install(conn)` right after sglang's
`disaggregation/mooncake/conn.py` is imported, when KVGATE_TEST_HOOK names this file
(tests/real/test_isolation_fault_real.py sets it, with KVGATE_TEST_META_DIR, on the one pair it starts).
It acts only in the decode: its patches go in when the first `MooncakeKVReceiver` is built (only a
decode builds receivers; by then sglang's decode module is fully imported).

What it injects (sglang #17259: two requests in flight share one metadata buffer slot), by the mode the
test writes to `<dir>/mode`, read at every call so that one pair serves every phase:
- `off`: inert (the real code runs unchanged);
- `double-free`: `ReqToMetadataIdxAllocator.free` pushes the freed index twice, at the front, so the next
  two allocations get the same slot. Requests sent one at a time never overlap on it; requests in flight
  together do, and the prefill of one writes its first token and bootstrap_room over the other's:
  #17430's room check in the decode then aborts one ("Metadata corruption detected - bootstrap_room
  mismatch", HTTP 500);
- `silent`: the double free, and that room check bypassed: the reading request is shown its own room,
  so it commits the other request's first token silently (sglang before #17430).

Every injected step is appended to `<dir>/events.jsonl`, which the test reads. Standard library (and
the release's own torch) only: it runs in the release's interpreter.
"""

from __future__ import annotations

import json
import os
import threading
from types import ModuleType
from typing import Any

DOUBLE_FREE, SILENT, OFF = "double-free", "silent", "off"


def _folder() -> str:
    return os.environ["KVGATE_TEST_META_DIR"]


def _mode() -> str:
    try:
        with open(os.path.join(_folder(), "mode")) as f:
            return f.read().strip() or OFF
    except FileNotFoundError:
        return OFF


def _log(event: dict[str, Any]) -> None:
    with open(os.path.join(_folder(), "events.jsonl"), "a") as f:
        f.write(json.dumps(event) + "\n")


def _patch_decode() -> None:
    import torch
    from sglang.srt.disaggregation import decode, utils

    allocator = utils.ReqToMetadataIdxAllocator
    real_free = allocator.free

    def free(self: Any, free_index: int) -> None:
        if _mode() in (DOUBLE_FREE, SILENT):
            self.free_slots.appendleft(free_index)
            self.free_slots.appendleft(free_index)
            _log({"event": "double_free", "index": int(free_index)})
        else:
            real_free(self, free_index)

    allocator.free = free

    reading = threading.local()  # the bootstrap_room of the request whose transfer is being committed
    buffers = utils.MetadataBuffers
    real_get_buf = buffers.get_buf

    def get_buf(self: Any, idx: int) -> Any:
        out = real_get_buf(self, idx)
        expected = getattr(reading, "room", None)
        if expected is None or _mode() != SILENT:
            return out
        room = out[-1]
        if not torch.equal(room, self.bootstrap_room[idx]):
            raise RuntimeError("TEST HOOK: get_buf's last item is not the bootstrap_room (another release?)")
        actual = int(room.flatten()[0].item())
        if actual in (0, expected):
            return out
        _log({"event": "room_check_bypassed", "index": int(idx), "expected": expected, "actual": actual})
        shown = room.clone()
        shown.flatten()[0] = expected
        return (*out[:-1], shown)

    buffers.get_buf = get_buf

    queue = decode.DecodeTransferQueue
    real_commit = queue._commit_transfer_to_req

    def commit(self: Any, decode_req: Any) -> Any:
        room = decode_req.req.bootstrap_room
        reading.room = int(room) if room is not None else 0
        try:
            return real_commit(self, decode_req)
        finally:
            reading.room = None

    queue._commit_transfer_to_req = commit
    _log({"event": "installed", "pid": os.getpid()})


def install(conn: ModuleType) -> None:
    receiver = conn.MooncakeKVReceiver
    real_init = receiver.__init__
    done = threading.Event()
    lock = threading.Lock()

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        if not done.is_set():
            with lock:
                if not done.is_set():
                    _patch_decode()
                    done.set()
        real_init(self, *args, **kwargs)

    receiver.__init__ = init
