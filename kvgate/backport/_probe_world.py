"""Runs INSIDE the interpreter that has the target sglang (no kvgate import): the real sglang classes
every probe of _probe_payload.py (and _lifetime_payload.py) drives, imported once (`World`), the
recorders that stand in for the collaborators the doors hand work to, and how an exception becomes an
error result (never a verdict).

Shipped beside _probe_payload.py: that script's folder is the first entry of its `sys.path`.
"""

from __future__ import annotations

import sys
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

    def _door(self, cls: Any, sched: Any, mode: str) -> Any:
        """A door's queue made with `cls.__new__`, with what both doors read (a FAKE transfer backend)."""
        q = cls.__new__(cls)
        q.scheduler = sched
        q.queue = []
        q.kv_manager = self.kv_manager(mode)
        q.transfer_backend = self.dutils.TransferBackend.FAKE
        q.max_total_num_tokens = 1 << 20
        q.req_to_metadata_buffer_idx_allocator = self.dutils.ReqToMetadataIdxAllocator(4)
        q.token_to_kv_pool_allocator = _PageSize(1)
        return q

    def prefill_queue(self, sched: Any) -> Any:
        q = self._door(self.prefill_mod.PrefillBootstrapQueue, sched, "PREFILL")
        q.tp_rank = 0
        q.pp_rank = 0
        q.bootstrap_port = 8998
        q.max_input_len = 1 << 20
        sched.token_to_kv_pool_allocator = q.token_to_kv_pool_allocator
        return q

    def decode_queue(self, sched: Any) -> Any:
        q = self._door(self.decode_mod.DecodePreallocQueue, sched, "DECODE")
        q.pending_reqs = []
        q.retracted_queue = []
        q.token_to_kv_pool = _PlainKVPool()  # not SWA / DSv4: no tail preallocation
        q.num_reserved_decode_tokens = 0
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


class _NoSpec:
    """No speculative decoding (what the commit path and the post-forward path ask)."""

    def is_none(self) -> bool:
        return True

    def is_eagle(self) -> bool:
        return False


def _error(exc: BaseException) -> dict[str, Any]:
    # AttributeError/ImportError name what is missing; anything else still is an error, never a verdict.
    missing = getattr(exc, "name", None) if isinstance(exc, (AttributeError, ImportError)) else None
    return {
        "status": "error",
        "error": f"{type(exc).__name__}: {exc}",
        "missing": missing,
        "traceback": traceback.format_exc(limit=6),
    }
