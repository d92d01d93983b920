"""The decode side of one room, as the simulated decode worker (kvgate/sim/decode.py) keeps it: the
request's reservation, its bootstrap connection, its metadata slot, what arrived and how it ended."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvgate.sim.request import SimReq


@dataclass
class Transfer:
    """The decode side of one room: reservation, bootstrap connection and what arrived."""

    req: SimReq
    pages: np.ndarray
    num_tokens: int
    done: asyncio.Future[dict[str, Any]]
    ack: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    aborted: asyncio.Event = field(default_factory=asyncio.Event)
    writer: asyncio.StreamWriter | None = None
    reader_task: asyncio.Task[None] | None = None
    pages_received: int = 0
    freed: bool = False
    release_deferred: bool = False
    #: metadata buffer slot (`req_to_metadata_buffer_idx_allocator`); `slot_shared`: another holds it too
    slot: int = -1
    slot_shared: bool = False
    #: pages lent by an injected fault (another request's reservation): never freed by this request
    borrowed: bool = False
    #: set once this room's metadata write landed (or the request ended)
    written: asyncio.Event = field(default_factory=asyncio.Event)
    #: injected fault: the later request whose write must land before this one commits
    wait_for: Transfer | None = None
