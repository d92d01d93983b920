"""One request as a worker sees it, and how it ends: the `Req` fields that matter for isolation,
the abort it may carry, the error response it may become, and its `meta_info` (the output logprobs too).
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import numpy as np

from kvgate.sim import tokenizer


@dataclass
class Abort:
    """A pending or final abort (`FINISH_ABORT(message, status_code, err_type)`)."""

    message: str
    status_code: int = HTTPStatus.BAD_REQUEST
    err_type: str = "BadRequestError"

    def finish_reason(self) -> dict[str, Any]:
        return {
            "type": "abort",
            "message": self.message,
            "status_code": int(self.status_code),
            "err_type": self.err_type,
        }


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
    input_ids: np.ndarray
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
    #: `return_logprob` / `top_logprobs_num` of `GenerateReqInput` (output logprobs only: the toy model
    #: scores no input positions)
    return_logprob: bool = False
    top_logprobs_num: int = 0
    created: float = field(default_factory=time.time)

    def finished(self) -> bool:
        """`Req.finished()`: reads `finished_reason` only, never `to_finish`."""
        return self.finished_reason is not None


TokenSink = Callable[[list[int], str], Awaitable[None]]


def meta_info(req: SimReq, *, prompt_tokens: int, completion_tokens: int, e2e: float) -> dict[str, Any]:
    """The `meta_info` of a request's answer, on either role."""
    return {
        "id": req.rid,
        "finish_reason": req.finished_reason,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "cached_tokens": 0,
        "reasoning_tokens": 0,
        "weight_version": "default",
        "num_retractions": 0,
        "e2e_latency": round(e2e, 6),
    }


#: The toy model's logprobs (it is certain of its token): the chosen token, then the runners-up.
TOP_LOGPROB = math.log(0.97)
RUNNER_UP_LOGPROBS = (math.log(0.02), math.log(0.01))


def logprob_fields(out: list[int], top: int) -> dict[str, Any]:
    """SGLang's output logprob fields (`TokenizerManager` meta_info; `(logprob, token_id, text)` with
    text None unless return_text_in_logprobs): the toy model's token, then runners-up (next byte ids)."""
    ranked = [TOP_LOGPROB, *RUNNER_UP_LOGPROBS]
    fields: dict[str, Any] = {"output_token_logprobs": [[TOP_LOGPROB, tok, None] for tok in out]}
    if top > 0:
        fields["output_top_logprobs"] = [
            [[ranked[r], (tok + r) % tokenizer.VOCAB_SIZE, None] for r in range(min(top, len(ranked)))] for tok in out
        ]
    return fields
