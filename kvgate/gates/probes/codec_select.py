"""Choosing how sentinel text becomes token ids for this target (see sentinels.py)."""

from __future__ import annotations

from collections.abc import Sequence

import httpx

from kvgate.gates.probes.sentinels import ByteCodec, ServerCodec, TokenCodec, TokenSpaceCodec, new_sentinel
from kvgate.gates.probes.settings import ProbeSettings
from kvgate.reading.node import PREFILL, NodeReading


def is_simulator(readings: Sequence[NodeReading]) -> bool:
    """True when every worker's server_info carries the simulator's own `kvgate_simulator: true` (its
    byte-level tokenizer is known). Never from a path or a name: a real server's model may well live
    under a folder called kvgate."""
    return bool(readings) and all(r.server_info.get("kvgate_simulator") is True for r in readings)


def _server_codec(http: httpx.Client, readings: Sequence[NodeReading]) -> tuple[ServerCodec | None, str]:
    urls = [r.spec.url for r in readings if r.spec.role == PREFILL] or [r.spec.url for r in readings]
    why = "no worker to ask"
    for url in urls:
        codec = ServerCodec(http, url)
        try:
            if codec.round_trips(new_sentinel("probe").text):
                return codec, f"{url}/v1/tokenize (round-trip verified with /v1/detokenize)"
            why = f"{url}/v1/detokenize does not give the sentinel back"
        except (httpx.HTTPError, ValueError) as exc:
            why = f"{url}/v1/tokenize unusable ({type(exc).__name__})"
    return None, why


def select_codec(
    http: httpx.Client, readings: Sequence[NodeReading], settings: ProbeSettings
) -> tuple[TokenCodec | None, str]:
    """The codec and a sentence saying why; None when sentinels cannot be decoded (canaries inconclusive:
    only `tokenizer: server` with no usable /v1/tokenize). In "auto" mode a server with no tokenizer gets
    sentinels in token space (planted as id sequences, searched in `output_ids`)."""
    if settings.tokenizer == "bytes":
        return ByteCodec(settings.byte_offset), f"byte-level ids (offset {settings.byte_offset}, from the profile)"
    if settings.tokenizer == "ids":
        return (
            TokenSpaceCodec(settings.byte_offset),
            f"token space: id sequences planted, searched in output_ids (offset {settings.byte_offset}, "
            "from the profile)",
        )
    codec, why = _server_codec(http, readings)
    if codec is not None:
        return codec, why
    if settings.tokenizer == "auto" and is_simulator(readings):
        return ByteCodec(0), "the kvgate simulator's byte-level tokenizer"
    if settings.tokenizer == "auto":
        return (
            TokenSpaceCodec(settings.byte_offset),
            f"token space: id sequences planted, searched in output_ids (no server tokenizer: {why})",
        )
    return None, why
