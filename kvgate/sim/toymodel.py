"""The toy model (decode side): the attended context is read from the pool (pad token 0 skipped), cut
into lines, and reduced to its distinct lines in order of first appearance (at most 64 KiB); output
token t is byte t (cyclically) of that digest. A healthy request therefore echoes its own prompt's
distinct lines; a request attending stale pages echoes the earlier tenants' lines, so a sentinel on
its own line in an earlier prompt shows up in the text. Content is re-read whenever the pool changed
since the previous step, so a late write that lands mid-generation changes the following tokens.
Everything is deterministic: the same inputs in the same order give the same bytes.
"""

from __future__ import annotations

import numpy as np

from kvgate.sim import tokenizer
from kvgate.sim.kvpool import KVPool

DIGEST_LIMIT = 65536


def attend(pool: KVPool, pages: np.ndarray, num_tokens: int) -> bytes:
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


class Context:
    """The toy model's autoregressive state over one context (issue 39: prefill is the oracle).

    The next token is a function of the context alone, so prefill, computing the first token of
    `X + y[:k]` on its own KV, gives the token a healthy decode produced at answer position k. The rule
    keeps the echo of the distinct lines: the trailing partial line is continued where it is a proper
    prefix of a known line (searched from the line after the last complete one), or where it is one but
    for one token, else ended ("\\n");
    after a complete line comes the known line that follows it (cyclically), so a whole-line prompt is
    echoed from its first distinct line. Pad (0) is skipped, known lines stop at DIGEST_LIMIT bytes.
    `feed` extends the state one token at a time; building from bytes and feeding them agree.
    """

    def __init__(self, raw: bytes = b"") -> None:
        self.lines: list[bytes] = []
        self.index: dict[bytes, int] = {}
        self.size = 0
        self.prev: bytes | None = None
        self.tail = b""
        pieces = raw.replace(b"\x00", b"").split(b"\n")
        for line in pieces[:-1]:
            self._complete(line)
        self.tail = pieces[-1]

    def _complete(self, line: bytes) -> None:
        if not line:
            return
        if line not in self.index and self.size + len(line) + 1 <= DIGEST_LIMIT:
            self.index[line] = len(self.lines)
            self.lines.append(line)
            self.size += len(line) + 1
        self.prev = line

    def feed(self, token: int) -> None:
        """Append one generated token (a byte id; others read as 0xFF, pad skipped)."""
        b = token if 0 <= token < tokenizer.VOCAB_SIZE else 0xFF
        if b == 0:
            return
        if b == 0x0A:
            self._complete(self.tail)
            self.tail = b""
        else:
            self.tail += bytes((b,))

    def next_token(self) -> int | None:
        """The greedy next token; None when the context holds nothing to echo."""
        if not self.lines:
            return 0x0A if self.tail else None
        start = self.index.get(self.prev, -1) + 1 if self.prev is not None else 0
        n = len(self.lines)
        if not self.tail:
            return self.lines[start % n][0]
        t = self.tail
        for i in range(n):
            line = self.lines[(start + i) % n]
            if len(line) > len(t) and line.startswith(t):
                return line[len(t)]
        # No known line starts so: the one that matches all but one token of the partial line is
        # continued (a line with one token from elsewhere still reads as that line), else it is ended.
        for i in range(n):
            line = self.lines[(start + i) % n]
            if len(line) > len(t) and _one_off(line, t):
                return line[len(t)]
        return 0x0A


def _one_off(line: bytes, tail: bytes) -> bool:
    """`tail` equals the start of `line` but for exactly one token."""
    misses = 0
    for a, b in zip(line[: len(tail)], tail, strict=True):
        if a != b:
            misses += 1
            if misses > 1:
                return False
    return misses == 1


def context_of(pool: KVPool, pages: np.ndarray, num_tokens: int) -> Context:
    """The toy model's state over the first `num_tokens` slots of `pages`."""
    return Context(tokenizer.tensor_to_bytes(pool.read_pages(pages)[:num_tokens]))
