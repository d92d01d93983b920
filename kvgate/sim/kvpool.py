"""The paged KV pool of a simulated worker: a torch tensor plus a page allocator.

The toy model's "KV" of a token is the token itself, so a pool page holds `page_size` token ids.
Like GPU memory, a freed page is NOT cleared: its stale content stays until a later write lands
on it. This is what makes the incident's leak reproducible (incident.md section 2, step 6).

Modelled on SGLang's `mem_cache/memory_pool.py ReqToTokenPool`/`TokenToKVPoolAllocator` only in
shape (a fixed capacity in tokens, page-granular allocation); nothing is copied from it.
"""

from __future__ import annotations

import threading

import torch


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
        self.data = torch.zeros((self.num_pages, page_size), dtype=torch.int32)
        self._free = torch.ones(self.num_pages, dtype=torch.bool)
        self._lock = threading.Lock()
        self.version = 0

    def pages_for(self, num_tokens: int) -> int:
        """Pages needed to hold `num_tokens` tokens (at least one)."""
        return max(1, -(-num_tokens // self.page_size))

    @property
    def free_pages(self) -> int:
        """How many pages are free now."""
        return int(self._free.sum())

    def alloc(self, num_pages: int) -> torch.Tensor:
        """Reserve `num_pages` pages, lowest index first (so reuse of freed pages is deterministic)."""
        with self._lock:
            free_idx = torch.nonzero(self._free, as_tuple=False).flatten()
            if free_idx.numel() < num_pages:
                raise PoolExhausted(f"need {num_pages} pages, {free_idx.numel()} free")
            pages = free_idx[:num_pages].to(torch.int64)
            self._free[pages] = False
            return pages

    def free(self, pages: torch.Tensor) -> None:
        """Return pages to the allocator. Their content is left as it is (stale)."""
        with self._lock:
            self._free[pages] = True

    def write_tokens(self, pages: torch.Tensor, tokens: torch.Tensor) -> None:
        """Write `tokens` into consecutive slots of `pages`; the tail of a last partial page keeps its old content."""
        n = tokens.numel()
        if n == 0:
            return
        full, rest = divmod(n, self.page_size)
        if full:
            self.data[pages[:full]] = tokens[: full * self.page_size].view(full, self.page_size).to(torch.int32)
        if rest:
            self.data[pages[full], :rest] = tokens[full * self.page_size :].to(torch.int32)
        self.version += 1

    def write_pages(self, pages: torch.Tensor, content: torch.Tensor) -> None:
        """Overwrite whole pages (an RDMA-style page write: whatever the destination, no ownership check)."""
        if pages.numel() == 0:
            return
        self.data[pages] = content.view(pages.numel(), self.page_size).to(torch.int32)
        self.version += 1

    def read_pages(self, pages: torch.Tensor) -> torch.Tensor:
        """The content of `pages`, flattened, in the order given."""
        return self.data[pages].flatten()
