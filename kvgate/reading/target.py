"""The target client: reads what SGLang workers and routers say about themselves over bounded HTTP.

A transport failure (refused, timeout, 5xx, bad JSON) becomes a `TransportError`; what an answer says
is parsed by `kvgate.reading.node`.
"""

from __future__ import annotations

import functools
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from kvgate.defaults import DEFAULT_CONCURRENCY, METADATA_BODY_CAP, PROBE_BODY_CAP
from kvgate.errors import TransportError, UsageError
from kvgate.reading.compact import compact_info, compact_model_info, compact_models
from kvgate.reading.fleetread import read_workers
from kvgate.reading.httpbounds import BODY_CAP, OverCap, bounded_client
from kvgate.reading.node import NodeReading, NodeSpec, decode_answer, parse_node
from kvgate.reading.weburl import disagreement


def validate_url(flag: str, url: str) -> str:
    """An http(s) URL with a host, as httpx will parse it; anything else is a usage error naming the flag."""
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"{flag} {url}: expected an http:// or https:// URL")
    why = disagreement(url)
    if why is not None:  # the router would reach another worker than kvgate reads (kvgate/reading/weburl.py)
        raise UsageError(f"{flag} {url}: refused: {why}")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        raise UsageError(f"{flag} {url}: not a valid URL ({exc})") from None
    if not parsed.host or any(c.isspace() or c == "%" for c in parsed.host):
        raise UsageError(f"{flag} {url}: the URL names no valid host")
    if parsed.port is not None and not 0 < parsed.port < 65536:
        raise UsageError(f"{flag} {url}: port {parsed.port} is out of range")
    return url


@functools.lru_cache(maxsize=1)
def _ssl_context() -> ssl.SSLContext:
    """The system's trust store, loaded once per process (it costs about 30 ms, and a watch builds a
    client every pass); an SSLContext is safe to share between threads and clients."""
    return httpx.create_ssl_context()


class TargetClient:
    """HTTP access to SGLang workers and routers. Thread-safe; one per run.

    Every answer ends within its timeout, body included (`timeout` for metadata: one slow-dripping
    server cannot hold a read past it), and is read only up to a cap: `metadata_cap` bytes for the
    documents read here, `probe_cap` for what gates send through `http` (kvgate/reading/httpbounds.py).
    """

    def __init__(
        self,
        timeout: float = 10.0,
        token: str | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        *,
        metadata_cap: int = METADATA_BODY_CAP,
        probe_cap: int = PROBE_BODY_CAP,
    ) -> None:
        self.timeout = timeout
        self.concurrency = concurrency
        self.metadata_cap = metadata_cap
        self.probe_cap = probe_cap
        self._token = token
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._ssl = _ssl_context()  # every client below shares it
        self._http = self._new_http()

    def _new_http(self) -> httpx.Client:
        return bounded_client(timeout=self.timeout, body_cap=self.probe_cap, verify=self._ssl, headers=self._headers)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> TargetClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def http(self) -> httpx.Client:
        """The underlying client for gates that send requests: authorised; each answer ends within its
        request's timeout and stops at `probe_cap` bytes (an `OverCap`, an httpx.TransportError)."""
        return self._http

    def get_json(
        self,
        base: str,
        path: str,
        *,
        missing_ok: bool = False,
        deadline: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any | None:
        """GET base+path and parse JSON. 404 returns None when `missing_ok`; other failures raise.

        `deadline` (time.monotonic()) shortens the request's timeout to what is left of it. The timeout
        bounds the whole answer, body included; a body over `metadata_cap` bytes is a TransportError
        naming the cap. `headers` replace the client's own for this request (the router's admin token
        on control-plane routes).
        """
        url = base.rstrip("/") + path
        timeout, why = self.timeout, "timeout"
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TransportError(url, "not sent: the node's read deadline had passed")
            if left < timeout:
                timeout, why = left, "the node's read deadline"
        try:
            resp = self._http.get(url, timeout=timeout, extensions={BODY_CAP: self.metadata_cap}, headers=headers)
        except httpx.TimeoutException:
            raise TransportError(url, f"no whole answer within {timeout:g}s ({why})") from None
        except OverCap as exc:
            raise TransportError(url, f"{exc} (metadata cap)") from None
        except httpx.HTTPError as exc:
            raise TransportError(url, f"unreachable: {type(exc).__name__}: {exc}") from None
        return decode_answer(url, resp.status_code, resp.content, resp.headers.get("location"), missing_ok=missing_ok)

    def server_info(self, base: str, deadline: float | None = None) -> tuple[str, dict[str, Any]]:
        """(path, document) of a worker's /server_info, else its older /get_server_info.

        Neither there, or not a JSON object: a TransportError (not an SGLang worker, exit 4).
        """
        base = base.rstrip("/")
        for path in ("/server_info", "/get_server_info"):
            info = self.get_json(base, path, missing_ok=True, deadline=deadline)
            if info is None:
                continue
            if not isinstance(info, dict):
                raise TransportError(base + path, f"expected a JSON object, got {type(info).__name__}")
            return path, info
        raise TransportError(base, "neither /server_info nor /get_server_info exists: not an SGLang worker?")

    def read_node(self, spec: NodeSpec, deadline: float | None = None) -> NodeReading:
        """Read /server_info (or /get_server_info), /v1/models and /model_info of one worker."""

        def get(path: str) -> Any | None:
            return self.get_json(spec.url, path, missing_ok=True, deadline=deadline)

        info_path, info = self.server_info(spec.url, deadline=deadline)
        models = get("/v1/models")
        model_info = get("/model_info")
        if model_info is None:
            model_info = get("/get_model_info")
        return parse_node(spec, info_path, compact_info(info), compact_models(models), compact_model_info(model_info))

    def get_raw(self, gets: Sequence[tuple[str, str]], *, cap_name: str = "metadata cap") -> list[Any]:
        """GET each (base URL, path) at once through the one-thread reader (kvgate/reading/wideread.py), under this
        client's token, timeout, width and metadata cap; one `http11.Answer` or `http11.Failure` each,
        in order, all within one deadline (as many timeouts as the rounds of `concurrency` need, plus one)."""
        from kvgate.reading.wideread import get_each

        if not gets:
            return []
        rounds = -(-len(gets) // max(1, self.concurrency))
        return list(
            get_each(
                gets,
                headers=f"Authorization: Bearer {self._token}\r\n" if self._token else "",
                timeout=self.timeout,
                deadline=time.monotonic() + (rounds + 1) * self.timeout,
                width=self.concurrency,
                body_cap=self.metadata_cap,
                ssl_context=self._ssl,
                cap_name=cap_name,
            )
        )

    def read_nodes(
        self,
        specs: Sequence[NodeSpec],
        *,
        read_deadline_s: float | None = None,
        on_done: Callable[[], None] | None = None,
    ) -> list[NodeReading | TransportError]:
        """Read every node, `concurrency` at a time, through the fleet reader (kvgate/reading/fleetread.py, which
        `kvgate watch` reads with too); each slot holds its reading or its error.

        Every answer ends within the timeout, and every node's read within `read_deadline_s` of this call
        (a node whose turn comes later is not read). `on_done` is called as each node finishes.
        """
        deadline = time.monotonic() + read_deadline_s if read_deadline_s is not None else None
        return read_workers(
            specs,
            timeout=self.timeout,
            token=self._token,
            width=self.concurrency,
            deadline=deadline,
            ssl_context=self._ssl,
            body_cap=self.metadata_cap,
            on_done=on_done,
            deadline_name=(
                f"the whole read's deadline ({read_deadline_s:g}s; raise --read-deadline or --concurrency)"
                if read_deadline_s is not None
                else "the whole read's deadline"
            ),
        )
