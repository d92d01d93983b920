"""SGLang's admission limits: which prompt lengths a worker accepts, and how it rejects the others.

Two bounds, the same in every release kvgate knows (0.5.19-0.5.23, read from the wheels):
- the tokenizer manager rejects a prompt of N >= context tokens with a plain 400
  (`managers/tokenizer_manager.py _validate_one_request`; no speculative decoding, so it reserves no tokens);
- the scheduler rejects N >= max_req_input_len (`managers/utils.py validate_input_length`) through
  `set_finish_with_abort`, the path that leaked before #36988/#38935, where
  max_req_input_len = min(context - 1, pool - 1) - 5 (`managers/tp_worker.py get_worker_info`).

So a prompt is accepted iff it passes both, and every length in [max_req_input_len, context - 1] passes
the tokenizer and takes the abort path: the reject band. The gates, the planner and the simulator all
take these numbers from here.
"""

from __future__ import annotations

from dataclasses import dataclass


def max_req_input_len(context: int, pool: int) -> int:
    """SGLang's scheduler bound for a worker with `context` and a KV pool of `pool` tokens."""
    return min(context - 1, pool - 1) - 5


@dataclass(frozen=True)
class AdmissionLimits:
    """The limits of one worker, or the most restrictive ones over a deployment.

    `max_req_input_len` is the scheduler bound in force (what the worker reports); `pool` may be
    unknown, and then so are the expected bound and the over-pool band.
    """

    context: int
    max_req_input_len: int
    pool: int | None = None

    @classmethod
    def of(cls, context: int, pool: int, reported: int | None = None) -> AdmissionLimits:
        """One worker's limits: the max_req_input_len it reports, else SGLang's formula."""
        bound = reported if reported is not None else max_req_input_len(context, pool)
        return cls(context=context, max_req_input_len=bound, pool=pool)

    @property
    def expected_max_req_input_len(self) -> int | None:
        """What SGLang computes from this context and pool (None when the pool is unknown)."""
        return None if self.pool is None else max_req_input_len(self.context, self.pool)

    @property
    def longest_accepted(self) -> int:
        """The longest prompt both bounds accept: min(max_req_input_len, context) - 1."""
        return min(self.max_req_input_len, self.context) - 1

    @property
    def reject_band(self) -> tuple[int, int] | None:
        """Lengths that pass the tokenizer but are rejected by the scheduler (inclusive bounds)."""
        lo, hi = self.max_req_input_len, self.context - 1
        return (lo, hi) if lo <= hi else None

    @property
    def over_pool_band(self) -> tuple[int, int] | None:
        """(pool, context] as inclusive bounds: prompts that fit the context but not the pool."""
        if self.pool is None or self.pool >= self.context:
            return None
        return (self.pool + 1, self.context)
