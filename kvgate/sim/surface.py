"""The metadata documents a simulated worker serves, as pure functions of its config and release.

One place for `/server_info`, `/model_info` and `/v1/models`, shared by the full worker
(`server.py`, FastAPI around a real engine) and the metadata-only fleet host (`fleet.py`, many
workers per process), so both answer the same shapes (sglang-surface.md section 1).
"""

from __future__ import annotations

from typing import Any

from kvgate.sim.config import WorkerConfig, env_bool, exportable_env_vars
from kvgate.sim.releases import SimRelease
from kvgate.upstream.admission import max_req_input_len


def pool_capacity(max_total_tokens: int, page_size: int) -> int:
    """Tokens the pool really holds: whole pages only (`KVPool.capacity_tokens`)."""
    return (max_total_tokens // page_size) * page_size


#: SGLang reports the seed it resolved (without --random-seed a random int in [0, 2**30]:
#: `arg_groups/serving_hook.py`); the toy model is deterministic, so the simulator reports a fixed one.
RANDOM_SEED = 0


def resolved_args(cfg: WorkerConfig, release: SimRelease) -> dict[str, Any]:
    """The ServerArgs part of `/server_info` (flag names as SGLang resolves them)."""
    args: dict[str, Any] = {
        "model_path": cfg.model_path,
        "tokenizer_path": cfg.model_path,
        "served_model_name": cfg.served_model_name or cfg.model_path,
        "host": cfg.host,
        "port": cfg.port,
        "context_length": cfg.context_length,
        "max_total_tokens": cfg.max_total_tokens,
        "max_running_requests": cfg.max_running_requests,
        "page_size": cfg.page_size,
        "chunked_prefill_size": cfg.chunked_prefill_size,
        "mem_fraction_static": cfg.mem_fraction_static if cfg.mem_fraction_static is not None else 0.88,
        "tp_size": cfg.tp_size,
        "dp_size": cfg.dp_size,
        "pp_size": 1,
        "device": "cpu",
        "random_seed": RANDOM_SEED,
        "allow_auto_truncate": cfg.allow_auto_truncate,
        "disaggregation_mode": cfg.mode,
        "disaggregation_transfer_backend": cfg.disaggregation_transfer_backend,
        "disaggregation_bootstrap_port": cfg.disaggregation_bootstrap_port,
        "disaggregation_ib_device": cfg.disaggregation_ib_device,
        "num_reserved_decode_tokens": 512,
        "kv_canary": cfg.kv_canary,
        "kv_canary_real_data": cfg.kv_canary_real_data,
        "kv_canary_sweep_interval": cfg.kv_canary_sweep_interval,
        "skip_server_warmup": True,
    }
    if release.has_kv_checksum_flag:
        args["disaggregation_enable_kv_checksum"] = cfg.disaggregation_enable_kv_checksum
    if release.has_decode_allocation_args:
        args["disaggregation_decode_allocation_policy"] = "early"
        args["enable_pd_role_switch"] = False
    return args


def server_info(
    cfg: WorkerConfig, release: SimRelease, *, pool_tokens: int, started: float, last_gen_throughput: float = 0.0
) -> dict[str, Any]:
    """`/server_info`: resolved args, the sized pool, the admission limit and one internal state."""
    args = resolved_args(cfg, release)
    state: dict[str, Any] = {
        **args,
        "world_size": 1,
        "last_gen_throughput": last_gen_throughput,
        "startup_time": started,
        "effective_max_running_requests_per_dp": cfg.max_running_requests or 4096,
        "memory_usage": {
            "weight": 0.0,
            "kvcache": pool_tokens * 4 / 2**30,
            "startup_available": 0.0,
            "token_capacity": pool_tokens,
            "token_capacity_swa": None,
            "graph": {},
        },
        **release.internal_state_extra(cfg.mode),
    }
    if env_bool("SGLANG_EXPOSE_OWN_ENV_VARS", False):
        state["env_vars"] = exportable_env_vars()
    return {
        **args,
        "launch_command": cfg.launch_command,
        "max_total_num_tokens": pool_tokens,
        "max_req_input_len": max_req_input_len(cfg.effective_context, pool_tokens),
        "status": "ready",
        "kvgate_simulator": True,
        **release.server_info_extra(cfg.mode),
        "startup_time": started,
        "internal_states": [dict(state) for _ in range(cfg.dp_size)],
        "version": release.version,
    }


def model_info(cfg: WorkerConfig, release: SimRelease) -> dict[str, Any]:
    """`/model_info` (`/get_model_info`)."""
    return {
        "model_path": cfg.model_path,
        "served_model_name": cfg.served_model_name or cfg.model_path,
        "tokenizer_path": cfg.model_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "load_format": "auto",
        "reasoning_parser": None,
        "tool_call_parser": None,
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": "byte-echo",
        "architectures": ["KvgateSimByteEchoForCausalLM"],
        **release.model_info_extra(cfg.mode),
    }


def v1_models(cfg: WorkerConfig, started: float) -> dict[str, Any]:
    """`/v1/models`: one model whose `max_model_len` is the effective context."""
    name = cfg.served_model_name or cfg.model_path
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": int(started),
                "owned_by": "sglang",
                "root": name,
                "parent": None,
                "max_model_len": cfg.effective_context,
            }
        ],
    }
