"""Listing the workers a router routes to (fleet.md section 2).

smg (1.9+) answers `GET /workers` with one entry per worker: `url` (with `@rank` under DP-aware
routing, plus `dp_base_url` / `dp_rank` / `dp_size`), `worker_type`, `bootstrap_port`, `is_healthy`
and `status`. Older sgl-router answers `GET /list_workers` with `{"urls": [...]}` only; the roles then
come from each worker's own server_info. The router's own `/get_server_info` is never used for a
worker: in PD mode it proxies the first prefill only.

An unreachable router, or one that answers something that is not a worker list, raises
TransportError (exit 4): a fleet that cannot be listed cannot be gated.

Control plane: smg protects `/workers`, `/workers/{worker_id}` and `/get_loads` with an admin (or
read-only user) key when `--control-plane-api-keys` or JWT auth is on (401, `WWW-Authenticate: Bearer
realm="control-plane"`), while `/health`, `/readiness`, `/liveness` and `/get_server_info` stay
public. kvgate sends the router token (`--router-token-env`, never the workers' token) on those routes
only, and a refused listing says so, naming whether a token was given.

`/get_loads` reports the pool per DP rank from the router's side (`loads[]`: `worker`, `dp_rank`,
`max_total_num_tokens`, ...); smg 1.13.0 answers `loads: []` for HTTP-connected PD workers (observed),
so an empty answer is "nothing to compare", never agreement.

Identity: an entry names exactly one worker, the one its `url` routes to (`@rank` split off). smg keys
it by `id` (its `worker_id`, kept as `worker_id`); one pod can be several workers (ports annotation).
Where
its other fields say otherwise (a `dp_base_url` that is another worker, a `dp_rank` that is not the
URL's rank, a rank at or past `dp_size`, a number that is not a sane JSON integer) the entry keeps
the routed URL and carries the disagreement in `problems`; the fleet gate reports it.

One parse: a URL the router (WHATWG rules) and Python's urllib read differently (a backslash, odd
userinfo, a percent-encoded or numeric host, a dropped tab: `weburl.disagreement`) is refused, never
read as the host urllib names: its entry carries `refused`, stays out of `by_base_url` (so it is not
read, matched or counted as a worker) and `check` reports it (`fleet.router-url`).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from kvgate.defaults import NODE_DEADLINE_REQUESTS
from kvgate.errors import TransportError
from kvgate.reading.node import SANE_MAX, SANE_PORT, SANE_RANKS
from kvgate.reading.target import TargetClient
from kvgate.reading.weburl import disagreement

#: smg's worker states (`crates/protocols/src/worker.rs`); only "ready" takes traffic normally.
READY = "ready"
DRAINING = "draining"
ROUTER_STATES = ("pending", "ready", "not_ready", "failed", "draining")
#: The control-plane routes kvgate reads (the rest it reads from the router are public).
CONTROL_PLANE = ("/workers", "/list_workers", "/get_loads")


def control_plane_headers(router_token: str | None) -> dict[str, str] | None:
    """What a control-plane GET carries: the router's own token when given, else the client's own
    headers (the `--token-env` token, where a router shares one key for everything)."""
    return {"Authorization": f"Bearer {router_token}"} if router_token else None


def refused(router: str, path: str, exc: TransportError, router_token: str | None) -> TransportError:
    """A 401/403 on a control-plane route, said plainly; any other failure unchanged."""
    if not exc.problem.startswith(("HTTP 401", "HTTP 403")):
        return exc
    status = exc.problem.split(":", 1)[0]
    if router_token:
        why = (
            f"the router refused the token from --router-token-env ({status}): it is not one of its "
            "control-plane keys, or its role may not read this route"
        )
    else:
        why = (
            f"the router refused it ({status}) for lack of a router token: its control plane needs an "
            "admin or read-only key; give it with --router-token-env VAR (the variable's name, never "
            "the key itself)"
        )
    return TransportError(router.rstrip("/") + path, why)


@dataclass(frozen=True)
class RouterWorker:
    """One worker as the router lists it. None means the router did not say."""

    url: str
    base_url: str
    role: str | None
    status: str | None
    healthy: bool | None
    bootstrap_port: int | None = None
    dp_rank: int | None = None
    dp_size: int | None = None
    # `dp_base_url` as the router sent it (None: absent); the URL gated is `base_url`, from `url`.
    dp_base_url: str | None = None
    # Where the entry's own fields disagree about which worker or rank it names (see the module doc).
    problems: tuple[str, ...] = ()
    # smg's key for the entry (`id`, the `{worker_id}` of /workers/{worker_id}); None: not given.
    worker_id: str | None = None

    @property
    def name(self) -> str:
        """How the router names it: its worker_id and the URL it routes to."""
        return f"{self.worker_id} ({self.url})" if self.worker_id else self.url

    @property
    def draining(self) -> bool:
        return self.status == DRAINING

    # Why the URL is not gated: the router's parser and Python's read it as different workers (None: they agree).
    refused: str | None = None

    @property
    def ready(self) -> bool | None:
        """Whether the router would route to it now (None: the listing has no state)."""
        if self.status is None and self.healthy is None:
            return None
        return self.status in (None, READY) and self.healthy is not False  # draining: no new requests


@dataclass(frozen=True)
class RouterListing:
    """Every worker a router lists, from which endpoint, in the router's order."""

    router: str
    endpoint: str
    workers: tuple[RouterWorker, ...]
    # smg's `total` as the router sent it (absent: None); `/list_workers` has none.
    total: object = None

    def total_problem(self) -> str | None:
        """Why the listing may be partial: a `total` that is neither the entries listed nor the workers
        they group into (a DP worker is one entry per rank). None when it matches, or there is none."""
        if self.total is None:
            return None
        if not isinstance(self.total, int) or isinstance(self.total, bool):
            return f"its total is {self.total!r}, not a count"
        counts = {len(self.workers), len(self.by_base_url())}
        if self.total in counts:
            return None
        return f"it says total {self.total} but lists {len(self.workers)} entries ({len(self.by_base_url())} workers)"

    def accepted(self) -> list[RouterWorker]:
        """The entries whose URL both parsers read alike (the only ones read and gated)."""
        return [w for w in self.workers if w.refused is None]

    def refused(self) -> list[RouterWorker]:
        """The entries whose URL the router and Python read as different workers: never read."""
        return [w for w in self.workers if w.refused is not None]

    def by_base_url(self) -> dict[str, list[RouterWorker]]:
        """Entries grouped by normalized worker URL (a DP worker is listed once per rank)."""
        out: dict[str, list[RouterWorker]] = {}
        for w in self.accepted():
            out.setdefault(normalize_url(w.base_url), []).append(w)
        return out

    def duplicates(self) -> list[tuple[str, int | None, list[str]]]:
        """(worker, rank, the URLs as listed) for every worker and rank listed more than once,
        under the same spelling or several."""
        seen: dict[tuple[str, int | None], list[str]] = {}
        for w in self.accepted():
            seen.setdefault((normalize_url(w.base_url), w.dp_rank), []).append(w.url)
        return [(url, rank, urls) for (url, rank), urls in seen.items() if len(urls) > 1]


@functools.lru_cache(maxsize=1 << 16)  # a fleet's listing is grouped several times per run
def normalize_url(url: str) -> str:
    """Scheme and host lowercased, default port and trailing slash dropped: one spelling per worker."""
    parts = urlsplit(url.strip().rstrip("/"))
    host = (parts.hostname or "").lower()
    default = {"http": 80, "https": 443}.get(parts.scheme.lower())
    port = "" if parts.port in (None, default) else f":{parts.port}"
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return f"{parts.scheme.lower()}://{host}{port}{parts.path}"


def _split_rank(url: str) -> tuple[str, int | None]:
    """smg's DP-aware URLs are `http://host:port@rank`."""
    base, sep, rank = url.rpartition("@")
    if sep and rank.isdigit() and "://" in base:
        return base, int(rank)
    return url, None


def _opt_int(entry: dict[str, Any], key: str, lo: int, hi: int, problems: list[str]) -> int | None:
    """A sane JSON integer, or None: absent or null says nothing; anything else is noted in `problems`."""
    value = entry.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(f"{key} is {value!r}, not a JSON integer")
        return None
    if not lo <= value <= hi:
        problems.append(f"{key} is {value}, outside {lo}..{hi}")
        return None
    return value


def parse_workers(router: str, doc: Any) -> RouterListing:
    """smg's `GET /workers` document; anything else raises TransportError naming what is wrong."""
    where = router.rstrip("/") + "/workers"
    workers = doc.get("workers") if isinstance(doc, dict) else None
    if not isinstance(workers, list):
        raise TransportError(where, f'not a worker list: expected {{"workers": [...]}}, got {_shape(doc)}')
    out: list[RouterWorker] = []
    for i, entry in enumerate(workers):
        url = entry.get("url") if isinstance(entry, dict) else None
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise TransportError(where, f"workers[{i}]: no http(s) url in {_shape(entry)}")
        problems: list[str] = []
        base, url_rank = _split_rank(url)
        dp_base = entry.get("dp_base_url")
        if dp_base is not None and not isinstance(dp_base, str):
            problems.append(f"dp_base_url is {dp_base!r}, not a URL")
            dp_base = None
        if isinstance(dp_base, str) and normalize_url(dp_base) != normalize_url(base):
            problems.append(f"url {url} routes to {base}, but dp_base_url names {dp_base}")
        dp_rank = _opt_int(entry, "dp_rank", 0, SANE_RANKS, problems)
        dp_size = _opt_int(entry, "dp_size", 1, SANE_RANKS, problems)
        if dp_rank is not None and url_rank is not None and dp_rank != url_rank:
            problems.append(f"url {url} routes to rank {url_rank}, but dp_rank is {dp_rank}")
        rank = url_rank if url_rank is not None else dp_rank
        if rank is not None and dp_size is not None and rank >= dp_size:
            problems.append(f"rank {rank} is not one of dp_size {dp_size} ranks")
        role = entry.get("worker_type")
        status = entry.get("status")
        healthy = entry.get("is_healthy")
        wid = entry.get("id")
        out.append(
            RouterWorker(
                url=url,
                base_url=base,
                role=role if isinstance(role, str) else None,
                status=status if isinstance(status, str) else None,
                healthy=healthy if isinstance(healthy, bool) else None,
                bootstrap_port=_opt_int(entry, "bootstrap_port", 1, SANE_PORT, problems),
                dp_rank=rank,
                dp_size=dp_size,
                dp_base_url=entry.get("dp_base_url") if isinstance(entry.get("dp_base_url"), str) else None,
                problems=tuple(problems),
                worker_id=wid if isinstance(wid, str) and wid else None,
                refused=disagreement(base),
            )
        )
    total = doc.get("total") if isinstance(doc, dict) else None
    return RouterListing(router=router, endpoint="/workers", workers=tuple(out), total=total)


def parse_list_workers(router: str, doc: Any) -> RouterListing:
    """The older `GET /list_workers` document: `{"urls": [...]}`, no roles, no states."""
    where = router.rstrip("/") + "/list_workers"
    urls = doc.get("urls") if isinstance(doc, dict) else None
    if not isinstance(urls, list) or not all(
        isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls
    ):
        raise TransportError(where, f'not a worker list: expected {{"urls": [URL, ...]}}, got {_shape(doc)}')
    workers = []
    for url in urls:
        base, rank = _split_rank(url)
        workers.append(
            RouterWorker(
                url=url,
                base_url=base,
                role=None,
                status=None,
                healthy=None,
                dp_rank=rank,
                refused=disagreement(base),
            )
        )
    return RouterListing(router=router, endpoint="/list_workers", workers=tuple(workers))


def _control_get(client: TargetClient, router: str, path: str, router_token: str | None, deadline: float) -> Any:
    try:
        return client.get_json(
            router, path, missing_ok=True, deadline=deadline, headers=control_plane_headers(router_token)
        )
    except TransportError as exc:
        raise refused(router, path, exc, router_token) from None


def list_router_workers(client: TargetClient, router: str, router_token: str | None = None) -> RouterListing:
    """`GET /workers`, else `GET /list_workers`; TransportError when neither gives a worker list, or
    when the router refuses it (saying whether a router token was given).

    Each answer ends within the client's timeout and metadata cap, both reads within
    NODE_DEADLINE_REQUESTS x the timeout.
    """
    router = router.rstrip("/")
    deadline = time.monotonic() + NODE_DEADLINE_REQUESTS * client.timeout
    doc = _control_get(client, router, "/workers", router_token, deadline)
    if doc is not None:
        return parse_workers(router, doc)
    doc = _control_get(client, router, "/list_workers", router_token, deadline)
    if doc is not None:
        return parse_list_workers(router, doc)
    raise TransportError(router, "lists no workers: neither GET /workers (smg) nor GET /list_workers exists")


@dataclass(frozen=True)
class RankLoad:
    """One DP rank's pool as the router's `/get_loads` reports it."""

    worker: str
    dp_rank: int
    max_total_num_tokens: int


def parse_loads(router: str, doc: Any) -> tuple[RankLoad, ...]:
    """smg's `/get_loads` document: the ranks whose worker, rank and pool are sane; anything that is not
    the document raises TransportError."""
    where = router.rstrip("/") + "/get_loads"
    loads = doc.get("loads") if isinstance(doc, dict) else None
    if not isinstance(loads, list):
        raise TransportError(where, f'not a load report: expected {{"loads": [...]}}, got {_shape(doc)}')
    out = []
    for i, entry in enumerate(loads):
        if not isinstance(entry, dict):
            raise TransportError(where, f"loads[{i}] is {_shape(entry)}")
        worker = entry.get("worker")
        problems: list[str] = []
        rank = _opt_int(entry, "dp_rank", 0, SANE_RANKS, problems)
        pool = _opt_int(entry, "max_total_num_tokens", 0, SANE_MAX, problems)
        if not isinstance(worker, str) or problems or rank is None or pool is None:
            why = "; ".join(problems) or "no worker, dp_rank or max_total_num_tokens"
            raise TransportError(where, f"loads[{i}]: {why}")
        base, url_rank = _split_rank(worker)
        out.append(RankLoad(base, url_rank if url_rank is not None else rank, pool))
    return tuple(out)


def read_router_loads(
    client: TargetClient, router: str, router_token: str | None = None
) -> tuple[RankLoad, ...] | None:
    """The router's per-rank pools (`GET /get_loads`), or None where the router has no such route."""
    router = router.rstrip("/")
    deadline = time.monotonic() + client.timeout
    doc = _control_get(client, router, "/get_loads", router_token, deadline)
    return None if doc is None else parse_loads(router, doc)


def _shape(value: Any) -> str:
    if isinstance(value, dict):
        return "an object with keys " + (", ".join(sorted(map(str, value))[:8]) or "(none)")
    return type(value).__name__
