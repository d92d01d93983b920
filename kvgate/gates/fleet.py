"""The fleet gate: what the router says against what the workers say, and the workers against each other.

- router-status: a worker the router lists as failed (or unhealthy) fails; pending, not_ready or
  draining is inconclusive (it takes no traffic now, and nothing proves it will come back as read).
  "Healthy" is not "routable": smg lists a draining worker `is_healthy: false, status: draining` while
  it stops taking new requests; that is a drain, not a failure.
- router-pool: the pool per DP rank the router reports (/get_loads `max_total_num_tokens`) against
  the worker's own server_info, like every other fact read twice: a difference is inconclusive.
- router-membership (worker URLs given and --router-url): a worker the router routes to that the gate
  was not told about fails (traffic reaches an ungated worker); a given worker the router does not
  list is inconclusive (gated, but takes no traffic through this router).
- router-role: the router's role for a worker must be the role the worker reports.
- router-identity: a router entry names exactly one worker and rank (its `url`, the one it routes
  to, is the one gated), each worker and rank is listed once, and the DP ranks the router routes to
  are the ranks the worker reports and kvgate read. Any disagreement is inconclusive naming both
  views, and blocks whatever the strictness: the gate cannot say which view is the deployment.
- pair-consistency (kvgate.gates.pair): what makes KV transferable between prefill and decode.
- context-consistency / page-size-consistency: every PD worker must agree on the effective context
  and the page size (decode errors on a page-size mismatch, sglang PR #14474); the workers off the
  most common value are named.
- prefill-admission-consistency: a request can land on any prefill, so every prefill must admit the
  same prompts (`max_req_input_len`); the prefills that admit less are named. Pools that differ but
  all exceed the context admit the same prompts and pass (real pools differ by GPU memory left).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace

from kvgate.gates.base import GateContext
from kvgate.gates.pair import pair_consistency
from kvgate.reading.discovery import RankLoad, RouterListing, RouterWorker, normalize_url
from kvgate.reading.node import DECODE, PREFILL, NodeReading
from kvgate.results.findings import Evidence, Finding, failed, inconclusive, info, passed

GATE = "fleet"
PD_ROLES = (PREFILL, DECODE)
DEPLOYMENT = "deployment"


def _state(entries: list[RouterWorker]) -> str:
    return ", ".join(sorted({f"{e.status or '?'}{'' if e.healthy is not False else ' (unhealthy)'}" for e in entries}))


def router_status(listing: RouterListing, labels: dict[str, str]) -> list[Finding]:
    """One finding per worker the router lists that is not ready; one pass for the ready rest."""
    out: list[Finding] = []
    ready = 0
    for url, entries in listing.by_base_url().items():
        node = labels.get(url, f"worker {url}")
        states = [e.ready for e in entries]
        if None in states:
            continue  # /list_workers: no state to judge
        if all(states):
            ready += 1
            continue
        ev = Evidence(node, f"router {listing.endpoint} status", _state(entries), "ready")
        names = Evidence(node, "router worker_id", [e.name for e in entries], "the router's key")
        if any(e.draining for e in entries) and not any(e.status == "failed" for e in entries):
            out.append(
                inconclusive(
                    GATE,
                    "router-status",
                    node,
                    f"the router is draining this worker ({_state(entries)}): it takes no new requests, so it "
                    "is not routable; what was read from it may not be what serves after the drain",
                    ev,
                    names,
                    remedy="re-run once the drain finishes (the router then drops the worker) or is undone",
                )
            )
        elif any(e.status == "failed" or e.healthy is False for e in entries):
            out.append(
                failed(
                    GATE,
                    "router-status",
                    node,
                    f"the router lists this worker as {_state(entries)}",
                    ev,
                    names,
                    remedy="fix or replace the worker (its health check fails), or remove it from "
                    "the router before promoting",
                )
            )
        else:
            out.append(
                inconclusive(
                    GATE,
                    "router-status",
                    node,
                    f"the router lists this worker as {_state(entries)}: it takes no traffic now",
                    ev,
                    names,
                    remedy="re-run the gate once the router lists it as ready",
                )
            )
    if ready:
        out.append(
            passed(
                GATE,
                "router-status",
                DEPLOYMENT,
                f"{ready} worker(s) listed as ready by the router",
                Evidence(DEPLOYMENT, f"router {listing.endpoint}", ready, "ready"),
            )
        )
    return out


def router_membership(listing: RouterListing, given: Sequence[str], labels: dict[str, str]) -> list[Finding]:
    """Given worker URLs versus the router's list (both normalized)."""
    listed = listing.by_base_url()
    given_set = {normalize_url(u) for u in given}
    out: list[Finding] = []
    for url in listed:
        if url not in given_set:
            node = f"worker {url}"
            out.append(
                failed(
                    GATE,
                    "router-membership",
                    node,
                    f"the router routes to {url}, which the gate was not told about: it was not gated",
                    Evidence(node, f"router {listing.endpoint}", url, "one of the given worker URLs"),
                    remedy="gate every worker the router lists (run with --router-url alone), or pass "
                    "the URLs exactly as the router lists them",
                )
            )
    for url in sorted(given_set - set(listed)):
        node = labels.get(url, f"worker {url}")
        out.append(
            inconclusive(
                GATE,
                "router-membership",
                node,
                f"the router does not list {url}: gated, but it takes no traffic through this router",
                Evidence(node, f"router {listing.endpoint}", None, "listed"),
                remedy="check the URL, or register the worker with the router",
            )
        )
    if not out:
        out.append(
            passed(
                GATE, "router-membership", DEPLOYMENT, f"the router lists exactly the {len(given_set)} given worker(s)"
            )
        )
    return out


def router_roles(listing: RouterListing | None, readings: Sequence[NodeReading]) -> list[Finding]:
    """The router's role for each worker against the worker's own; a worker with no known PD role fails."""
    listed = listing.by_base_url() if listing else {}
    out: list[Finding] = []
    for r in readings:
        entries = listed.get(normalize_url(r.spec.url), [])
        routed = sorted({e.role for e in entries if e.role})
        if r.spec.role not in PD_ROLES:
            out.append(
                failed(
                    GATE,
                    "router-role",
                    r.node,
                    f"no PD role: the router says {routed or 'nothing'} and the worker reports "
                    f"{r.role!r}; it cannot be gated as prefill or decode",
                    Evidence(r.node, "disaggregation_mode", r.role, "prefill or decode"),
                    remedy="launch it with --disaggregation-mode prefill|decode, or remove it from the router",
                )
            )
            continue
        if not routed or r.role == "unknown":
            continue  # nothing to compare (pool-context reports an unknown role)
        if routed != [r.role]:
            out.append(
                failed(
                    GATE,
                    "router-role",
                    r.node,
                    f"the router routes it as {'/'.join(routed)} but it reports disaggregation_mode={r.role!r}",
                    Evidence(r.node, "router worker_type", "/".join(routed), r.role),
                    remedy=f"register it with the router as --{r.role} (or relaunch it as {routed[0]})",
                )
            )
        else:
            out.append(
                passed(
                    GATE,
                    "router-role",
                    r.node,
                    f"router and worker agree: {r.role}",
                    Evidence(r.node, "router worker_type", r.role, r.role),
                )
            )
    return out


def _identity_doubt(node: str, summary: str, *ev: Evidence, remedy: str) -> Finding:
    return replace(inconclusive(GATE, "router-identity", node, summary, *ev, remedy=remedy), blocking=True)


def _one_server_under_two_names(readings: Sequence[NodeReading], where: str) -> list[Finding]:
    """Workers listed under spellings no normalisation joins (`localhost` and `127.0.0.1`, a name and
    its address) answer with one server's self-description: the same `port` and `startup_time` (the
    float SGLang stamps at launch). Two servers that share both are one server read twice."""
    seen: dict[tuple[int, float], list[NodeReading]] = {}
    for r in readings:
        port, started = r.server_info.get("port"), r.server_info.get("startup_time")
        if isinstance(port, int) and not isinstance(port, bool) and isinstance(started, (int, float)):
            if not isinstance(started, bool):
                seen.setdefault((port, float(started)), []).append(r)
    out = []
    for (port, started), same in seen.items():
        urls = sorted({normalize_url(r.spec.url) for r in same})
        if len(urls) > 1:
            out.append(
                _identity_doubt(
                    same[0].node,
                    f"the router lists one worker under {len(urls)} URLs ({', '.join(urls)}): each answers as "
                    f"the server on port {port} started at {started}; one worker counted as several",
                    Evidence(same[0].node, where, urls, "one entry per worker"),
                    Evidence(same[0].node, "server_info port / startup_time", f"{port} / {started}", "distinct"),
                    remedy="deregister the duplicate entries from the router, and re-run",
                )
            )
    return out


def router_identity(listing: RouterListing, readings: Sequence[NodeReading], labels: dict[str, str]) -> list[Finding]:
    """Each entry names one worker and rank; each is listed once; the ranks routed are the ranks read."""
    out: list[Finding] = []
    where = f"router {listing.endpoint}"
    for w in listing.accepted():  # a refused URL is reported as fleet.router-url (pipeline/router.py, refused_urls)
        if w.problems:
            node = labels.get(normalize_url(w.base_url), f"worker {w.base_url}")
            out.append(
                _identity_doubt(
                    node,
                    f"the router's entry {w.url} does not name one worker: {'; '.join(w.problems)}; "
                    f"gated: {w.base_url} (the URL it routes to)",
                    Evidence(node, f"{where} url", w.url, "the URL gated"),
                    Evidence(node, f"{where} dp_base_url", w.dp_base_url, f"{w.base_url} (the url's worker)"),
                    Evidence(node, f"{where} dp_rank / dp_size", f"{w.dp_rank} / {w.dp_size}", "the url's rank"),
                    remedy="fix the router's registration of this worker (one URL per entry: url, dp_base_url and "
                    "dp_rank must name the same worker and rank), and re-run",
                )
            )
    for url, rank, urls in listing.duplicates():
        node = labels.get(url, f"worker {url}")
        at = "" if rank is None else f" rank {rank}"
        out.append(
            _identity_doubt(
                node,
                f"the router lists {url}{at} {len(urls)} times ({', '.join(urls)}): one worker counted as several",
                Evidence(node, where, urls, "one entry per worker and rank"),
                remedy="deregister the duplicate entries from the router, and re-run",
            )
        )
    out += _one_server_under_two_names(readings, where)
    listed = listing.by_base_url()
    for r in readings:
        entries = listed.get(normalize_url(r.spec.url), [])
        routed = {e.dp_rank for e in entries if e.dp_rank is not None}
        if not routed:
            continue  # not DP-aware: the worker spreads requests over its own ranks (dp-ranks checks each)
        sizes = sorted({e.dp_size for e in entries if e.dp_size is not None})
        reported = set(range(r.dp_size)) if r.dp_size is not None else None
        read = {rk.dp_rank for rk in r.ranks if rk.token_capacity is not None}
        ev = [
            Evidence(r.node, f"{where} ranks", sorted(routed), "the ranks the worker reports"),
            Evidence(r.node, f"{where} dp_size", sizes or None, f"== {r.dp_size}"),
            Evidence(r.node, "dp_size", r.dp_size, "reported by the worker"),
            Evidence(r.node, "internal_states ranks read", sorted(read), "every routed rank"),
        ]
        why = []
        if reported is None:
            why.append("the worker reports no dp_size to match the router's ranks with")
        else:
            if routed - reported:
                why.append(f"the router routes to rank(s) {sorted(routed - reported)} the worker does not report")
            if reported - routed:
                why.append(f"the worker reports rank(s) {sorted(reported - routed)} the router does not list")
        if any(s != r.dp_size for s in sizes):
            why.append(f"the router says dp_size {'/'.join(map(str, sizes))}, the worker {r.dp_size}")
        unread = sorted(routed - read)
        if unread:
            why.append(f"routed rank(s) {unread} could not be read (no well-formed internal_states entry)")
        if why:
            out.append(
                _identity_doubt(
                    r.node,
                    "the router's ranks and the worker's do not agree: " + "; ".join(why),
                    *ev,
                    remedy="re-run once the router lists exactly the worker's DP ranks and every rank answers "
                    "/server_info (restart the router's registration of this worker if it is stale)",
                )
            )
    if not out:
        out.append(
            passed(
                GATE,
                "router-identity",
                DEPLOYMENT,
                f"{len(listing.workers)} router entries name {len(listed)} worker(s), each worker and rank once; "
                "the ranks routed are the ranks read",
            )
        )
    return out


def _consistency(
    check: str, what: str, readings: Sequence[NodeReading], value: Callable[[NodeReading], int | None], remedy: str
) -> list[Finding]:
    """Every worker off the most common value fails (every worker, when there is no single most common)."""
    known = [(r, v) for r in readings if (v := value(r)) is not None]
    counts = Counter(v for _, v in known)
    if len(counts) < 2:
        if len(known) >= 2:
            return [passed(GATE, check, DEPLOYMENT, f"{len(known)} workers agree on {what} {known[0][1]:,}")]
        return []
    (top, n), *rest = counts.most_common()
    tie = bool(rest) and rest[0][1] == n
    example = next(r for r, v in known if v == top)
    out = []
    for r, v in known:
        if v == top and not tie:
            continue
        other = example if v != top else next(x for x, w in known if w != top)
        ov = value(other)
        out.append(
            failed(
                GATE,
                check,
                r.node,
                f"{what} {v:,} differs from {other.node} ({ov:,})",
                Evidence(r.node, what, v, f"== {ov:,} like {other.node}"),
                Evidence(DEPLOYMENT, f"{what} values", dict(sorted(counts.items())), "one value"),
                remedy=remedy,
            )
        )
    return out


def _context(r: NodeReading) -> int | None:
    return r.context_length if r.context_length is not None else r.context_length_flag


def prefill_admission(prefills: Sequence[NodeReading]) -> list[Finding]:
    """Prefills behind one router must admit the same prompts; the ones that admit less are named."""
    known = [r for r in prefills if r.max_req_input_len is not None]
    if len(known) < 2:
        return []
    best = max(known, key=lambda r: r.max_req_input_len or 0)
    top = best.max_req_input_len or 0
    pools = sorted({r.max_total_num_tokens for r in known if r.max_total_num_tokens is not None})
    out = []
    for r in known:
        limit = r.max_req_input_len or 0
        if limit < top:
            out.append(
                failed(
                    GATE,
                    "prefill-admission-consistency",
                    r.node,
                    f"admits prompts below {limit:,} tokens (pool {r.max_total_num_tokens or 0:,}) while {best.node} "
                    f"admits below {top:,}: a request the router sends here is rejected or takes the abort path",
                    Evidence(r.node, "max_req_input_len", limit, f"== {top:,} like {best.node}"),
                    Evidence(
                        r.node,
                        "max_total_num_tokens",
                        r.max_total_num_tokens,
                        f"like {best.node}: {best.max_total_num_tokens or 0:,}",
                    ),
                    remedy="size every prefill's KV pool alike (--max-total-tokens / --mem-fraction-static), or take "
                    "the small one out of the router",
                )
            )
    if not out:
        spread = "" if len(pools) < 2 else f" (pools {pools[0]:,} .. {pools[-1]:,}, all above the admission limit)"
        out.append(
            passed(
                GATE,
                "prefill-admission-consistency",
                DEPLOYMENT,
                f"{len(known)} prefills admit the same prompts (max_req_input_len {top:,}){spread}",
            )
        )
    return out


def router_pool(
    loads: Sequence[RankLoad] | None, problem: str | None, readings: Sequence[NodeReading], router: str
) -> list[Finding]:
    """/get_loads' `max_total_num_tokens` per DP rank against what each worker reports for that rank
    (`internal_states[rank].memory_usage.token_capacity`, else the top-level `max_total_num_tokens`)."""
    node = f"router {router}"
    if problem is not None:
        return [
            inconclusive(
                GATE,
                "router-pool",
                node,
                f"the router's per-rank pools could not be read: {problem}",
                Evidence(node, "GET /get_loads", problem, "the per-rank pools"),
                remedy="give the router's control-plane key with --router-token-env, or find why /get_loads fails",
            )
        ]
    if loads is None:
        return []  # no /get_loads on this router
    if not loads:
        return [
            info(
                GATE,
                "router-pool",
                node,
                "the router reports no per-rank pool (/get_loads loads: []; smg 1.13.0 answers so for "
                "HTTP-connected PD workers): its view of the pool was not compared",
                Evidence(node, "/get_loads loads", 0, "one entry per worker DP rank"),
            )
        ]
    by_url = {normalize_url(r.spec.url): r for r in readings}
    out: list[Finding] = []
    compared = 0
    for load in loads:
        r = by_url.get(normalize_url(load.worker))
        if r is None:
            continue  # a worker not read: router-membership and reachable say so
        rank = next((rk for rk in r.ranks if rk.dp_rank == load.dp_rank and rk.token_capacity is not None), None)
        if rank is not None and rank.token_capacity is not None:
            own, field = rank.token_capacity, f"internal_states[{load.dp_rank}].memory_usage.token_capacity"
        elif load.dp_rank == 0 and r.max_total_num_tokens is not None:
            own, field = r.max_total_num_tokens, r.pool_key or "max_total_num_tokens"
        else:
            continue
        compared += 1
        if own != load.max_total_num_tokens:
            out.append(
                inconclusive(
                    GATE,
                    "router-pool",
                    r.node,
                    f"two answers for the pool of DP rank {load.dp_rank}: the router's /get_loads says "
                    f"{load.max_total_num_tokens:,}, the worker's {field} says {own:,}",
                    Evidence(
                        r.node,
                        f"router /get_loads dp_rank {load.dp_rank} max_total_num_tokens",
                        load.max_total_num_tokens,
                        f"== {own:,}",
                    ),
                    Evidence(r.node, field, own, "the worker's own answer"),
                    remedy="find which answer is the server's (a stale router registration, a proxy, or a worker "
                    "replaced behind the same URL), and re-run once they agree",
                )
            )
    if compared and not out:
        out.append(
            passed(
                GATE,
                "router-pool",
                DEPLOYMENT,
                f"the router's per-rank pools agree with the workers' own ({compared} DP rank(s))",
            )
        )
    return out


class FleetGate:
    """Router cross-checks and fleet-wide consistency over every worker read."""

    name = GATE

    def run(self, ctx: GateContext) -> list[Finding]:
        readings = list(ctx.readings)
        labels = {normalize_url(s.url): s.label for s in ctx.attempted}
        out: list[Finding] = []
        if ctx.listing is not None:
            out += router_status(ctx.listing, labels)
            given = list(ctx.options.prefill_urls) + list(ctx.options.decode_urls)
            if given:
                out += router_membership(ctx.listing, given, labels)
            out += router_identity(ctx.listing, readings, labels)
            out += router_pool(ctx.router_loads, ctx.router_loads_problem, readings, ctx.listing.router)
        out += router_roles(ctx.listing, readings)
        pd = [r for r in readings if r.spec.role in PD_ROLES]
        out += _consistency(
            "context-consistency", "context", pd, _context, "give every prefill and decode the same --context-length"
        )
        out += _consistency(
            "page-size-consistency",
            "page_size",
            pd,
            lambda r: r.page_size,
            "give every prefill and decode the same --page-size",
        )
        out += prefill_admission([r for r in pd if r.spec.role == PREFILL])
        out += pair_consistency(pd)
        return out
