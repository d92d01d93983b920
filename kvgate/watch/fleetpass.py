"""The per-interval metadata pass: the fleet read as `kvgate check` reads it, compared with what the
last full gate judged.

The pass reads what the gate reads, with the same reader (kvgate/reading/fleetread.py: the router's listing,
every worker's server_info with every DP rank's `internal_states`, `/v1/models`, `/model_info`), all at
once on one thread: a fleet of 1,024 workers costs about one slow answer (bench/fleet_read.py measures
it). Every fact the gate judged (`fleetread.judged_facts`, the router's entries for each worker, the
listing itself) is compared with the value the gate judged; any difference is a change, logged old ->
new, and re-runs the gate. A worker whose process changed (its startup times: `fleetread.process_identity`)
is a new worker, whatever its flags and version label say: the gate runs again, its code scan included.
Load, clocks and live counters are not facts, so a busy fleet re-gates only on schedule. What the
last full gate judged is kept by a tap among its gates (`ReadingsTap`).
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

from kvgate.errors import TransportError
from kvgate.gates.base import GateContext
from kvgate.pipeline.check import discovered_specs
from kvgate.reading.discovery import RouterListing, list_router_workers
from kvgate.reading.fleetread import JUDGED_KEYS, judged_facts, read_workers
from kvgate.reading.node import NodeReading, NodeSpec
from kvgate.reading.target import TargetClient
from kvgate.results.findings import Finding

#: flag changes logged per worker (a restart with other flags can move dozens; the first few say enough)
MAX_FLAG_LINES = 8


@dataclass(frozen=True)
class WorkerView:
    """One listed worker as one read saw it: the router's entries for it, and its judged facts or why
    it could not be read."""

    router: tuple[tuple[object, ...], ...]
    facts: Mapping[str, object] | None
    error: str | None


@dataclass(frozen=True)
class FleetView:
    """The fleet as one read saw it (a pass, or the full gate): the listing's state ("ok", "unlisted":
    none could be had or it lists no worker, "partial: why"), its own facts, and every listed worker."""

    listing_state: str
    listing: Mapping[str, object]
    workers: Mapping[str, WorkerView]


def listing_state(listing: RouterListing | None) -> str:
    """What the gate makes of a listing: none (or an empty one) gates nothing, a partial one is doubt."""
    if listing is None or not listing.workers:
        return "unlisted"
    problem = listing.total_problem()
    return "ok" if problem is None else f"partial: {problem}"


def view_of(listing: RouterListing | None, results: Mapping[str, NodeReading | str]) -> FleetView:
    """The view of one read: `results` maps each listed worker's URL to its reading or its error."""
    state = listing_state(listing)
    if listing is None:
        return FleetView(state, {}, {})
    entries = listing.by_base_url()
    workers: dict[str, WorkerView] = {}
    for url, got in results.items():
        router = tuple(sorted((tuple(vars(e).values()) for e in entries.get(url, ())), key=repr))
        if isinstance(got, NodeReading):
            workers[url] = WorkerView(router, judged_facts(got), None)
        else:
            workers[url] = WorkerView(router, None, got)
    return FleetView(state, {"endpoint": listing.endpoint, "total": listing.total}, workers)


#: every kind a Change can have (`Change.kind`): the watch's change counter starts each at 0
CHANGE_KINDS = (
    *(k for k in JUDGED_KEYS if " " not in k),
    "rank",
    "problem",
    "flag",
    "listing",
    "worker",
    "router",
    "reachable",
)


@dataclass(frozen=True)
class Change:
    """One logged change: which worker, which fact, the value the gate judged and the value read now."""

    worker: str
    fact: str
    old: object
    new: object

    def line(self) -> str:
        if self.fact == "process":
            return f"{self.worker}: process {self.old} -> {self.new} (restarted: a new worker, gated whole again)"
        return f"{self.worker}: {self.fact} {self.old} -> {self.new}"

    @property
    def kind(self) -> str:
        """The fact's kind, for a metric label (one per kind, not per rank or flag)."""
        return "rank" if re.match(r"dp\d+ ", self.fact) else self.fact.split(" ")[0]


@dataclass(frozen=True)
class FleetSnapshot:
    """One pass: what it saw, the readings behind it, the specs it read (the next pass's expected
    workers), why the listing could not be had (None: it was) and what it cost."""

    view: FleetView
    readings: Mapping[str, NodeReading]
    specs: tuple[NodeSpec, ...]
    listing_error: str | None
    elapsed_s: float

    @property
    def errors(self) -> dict[str, str]:
        return {u: w.error for u, w in self.view.workers.items() if w.error is not None}


def _same(a: object, b: object) -> bool:
    """Equal as JSON values. Plain equality first (no serialising in the common, unchanged case), then
    as canonical JSON, which a NaN (never equal to itself) in a document also passes."""
    if a == b:
        return True
    canon = functools.partial(json.dumps, sort_keys=True, default=str)
    return bool(canon(a) == canon(b))


def changes(judged: FleetView | None, new: FleetView) -> list[Change]:
    """Every difference between what the last full gate judged and what this pass read: the listing,
    workers listed or gone, the router's entries for a worker, a worker readable or not, and each of
    its judged facts. Nothing before the first gate."""
    out: list[Change] = []
    if judged is None:
        return out
    if judged.listing_state != new.listing_state:
        out.append(Change("router", "listing", judged.listing_state, new.listing_state))
    for key in sorted(set(judged.listing) | set(new.listing)):
        a, b = judged.listing.get(key), new.listing.get(key)
        if not _same(a, b):
            out.append(Change("router", f"listing {key}", a, b))
    for url in sorted(set(judged.workers) - set(new.workers)):
        out.append(Change(url, "worker", "listed", "gone"))
    for url in sorted(set(new.workers) - set(judged.workers)):
        out.append(Change(url, "worker", "absent", "listed"))
    for url in sorted(set(new.workers) & set(judged.workers)):
        was, now = judged.workers[url], new.workers[url]
        if not _same(was.router, now.router):
            out.append(Change(url, "router entry", list(was.router), list(now.router)))
        if (was.error is None) != (now.error is None):
            out.append(Change(url, "reachable", was.error or "yes", now.error or "yes"))
        if was.facts is None or now.facts is None or now.error is not None:
            continue
        flags = 0
        for key in [*now.facts, *(k for k in was.facts if k not in now.facts)]:
            a, b = was.facts.get(key, "(absent)"), now.facts.get(key, "(absent)")
            if _same(a, b):
                continue
            if key.startswith("flag "):
                flags += 1
                if flags > MAX_FLAG_LINES:
                    continue
            out.append(Change(url, key, a, b))
    return out


def _list(
    router: str, timeout: float, token: str | None, router_token: str | None = None
) -> tuple[RouterListing | None, str | None]:
    """The router's listing as `kvgate check` lists it, or why it could not be had."""
    try:
        with TargetClient(timeout=timeout, token=token) as client:
            listing = list_router_workers(client, router, router_token)
    except TransportError as exc:
        return None, str(exc)
    if not listing.workers:
        return listing, f"the router lists no workers ({listing.endpoint})"
    return listing, None


def read_fleet(
    router: str,
    *,
    timeout: float,
    token: str | None,
    concurrency: int,
    deadline_s: float,
    expected: Sequence[NodeSpec] = (),
    router_token: str | None = None,
) -> FleetSnapshot:
    """List the router's workers and read every listed worker with the fleet reader.

    The `expected` workers (the last pass's) are read while the listing is still coming, so a pass
    costs about one answer, not a listing plus one answer; a worker the listing adds is read after it,
    one the listing dropped is forgotten.
    """
    t0 = time.monotonic()
    end = t0 + deadline_s
    kw = {"timeout": timeout, "token": token, "width": concurrency, "deadline": end}
    deadline_name = "the pass's deadline"
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending: list[Future[tuple[RouterListing | None, str | None]]] = []

        def list_now() -> None:  # once the reads are out: the listing's parsing then overlaps their wait
            pending.append(pool.submit(_list, router, timeout, token, router_token))

        got = read_workers(list(expected), on_sent=list_now, deadline_name=deadline_name, **kw)  # type: ignore[arg-type]
        read: dict[str, NodeReading | TransportError] = {s.url: r for s, r in zip(expected, got, strict=True)}
        if not pending:
            list_now()
        listing, listing_error = pending[0].result()
    specs = discovered_specs(listing) if listing is not None and listing.workers else []
    new = [s for s in specs if s.url not in read]
    if new:
        more = read_workers(new, deadline_name=deadline_name, **kw)  # type: ignore[arg-type]
        read.update({s.url: r for s, r in zip(new, more, strict=True)})
    results: dict[str, NodeReading | str] = {
        s.url: (r if isinstance(r, NodeReading) else str(r)) for s in specs for r in (read[s.url],)
    }
    readings = {u: r for u, r in results.items() if isinstance(r, NodeReading)}
    view = view_of(listing, results)
    return FleetSnapshot(view, readings, tuple(specs), listing_error, round(time.monotonic() - t0, 4))


class ReadingsTap:
    """A gate that only keeps the run's snapshot: what the gates judged (the passes compare with it)
    and the readings (the probes plan their lengths from them)."""

    name = "watch-snapshot"

    def __init__(self) -> None:
        self.readings: list[NodeReading] = []
        self.listing: RouterListing | None = None
        self.attempted: tuple[str, ...] = ()

    def run(self, ctx: GateContext) -> list[Finding]:
        self.readings = list(ctx.readings)
        self.listing = ctx.listing
        self.attempted = tuple(s.url for s in ctx.attempted)
        return []

    def view(self, before: FleetView | None) -> FleetView:
        """The fleet as the gate judged it. A worker it could not read keeps the facts an earlier gate
        judged for it, so the pass that reads it again logs what a restart changed (pool 8192 -> 2048)."""
        got: dict[str, NodeReading | str] = dict.fromkeys(self.attempted, "not read by the full gate")
        got.update({r.spec.url: r for r in self.readings})
        view = view_of(self.listing, got)
        if before is None:
            return view
        workers = dict(view.workers)
        for url, w in workers.items():
            old = before.workers.get(url)
            if w.facts is None and old is not None and old.facts is not None:
                workers[url] = replace(w, facts=old.facts)
        return replace(view, workers=workers)


__all__ = [
    "CHANGE_KINDS",
    "Change",
    "FleetSnapshot",
    "FleetView",
    "ReadingsTap",
    "WorkerView",
    "changes",
    "listing_state",
    "read_fleet",
    "view_of",
]
