"""The paged KV pool of a simulated worker: a numpy array plus a page allocator.

The toy model's "KV" of a token is the token itself, so a pool page holds `page_size` token ids.
Like GPU memory, a freed page is NOT cleared: its stale content stays until a later write lands
on it. This is what makes the incident's leak reproducible (incident.md section 2, step 6).

Modelled on SGLang's `mem_cache/memory_pool.py ReqToTokenPool`/`TokenToKVPoolAllocator` only in
shape (a fixed capacity in tokens, page-granular allocation); nothing is copied from it.
"""

from __future__ import annotations

import threading

import numpy as np


class PoolExhausted(Exception):
    """Not enough free pages."""


class KVPool:
    """`num_pages x page_size` int32 token ids, lowest-index-first allocation, no zeroing on free.

    `version` increases on every write, so readers can tell whether content changed since they last
    looked (the decode loop re-reads KV only then).
    """

    def __init__(self, capacity_tokens: int, page_size: int) -> None:
        if page_size < 1 or capacity_tokens < page_size:
            raise ValueError("pool must hold at least one page")
        self.page_size = page_size
        self.num_pages = capacity_tokens // page_size
        self.capacity_tokens = self.num_pages * page_size
        self.data = np.zeros((self.num_pages, page_size), dtype=np.int32)
        self._free = np.ones(self.num_pages, dtype=bool)
        self._lock = threading.Lock()
        self.version = 0

    def pages_for(self, num_tokens: int) -> int:
        """Pages needed to hold `num_tokens` tokens (at least one)."""
        return max(1, -(-num_tokens // self.page_size))

    @property
    def free_pages(self) -> int:
        """How many pages are free now."""
        return int(self._free.sum())

    def alloc(self, num_pages: int) -> np.ndarray:
        """Reserve `num_pages` pages, lowest index first (so reuse of freed pages is deterministic)."""
        with self._lock:
            free_idx = np.flatnonzero(self._free)
            if free_idx.size < num_pages:
                raise PoolExhausted(f"need {num_pages} pages, {free_idx.size} free")
            pages = free_idx[:num_pages].astype(np.int64)
            self._free[pages] = False
            return pages

    def free(self, pages: np.ndarray) -> None:
        """Return pages to the allocator. Their content is left as it is (stale)."""
        with self._lock:
            self._free[pages] = True

    def write_tokens(self, pages: np.ndarray, tokens: np.ndarray) -> None:
        """Write `tokens` into consecutive slots of `pages`; the tail of a last partial page keeps its old content."""
        n = tokens.size
        if n == 0:
            return
        full, rest = divmod(n, self.page_size)
        if full:
            self.data[pages[:full]] = tokens[: full * self.page_size].reshape(full, self.page_size).astype(np.int32)
        if rest:
            self.data[pages[full], :rest] = tokens[full * self.page_size :].astype(np.int32)
        self.version += 1

    def write_pages(self, pages: np.ndarray, content: np.ndarray) -> None:
        """Overwrite whole pages (an RDMA-style page write: whatever the destination, no ownership check)."""
        if pages.size == 0:
            return
        self.data[pages] = content.reshape(pages.size, self.page_size).astype(np.int32)
        self.version += 1

    def read_pages(self, pages: np.ndarray) -> np.ndarray:
        """The content of `pages`, flattened, in the order given."""
        return self.data[pages].reshape(-1)
