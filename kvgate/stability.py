"""A stable fleet or no verdict: the router's listing and each worker's view of itself, read again
just before `check` gives its verdict, must be what the gates judged.

A router's listing is read once at the start; a worker that registers while the others are read (or
leaves, or is replaced, or restarts on other code) would otherwise never be judged, and the run would
pass a fleet that is no longer the one taking traffic. So the listing is read again after the gates,
and every worker read answers its server_info again: any entry added, removed or changed, any worker
whose process (`startup_time`) or judged facts moved, is a blocking inconclusive naming the change
(`fleet.stable`, no waiver reaches it); the remedy is a re-run once the fleet holds still. A run whose
second look matches says so (passed), so a report shows the verdict covers the fleet as it stood.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from kvgate.discovery import RouterListing, RouterWorker, list_router_workers
from kvgate.errors import TransportError
from kvgate.findings import Evidence, Finding, inconclusive, passed
from kvgate.fleetread import self_view
from kvgate.target import NodeReading, TargetClient

GATE, CHECK = "fleet", "stable"
_REMEDY = "re-run once the fleet holds still (no worker registering, leaving or restarting during the run)"
_SHOWN = 8  # changes named in one finding; the rest counted


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
        f"{u} changed its entry" for u in old if u in new and sorted(map(repr, old[u])) != sorted(map(repr, new[u]))
    ]
    if before.endpoint != after.endpoint or before.total != after.total:
        out.append(
            f"the listing itself changed ({before.endpoint} total {before.total} -> "
            f"{after.endpoint} total {after.total})"
        )
    return out


def _view_change(a: dict[str, object], b: dict[str, object]) -> str:
    if a.get("startup_time") != b.get("startup_time"):
        return f"restarted (startup_time {a.get('startup_time')} -> {b.get('startup_time')})"
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return "changed " + ", ".join(keys[:4]) + (f" (+{len(keys) - 4} more)" if len(keys) > 4 else "")


def confirm(
    client: TargetClient,
    router: str | None,
    listing: RouterListing | None,
    readings: Sequence[NodeReading],
    *,
    read_deadline_s: float | None,
    router_token: str | None = None,
) -> list[Finding]:
    """The second look: one finding, passed when the fleet read is the fleet now, else blocking doubt."""
    node = f"router {router}" if router else "deployment"
    changes: list[str] = []
    if router is not None and listing is not None:
        try:
            now = list_router_workers(client, router, router_token)
        except TransportError as exc:
            changes.append(f"the router's listing could not be read again: {exc}")
        else:
            changes += listing_changes(listing, now)
    if readings:
        views = client.reread_views(readings, read_deadline_s=read_deadline_s)
        for r, view in zip(readings, views, strict=True):
            if isinstance(view, TransportError):
                changes.append(f"{r.spec.url} could not be read again: {view.problem}")
            elif view != (was := self_view(r)):
                changes.append(f"{r.spec.url} {_view_change(was, view)}")
    if not changes:
        return [
            passed(
                GATE,
                CHECK,
                node,
                f"read again before the verdict: the router's listing and {len(readings)} worker(s) unchanged",
            )
        ]
    shown = "; ".join(changes[:_SHOWN]) + (f"; and {len(changes) - _SHOWN} more" if len(changes) > _SHOWN else "")
    return [
        replace(
            inconclusive(
                GATE,
                CHECK,
                node,
                f"the fleet changed while it was gated: {shown}; the verdict would be on a fleet that no longer runs",
                Evidence(node, "listing and server_info, read again before the verdict", changes[:_SHOWN], "unchanged"),
                remedy=_REMEDY,
            ),
            blocking=True,
        )
    ]


__all__ = ["confirm", "listing_changes"]
