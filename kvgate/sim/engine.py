"""The simulated scheduler of one PD worker: admission, bootstrap, prefill forward, KV transfer, decode.

One asyncio event loop per worker process. The prefill runs one forward at a time, chunk by chunk
(`--chunked-prefill-size` tokens per chunk, `--sim-prefill-tokens-per-s` of compute), and requests
interleave per chunk like continuous batching; each chunk's pages are posted to the room's sender
queue (delivered after `--sim-transfer-tokens-per-s` transfer time). The decode preallocates pages at
bootstrap, applies whatever page writes arrive, and "attends" over the prompt slots it reserved at
every decode step, writing its output tokens' KV after them.

This module holds what both roles share (`BaseEngine`: pool, limits, the tokenizer- and scheduler-stage
checks); the roles are `prefill.PrefillEngine` and `decode.DecodeEngine`, the request types are in
`request.py` and the toy model the decode runs is in `toymodel.py`.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from kvgate.sim.config import WorkerConfig, env_bool, env_float
from kvgate.sim.kvpool import KVPool
from kvgate.sim.releases import SimRelease
from kvgate.sim.request import Abort, RequestError, SimReq
from kvgate.upstream.admission import max_req_input_len


class BaseEngine:
    """What prefill and decode share: pool, limits, tokenizer-stage and scheduler-stage checks."""

    def __init__(self, cfg: WorkerConfig, release: SimRelease) -> None:
        self.cfg = cfg
        self.release = release
        self.pool = KVPool(cfg.max_total_tokens or cfg.DEFAULT_POOL, cfg.page_size)
        self.started = time.time()
        self.waiting_timeout = env_float("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300.0)
        self.bootstrap_timeout = env_float("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 300.0)
        self.deferred_release = env_bool(
            "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE", release.deferred_release_default
        )
        self.deferred_release_timeout = env_float("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT", 30.0)
        self.stats: dict[str, int] = {
            "requests": 0,
            "rejected": 0,
            "kv_pages_sent": 0,
            "kv_pages_received": 0,
            "late_pages_received": 0,
        }
        self.last_gen_throughput = 0.0
        # `sglang:num_requests_total` / `sglang:prompt_tokens_total` by is_streaming: what the tokenizer
        # manager counts for each finished request (an abort from the scheduler included; a tokenizer
        # rejection never reaches it).
        self.finished: dict[bool, list[int]] = {False: [0, 0], True: [0, 0]}

    @property
    def max_total_num_tokens(self) -> int:
        """The pool capacity in tokens (`Scheduler.get_init_info` -> `max_total_num_tokens`)."""
        return self.pool.capacity_tokens

    @property
    def max_req_input_len(self) -> int:
        """`managers/tp_worker.py get_worker_info` over the pool's capacity (`kvgate.upstream.admission`)."""
        return max_req_input_len(self.cfg.effective_context, self.max_total_num_tokens)

    def tokenizer_stage(self, input_ids: np.ndarray, max_new_tokens: int | None) -> np.ndarray:
        """`managers/tokenizer_manager.py TokenizerManager._validate_one_request` (ValueError -> 400)."""
        n = int(input_ids.size)
        ctx = self.cfg.effective_context
        if n >= ctx:
            if self.cfg.allow_auto_truncate:
                return input_ids[:ctx]
            raise RequestError(
                Abort(f"The input ({n} tokens) is longer than the model's context length ({ctx} tokens)."),
                value_error=True,
            )
        if max_new_tokens is not None and n + max_new_tokens > ctx:
            raise RequestError(
                Abort(
                    f"Requested token count exceeds the model's maximum context length of {ctx} tokens. "
                    f"You requested a total of {n + max_new_tokens} tokens: {n} tokens from the input messages "
                    f"and {max_new_tokens} tokens for the completion. Please reduce the number of tokens in the "
                    f"input messages or the completion to fit within the limit."
                ),
                value_error=True,
            )
        return input_ids

    def scheduler_stage(self, req: SimReq) -> None:
        """`Scheduler.handle_generate_request`: PD room check, then `validate_input_length`.

        A too-long input gets `Req.set_finish_with_abort` semantics (`managers/schedule_batch.py`):
        `to_finish = FINISH_ABORT(...)` and `origin_input_ids = [0]`; `finished()` stays False.
        """
        if req.bootstrap_room is None and self.cfg.disaggregation_transfer_backend == "fake":
            req.bootstrap_room = -1  # a synthetic room: no KV moves ("synthetic decode benchmarks")
        if req.bootstrap_room is None:
            raise RequestError(
                Abort(f"Invalid request: Disaggregated request received without bootstrap room id. req.rid={req.rid!r}")
            )
        n = int(req.input_ids.size)
        limit = self.max_req_input_len
        if n >= limit:
            if self.cfg.allow_auto_truncate:
                req.input_ids = req.input_ids[:limit]
                return
            req.to_finish = Abort(
                f"Input length ({n} tokens) exceeds the maximum allowed length ({limit} tokens). "
                f"Use a shorter input or enable --allow-auto-truncate."
            )
            req.input_ids = np.zeros(1, dtype=np.int32)
            self.stats["rejected"] += 1

    def count_finished(self, req: SimReq, stream: bool) -> None:
        """One finished request, as `TokenizerManager.collect_metrics` counts it."""
        self.finished[stream][0] += 1
        self.finished[stream][1] += int(req.caller_tokens)

    def metrics_text(self, model_name: str) -> str:
        """`/metrics` with `--enable-metrics`: SGLang's two request counters, in Prometheus text format."""
        lines: list[str] = []
        for i, (name, what) in enumerate(
            (
                ("sglang:prompt_tokens_total", "Number of prefill tokens processed."),
                ("sglang:num_requests_total", "Number of requests processed."),
            )
        ):
            lines += [f"# HELP {name} {what}", f"# TYPE {name} counter"]
            for stream, counts in self.finished.items():
                labels = f'model_name="{model_name}",is_streaming="{"true" if stream else "false"}"'
                lines.append(f"{name}{{{labels}}} {float(counts[1 - i])}")
        return "\n".join(lines) + "\n"

    def state(self) -> dict[str, Any]:
        """Simulator-only introspection (`GET /sim/state`)."""
        return {
            "mode": self.cfg.mode,
            "emulate": self.release.version,
            "free_pages": self.pool.free_pages,
            "num_pages": self.pool.num_pages,
            "page_size": self.pool.page_size,
            "deferred_release": self.deferred_release,
            "waiting_timeout": self.waiting_timeout,
            "stats": dict(self.stats),
        }

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
