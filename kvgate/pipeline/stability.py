"""A stable fleet or no verdict: the router's listing and every worker's view of itself, read again just
before `check` gives its verdict, must be what the gates judged.

The router's listing is read once at the start; a worker that registers while the others are read (or
leaves, or is replaced, or restarts on other code) would otherwise never be judged, and the run would
pass a fleet that no longer takes the traffic. So after the gates the listing is read again, and every
worker read is read again whole (server_info, /v1/models, /model_info: what `fleetread.judged_facts`
keeps, its process identity included). Then:

- nothing moved: passed; the verdict covers the fleet as it stands;
- members moved (joined, left, replaced, an entry changed, a worker restarted: a new process is a new
  worker, it may run other code): the run judges again, on the listing just read, with the readings
  just taken, reading only the workers it has no fresh reading of; every gate but the probes runs
  again (the probes' findings stand from the first round, and the finding says who they never saw);
  then it looks again. At most `MAX_REGATES` times: a fleet still moving after that is a blocking
  inconclusive naming the moves;
- a worker whose served state changed within one process (weights path, served model, context, pool
  or flags, with the same startup times: an in-place update in progress), or a listing or a worker
  that could not be read again: a blocking inconclusive naming it (`fleet.stable`, no waiver reaches
  it); the remedy is a re-run once the fleet holds still.

A member that left is not judged (the verdict covers the listing at the verdict) and is named.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from kvgate.errors import TransportError
from kvgate.reading.discovery import RouterListing, RouterWorker, list_router_workers, normalize_url
from kvgate.reading.fleetread import judged_facts
from kvgate.reading.node import NodeReading, NodeSpec
from kvgate.reading.target import TargetClient
from kvgate.results.findings import Evidence, Finding, inconclusive, passed

GATE, CHECK = "fleet", "stable"
_REMEDY = "re-run once the fleet holds still (no worker registering, leaving, restarting or updating during the run)"
_SHOWN = 8  # changes named in one finding; the rest counted
#: how many times a fleet that moved is judged again before the run gives up on a verdict
MAX_REGATES = 3


@dataclass(frozen=True)
class Judged:
    """One round of judging: the listing and the workers it judged, their readings (or why not), and the
    findings the round's steps and gates gave."""

    listing: RouterListing | None
    specs: tuple[NodeSpec, ...]
    results: tuple[NodeReading | TransportError, ...]
    findings: tuple[Finding, ...] = ()

    @property
    def readings(self) -> list[NodeReading]:
        return [r for r in self.results if isinstance(r, NodeReading)]


#: judges the fleet again: the listing now (None without a router) and the fresh readings by spec URL
Regate = Callable[[RouterListing | None, Mapping[str, NodeReading]], Judged]


@dataclass
class Look:
    """What one look found: moves the run can judge again, doubts it cannot, and the fresh readings."""

    listing: RouterListing | None
    moves: list[str] = field(default_factory=list)
    doubts: list[str] = field(default_factory=list)
    fresh: dict[str, NodeReading] = field(default_factory=dict)


def _entry(w: RouterWorker) -> tuple[object, ...]:
    return (w.role, w.status, w.healthy, w.bootstrap_port, w.dp_rank, w.dp_size, w.dp_base_url, w.refused)


def listing_changes(before: RouterListing, after: RouterListing) -> list[str]:
    """What differs between two listings of one router, entry by entry (by URL as listed), as sentences."""
    old: dict[str, list[tuple[object, ...]]] = {}
    new: dict[str, list[tuple[object, ...]]] = {}
    for w in before.workers:
        old.setdefault(w.url, []).append(_entry(w))
    for w in after.workers:
        new.setdefault(w.url, []).append(_entry(w))
    out = [f"{u} joined" for u in new if u not in old]
    out += [f"{u} left" for u in old if u not in new]
    out += [
        f"{u} changed its entry"
        for u, was in old.items()
        if u in new and was != new[u] and sorted(map(repr, was)) != sorted(map(repr, new[u]))
    ]
    if before.endpoint != after.endpoint or before.total != after.total:
        out.append(
            f"the listing itself changed ({before.endpoint} total {before.total} -> "
            f"{after.endpoint} total {after.total})"
        )
    return out


def _changed(a: Mapping[str, object], b: Mapping[str, object]) -> str:
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    shown = ", ".join(f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in keys[:3])
    return shown + (f" (+{len(keys) - 3} more)" if len(keys) > 3 else "")


def look(
    client: TargetClient,
    router: str | None,
    judged: Judged,
    *,
    discovered: bool,
    read_deadline_s: float | None,
    router_token: str | None = None,
) -> Look:
    """Read the listing and every worker judged again, and say what moved since `judged`'s reads."""
    seen = Look(judged.listing)
    readings = judged.readings
    with ThreadPoolExecutor(1, thread_name_prefix="kvgate-relist") as pool:
        # The listing is read again while the workers are: both after the gates, at one moment.
        relist = (
            pool.submit(list_router_workers, client, router, router_token)
            if router is not None and judged.listing is not None
            else None
        )
        again = client.read_nodes([r.spec for r in readings], read_deadline_s=read_deadline_s)
        if relist is not None and judged.listing is not None:
            try:
                seen.listing = relist.result()
            except TransportError as exc:
                seen.doubts.append(f"the router's listing could not be read again: {exc}")
            else:
                seen.moves += listing_changes(judged.listing, seen.listing)
    listed = set(seen.listing.by_base_url()) if seen.listing is not None else None
    for was, now in zip(readings, again, strict=True):
        url = was.spec.url
        if discovered and listed is not None and normalize_url(url) not in listed:
            continue  # it left the listing (named above): not part of the fleet at the verdict
        if isinstance(now, TransportError):
            seen.doubts.append(f"{url} could not be read again: {now.problem}")
            continue
        a, b = judged_facts(was), judged_facts(now)
        if a != b:
            if a.get("process") == b.get("process"):
                seen.doubts.append(f"{url} changed without restarting ({_changed(a, b)})")
                continue
            pa, pb = a.get("process"), b.get("process")
            old = pa.get("startup_time") if isinstance(pa, dict) else pa
            new = pb.get("startup_time") if isinstance(pb, dict) else pb
            seen.moves.append(f"{url} restarted (startup_time {old} -> {new})")
        seen.fresh[url] = now
    return seen


def _says(items: list[str]) -> str:
    return "; ".join(items[:_SHOWN]) + (f"; and {len(items) - _SHOWN} more" if len(items) > _SHOWN else "")


def settle(
    client: TargetClient,
    router: str | None,
    first: Judged,
    regate: Regate,
    *,
    discovered: bool,
    read_deadline_s: float | None,
    router_token: str | None = None,
    max_regates: int = MAX_REGATES,
) -> tuple[Judged, Finding]:
    """Look again until the fleet read is the fleet now, judging it again (`regate`) each time members
    moved, at most `max_regates` times. Returns the round the verdict is on and the `fleet.stable` finding."""
    node = f"router {router}" if router else "deployment"
    judged = first
    history: list[str] = []  # every move judged again, in order
    rounds = 0
    while True:
        seen = look(
            client, router, judged, discovered=discovered, read_deadline_s=read_deadline_s, router_token=router_token
        )
        if not seen.moves and not seen.doubts:
            return judged, _stable(node, judged, history, rounds)
        if seen.doubts or rounds == max_regates:
            why = seen.doubts + seen.moves
            moving = "" if seen.doubts else f" (still moving after {rounds} re-gate(s))"
            return judged, _unstable(node, why, history, moving)
        history += seen.moves
        rounds += 1
        judged = regate(seen.listing, seen.fresh)


def _stable(node: str, judged: Judged, history: list[str], rounds: int) -> Finding:
    what = f"the router's listing and {len(judged.readings)} worker(s)" if judged.listing else "every worker"
    if not history:
        return passed(GATE, CHECK, node, f"read again before the verdict: {what} unchanged")
    return passed(
        GATE,
        CHECK,
        node,
        f"the fleet moved while it was gated ({_says(history)}); judged again {rounds} time(s) on the fleet as "
        f"it then stood (new members read and gated; the probes, if any, ran before the move), then read "
        f"again before the verdict: {what} unchanged",
        Evidence(node, "moves judged again", history[:_SHOWN], "none, or each judged again"),
    )


def _unstable(node: str, why: list[str], history: list[str], moving: str) -> Finding:
    before = f" (judged again before, after: {_says(history)})" if history else ""
    return replace(
        inconclusive(
            GATE,
            CHECK,
            node,
            f"the fleet changed while it was gated{moving}: {_says(why)}{before}; the verdict would be on a fleet "
            "that no longer runs",
            Evidence(node, "listing and each worker, read again before the verdict", why[:_SHOWN], "unchanged"),
            remedy=_REMEDY,
        ),
        blocking=True,
    )


__all__ = ["Judged", "Look", "MAX_REGATES", "listing_changes", "look", "settle"]
