"""The target client: reads what SGLang workers and routers say about themselves.

Every field kvgate relies on is extracted here, tolerant of the 0.5.19-0.5.23 shapes
(sglang-surface.md section 1). A missing or malformed field becomes a `FieldProblem`, never a guess;
a transport failure (refused, timeout, 5xx, bad JSON) becomes a `TransportError`.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import httpx

from kvgate.errors import TransportError

PREFILL = "prefill"
DECODE = "decode"
ROUTER = "router"

# Pool capacity keys in the order we trust them. SGLang's `max_total_tokens` is the operator's cap
# flag (often null), not the pool the engine sized, so it is deliberately not on this list.
POOL_KEYS = ("max_total_num_tokens", "kv_pool_tokens")


@dataclass(frozen=True)
class NodeSpec:
    """A worker (or router) as the operator named it on the command line."""

    role: str
    url: str
    index: int = 0

    @property
    def label(self) -> str:
        return f"{self.role}[{self.index}] {self.url}"


@dataclass(frozen=True)
class FieldProblem:
    """A field that was missing or malformed where kvgate needed it."""

    field: str
    problem: str


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


class TargetClient:
    """HTTP access to SGLang workers and routers. Thread-safe; one per run."""

    def __init__(self, timeout: float = 10.0, token: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = timeout
        self._http = httpx.Client(timeout=httpx.Timeout(timeout), headers=headers, follow_redirects=False)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "TargetClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def http(self) -> httpx.Client:
        """The underlying client (authorised, bounded timeouts) for gates that send requests."""
        return self._http

    def get_json(self, base: str, path: str, *, missing_ok: bool = False) -> Any | None:
        """GET base+path and parse JSON. 404 returns None when `missing_ok`; other failures raise."""
        url = base.rstrip("/") + path
        try:
            resp = self._http.get(url)
        except httpx.TimeoutException:
            raise TransportError(url, f"no answer within {self.timeout:g}s (timeout)") from None
        except httpx.HTTPError as exc:
            raise TransportError(url, f"unreachable: {type(exc).__name__}: {exc}") from None
        if resp.status_code == 404 and missing_ok:
            return None
        if resp.status_code in (401, 403):
            raise TransportError(url, f"HTTP {resp.status_code}: authentication refused (check --token-env)")
        if resp.status_code >= 400:
            raise TransportError(url, f"HTTP {resp.status_code}: {resp.text[:200]!r}")
        try:
            return resp.json()
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
            raise TransportError(url, f"malformed JSON ({exc}): {resp.text[:120]!r}") from None

    def read_node(self, spec: NodeSpec) -> NodeReading:
        """Read /server_info (or /get_server_info), /v1/models and /model_info of one worker."""
        info = self.get_json(spec.url, "/server_info", missing_ok=True)
        info_path = "/server_info"
        if info is None:
            info = self.get_json(spec.url, "/get_server_info", missing_ok=True)
            info_path = "/get_server_info"
        if info is None:
            raise TransportError(spec.url, "neither /server_info nor /get_server_info exists: not an SGLang worker?")
        if not isinstance(info, dict):
            raise TransportError(spec.url + info_path, f"expected a JSON object, got {type(info).__name__}")
        models = self.get_json(spec.url, "/v1/models", missing_ok=True)
        model_info = self.get_json(spec.url, "/model_info", missing_ok=True)
        if model_info is None:
            model_info = self.get_json(spec.url, "/get_model_info", missing_ok=True)
        return parse_node(spec, info_path, info, models, model_info)

    def read_nodes(self, specs: Sequence[NodeSpec]) -> list[NodeReading | TransportError]:
        """Read every node concurrently; each slot holds its reading or the error that prevented it."""

        def one(spec: NodeSpec) -> NodeReading | TransportError:
            try:
                return self.read_node(spec)
            except TransportError as exc:
                return exc

        if not specs:
            return []
        with ThreadPoolExecutor(max_workers=min(16, len(specs))) as pool:
            return list(pool.map(one, specs))


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

    def int_field(self, obj: Mapping[str, Any], key: str, name: str, *, required: bool, nullable: bool = False,
                  minimum: int = 0) -> int | None:
        value = self._value(obj, key, name, required=required, nullable=nullable)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                self.note(name, f"malformed: {value!r} is not an integer")
                return None
        if value < minimum:
            self.note(name, f"malformed: {value} < {minimum}")
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


def parse_node(spec: NodeSpec, info_path: str, info: Mapping[str, Any], models: Any,
               model_info: Any) -> NodeReading:
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
                cap = r.int_field(mem, "token_capacity", f"internal_states[{i}].memory_usage.token_capacity",
                                  required=True, minimum=1)
            live = state.get("disaggregation_mode")
            env = state.get("env_vars")
            ranks.append(RankReading(
                dp_rank=i,
                token_capacity=cap,
                disaggregation_mode=live if isinstance(live, str) else None,
                env_vars={str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else None,
            ))

    lives = {rk.disaggregation_mode for rk in ranks if rk.disaggregation_mode}
    live_mode = lives.pop() if len(lives) == 1 else None
    if len(lives) > 1:
        r.note("internal_states[*].disaggregation_mode", f"ranks disagree: {sorted(lives)}")

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
        max_req_input_len=r.int_field(info, "max_req_input_len", "max_req_input_len", required=True),
        page_size=r.int_field(info, "page_size", "page_size", required=False, nullable=True, minimum=1),
        disaggregation_mode=r.str_field(info, "disaggregation_mode", "disaggregation_mode", required=True),
        live_disaggregation_mode=live_mode,
        transfer_backend=r.str_field(info, "disaggregation_transfer_backend", "disaggregation_transfer_backend",
                                     required=False),
        bootstrap_port=r.int_field(info, "disaggregation_bootstrap_port", "disaggregation_bootstrap_port",
                                   required=False, nullable=True),
        kv_checksum=r.bool_field(info, "disaggregation_enable_kv_checksum", "disaggregation_enable_kv_checksum"),
        kv_canary=r.str_field(info, "kv_canary", "kv_canary", required=False),
        tp_size=r.int_field(info, "tp_size", "tp_size", required=False, minimum=1),
        dp_size=r.int_field(info, "dp_size", "dp_size", required=False, minimum=1),
        allow_auto_truncate=r.bool_field(info, "allow_auto_truncate", "allow_auto_truncate"),
        model_path=r.str_field(info, "model_path", "model_path", required=False),
        architectures=architectures,
        ranks=tuple(ranks),
        problems=tuple(r.problems),
        server_info=dict(info),
    )


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
        if isinstance(mem, dict) and isinstance(mem.get("weight"), (int, float)) and not isinstance(mem["weight"], bool):
            weight = float(mem["weight"])
    return SizingSettings(
        pp_size=r.int_field(info, "pp_size", "pp_size", required=False, minimum=1),
        enable_dp_attention=r.bool_field(info, "enable_dp_attention", "enable_dp_attention"),
        mem_fraction_static=float(frac) if isinstance(frac, (int, float)) and not isinstance(frac, bool) else None,
        kv_cache_dtype=r.str_field(info, "kv_cache_dtype", "kv_cache_dtype", required=False),
        max_total_tokens=r.int_field(info, "max_total_tokens", "max_total_tokens", required=False, nullable=True,
                                     minimum=1),
        weight_gib=weight,
    )
