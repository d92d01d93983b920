"""`kvgate plan`: predict the KV pool SGLang will size, before the GPUs are paid for."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import typer

from kvgate.commands import options as opt
from kvgate.commands._common import (
    fatal_report,
    finish,
    handle_errors,
    with_anchors,
)
from kvgate.errors import KvgateError, UsageError
from kvgate.formats import ReportFormat
from kvgate.formats.reporting import pair_outputs

ROLES = ("prefill", "decode")


@handle_errors
def plan(
    model_config: Path | None = opt.model_config("The model's config.json (or its folder)."),
    gpu_memory_gib: float | None = typer.Option(
        None, "--gpu-memory-gib", help="Free GiB per GPU before the weights load (e.g. 139.5 on an H200)."
    ),
    gpus_per_worker: int | None = typer.Option(
        None, "--gpus-per-worker", min=1, help="GPUs of one worker (default tp x pp)."
    ),
    tp: int | None = typer.Option(None, "--tp", min=1, help="--tp-size of the workers."),
    tp_size: int | None = typer.Option(None, "--tp-size", min=1, hidden=True),  # `up`'s and SGLang's spelling
    dp: int | None = typer.Option(None, "--dp", min=1, help="--dp-size of the workers (default 1)."),
    attention_dp: bool = typer.Option(False, "--attention-dp", help="--enable-dp-attention: one pool per DP rank."),
    pp: int | None = typer.Option(None, "--pp", min=1, help="--pp-size of the workers (default 1)."),
    mem_fraction_static: float | None = opt.mem_fraction_static("As given to the workers."),
    kv_cache_dtype: str | None = typer.Option(None, "--kv-cache-dtype", help="auto (default), bfloat16 or fp8_e4m3."),
    page_size: int | None = opt.page_size("The page size server_info reports (default 1)."),
    context_length: int | None = opt.context_length("Advertised context the pool must hold."),
    headroom: float | None = opt.headroom("Required pool / context ratio (default 1.25)."),
    weights_gib: float | None = typer.Option(
        None, "--weights-gib", min=0.0, help="Measured weight GiB per GPU (default: estimated from the config)."
    ),
    max_total_tokens: int | None = typer.Option(
        None, "--max-total-tokens", min=1, help="The workers' pool cap, if any."
    ),
    release: str | None = opt.release("SGLang release whose sizing code to follow (default 0.5.23)."),
    gpu_sm: int | None = typer.Option(
        None, "--gpu-sm", help="GPU compute capability x10 (90 Hopper, 100 Blackwell); decides DSA's auto KV dtype."
    ),
    profile: str | None = opt.profile("Gate profile whose deployment: section to plan."),
    fmt: list[ReportFormat] = opt.format(),
    output: list[Path] = opt.output(),
    quiet: bool = opt.quiet(opt.QUIET_HELP + " plan prints none; accepted everywhere."),
    verbose: bool = opt.verbose(),
    sarif_anchor: Path | None = opt.sarif_anchor(),
) -> None:
    """Predict the KV pool SGLang sizes for a deployment; exit 1 when it cannot hold context x headroom."""
    pairs = pair_outputs(list(fmt), list(output))
    if tp is not None and tp_size is not None and tp != tp_size:
        finish(fatal_report("plan", UsageError(f"--tp {tp} and --tp-size {tp_size} disagree: give one")), pairs)
    tp = tp if tp is not None else tp_size
    flags = {
        "model_config": None if model_config is None else str(model_config),
        "gpu_memory_gib": gpu_memory_gib,
        "gpus_per_worker": gpus_per_worker,
        "tp": tp,
        "dp": dp,
        "attention_dp": attention_dp or None,
        "pp": pp,
        "mem_fraction_static": mem_fraction_static,
        "kv_cache_dtype": kv_cache_dtype,
        "page_size": page_size,
        "weights_gib": weights_gib,
        "max_total_tokens": max_total_tokens,
        "release": release,
        "gpu_sm": gpu_sm,
        "context_length": context_length,
        "headroom": headroom,
    }
    try:
        from kvgate.plan.planner import plan_worker
        from kvgate.plan.verdict import plan_report

        plans = {role: plan_worker(inputs) for role, inputs in role_inputs(flags, profile).items()}
        report = plan_report(plans)
    except KvgateError as exc:
        report = fatal_report("plan", exc, strict=False)
    finish(with_anchors(report, profile_file=profile, sarif_anchor=sarif_anchor), pairs, verbose)


def role_inputs(flags: dict[str, Any], profile_ref: str | None) -> dict[str, Any]:
    """PlanInputs per role: flags win, then the profile's deployment (role, then common), then defaults."""
    from kvgate.gates.profiles import Profile, load
    from kvgate.plan.model import load_shape
    from kvgate.plan.planner import PlanInputs

    prof = load(profile_ref) if profile_ref else Profile(name="(none)", path="")
    given = {k: v for k, v in flags.items() if v is not None}
    allowed = {f.name for f in fields(PlanInputs)}
    out = {}
    for role in ROLES:
        merged: dict[str, Any] = dict(prof.deployment.get(role, {}))
        if prof.context_length is not None:
            merged.setdefault("context_length", prof.context_length)
        if prof.headroom is not None:
            merged.setdefault("headroom", prof.headroom)
        merged.update(given)
        missing = [
            k
            for k in ("model_config", "gpu_memory_gib", "tp", "mem_fraction_static", "context_length")
            if merged.get(k) is None
        ]
        if missing:
            where = f" (profile {prof.path} has no deployment.{missing[0]})" if profile_ref else ""
            raise UsageError(f"kvgate plan needs --{missing[0].replace('_', '-')}{where}")
        shape = load_shape(Path(merged.pop("model_config")))
        if merged.get("gpus_per_worker") is None:
            replicas = 1 if merged.get("attention_dp") else merged.get("dp", 1)
            merged["gpus_per_worker"] = merged["tp"] * merged.get("pp", 1) * replicas
        out[role] = PlanInputs(shape=shape, **{k: v for k, v in merged.items() if k in allowed})
    return out
