"""`python -m kvgate.sim worker ...`: one simulated SGLang PD worker process.

Flag names are SGLang's (`arg_groups/fields/*.py`, `_` -> `-`) wherever SGLang has the flag; the
simulator's own knobs start with `--sim-` or are `--emulate`. SGLang's env-only settings
(SGLANG_DISAGGREGATION_WAITING_TIMEOUT, SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE[_TIMEOUT],
SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, SGLANG_EXPOSE_OWN_ENV_VARS) are read from the environment.
"""

from __future__ import annotations

import argparse
import logging
import shlex

from kvgate.sim.lifecycle import run_until_signalled
from kvgate.upstream.releases import RELEASES


def human_int(value: str) -> int:
    """SGLang's `human_readable_int`: 1048576, 1M, 512K, 2G."""
    v = value.strip().upper()
    mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(v[-1:], 1)
    return int(float(v[:-1]) * mult) if mult != 1 else int(v)


def build_parser() -> argparse.ArgumentParser:
    """The worker's command line."""
    p = argparse.ArgumentParser(prog="python -m kvgate.sim worker", description=__doc__)
    p.add_argument("--model-path", "--model", default="kvgate-sim/byte-echo")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--disaggregation-mode", choices=["prefill", "decode"], required=True)
    p.add_argument("--disaggregation-bootstrap-port", type=int, default=8998)
    p.add_argument(
        "--disaggregation-transfer-backend",
        default="mooncake",
        choices=["mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp"],
        help="reported only: the simulator always moves KV over its loopback protocol",
    )
    p.add_argument("--disaggregation-ib-device", default=None)
    p.add_argument(
        "--disaggregation-enable-kv-checksum",
        action="store_true",
        help="0.5.21+; accepted and reported in server_info. STUB: no checksum is computed.",
    )
    p.add_argument("--context-length", type=human_int, default=None)
    p.add_argument("--max-total-tokens", type=human_int, default=None)
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--chunked-prefill-size", type=human_int, default=8192)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--allow-auto-truncate", action="store_true")
    p.add_argument(
        "--enable-metrics",
        action="store_true",
        help="serve /metrics (SGLang's Prometheus page; the simulator's carries the request counters only)",
    )
    p.add_argument(
        "--skip-tokenizer-init",
        action="store_true",
        help="answers carry output_ids only, no text (SGLang's --skip-tokenizer-init)",
    )
    p.add_argument(
        "--kv-canary",
        choices=["none", "log", "raise"],
        default="none",
        help="accepted and reported. STUB: no canary runs.",
    )
    p.add_argument("--kv-canary-real-data", choices=["none", "partial", "all"], default="none")
    p.add_argument("--kv-canary-sweep-interval", type=int, default=0)
    p.add_argument("--skip-server-warmup", action="store_true")
    p.add_argument("--device", default="cpu")
    p.add_argument("--tp-size", "--tp", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--base-gpu-id", type=int, default=0, help="accepted for command-line compatibility")
    p.add_argument("--nccl-port", type=int, default=None, help="accepted for command-line compatibility")
    p.add_argument("--mem-fraction-static", type=float, default=None, help="reported in server_info only")
    p.add_argument("--disable-overlap-schedule", action="store_true")
    p.add_argument(
        "--emulate", choices=list(RELEASES), default="0.5.20", help="which SGLang release's behaviour to reproduce"
    )
    p.add_argument(
        "--fixed-by",
        choices=["kvgate-backport", "kvgate-backport-hardened"],
        default=None,
        help="emulate kvgate's backport series on 0.5.19/0.5.20 (see kvgate/sim/releases.py)",
    )
    p.add_argument(
        "--sim-prefill-tokens-per-s", type=float, default=2_000_000.0, help="prefill compute speed; 0 = instant"
    )
    p.add_argument(
        "--sim-decode-tokens-per-s",
        type=float,
        default=0.0,
        help="decode speed (one attention over the reservation per token); 0 = as fast as possible",
    )
    p.add_argument(
        "--sim-transfer-tokens-per-s",
        type=float,
        default=0.0,
        help="KV transfer bandwidth in tokens/s; a posted page write lands that much later "
        "(it is in flight meanwhile); 0 = instant",
    )
    p.add_argument(
        "--sim-e2e-factor",
        type=float,
        default=0.0,
        help="a slow end-to-end deployment: an answer of more than one token takes this many times its "
        "time to the KV (the steps after the first token share the rest); 0 = off",
    )
    return p


def main(argv: list[str]) -> None:
    """Parse, build the engine, serve until SIGTERM/SIGINT."""
    from kvgate.sim.config import WorkerConfig
    from kvgate.sim.decode import DecodeEngine
    from kvgate.sim.prefill import PrefillEngine
    from kvgate.sim.releases import get_release
    from kvgate.sim.server import serve

    if argv and argv[0] == "worker":
        argv = argv[1:]
    args = build_parser().parse_args(argv)
    if args.disaggregation_transfer_backend == "fake" and args.disaggregation_mode == "prefill":
        # `arg_groups/pd_disaggregation_hook.py`
        raise SystemExit("AssertionError: Prefill server does not support 'fake' as the transfer backend")
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [{args.disaggregation_mode}:{args.port}] %(message)s")
    cfg = WorkerConfig(
        mode=args.disaggregation_mode,
        host=args.host,
        port=args.port,
        disaggregation_bootstrap_port=args.disaggregation_bootstrap_port,
        disaggregation_transfer_backend=(
            "mooncake"
            if args.disaggregation_transfer_backend == "mooncake_tcp"
            else args.disaggregation_transfer_backend
        ),
        disaggregation_ib_device=args.disaggregation_ib_device,
        context_length=args.context_length,
        max_total_tokens=args.max_total_tokens,
        page_size=args.page_size,
        chunked_prefill_size=args.chunked_prefill_size,
        max_running_requests=args.max_running_requests,
        model_path=args.model_path,
        served_model_name=args.served_model_name,
        allow_auto_truncate=args.allow_auto_truncate,
        skip_tokenizer_init=args.skip_tokenizer_init,
        enable_metrics=args.enable_metrics,
        disaggregation_enable_kv_checksum=args.disaggregation_enable_kv_checksum,
        kv_canary=args.kv_canary,
        kv_canary_real_data=args.kv_canary_real_data,
        kv_canary_sweep_interval=args.kv_canary_sweep_interval,
        emulate=args.emulate,
        fixed_by=args.fixed_by,
        sim_prefill_tokens_per_s=args.sim_prefill_tokens_per_s,
        sim_decode_tokens_per_s=args.sim_decode_tokens_per_s,
        sim_transfer_tokens_per_s=args.sim_transfer_tokens_per_s,
        sim_e2e_factor=args.sim_e2e_factor,
        mem_fraction_static=args.mem_fraction_static,
        tp_size=args.tp_size,
        launch_command="python -m kvgate.sim worker " + shlex.join(argv),
    )
    try:
        release = get_release(args.emulate, args.fixed_by)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    if args.disaggregation_enable_kv_checksum and not release.has_kv_checksum_flag:
        raise SystemExit(f"error: unrecognized arguments: --disaggregation-enable-kv-checksum (not in {args.emulate})")
    engine = (PrefillEngine if cfg.mode == "prefill" else DecodeEngine)(cfg, release)

    run_until_signalled(serve(engine))
