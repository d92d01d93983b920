"""TEST CODE, loaded into a REAL decode worker of the real tier (never into a deployment kvgate gates).

kvgate's CPU-server `sitecustomize` runs `install(conn)` right after sglang's
`disaggregation/mooncake/conn.py` is imported, when KVGATE_TEST_HOOK names this file
(tests/real/test_handoff_fault_real.py sets it, with KVGATE_TEST_HANDOFF_DIR, on the one pair it
starts). It acts only in the decode: its patch goes in when the first `MooncakeKVReceiver` is built (only
a decode builds receivers; by then sglang's decode module is fully imported).

What it injects (issue 39: KV wrong the same way every time, nothing foreign in it), by the mode the test
writes to `<dir>/mode`, read at every call so that one pair serves both phases:
- `off`: inert (the real code runs unchanged);
- `zero-layer`: when the decode commits a finished transfer (`DecodeTransferQueue._commit_transfer_to_req`),
  the received values of layer 0 (`get_value_buffer(0)`) at the request's prompt slots are zeroed, as a
  transfer that drops one layer's buffer would leave them. The first output token (prefill's, from the
  metadata buffer) is untouched; every later one is computed over the damaged KV, the same way every time.

Every injected step is appended to `<dir>/events.jsonl`, which the test reads. Standard library (and the
release's own torch) only: it runs in the release's interpreter.
"""

from __future__ import annotations

import json
import os
import threading
from types import ModuleType
from typing import Any

ZERO_LAYER, OFF = "zero-layer", "off"


def _folder() -> str:
    return os.environ["KVGATE_TEST_HANDOFF_DIR"]


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
    from sglang.srt.disaggregation import decode

    queue = decode.DecodeTransferQueue
    real_commit = queue._commit_transfer_to_req

    def commit(self: Any, decode_req: Any) -> Any:
        if _mode() == ZERO_LAYER:
            req = decode_req.req
            sched = self.scheduler
            n = len(req.origin_input_ids)
            # 0.5.22 keeps the pool index on `req.kv`, older releases on the request itself
            pool_idx = getattr(getattr(req, "kv", None), "req_pool_idx", None)
            pool_idx = pool_idx if pool_idx is not None else req.req_pool_idx
            slots = sched.req_to_token_pool.req_to_token[pool_idx, :n].long()
            values = sched.token_to_kv_pool_allocator.get_kvcache().get_value_buffer(0)
            values[slots] = 0
            _log({"event": "zeroed", "rid": str(req.rid), "tokens": int(n)})
        return real_commit(self, decode_req)

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
