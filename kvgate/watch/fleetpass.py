"""The per-interval metadata pass: who the router lists, and what every worker says about itself.

One GET of each worker's server_info (the fields a capacity change moves: pool, context, version,
role, flags), all at once up to `concurrency` in flight on one event loop: a fleet of 1,024 workers
costs about one slow answer, not 1,024/width of them (bench/fleet_read.py measures it). The full
gate (kvgate.check) reads everything again, strictly; this pass only decides when it must run.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import ssl as ssl_module
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from kvgate.defaults import METADATA_BODY_CAP
from kvgate.discovery import RouterListing, list_router_workers
from kvgate.errors import TransportError
from kvgate.target import POOL_KEYS, TargetClient

#: server_info keys that move without any change of configuration (load, clocks, live state).
VOLATILE_KEYS = frozenset(
    {"internal_states", "startup_time", "status", "last_gen_throughput", "load", "uptime", "num_running_reqs"}
)
#: the facts whose change re-runs the gate, in the order changes are logged
FACTS = ("role", "version", "pool", "context", "max_req_input_len", "page_size", "flags")


@dataclass(frozen=True)
class WorkerFacts:
    """What one worker's server_info says, reduced to what a capacity change moves."""

    url: str
    role: str | None
    version: str | None
    pool: int | None
    context: int | None
    max_req_input_len: int | None
    page_size: int | None
    flags: str  # digest of every non-volatile key
    settings: Mapping[str, Any] = field(compare=False, repr=False)  # every non-volatile key, for the change log

    def value(self, fact: str) -> object:
        return getattr(self, fact)


@dataclass(frozen=True)
class Change:
    """One logged change: which worker, which fact, the old and the new value."""

    worker: str
    fact: str
    old: object
    new: object

    def line(self) -> str:
        return f"{self.worker}: {self.fact} {self.old} -> {self.new}"


@dataclass(frozen=True)
class FleetSnapshot:
    """One pass: the listing's roles, every worker's facts or its error, and what the pass cost."""

    roles: Mapping[str, str | None]
    facts: Mapping[str, WorkerFacts]
    errors: Mapping[str, str]
    listing_error: str | None
    elapsed_s: float


def _int(info: Mapping[str, Any], key: str) -> int | None:
    v = info.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def facts_from(url: str, info: Mapping[str, Any]) -> WorkerFacts:
    """The facts of one server_info document (missing fields are None; the full gate judges them)."""
    pool = next((_int(info, k) for k in POOL_KEYS if k in info), None)
    settings = {str(k): v for k, v in info.items() if k not in VOLATILE_KEYS}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]
    role = info.get("disaggregation_mode")
    version = info.get("version")
    return WorkerFacts(
        url=url,
        role=role if isinstance(role, str) else None,
        version=version if isinstance(version, str) else None,
        pool=pool,
        context=_int(info, "context_length"),
        max_req_input_len=_int(info, "max_req_input_len"),
        page_size=_int(info, "page_size"),
        flags=digest,
        settings=settings,
    )


def changes(old: FleetSnapshot | None, new: FleetSnapshot, known: Mapping[str, WorkerFacts]) -> list[Change]:
    """What moved since the last pass: workers added or gone, reachable or not, and every fact that
    differs from the worker's last known facts (so a restart shows its old and new pool)."""
    out: list[Change] = []
    if old is None:
        return out
    if old.listing_error != new.listing_error:
        out.append(Change("router", "listing", old.listing_error or "ok", new.listing_error or "ok"))
    for url in sorted(set(old.roles) - set(new.roles)):
        out.append(Change(url, "worker", "listed", "gone"))
    for url in sorted(set(new.roles) - set(old.roles)):
        out.append(Change(url, "worker", "absent", "listed"))
    for url in sorted(new.roles):
        if url in new.errors and url not in old.errors:
            out.append(Change(url, "reachable", "yes", new.errors[url]))
        elif url in old.errors and url in new.facts and url in old.roles:
            out.append(Change(url, "reachable", old.errors[url], "yes"))
        prev, cur = known.get(url), new.facts.get(url)
        if prev is None or cur is None:
            continue
        for fact in FACTS:
            if fact == "flags" and prev.flags != cur.flags:
                a, b = prev.settings, cur.settings
                keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
                for k in keys[:8]:
                    out.append(Change(url, f"flag {k}", a.get(k, "(absent)"), b.get(k, "(absent)")))
            elif fact != "flags" and prev.value(fact) != cur.value(fact):
                out.append(Change(url, fact, prev.value(fact), cur.value(fact)))
    return out


#: the most of a server_info answer the pass reads (a hostile worker cannot make it read more): the same cap
#: as every other metadata read (kvgate.defaults)
MAX_BODY = METADATA_BODY_CAP
MAX_HEAD = 64 << 10


class _HttpProblem(Exception):
    pass


async def _get(url: str, path: str, auth: str, ssl: ssl_module.SSLContext | None) -> tuple[int, bytes]:
    """One HTTP/1.1 GET on a fresh connection: (status, body), bounded in size (the caller bounds time).

    A plain asyncio client on purpose: httpx's per-request cost (and its connection pool's scan of
    every connection) made a pass over 1,024 workers CPU-bound at 5-40x the cost of one answer.
    """
    parts = urlsplit(url)
    https = parts.scheme == "https"
    host = parts.hostname or ""
    port = parts.port or (443 if https else 80)
    reader, writer = await asyncio.open_connection(host, port, ssl=ssl if https else None, limit=MAX_HEAD)
    try:
        target = parts.path.rstrip("/") + path
        writer.write(
            f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nAccept: application/json\r\n"
            f"Connection: close\r\n{auth}\r\n".encode("latin-1")
        )
        await writer.drain()
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise _HttpProblem("response headers over 64 KiB") from None
        lines = head.decode("latin-1").split("\r\n")
        status_line = lines[0].split(" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith("HTTP/1.") or not status_line[1].isdigit():
            raise _HttpProblem(f"not an HTTP/1.x answer: {lines[0][:60]!r}")
        status = int(status_line[1])
        fields = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        if "chunked" in fields.get("transfer-encoding", "").lower():
            body = await _read_chunked(reader)
        elif "content-length" in fields:
            n = int(fields["content-length"]) if fields["content-length"].isdigit() else -1
            if not 0 <= n <= MAX_BODY:
                raise _HttpProblem(f"Content-Length {fields['content-length'][:20]!r} not within 0..{MAX_BODY}")
            body = await reader.readexactly(n)
        else:
            body = await reader.read(MAX_BODY + 1)
            if len(body) > MAX_BODY:
                raise _HttpProblem(f"body over {MAX_BODY} bytes")
        return status, body
    finally:
        writer.close()


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while True:
        size_line = await reader.readline()
        try:
            size = int(size_line.split(b";")[0].strip() or b"x", 16)
        except ValueError:
            raise _HttpProblem("malformed chunked encoding") from None
        if size == 0:
            return bytes(out)
        if len(out) + size > MAX_BODY:
            raise _HttpProblem(f"body over {MAX_BODY} bytes")
        out += await reader.readexactly(size)
        await reader.readexactly(2)


async def _read_all(
    urls: list[str], *, timeout: float, token: str | None, concurrency: int, deadline: float
) -> dict[str, dict[str, Any] | str]:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    ssl = ssl_module.create_default_context() if any(u.startswith("https:") for u in urls) else None
    gate = asyncio.Semaphore(concurrency)
    out: dict[str, dict[str, Any] | str] = {}

    async def one(url: str) -> None:
        async with gate:
            out[url] = await _server_info(url, auth, ssl, timeout, deadline)

    await asyncio.gather(*(one(u) for u in urls))
    return out


async def _server_info(
    url: str, auth: str, ssl: ssl_module.SSLContext | None, timeout: float, deadline: float
) -> dict[str, Any] | str:
    """The worker's server_info document, or a sentence saying why not (never raises)."""
    for path in ("/server_info", "/get_server_info"):
        left = min(timeout, deadline - time.monotonic())
        if left <= 0:
            return f"not read: the pass's deadline passed ({url}{path})"
        try:
            status, body = await asyncio.wait_for(_get(url, path, auth, ssl), timeout=left)
        except asyncio.TimeoutError:
            return f"{url}{path}: no answer within {left:.3g}s"
        except _HttpProblem as exc:
            return f"{url}{path}: {exc}"
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            return f"{url}{path}: unreachable: {type(exc).__name__}"
        if status == 404:
            continue
        if status != 200:
            return f"{url}{path}: HTTP {status}"
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):
            return f"{url}{path}: malformed JSON"
        return doc if isinstance(doc, dict) else f"{url}{path}: not a JSON object"
    return f"{url}: neither /server_info nor /get_server_info exists"


def _list(router: str, timeout: float, token: str | None) -> tuple[dict[str, str | None], str | None]:
    """url -> the router's role for it (None: no single role), or the listing's error."""
    try:
        with TargetClient(timeout=timeout, token=token) as client:
            listing: RouterListing = list_router_workers(client, router)
    except TransportError as exc:
        return {}, str(exc)
    roles: dict[str, str | None] = {}
    for url, entries in listing.by_base_url().items():
        kinds = {e.role for e in entries if e.role}
        roles[url] = kinds.pop() if len(kinds) == 1 else None
    return roles, None


def read_fleet(
    router: str,
    *,
    timeout: float,
    token: str | None,
    concurrency: int,
    deadline_s: float,
    expected: Sequence[str] = (),
) -> FleetSnapshot:
    """List the router's workers and read every listed worker's server_info at once.

    The `expected` workers (the last pass's) are read while the listing is still coming, so a pass
    costs about one answer, not a listing plus one answer; a worker the listing adds is read after it,
    one the listing dropped is forgotten.
    """
    t0 = time.monotonic()
    end = t0 + deadline_s

    async def both() -> tuple[dict[str, str | None], str | None, dict[str, dict[str, Any] | str]]:
        listing = asyncio.create_task(asyncio.to_thread(_list, router, timeout, token))
        docs = await _read_all(list(expected), timeout=timeout, token=token, concurrency=concurrency, deadline=end)
        roles, problem = await listing
        new = [u for u in roles if u not in docs]
        if new:
            docs.update(await _read_all(new, timeout=timeout, token=token, concurrency=concurrency, deadline=end))
        return roles, problem, docs

    roles, listing_error, docs = asyncio.run(both())
    facts: dict[str, WorkerFacts] = {}
    errors: dict[str, str] = {}
    for url in roles:
        doc = docs[url]
        if isinstance(doc, str):
            errors[url] = doc
        else:
            facts[url] = facts_from(url, doc)
    return FleetSnapshot(roles, facts, errors, listing_error, round(time.monotonic() - t0, 4))
