"""Server-info, /v1/models and /model_info documents shaped like real SGLang workers.

Shapes follow ../shared/reference/sglang-surface.md section 1 (read from the 0.5.20 and 0.5.23 wheels):
flat resolved server args + scheduler info (max_total_num_tokens, max_req_input_len) + one
internal_states entry per DP rank + version. Only the keys kvgate reads and their neighbours are
filled; values are parameters so a test states the deployment it means.
"""

from __future__ import annotations

from typing import Any


def max_req_input_len(context: int, pool: int) -> int:
    """SGLang's bound (managers/tp_worker.py get_worker_info): min(context-1, pool-1) - 5."""
    return min(context - 1, pool - 1) - 5


def server_info(
    version: str = "0.5.20",
    *,
    mode: str = "prefill",
    context: int = 1_048_576,
    pool: int = 681_280,
    rank_pools: list[int] | None = None,
    context_flag: int | None = None,
    page_size: int = 64,
    backend: str = "mooncake",
    tp_size: int = 8,
    drop: tuple[str, ...] = (),
    drop_in_states: tuple[str, ...] = (),
    env_vars: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A /server_info document of `version` (0.5.19-0.5.23)."""
    minor = int(version.split(".")[2].split("+")[0].split("rc")[0][:2])
    ranks = rank_pools if rank_pools is not None else [pool]
    resolved: dict[str, Any] = {
        "model_path": "zai-org/GLM-5.3",
        "tokenizer_path": "zai-org/GLM-5.3",
        "served_model_name": "glm-5.3",
        "context_length": context_flag,
        "max_total_tokens": None,
        "max_running_requests": None,
        "page_size": page_size,
        "mem_fraction_static": 0.83,
        "tp_size": tp_size,
        "dp_size": len(ranks),
        "pp_size": 1,
        "device": "cuda",
        "disaggregation_mode": mode,
        "disaggregation_transfer_backend": backend,
        "disaggregation_bootstrap_port": 8998,
        "disaggregation_ib_device": None,
        "num_reserved_decode_tokens": 512,
        "kv_canary": "none",
        "kv_canary_real_data": "none",
        "kv_canary_sweep_interval": 0,
        "allow_auto_truncate": False,
    }
    if minor >= 21:
        resolved["disaggregation_enable_kv_checksum"] = False
    if minor >= 23:
        resolved["disaggregation_decode_allocation_policy"] = "early"
        resolved["enable_pd_role_switch"] = False
    states = []
    for cap in ranks:
        state = dict(resolved)
        state.update(
            {
                "world_size": tp_size,
                "last_gen_throughput": 0.0,
                "effective_max_running_requests_per_dp": 256,
                "memory_usage": {
                    "weight": 90.1,
                    "kvcache": 40.2,
                    "startup_available": 10.0,
                    "token_capacity": cap,
                    "token_capacity_swa": None,
                    "graph": {"decode": 1.2},
                },
            }
        )
        if minor >= 22:
            state["disaggregation_mode"] = mode
            state["decode_cuda_graph_bs"] = [1, 2, 4, 8]
        if env_vars is not None:
            state["env_vars"] = dict(env_vars)
        states.append(state)
    doc: dict[str, Any] = dict(resolved)
    doc["launch_command"] = f"python -m sglang.launch_server --disaggregation-mode {mode}"
    doc["max_total_num_tokens"] = ranks[0]
    doc["max_req_input_len"] = max_req_input_len(context, ranks[0])
    if minor < 23:
        doc["status"] = "ready"
    doc["startup_time"] = 1_790_000_000.0
    doc["internal_states"] = states
    doc["version"] = version
    doc["kv_events"] = None
    if minor >= 21:
        doc["frontend"] = "python"
    for key in drop:
        doc.pop(key, None)
    for state in states:
        for key in drop_in_states:
            state.pop(key, None)
    return doc


def v1_models(context: int = 1_048_576) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": "glm-5.3",
                "object": "model",
                "created": 1790000000,
                "owned_by": "sglang",
                "root": "glm-5.3",
                "parent": None,
                "max_model_len": context,
            }
        ],
    }


def model_info(version: str = "0.5.20", mode: str = "prefill") -> dict[str, Any]:
    doc: dict[str, Any] = {
        "model_path": "zai-org/GLM-5.3",
        "served_model_name": "glm-5.3",
        "tokenizer_path": "zai-org/GLM-5.3",
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "load_format": "auto",
        "reasoning_parser": None,
        "tool_call_parser": None,
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": "glm_moe_dsa",
        "architectures": ["GlmMoeDsaForCausalLM"],
    }
    if int(version.split(".")[2][:2]) >= 21:
        doc["disaggregation_mode"] = mode
    return doc
