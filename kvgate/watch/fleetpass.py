"""The per-interval metadata pass: who the router lists, and what every worker says about itself.

One GET of each worker's server_info (the fields a capacity change moves: pool, context, version,
role, flags), all at once up to `concurrency` in flight on one thread (wideread.py): a fleet of 1,024
workers costs about one slow answer, not 1,024/width of them (bench/fleet_read.py measures it). The full
gate (kvgate.check) reads everything again, strictly; this pass only decides when it must run.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kvgate.defaults import METADATA_BODY_CAP
from kvgate.discovery import RouterListing, list_router_workers
from kvgate.errors import TransportError
from kvgate.target import POOL_KEYS, TargetClient
from kvgate.watch.wideread import Answer, Failure, get_many

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
    settings: Mapping[str, Any] = field(repr=False)  # every non-volatile key: the "flags" fact

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
        settings=settings,
    )


def _same(a: object, b: object) -> bool:
    """Equal as JSON values. Plain equality first (no serialising in the common, unchanged case), then
    as canonical JSON, which a NaN (never equal to itself) in a document also passes."""
    if a == b:
        return True
    canon = functools.partial(json.dumps, sort_keys=True, default=str)
    return bool(canon(a) == canon(b))


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
            if fact == "flags" and not _same(prev.settings, cur.settings):
                a, b = prev.settings, cur.settings
                keys = sorted(k for k in set(a) | set(b) if not _same(a.get(k), b.get(k)))
                for k in keys[:8]:
                    out.append(Change(url, f"flag {k}", a.get(k, "(absent)"), b.get(k, "(absent)")))
            elif fact != "flags" and prev.value(fact) != cur.value(fact):
                out.append(Change(url, fact, prev.value(fact), cur.value(fact)))
    return out


def _read_workers(
    urls: list[str],
    *,
    timeout: float,
    token: str | None,
    width: int,
    deadline: float,
    on_sent: Callable[[], None] | None = None,
) -> dict[str, WorkerFacts | str]:
    """url -> the facts of its server_info, or a sentence saying why not: /server_info from every worker
    at once, then the older /get_server_info from those that answered 404. Each answer is parsed as it
    arrives, while the rest are still coming."""
    headers = f"Authorization: Bearer {token}\r\n" if token else ""
    out: dict[str, WorkerFacts | str] = {}
    todo = urls
    for path in ("/server_info", "/get_server_info"):
        if not todo:
            break
        batch = todo

        def judge(i: int, got: Answer, batch: list[str] = batch, path: str = path) -> None:
            if got.status != 404:  # a 404 tries the older path next
                doc = _document(f"{batch[i]}{path}", got)
                out[batch[i]] = doc if isinstance(doc, str) else facts_from(batch[i], doc)

        answers = get_many(
            batch,
            path,
            headers=headers,
            timeout=timeout,
            deadline=deadline,
            width=width,
            body_cap=METADATA_BODY_CAP,
            on_answer=judge,
            on_sent=on_sent,
        )
        on_sent = None
        todo = []
        for url, got in zip(batch, answers, strict=True):
            if isinstance(got, Failure):
                out[url] = got.reason
            elif got.status == 404:
                todo.append(url)
    for url in todo:
        out[url] = f"{url}: neither /server_info nor /get_server_info exists"
    return out


def _document(where: str, got: Answer) -> dict[str, Any] | str:
    if got.status != 200:
        return f"{where}: HTTP {got.status}"
    try:
        doc = json.loads(got.body)
    except (ValueError, RecursionError):
        return f"{where}: malformed JSON"
    return doc if isinstance(doc, dict) else f"{where}: not a JSON object"


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
    with ThreadPoolExecutor(max_workers=1) as pool:
        listing: list[Future[tuple[dict[str, str | None], str | None]]] = []

        def list_now() -> None:  # once the reads are out: the listing's parsing then overlaps their wait
            listing.append(pool.submit(_list, router, timeout, token))

        read = _read_workers(
            list(expected), timeout=timeout, token=token, width=concurrency, deadline=end, on_sent=list_now
        )
        if not listing:
            list_now()
        roles, listing_error = listing[0].result()
    new = [u for u in roles if u not in read]
    if new:
        read.update(_read_workers(new, timeout=timeout, token=token, width=concurrency, deadline=end))
    facts = {url: got for url in roles if isinstance(got := read[url], WorkerFacts)}
    errors = {url: got for url in roles if isinstance(got := read[url], str)}
    return FleetSnapshot(roles, facts, errors, listing_error, round(time.monotonic() - t0, 4))
