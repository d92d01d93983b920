"""The toy model (decode side): the attended context is read from the pool (pad token 0 skipped), cut
into lines, and reduced to its distinct lines in order of first appearance (at most 64 KiB); output
token t is byte t (cyclically) of that digest. A healthy request therefore echoes its own prompt's
distinct lines; a request attending stale pages echoes the earlier tenants' lines, so a sentinel on
its own line in an earlier prompt shows up in the text. Content is re-read whenever the pool changed
since the previous step, so a late write that lands mid-generation changes the following tokens.
Everything is deterministic: the same inputs in the same order give the same bytes.
"""

from __future__ import annotations

import torch

from kvgate.sim import tokenizer
from kvgate.sim.kvpool import KVPool

DIGEST_LIMIT = 65536


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
