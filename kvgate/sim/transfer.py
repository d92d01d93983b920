"""The KV transfer protocol between a simulated decode and prefill: loopback TCP on the bootstrap port.

SGLang's prefill runs a bootstrap server (`disaggregation/common/conn.py CommonKVBootstrapServer`)
and the decode's `KVReceiver` registers a room there, telling the prefill where its preallocated KV
lives; the prefill's `KVSender` then writes pages straight into decode memory (RDMA, Mooncake/NIXL)
and signals the transfer done (`KVPoll.Success`). This module models that with one TCP connection
per room, opened by decode to the prefill's `--disaggregation-bootstrap-port`:

decode -> prefill
    ``register``  {room, rid, num_tokens}; payload: the decode's destination page ids (int64)
    ``abort``     {room}: decode-initiated abort (`CommonKVReceiver.abort` / abort notification)
prefill -> decode
    ``kv``        {room, count}; payload: destination page ids (int64) then page content (int32).
                  Like an RDMA write, it names the remote pages itself: the decode applies it to
                  those pages whoever owns them now (a late write lands on reassigned pages).
    ``done``      {room, claimed_tokens, claimed_pages}: transfer-complete with what prefill claims
    ``abort_ack`` {room}: in-flight writes for the room drained (deferred decode KV release)

No message says that the prefill rejected a request: like SGLang's prefill (0.5.20 after the forward,
0.5.21+ at its admission door) it just never sends the room's KV, and the decode waits until its
waiting timeout.

Frame: 4-byte big-endian header length, 4-byte big-endian payload length, JSON header, payload.
"""

from __future__ import annotations

import asyncio
import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

_FRAME = struct.Struct(">II")


@dataclass
class Message:
    """One protocol message: a JSON header (with `type`) and a binary payload."""

    header: dict[str, Any]
    payload: bytes = b""

    @property
    def type(self) -> str:
        return str(self.header.get("type"))


async def send(writer: asyncio.StreamWriter, header: dict[str, Any], payload: bytes = b"") -> None:
    """Write one framed message and drain."""
    head = json.dumps(header).encode()
    writer.write(_FRAME.pack(len(head), len(payload)) + head)
    if payload:
        writer.write(payload)
    await writer.drain()


async def recv(reader: asyncio.StreamReader) -> Message | None:
    """Read one framed message; None on a clean EOF."""
    try:
        raw = await reader.readexactly(_FRAME.size)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    hlen, plen = _FRAME.unpack(raw)
    try:
        head = await reader.readexactly(hlen)
        payload = await reader.readexactly(plen) if plen else b""
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    return Message(json.loads(head), payload)


def pack_pages(dst_pages: np.ndarray, content: np.ndarray) -> bytes:
    """Payload of a ``kv`` message: int64 page ids then int32 content (native byte order: the simulator's
    peers share a host)."""
    return dst_pages.astype(np.int64).tobytes() + content.astype(np.int32).tobytes()


def unpack_pages(payload: bytes, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of `pack_pages`: read-only views of `payload`, no copy."""
    split = count * 8
    pages = np.frombuffer(payload, dtype=np.int64, count=count) if count else np.zeros(0, dtype=np.int64)
    if len(payload) <= split:
        return pages, np.zeros(0, dtype=np.int32)
    content = np.frombuffer(payload, dtype=np.int32, offset=split)
    return pages, content
