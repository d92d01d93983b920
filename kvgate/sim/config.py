"""A simulated worker's settings and SGLang's env-only knobs: no numpy, so the metadata-only fleet
host (fleet.py) can use them without importing the engine."""

from __future__ import annotations

import os
from dataclasses import dataclass

#: The SGLang env vars the simulator reads (and exports under SGLANG_EXPOSE_OWN_ENV_VARS=1).
KNOWN_ENV = (
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT",
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT",
    "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE",
    "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT",
    "SGLANG_EXPOSE_OWN_ENV_VARS",
    "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION",
    "SGLANG_REQUEST_STATE_WAIT_TIMEOUT",
)


def env_bool(name: str, default: bool) -> bool:
    """SGLang's EnvBool parsing (`srt/environ.py`): true/1/yes/y vs false/0/no/n."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    val = raw.strip().lower()
    if val in ("true", "1", "yes", "y"):
        return True
    if val in ("false", "0", "no", "n"):
        return False
    return default


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    try:
        return float(raw) if raw not in (None, "") else default
    except ValueError:
        return default


def exportable_env_vars() -> dict[str, str]:
    """Models `srt/environ.py exportable_env_vars`: the known SGLang vars that are set, sorted."""
    return {name: os.environ[name] for name in sorted(KNOWN_ENV) if name in os.environ}


@dataclass
class WorkerConfig:
    """Resolved settings of one simulated worker (flag names follow SGLang's ServerArgs)."""

    mode: str
    host: str = "127.0.0.1"
    port: int = 30000
    disaggregation_bootstrap_port: int = 8998
    disaggregation_transfer_backend: str = "mooncake"
    disaggregation_ib_device: str | None = None
    context_length: int | None = None
    max_total_tokens: int | None = None
    page_size: int = 1
    chunked_prefill_size: int = 8192
    max_running_requests: int | None = None
    model_path: str = "kvgate-sim/byte-echo"
    served_model_name: str | None = None
    allow_auto_truncate: bool = False
    skip_tokenizer_init: bool = False
    enable_metrics: bool = False
    disaggregation_enable_kv_checksum: bool = False
    kv_canary: str = "none"
    kv_canary_real_data: str = "none"
    kv_canary_sweep_interval: int = 0
    emulate: str = "0.5.20"
    fixed_by: str | None = None
    sim_prefill_tokens_per_s: float = 2_000_000.0
    sim_decode_tokens_per_s: float = 0.0
    sim_transfer_tokens_per_s: float = 0.0
    #: Emulates a deployment whose answers take this many times their time to the KV end to end (a slow
    #: decode: a larger model, its first token from the prefill, every further one a step); 0 = off.
    sim_e2e_factor: float = 0.0
    mem_fraction_static: float | None = None
    tp_size: int = 1
    #: Reported only (metadata-only fleet workers): one internal state per DP rank, each with the pool.
    dp_size: int = 1
    launch_command: str = ""

    #: The toy model's own context window when `--context-length` is not given.
    DEFAULT_CONTEXT = 32768
    DEFAULT_POOL = 65536

    @property
    def effective_context(self) -> int:
        return self.context_length or self.DEFAULT_CONTEXT
