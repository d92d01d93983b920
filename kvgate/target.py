"""The target client: reads what SGLang workers and routers say about themselves.

Every field kvgate relies on is extracted here, tolerant of the 0.5.19-0.5.23 shapes
(sglang-surface.md section 1). A missing or malformed field becomes a `FieldProblem`, never a guess;
a transport failure (refused, timeout, 5xx, bad JSON) becomes a `TransportError`.
"""

from __future__ import annotations

import functools
import json
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from kvgate.compact import RANK_COUNT, compact_info, compact_model_info, compact_models
from kvgate.errors import TransportError, UsageError
from kvgate.httpbounds import BODY_CAP, OverCap, bounded_client, parse_json
from kvgate.redact import clip
from kvgate.weburl import disagreement

PREFILL = "prefill"
DECODE = "decode"
ROUTER = "router"

# Pool capacity keys in the order we trust them. SGLang's `max_total_tokens` is the operator's cap
# flag (often null), not the pool the engine sized, so it is deliberately not on this list.
POOL_KEYS = ("max_total_num_tokens", "kv_pool_tokens")
from kvgate.defaults import (  # noqa: E402,F401  (one home)
    DEFAULT_CONCURRENCY,
    METADATA_BODY_CAP,
    NODE_DEADLINE_REQUESTS,
    PROBE_BODY_CAP,
)


def validate_url(flag: str, url: str) -> str:
    """An http(s) URL with a host, as httpx will parse it; anything else is a usage error naming the flag."""
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"{flag} {url}: expected an http:// or https:// URL")
    why = disagreement(url)
    if why is not None:  # the router would reach another worker than kvgate reads (kvgate/weburl.py)
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


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys repeat is ambiguous (which value does the engine mean?): refuse it."""
    out = dict(pairs)  # built in C: a fleet's documents are thousands of objects
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {key!r}")
            seen.add(key)
    return out


def decode_answer(url: str, status: int, body: bytes, location: str | None, *, missing_ok: bool) -> Any | None:
    """The JSON document of one metadata answer, judged the same way whichever reader fetched it:
    404 is None when `missing_ok`; a refusal, an error status, a redirect (never followed: kvgate reads
    the worker it was pointed at) or malformed JSON (a repeated key included) is a TransportError."""
    if status == 404 and missing_ok:
        return None

    def text(n: int) -> str:
        return clip(body.decode("utf-8", "replace"), n)

    if status in (401, 403):
        raise TransportError(url, f"HTTP {status}: authentication refused (check --token-env)")
    if status >= 400:
        raise TransportError(url, f"HTTP {status}: {text(200)!r}")
    if not 200 <= status < 300:
        raise TransportError(
            url, f"HTTP {status} (redirect to {location or '?'!r}, not followed): point kvgate at the worker itself"
        )
    try:
        return parse_json(body, object_pairs_hook=_unique_keys)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise TransportError(url, f"malformed JSON ({exc}): {text(120)!r}") from None


@dataclass(frozen=True)
class NodeSpec:
    """A worker (or router) as the operator named it on the command line."""

    role: str
    url: str
    index: int = 0

    @property
    def label(self) -> str:
        return f"{self.role}[{self.index}] {self.url}"


#: The largest count kvgate takes from a worker (tokens, lengths, sizes): 2**32 tokens of KV is
#: terabytes per rank, past any pool SGLang sizes; a larger value is a broken or hostile server.
SANE_MAX = 2**32
#: Ranks and parallel sizes: a worker with more DP/TP ranks than this is not one SGLang server.
SANE_RANKS = 2**16
SANE_PORT = 65_535


@dataclass(frozen=True)
class FieldProblem:
    """A field that was missing or malformed where kvgate needed it."""

    field: str
    problem: str
    # True when the value was there but is not a sane JSON integer (a float such as 1e308, a bool,
    # a string, a negative or an absurd number): `pool-context.number` names each as an error.
    number: bool = False


@dataclass(frozen=True)
class RankReading:
    """What one DP rank's scheduler reports in `internal_states[i]`."""

    dp_rank: int
    token_capacity: int | None
    disaggregation_mode: str | None
    env_vars: Mapping[str, str] | None


@dataclass(frozen=True)
class NodeReading:
    """Everything gate decisions need from one worker, read once."""

    spec: NodeSpec
    info_path: str
    version: str | None
    context_length: int | None
    context_source: str | None
    context_length_flag: int | None
    max_total_num_tokens: int | None
    pool_key: str | None
    max_req_input_len: int | None
    page_size: int | None
    disaggregation_mode: str | None
    live_disaggregation_mode: str | None
    transfer_backend: str | None
    bootstrap_port: int | None
    kv_checksum: bool | None
    kv_canary: str | None
    tp_size: int | None
    dp_size: int | None
    allow_auto_truncate: bool | None
    model_path: str | None
    architectures: tuple[str, ...] | None
    ranks: tuple[RankReading, ...]
    problems: tuple[FieldProblem, ...] = ()
    server_info: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # `enable_dp_attention`: with it, dp_size attention-DP groups split tp_size GPUs.
    dp_attention: bool | None = None
    # How many `internal_states` entries the server sent (one per DP rank, malformed ones included).
    rank_entries: int = 0
    # The name the worker serves its model under (/v1/models data[0].id; None: not said).
    served_model: str | None = None

    @property
    def node(self) -> str:
        return self.spec.label

    @property
    def role(self) -> str:
        """The role the node itself reports: the live role (0.5.22+) wins over the launch argument."""
        return self.live_disaggregation_mode or self.disaggregation_mode or "unknown"

    @property
    def env_vars(self) -> Mapping[str, str] | None:
        """Env vars the server exposes (only with SGLANG_EXPOSE_OWN_ENV_VARS=1), from rank 0."""
        for rank in self.ranks:
            if rank.env_vars is not None:
                return rank.env_vars
        return None

    def problem(self, name: str) -> FieldProblem | None:
        for p in self.problems:
            if p.field == name:
                return p
        return None


@functools.lru_cache(maxsize=1)
def _ssl_context() -> ssl.SSLContext:
    """The system's trust store, loaded once per process (it costs about 30 ms, and a watch builds a
    client every pass); an SSLContext is safe to share between threads and clients."""
    return httpx.create_ssl_context()


class TargetClient:
    """HTTP access to SGLang workers and routers. Thread-safe; one per run.

    Every answer ends within its timeout, body included (`timeout` for metadata: one slow-dripping
    server cannot hold a read past it), and is read only up to a cap: `metadata_cap` bytes for the
    documents read here, `probe_cap` for what gates send through `http` (kvgate/httpbounds.py).
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
        """GET each (base URL, path) at once through the one-thread reader (kvgate/wideread.py), under this
        client's token, timeout, width and metadata cap; one `wideread.Answer` or `wideread.Failure` each,
        in order, all within one deadline (as many timeouts as the rounds of `concurrency` need, plus one)."""
        from kvgate.wideread import get_each

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
        """Read every node, `concurrency` at a time, through the fleet reader (kvgate/fleetread.py, which
        `kvgate watch` reads with too); each slot holds its reading or its error.

        Every answer ends within the timeout, and every node's read within `read_deadline_s` of this call
        (a node whose turn comes later is not read). `on_done` is called as each node finishes.
        """
        from kvgate.fleetread import read_workers  # the fleet reader builds on this module

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


# ---------------------------------------------------------------------------------------------
# Field extraction. Pure functions over parsed JSON, so every shape is testable without a server.


class _Reader:
    def __init__(self) -> None:
        self.problems: list[FieldProblem] = []

    def note(self, name: str, problem: str) -> None:
        self.problems.append(FieldProblem(name, problem))

    def _value(self, obj: Mapping[str, Any], key: str, name: str, *, required: bool, nullable: bool) -> Any:
        """The value of `key`, or None (noting a problem when it had to be there and be non-null)."""
        if key not in obj:
            if required:
                self.note(name, "missing")
            return None
        value = obj[key]
        if value is None and not nullable:
            self.note(name, "null")
        return value

    def int_field(
        self,
        obj: Mapping[str, Any],
        key: str,
        name: str,
        *,
        required: bool,
        nullable: bool = False,
        minimum: int = 0,
        maximum: int = SANE_MAX,
    ) -> int | None:
        """A JSON integer in [minimum, maximum]. Never coerced: a float (even 8192.0, or 1e308, which
        `float.is_integer` calls whole), a bool or a string is malformed, as is a value out of range."""
        value = self._value(obj, key, name, required=required, nullable=nullable)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.problems.append(FieldProblem(name, f"malformed: {value!r} is not a JSON integer", number=True))
            return None
        if not minimum <= value <= maximum:
            bound = f"< {minimum}" if value < minimum else f"> {maximum:,} (absurd)"
            self.problems.append(FieldProblem(name, f"malformed: {value} {bound}", number=True))
            return None
        return value

    def str_field(self, obj: Mapping[str, Any], key: str, name: str, *, required: bool) -> str | None:
        # A required string that is null (e.g. "version": null) is as unknown as a missing one.
        value = self._value(obj, key, name, required=required, nullable=not required)
        if value is None:
            return None
        if not isinstance(value, str):
            self.note(name, f"malformed: {value!r} is not a string")
            return None
        return value

    def bool_field(self, obj: Mapping[str, Any], key: str, name: str) -> bool | None:
        if key not in obj:
            return None
        value = obj[key]
        if isinstance(value, bool):
            return value
        if value is None:
            return None
        self.note(name, f"malformed: {value!r} is not a boolean")
        return None


def _context_from_models(r: _Reader, models: Any) -> int | None:
    if models is None:
        r.note("/v1/models", "endpoint missing (404)")
        return None
    data = models.get("data") if isinstance(models, dict) else None
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        r.note("/v1/models data[0]", "missing or malformed")
        return None
    return r.int_field(data[0], "max_model_len", "/v1/models data[0].max_model_len", required=True, minimum=1)


def parse_node(spec: NodeSpec, info_path: str, info: Mapping[str, Any], models: Any, model_info: Any) -> NodeReading:
    """Extract a NodeReading from the raw JSON documents of one worker."""
    r = _Reader()
    pool: int | None = None
    pool_key: str | None = None
    for key in POOL_KEYS:
        if key in info:
            pool_key = key
            pool = r.int_field(info, key, key, required=True, minimum=1)
            break
    if pool_key is None:
        r.note("max_total_num_tokens", "missing (no KV pool capacity key: " + ", ".join(POOL_KEYS) + ")")

    context = _context_from_models(r, models)
    context_flag = r.int_field(info, "context_length", "context_length", required=False, nullable=True, minimum=1)
    context_source = "/v1/models max_model_len" if context is not None else None

    ranks: list[RankReading] = []
    states = info.get("internal_states")
    if isinstance(states, list) and states and _rank_entries(info, states) > len(states):
        r.note(
            "internal_states",
            f"{_rank_entries(info, states):,} entries, more DP ranks than kvgate reads ({len(states)}): "
            "not one SGLang server",
        )
    if not isinstance(states, list) or not states:
        r.note("internal_states", "missing or empty: per-DP-rank capacities cannot be checked")
    else:
        for i, state in enumerate(states):
            if not isinstance(state, dict):
                r.note(f"internal_states[{i}]", "malformed: not an object")
                continue
            mem = state.get("memory_usage")
            cap: int | None = None
            if not isinstance(mem, dict):
                r.note(f"internal_states[{i}].memory_usage", "missing or malformed")
            else:
                cap = r.int_field(
                    mem, "token_capacity", f"internal_states[{i}].memory_usage.token_capacity", required=True, minimum=1
                )
            live = state.get("disaggregation_mode")
            env = state.get("env_vars")
            ranks.append(
                RankReading(
                    dp_rank=i,
                    token_capacity=cap,
                    disaggregation_mode=live if isinstance(live, str) else None,
                    env_vars={str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else None,
                )
            )

    lives = {rk.disaggregation_mode for rk in ranks if rk.disaggregation_mode}
    live_mode = lives.pop() if len(lives) == 1 else None
    if len(lives) > 1:
        r.note("internal_states[*].disaggregation_mode", f"ranks disagree: {sorted(lives)}")

    dp_attention = r.bool_field(info, "enable_dp_attention", "enable_dp_attention")
    architectures: tuple[str, ...] | None = None
    if isinstance(model_info, dict) and isinstance(model_info.get("architectures"), list):
        architectures = tuple(str(a) for a in model_info["architectures"])

    return NodeReading(
        spec=spec,
        info_path=info_path,
        version=r.str_field(info, "version", "version", required=True),
        context_length=context,
        context_source=context_source,
        context_length_flag=context_flag,
        max_total_num_tokens=pool,
        pool_key=pool_key,
        max_req_input_len=r.int_field(info, "max_req_input_len", "max_req_input_len", required=True, minimum=1),
        page_size=r.int_field(info, "page_size", "page_size", required=False, nullable=True, minimum=1),
        disaggregation_mode=r.str_field(info, "disaggregation_mode", "disaggregation_mode", required=True),
        live_disaggregation_mode=live_mode,
        transfer_backend=r.str_field(
            info, "disaggregation_transfer_backend", "disaggregation_transfer_backend", required=False
        ),
        bootstrap_port=r.int_field(
            info,
            "disaggregation_bootstrap_port",
            "disaggregation_bootstrap_port",
            required=False,
            nullable=True,
            maximum=SANE_PORT,
        ),
        kv_checksum=r.bool_field(info, "disaggregation_enable_kv_checksum", "disaggregation_enable_kv_checksum"),
        kv_canary=r.str_field(info, "kv_canary", "kv_canary", required=False),
        tp_size=r.int_field(info, "tp_size", "tp_size", required=False, minimum=1, maximum=SANE_RANKS),
        dp_size=r.int_field(info, "dp_size", "dp_size", required=False, minimum=1, maximum=SANE_RANKS),
        allow_auto_truncate=r.bool_field(info, "allow_auto_truncate", "allow_auto_truncate"),
        model_path=r.str_field(info, "model_path", "model_path", required=False),
        architectures=architectures,
        ranks=tuple(ranks),
        problems=tuple(r.problems),
        server_info=dict(info),
        dp_attention=dp_attention,
        rank_entries=_rank_entries(info, states),
        served_model=_served_model(models),
    )


def _served_model(models: Any) -> str | None:
    """/v1/models' first card's `id` (what the second look and the watch compare), when it is a string."""
    data = models.get("data") if isinstance(models, dict) else None
    card = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
    return card["id"] if isinstance(card.get("id"), str) else None


def _rank_entries(info: Mapping[str, Any], states: Any) -> int:
    """How many `internal_states` entries the server sent (the compact form keeps the count, not them all)."""
    if not isinstance(states, list):
        return 0
    sent = info.get(RANK_COUNT)
    return sent if isinstance(sent, int) and not isinstance(sent, bool) and sent > len(states) else len(states)


@dataclass(frozen=True)
class SizingSettings:
    """The settings a worker's KV pool was sized with, as its server_info reports them (None: not reported).

    Read only to explain a pool/context failure with `kvgate plan`'s knobs; no verdict rests on them.
    """

    pp_size: int | None
    enable_dp_attention: bool | None
    mem_fraction_static: float | None
    kv_cache_dtype: str | None
    max_total_tokens: int | None  # the operator's --max-total-tokens cap (usually null)
    weight_gib: float | None  # internal_states[0].memory_usage.weight: weights per GPU, measured


def sizing_settings(reading: NodeReading) -> SizingSettings:
    """Extract SizingSettings from a reading's server_info (tolerant: a malformed field is None)."""
    info = reading.server_info
    r = _Reader()
    frac = info.get("mem_fraction_static")
    weight = None
    states = info.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        mem = states[0].get("memory_usage")
        w = mem.get("weight") if isinstance(mem, dict) else None
        if isinstance(w, (int, float)) and not isinstance(w, bool):
            weight = float(w)
    return SizingSettings(
        pp_size=r.int_field(info, "pp_size", "pp_size", required=False, minimum=1),
        enable_dp_attention=r.bool_field(info, "enable_dp_attention", "enable_dp_attention"),
        mem_fraction_static=float(frac) if isinstance(frac, (int, float)) and not isinstance(frac, bool) else None,
        kv_cache_dtype=r.str_field(info, "kv_cache_dtype", "kv_cache_dtype", required=False),
        max_total_tokens=r.int_field(
            info, "max_total_tokens", "max_total_tokens", required=False, nullable=True, minimum=1
        ),
        weight_gib=weight,
    )
