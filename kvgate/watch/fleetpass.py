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
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

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
    settings: tuple[tuple[str, str], ...]  # (key, value as JSON) of every non-volatile key, for the change log

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
    settings = tuple(
        sorted((str(k), json.dumps(v, sort_keys=True, default=str)) for k, v in info.items() if k not in VOLATILE_KEYS)
    )
    digest = hashlib.sha256(repr(settings).encode()).hexdigest()[:16]
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
                a, b = dict(prev.settings), dict(cur.settings)
                keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
                for k in keys[:8]:
                    out.append(Change(url, f"flag {k}", a.get(k, "(absent)"), b.get(k, "(absent)")))
            elif fact != "flags" and prev.value(fact) != cur.value(fact):
                out.append(Change(url, fact, prev.value(fact), cur.value(fact)))
    return out


async def _read_all(
    urls: list[str], *, timeout: float, token: str | None, concurrency: int, deadline: float
) -> dict[str, dict[str, Any] | str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    gate = asyncio.Semaphore(concurrency)
    out: dict[str, dict[str, Any] | str] = {}
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(timeout), headers=headers, limits=limits, follow_redirects=False
    ) as http:

        async def one(url: str) -> None:
            async with gate:
                out[url] = await _server_info(http, url, deadline)

        await asyncio.gather(*(one(u) for u in urls))
    return out


async def _server_info(http: httpx.AsyncClient, url: str, deadline: float) -> dict[str, Any] | str:
    """The worker's server_info document, or a sentence saying why not (never raises)."""
    for path in ("/server_info", "/get_server_info"):
        left = deadline - time.monotonic()
        if left <= 0:
            return f"not read: the pass's deadline passed ({url}{path})"
        try:
            resp = await asyncio.wait_for(http.get(url + path), timeout=left)
        except (asyncio.TimeoutError, httpx.TimeoutException):
            return f"{url}{path}: no answer in time"
        except httpx.HTTPError as exc:
            return f"{url}{path}: unreachable: {type(exc).__name__}"
        if resp.status_code == 404:
            continue
        if resp.status_code != 200:
            return f"{url}{path}: HTTP {resp.status_code}"
        try:
            doc = json.loads(resp.content)
        except (ValueError, RecursionError):
            return f"{url}{path}: malformed JSON"
        return doc if isinstance(doc, dict) else f"{url}{path}: not a JSON object"
    return f"{url}: neither /server_info nor /get_server_info exists"


def read_fleet(
    router: str,
    *,
    timeout: float,
    token: str | None,
    concurrency: int,
    deadline_s: float,
    static: Mapping[str, str] | None = None,
) -> FleetSnapshot:
    """List the router's workers (unless `static` gives url -> role) and read every server_info at once."""
    t0 = time.monotonic()
    roles: dict[str, str | None] = dict(static or {})
    listing_error: str | None = None
    if static is None:
        try:
            with TargetClient(timeout=timeout, token=token) as client:
                listing: RouterListing = list_router_workers(client, router)
        except TransportError as exc:
            listing_error = str(exc)
        else:
            for url, entries in listing.by_base_url().items():
                kinds = {e.role for e in entries if e.role}
                roles[url] = kinds.pop() if len(kinds) == 1 else None
    docs = asyncio.run(
        _read_all(list(roles), timeout=timeout, token=token, concurrency=concurrency, deadline=t0 + deadline_s)
    )
    facts: dict[str, WorkerFacts] = {}
    errors: dict[str, str] = {}
    for url, doc in docs.items():
        if isinstance(doc, str):
            errors[url] = doc
        else:
            facts[url] = facts_from(url, doc)
    return FleetSnapshot(roles, facts, errors, listing_error, round(time.monotonic() - t0, 4))
