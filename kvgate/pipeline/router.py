"""What the router says of itself in a round: that it answers, its worker listing judged (empty,
URLs refused, a total that says it is partial), its own count of healthy workers against that listing
(/readiness), and its per-rank loads. The pipeline (check.py) reads the router's side while it reads the
workers, and puts these findings before theirs.
"""

from __future__ import annotations

import time
from dataclasses import replace

from kvgate.errors import TransportError
from kvgate.reading.discovery import RankLoad, RouterListing, list_router_workers, read_router_loads
from kvgate.reading.target import TargetClient
from kvgate.results.findings import Evidence, Finding, error, inconclusive, passed


def router_reachable(client: TargetClient, url: str) -> list[Finding]:
    """Whether the router answers (its /readiness where it serves one): an error finding (exit 4) if not."""
    node = f"router {url}"
    try:
        body = client.get_json(url, "/readiness", missing_ok=True)
    except TransportError as exc:
        return [error("target", "reachable", node, str(exc), Evidence(node, "GET /readiness", exc.problem, "200"))]
    if body is None:
        return [passed("target", "reachable", node, "router answers (no /readiness endpoint)")]
    return [passed("target", "reachable", node, "router is ready", Evidence(node, "/readiness", body, "200"))]


def router_loads(
    client: TargetClient, router: str, router_token: str | None
) -> tuple[tuple[RankLoad, ...] | None, str | None]:
    """The router's per-rank pools, or why not (the fleet gate says it; a listing already read stands)."""
    try:
        return read_router_loads(client, router, router_token), None
    except TransportError as exc:
        return None, str(exc)


#: smg's /readiness is a cached snapshot up to about 1 s stale (smg #1711): a count that disagrees
#: with the listing is read once more after this long before it counts.
READINESS_STALE_S = 1.1


def _readiness_counts(doc: object) -> tuple[int, int] | None:
    if not isinstance(doc, dict):
        return None
    h, t = doc.get("healthy_workers"), doc.get("total_workers")
    ok = all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v for v in (h, t))
    return (h, t) if ok else None  # type: ignore[return-value]


def router_readiness(client: TargetClient, url: str, listing: RouterListing) -> list[Finding]:
    """The router's own count of healthy workers (/readiness, where it serves it) against its listing:
    a worker it lists but does not count healthy (draining, failing) takes no new requests."""
    node = f"router {url}"
    where = f"{url.rstrip('/')}/readiness"
    routable = sum(1 for w in listing.workers if w.ready)

    def read() -> tuple[object, str | None]:
        try:
            return client.get_json(url, "/readiness", missing_ok=True), None
        except TransportError as exc:
            return None, exc.problem

    doc, problem = read()
    counts = _readiness_counts(doc)
    if counts is not None and counts[0] != counts[1]:
        time.sleep(READINESS_STALE_S)  # a cached snapshot: read the next one before believing it
        doc, problem = read()
        counts = _readiness_counts(doc)
    if problem is not None:
        return [
            inconclusive(
                "fleet",
                "router-readiness",
                node,
                f"the router is not ready: {problem}",
                Evidence(node, "GET /readiness", problem, "200 ready"),
                remedy="re-run once the router's /readiness answers 200 (it counts a draining worker as not "
                "ready); give --router-health-url where it serves its probes (smg --health-check-port)",
            )
        ]
    if doc is None or counts is None:
        return []  # no /readiness (older routers), or no counts in it: the listing's states still count
    healthy, total = counts
    ev = [
        Evidence(node, f"{where} healthy_workers / total_workers", f"{healthy} / {total}", "all healthy"),
        Evidence(node, f"router {listing.endpoint} routable entries", routable, f"{len(listing.workers)} listed"),
    ]
    if healthy < total:
        leaving = [w.name for w in listing.workers if not w.ready]
        return [
            inconclusive(
                "fleet",
                "router-readiness",
                node,
                f"the router counts {healthy} of {total} workers healthy: it routes to fewer than it lists"
                + (f" (not routable: {', '.join(leaving[:4])})" if leaving else ""),
                *ev,
                remedy="re-run once every worker the router lists is routable again (a drain finishes, a "
                "failing worker is fixed or removed)",
            )
        ]
    return [passed("fleet", "router-readiness", node, f"the router counts all {total} workers healthy", *ev)]


def read_listing(
    client: TargetClient, router: str, findings: list[Finding], router_token: str | None = None
) -> RouterListing | None:
    """The router's worker list, or None with an error finding (exit 4) when it cannot be had."""
    node = f"router {router}"
    try:
        return list_router_workers(client, router, router_token)
    except TransportError as exc:
        findings.append(
            error(
                "fleet",
                "router-list",
                node,
                f"cannot list the router's workers: {exc}",
                Evidence(node, "GET /workers | /list_workers", exc.problem, "a worker list"),
            )
        )
        return None


def listing_findings(listing: RouterListing) -> list[Finding]:
    """What the listing itself says: empty (exit 4), URLs refused, a total that says it is partial, or passed."""
    node = f"router {listing.router}"
    if not listing.workers:
        return [
            error(
                "fleet",
                "router-list",
                node,
                f"the router lists no workers ({listing.endpoint})",
                Evidence(node, listing.endpoint, 0, ">= 1 worker"),
            )
        ]
    out = refused_urls(listing)
    partial = listing.total_problem()
    if partial is not None:
        # Some workers the router routes to may not be listed, so not gated: no opt-out lets that pass.
        out.append(
            replace(
                inconclusive(
                    "fleet",
                    "router-list",
                    node,
                    f"the router's worker list may be partial: {partial}; only the listed workers were gated",
                    Evidence(node, f"{listing.endpoint} total", listing.total, f"{len(listing.workers)} (the entries)"),
                    remedy="find why the router's total and its entries differ (a worker it routes to but does "
                    "not list), and re-run once they match",
                ),
                blocking=True,
            )
        )
        return out
    out.append(
        passed(
            "fleet",
            "router-list",
            node,
            f"{len(listing.by_base_url())} worker(s) listed by {listing.endpoint}",
            Evidence(node, listing.endpoint, len(listing.workers), ">= 1 worker"),
        )
    )
    return out


def refused_urls(listing: RouterListing) -> list[Finding]:
    """One blocking finding per entry whose URL the router and Python read as different workers: the
    worker taking its traffic cannot be named by kvgate's reader, so it is not read (kvgate/reading/weburl.py)."""
    where = f"router {listing.router}"
    return [
        replace(
            inconclusive(
                "fleet",
                "router-url",
                f"worker {w.url}",
                f"the router lists {w.url!r}, a URL its parser and kvgate's read differently, so it was not gated: "
                f"{w.refused}",
                Evidence(where, f"{listing.endpoint} url", w.url, "one URL both parsers read alike"),
                remedy="register the worker with the router under a plain http(s)://host:port URL (no backslash, "
                "userinfo, query, percent-escapes, dot segments or control characters), and re-run",
            ),
            blocking=True,
        )
        for w in listing.refused()
    ]
