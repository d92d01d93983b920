"""Runs INSIDE a real sglang release's CPU environment (kvgate.backport.cpuenv): sizes KV pools with the
release's own code and prints the numbers.

Executed for real, from the release: argument parsing and resolution (`prepare_server_args`,
`runtime_context.publish`), `ModelConfig` (its quantization detection), the quant method's own config
parsing (`get_quant_config`), `configure_kv_cache_dtype`, `resolve_layer_indices`,
`get_pp_indices`, `KVCacheConfigurator`, `create_memory_pool_configurator` (its `_cell_size`),
`KVCacheConfigurator._profile_available_bytes` and `config_from_budget` (page rounding and the
`--max-total-tokens` cap).

Supplied instead of measured (there is no GPU): the free GPU memory before and after the weights load
(`get_available_gpu_memory` returns the case's figure), a one-process world (`get_world_group`), the
GPU's compute capability (`torch.cuda.get_device_capability`, read by the DSA KV-dtype default), and the
pipeline-parallel MIN all-reduce, which this script performs itself over every stage it sizes.

Input: a JSON list of cases on stdin. Output: one line `KVGATE-RESULT <json list>`.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import sys
import traceback
from types import SimpleNamespace
from typing import Any


def size(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed
    from sglang.srt import runtime_context as rc
    from sglang.srt.configs.model_config import AttentionArch, ModelConfig
    from sglang.srt.distributed.utils import get_pp_indices
    from sglang.srt.mem_cache import kv_cache_configurator as kcm
    from sglang.srt.mem_cache import kv_cache_dtype as kdt
    from sglang.srt.model_executor import pool_configurator as pcm
    from sglang.srt.model_executor.model_runner_components.layer_setup import resolve_layer_indices
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    tp, dp, pp = spec["tp"], spec.get("dp", 1), spec.get("pp", 1)
    argv = [
        "--model-path",
        spec["model_dir"],
        "--device",
        "cpu",
        "--tp-size",
        str(tp),
        "--mem-fraction-static",
        repr(spec["mem_fraction_static"]),
        "--page-size",
        str(spec["page_size"]),
        "--kv-cache-dtype",
        spec["kv_cache_dtype"],
        "--context-length",
        str(spec["context_length"]),
        "--load-format",
        "dummy",
        "--skip-tokenizer-init",
    ]
    if pp > 1:
        argv += ["--pp-size", str(pp)]
    if dp > 1:
        argv += ["--dp-size", str(dp), "--enable-dp-attention"]
    if spec.get("max_total_tokens"):
        argv += ["--max-total-tokens", str(spec["max_total_tokens"])]
    if spec.get("disaggregation_mode"):
        argv += ["--disaggregation-mode", spec["disaggregation_mode"]]

    sm = spec["gpu_sm"]
    torch.cuda.get_device_capability = lambda *a, **k: (sm // 10, sm % 10)  # supplied: the GPU's SM
    server_args = prepare_server_args(argv)
    rc.publish(server_args, role="scheduler")
    model_config = ModelConfig.from_server_args(server_args)

    # Supplied memory figures and a one-process world; the PP MIN all-reduce is done below.
    kcm.get_available_gpu_memory = lambda *a, **k: spec["post_load_gib"]
    kcm.get_world_group = lambda: SimpleNamespace(world_size=1, cpu_group=None)
    torch.distributed.all_reduce = lambda *a, **k: None

    resolved_kv = rc.get_model().kv_cache_dtype
    params = inspect.signature(kdt.configure_kv_cache_dtype).parameters
    kw = dict(
        server_args_kv_cache_dtype=resolved_kv,
        model=checkpoint_quant_model(model_config),
        model_dtype=model_config.dtype,
        is_draft_worker=False,
        is_dflash=False,
        speculative_draft_attention_backend=None,
    )
    _, kv_dtype = kdt.configure_kv_cache_dtype(**{k: v for k, v in kw.items() if k in params})

    attn_tp = tp // dp
    one_process = SimpleNamespace(world_size=1, cpu_group=None)  # 0.5.21+ read the world group from here
    parallel = dict(
        tp_size=tp,
        tp_rank=0,
        pp_size=pp,
        attn_tp_size=attn_tp,
        attn_tp_rank=0,
        attn_dp_size=dp,
        attn_dp_rank=0,
        attn_cp_size=1,
        attn_cp_rank=0,
        attn_dcp_size=1,
        attn_dcp_rank=0,
        dp_size=dp,
        world_group=one_process,
        launch_world_size=1,
    )
    accepted = set(getattr(rc, "_PARALLEL_FIELDS", None) or rc._parallel_fields())
    stages = []
    for pp_rank in range(pp):
        with rc.get_parallel().override(**{k: v for k, v in dict(parallel, pp_rank=pp_rank).items() if k in accepted}):
            start, end = get_pp_indices(model_config.num_hidden_layers, pp_rank, pp)
            layer_kw = dict(
                model=SimpleNamespace(start_layer=start, end_layer=end),
                model_config=model_config,
                is_draft_worker=False,
                spec_algorithm=SpeculativeAlgorithm.NONE,
            )
            accepts = inspect.signature(resolve_layer_indices).parameters
            layer_info = resolve_layer_indices(**{k: v for k, v in layer_kw.items() if k in accepts})
            try:  # 0.5.19/0.5.20 take a ParallelState; 0.5.21+ take attn_dp_size and pp_size
                from sglang.srt.distributed.parallel_state_wrapper import ParallelState

                ps = ParallelState.trivial(
                    tp_size=tp, pp_size=pp, pp_rank=pp_rank, attn_tp_size=attn_tp, attn_dp_size=dp, dp_size=dp
                )
            except ImportError:
                ps = None
            known = dict(
                device="cpu",
                gpu_id=0,
                ps=ps,
                attn_dp_size=dp,
                pp_size=pp,
                pp_group=None,
                model=None,
                model_config=model_config,
                server_args=server_args,
                kv_cache_dtype=kv_dtype,
                kv_cache_dtype_str=resolved_kv,
                model_dtype=model_config.dtype,
                page_size=rc.get_schedule().page_size,
                sliding_window_size=None,
                spec_algorithm=SpeculativeAlgorithm.NONE,
                is_draft_worker=False,
                post_capture_kv_active=False,
                spec_aux_config=SimpleNamespace(),
                is_hybrid_swa=False,
                is_hybrid_swa_compress=False,
                use_mla_backend=model_config.attention_arch == AttentionArch.MLA,
                layer_info=layer_info,
                forward_stream=None,
                req_to_token_pool=None,
                token_to_kv_pool_allocator=None,
                memory_pool_config=None,
            )
            init = [f.name for f in dataclasses.fields(kcm.KVCacheConfigurator) if f.init]
            kvc = kcm.KVCacheConfigurator(**{name: known[name] for name in init if name in known})
            configurator = pcm.create_memory_pool_configurator(kvc)
            available = kvc._profile_available_bytes(spec["pre_load_gib"])
            config = kvc.config_from_budget(available)
            stages.append(
                dict(
                    layers=layer_info.num_effective_layers,
                    cell_size=configurator._cell_size,
                    available_bytes=available,
                    max_total_num_tokens=config.max_total_num_tokens,
                    configurator=type(configurator).__name__,
                )
            )
    pool = min(s["max_total_num_tokens"] for s in stages)
    return dict(
        stages=stages,
        max_total_num_tokens=pool,
        context_len=model_config.context_len,
        page_size=rc.get_schedule().page_size,
        kv_cache_dtype=str(kv_dtype),
        kv_cache_dtype_arg=resolved_kv,
        max_req_input_len=worker_max_req_input_len(model_config, pool),
        quantization=model_config.quantization,
    )


def checkpoint_quant_model(model_config: Any) -> Any:
    """What `configure_kv_cache_dtype` reads of the loaded model: its `quant_config`, built by the release's
    own loader path (`model_loader.weight_utils.get_quant_config`, which runs the quant method's
    `from_config` on the checkpoint's quantization config) — no weights are loaded. None when the
    checkpoint is not quantized, as the release passes a model without a quant config."""
    if not model_config.quantization:
        return None
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.weight_utils import get_quant_config

    return SimpleNamespace(quant_config=get_quant_config(model_config, LoadConfig(load_format="dummy"), {}))


class _Runner:
    """Stand-in for a ModelRunner whose pool holds `pool` tokens (a plain pool: no aux cache, no DCP)."""

    def __init__(self, pool: int) -> None:
        self.pool = pool
        self.req_to_token_pool = SimpleNamespace(
            schedulable_token_capacity=lambda capacity: capacity, size=0, max_context_len=0
        )
        self.token_to_kv_pool = SimpleNamespace(size=pool)
        self.token_to_kv_pool_allocator = None
        self.max_running_requests = 1
        self.forward_stream = None

    def __getattr__(self, name: str) -> Any:
        if name.endswith("max_total_num_tokens"):  # effective_/logical_/effective_logical_ variants
            return self.pool
        raise AttributeError(name)


def worker_max_req_input_len(model_config: Any, pool: int) -> int:
    """The release's own TpModelWorker.get_worker_info on a worker whose pool holds `pool` tokens."""
    from sglang.srt.managers.tp_worker import TpModelWorker

    worker = SimpleNamespace(
        model_config=model_config,
        model_runner=_Runner(pool),
        dllm_algorithm=None,
        random_seed=0,
        device="cpu",
        ps=SimpleNamespace(attn_dcp_size=1),
    )
    return int(TpModelWorker.get_worker_info(worker)[5])


def main() -> None:
    results = []
    for spec in json.load(sys.stdin):
        try:
            results.append(size(spec))
        except Exception as exc:  # noqa: BLE001 - reported per case, the test fails on it
            results.append({"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]})
    print("KVGATE-RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
