"""Canary sentinels: fresh per run, planted as token ids, searched for in response text.

Why text search: the probes must send `input_ids` (exact token counts), but a response comes back as
text. A sentinel is therefore ASCII text (`<KVG` + 10 random base32 characters + `>`) turned into ids
by a `TokenCodec`, and planted densely: the prompt is the ids of the sentinel's line repeated end to end, so every
KV page of it holds sentinel content. Any stale read of those pages decodes back to sentinel text.

How ids are obtained, honestly:
- `ServerCodec`: the worker's own tokenizer through SGLang's `/v1/tokenize` (ids without special
  tokens), accepted only if `/v1/detokenize` of the ids repeated twice gives the text back twice.
- `ByteCodec`: the kvgate simulator's reversible byte-level tokenizer (id = byte + offset).
- `TokenSpaceCodec`: a server without a tokenizer (`--skip-tokenizer-init`): the sentinel is planted as
  an id sequence (each byte of its text plus an offset, ids every vocabulary has) and searched for in
  the answers' `output_ids`, mapped back id by id; no tokenizer is needed on either side.
"""

from __future__ import annotations

import base64
import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from kvgate.output.redact import clip
from kvgate.reading.httpbounds import parse_json

PREFIX = "KVG"
_CORE_LEN = 10
# The core of a sentinel of any kvgate run, ours or an earlier one (no delimiters: for ids and summaries).
ANY_SENTINEL = re.compile(PREFIX + rf"[A-Z2-7]{{{_CORE_LEN}}}")
# A whole sentinel in text, delimiters included. Only this attributes content to an unknown request:
# the undelimited pattern also matches shapes glued from fragments ("KVG" + a real core's first 10).
WHOLE_SENTINEL = re.compile(r"<(" + ANY_SENTINEL.pattern + r")>")
# Fragments of this many random characters still identify one of this run's sentinels (40 bits) when
# an answer is too short to hold a whole one; such a sighting is reported as a partial match.
FRAGMENT = 8
WHOLE = "whole"
PARTIAL = "partial"
UNKNOWN_SOURCE = "an earlier kvgate run (unknown request)"


@dataclass(frozen=True)
class Sentinel:
    """One request's marker: the owner it identifies and its text."""

    owner: str
    core: str  # KVG + random part

    @property
    def text(self) -> str:
        return f"<{self.core}>"

    @property
    def unit(self) -> str:
        """What is planted, repeated: the sentinel on its own line (models echo lines; so does the simulator)."""
        return self.text + "\n"

    @property
    def fragments(self) -> tuple[str, ...]:
        rnd = self.core[len(PREFIX) :]
        return tuple(rnd[i : i + FRAGMENT] for i in range(len(rnd) - FRAGMENT + 1))

    def fragment_in(self, text: str) -> str | None:
        """The first fragment of this sentinel's random part found in `text`, if any."""
        return next((f for f in self.fragments if f in text), None)

    def found_in(self, text: str) -> bool:
        return self.text in text or self.fragment_in(text) is not None


def new_sentinel(owner: str) -> Sentinel:
    """A fresh sentinel from the OS CSPRNG (never reused across runs)."""
    rnd = base64.b32encode(secrets.token_bytes(8)).decode("ascii")[:_CORE_LEN]
    return Sentinel(owner, PREFIX + rnd)


class TokenCodec(Protocol):
    """Turns sentinel text into the target's token ids."""

    @property
    def name(self) -> str:
        """How the report names the codec."""

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without special tokens."""


@dataclass(frozen=True)
class ByteCodec:
    """Byte-level ids (the kvgate simulator's tokenizer): id = UTF-8 byte + offset."""

    offset: int = 0
    name: str = "bytes"

    def encode(self, text: str) -> list[int]:
        return [b + self.offset for b in text.encode("utf-8")]

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i - self.offset for i in ids if 0 <= i - self.offset < 256).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class TokenSpaceCodec:
    """Sentinels in token space: ids = UTF-8 bytes of the sentinel's text + offset, and back, one id at a
    time (an id outside the range maps to U+FFFD, so no sequence is ever glued across foreign ids)."""

    offset: int = 0
    name: str = "token-space"

    def encode(self, text: str) -> list[int]:
        return [b + self.offset for b in text.encode("utf-8")]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i - self.offset) if 0 <= i - self.offset < 128 else "\ufffd" for i in ids)


class ServerCodec:
    """The worker's tokenizer via SGLang's /v1/tokenize, verified with /v1/detokenize."""

    name = "server"

    def __init__(self, http: httpx.Client, base_url: str, timeout: float = 10.0) -> None:
        self.http = http
        self.base = base_url.rstrip("/")
        self.timeout = timeout

    def encode(self, text: str) -> list[int]:
        resp = self.http.post(
            self.base + "/v1/tokenize", json={"prompt": text, "add_special_tokens": False}, timeout=self.timeout
        )
        resp.raise_for_status()
        tokens = _object(resp.content).get("tokens")
        if not isinstance(tokens, list) or not tokens or not all(isinstance(t, int) for t in tokens):
            raise ValueError(f"/v1/tokenize returned no token list: {clip(resp.text, 120)!r}")
        return tokens

    def round_trips(self, text: str) -> bool:
        """True if the ids of `text`, repeated twice, decode to `text` twice (dense planting works)."""
        ids = self.encode(text)
        resp = self.http.post(self.base + "/v1/detokenize", json={"tokens": ids + ids}, timeout=self.timeout)
        resp.raise_for_status()
        decoded = _object(resp.content).get("text")
        return isinstance(decoded, str) and decoded.count(text.strip("<>")) == 2


def _object(content: bytes) -> dict[str, Any]:
    """A JSON object answer (depth-limited, httpbounds.parse_json); anything else is a ValueError."""
    doc = parse_json(content)
    if not isinstance(doc, dict):
        raise ValueError(f"expected a JSON object, got {type(doc).__name__}")
    return doc


def plant_ids(codec: TokenCodec, sentinel: Sentinel, length: int) -> list[int]:
    """Exactly `length` ids: the sentinel's ids repeated end to end (dense: every page holds it)."""
    unit = codec.encode(sentinel.unit)
    reps = -(-length // len(unit))
    return (unit * reps)[:length]


@dataclass(frozen=True)
class Sighting:
    """A sentinel seen in a response it does not belong to."""

    victim: str  # the request whose response carried it
    source: str  # the request whose content it is (UNKNOWN_SOURCE for a whole sentinel of no request of ours)
    sentinel: str  # the whole delimited sentinel whose content it is
    kind: str = WHOLE  # WHOLE, or PARTIAL: only a fragment of one of this run's sentinels was seen
    fragment: str | None = None  # what was seen, for a partial match

    @property
    def shown(self) -> str:
        """The sentinel, with its class and the fragment seen when it is a partial match."""
        if self.kind == PARTIAL:
            return f"{self.sentinel} (partial match: only fragment {self.fragment} seen)"
        return self.sentinel


def leading(sightings: Sequence[Sighting]) -> Sighting:
    """The sighting a summary names first: a whole sentinel before a partial match (a fragment is weaker
    evidence than the whole), else the first seen."""
    return next((s for s in sightings if s.kind != PARTIAL), sightings[0])


def scan(victim: str, own: Sentinel | None, text: str, book: Sequence[Sentinel]) -> list[Sighting]:
    """Every foreign sentinel in `text`: this run's, whole or partial (attributed), and whole delimited
    sentinels of no request of this run (an earlier run's)."""
    out: list[Sighting] = []
    for s in book:
        if own is not None and s.core == own.core:
            continue
        if s.text in text:
            out.append(Sighting(victim, s.owner, s.text))
        elif (frag := s.fragment_in(text)) is not None:
            out.append(Sighting(victim, s.owner, s.text, PARTIAL, frag))
    ours = {s.core for s in book}
    for m in sorted(set(WHOLE_SENTINEL.findall(text))):
        if m not in ours:
            out.append(Sighting(victim, UNKNOWN_SOURCE, f"<{m}>"))
    return out


def owners(sightings: Iterable[Sighting]) -> list[str]:
    return sorted({f"{s.source} -> {s.victim} ({s.shown})" for s in sightings})
