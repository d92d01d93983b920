"""`kvgate up`: start a real SGLang PD deployment (or the simulator) and, with --gate, gate it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from kvgate.commands import options as opt
from kvgate.commands._common import (
    deprecated_alias,
    fatal_report,
    finish,
    handle_errors,
    logs_left,
    resolve_strict,
    with_notes,
)
from kvgate.errors import Interrupted, KvgateError, UsageError
from kvgate.formats import ReportFormat
from kvgate.output import sinks

if TYPE_CHECKING:  # the launcher and the pipeline load when the command runs, not for --help
    from kvgate.deploy.launch import PDDeployment
    from kvgate.gates.base import CheckOptions


@handle_errors
def up(
    model_path: str | None = typer.Option(
        None, "--model-path", help="Model for every worker (SGLang --model-path; --device cpu: kvgate's tiny model)."
    ),
    prefill: int = opt.prefill(),
    decode: int = opt.decode(),
    tp_size: int = typer.Option(1, "--tp-size", min=1, help="GPUs per worker; workers get consecutive GPUs."),
    tp_old: int | None = typer.Option(None, "--tp", min=1, hidden=True),  # `plan`'s spelling
    dp_size: int = typer.Option(
        1,
        "--dp-size",
        min=1,
        help="DP ranks per worker (SGLang --dp-size; the router routes to ranks). --engine sglang.",
    ),
    context_length: int | None = opt.context_length("SGLang --context-length."),
    prefill_pool: int | None = opt.prefill_pool("Prefill --max-total-tokens."),
    decode_pool: int | None = opt.decode_pool("Decode --max-total-tokens."),
    mem_fraction_static: float | None = opt.mem_fraction_static("SGLang's flag."),
    page_size: int | None = opt.page_size("SGLang --page-size."),
    transfer_backend: str = typer.Option(
        "mooncake", "--transfer-backend", help="mooncake, nixl, ascend, mori, mooncake_tcp."
    ),
    ib_device: str | None = typer.Option(None, "--ib-device", help="SGLang --disaggregation-ib-device."),
    python: str | None = opt.python("Interpreter that has sglang (default: this one)."),
    engine: str = opt.engine("sglang (real workers) or sim (the simulator).", default="sglang"),
    device: str = typer.Option("gpu", "--device", help="gpu, or cpu: the real server on this CPU (needs --release)."),
    release: str | None = opt.release(
        "SGLang release, 0.5.19-0.5.23: to reproduce (--engine sim) or to run (--device cpu)."
    ),
    skip_tokenizer_init: bool = opt.skip_tokenizer_init("Workers take input_ids and answer output_ids only."),
    emulate_old: str | None = opt.emulate_old(),
    ready_deadline: float = typer.Option(1800.0, "--ready-deadline", min=1.0, help="Seconds to wait for readiness."),
    log_dir: Path | None = typer.Option(None, "--log-dir", help="Per-process logs (default: a temp folder)."),
    gate: bool = typer.Option(False, "--gate", help="Run kvgate check once ready, tear down, exit with its status."),
    fmt: list[ReportFormat] = opt.format("Report format with --gate (repeatable)."),
    output: list[Path] = opt.output(),
    strict: bool | None = opt.strict("With --gate: " + opt.STRICT_HELP),
    profile: str | None = opt.profile("With --gate: gate profile (file or bundled name, e.g. cpu-tiny)."),
    quiet: bool = opt.quiet(),
    verbose: bool = opt.verbose(),
    worker_arg: list[str] = typer.Option([], "--worker-arg", help="Extra argument for every worker (repeatable)."),
) -> None:
    """Start prefill and decode workers and the real router; print the URLs, or gate them with --gate."""
    import sys

    from kvgate.deploy.launch import PDDeployment, PDLaunchPlan
    from kvgate.formats.reporting import pair_outputs
    from kvgate.output.progress import terminal_observer
    from kvgate.pipeline.check import run_check

    pairs = pair_outputs(list(fmt), list(output))
    if tp_old is not None:
        if tp_size not in (1, tp_old):
            raise UsageError(f"--tp {tp_old} and --tp-size {tp_size} disagree: give one")
        tp_size = tp_old
    release = deprecated_alias("--release", "--emulate", release, emulate_old)
    emulate, release = (release, None) if engine == "sim" else (None, release)
    plan = PDLaunchPlan(
        model_path=model_path,
        prefill=prefill,
        decode=decode,
        tp_size=tp_size,
        dp_size=dp_size,
        context_length=context_length,
        prefill_max_total_tokens=prefill_pool,
        decode_max_total_tokens=decode_pool,
        mem_fraction_static=mem_fraction_static,
        page_size=page_size,
        transfer_backend=transfer_backend,
        ib_device=ib_device,
        python=python or sys.executable,
        engine=engine,
        emulate=emulate,
        device=device,
        release=release,
        skip_tokenizer_init=skip_tokenizer_init,
        extra_worker_args=tuple(worker_arg),
        ready_deadline_s=ready_deadline,
        # So that the defenses gate can read the deferred-release setting the workers really run with.
        env={"SGLANG_EXPOSE_OWN_ENV_VARS": "1"},
    )
    plan.validate()
    if device == "cpu" and engine == "sglang" and release is None:
        raise UsageError("--device cpu runs kvgate's CPU environment of one release: give --release (0.5.19-0.5.23)")
    if engine == "sim" and model_path is not None:
        sinks.echo("kvgate up: note: --engine sim serves its own toy model; --model-path is not used", err=True)
    if model_path is None and release is None and engine == "sglang":
        raise UsageError("--model-path is required (only --device cpu --release R has a default model)")
    dep = PDDeployment(plan, log_dir=log_dir)
    # Ctrl-C, and SIGTERM (handle_errors installs the handler), arrive here as KeyboardInterrupt.
    try:
        observer = terminal_observer(quiet)
        if observer:
            observer.log(f"starting {prefill} prefill + {decode} decode ({engine}) and the router")
        if not gate:
            dep.start()
            info = dep.info()
            sinks.echo(f"kvgate up: PD deployment is up (logs: {info['logs']})")
            sinks.echo(json.dumps({k: info[k] for k in ("router", "prefill", "decode")}))
            sinks.echo("Press Ctrl-C to stop.", err=True)
            assert dep.supervisor is not None
            dep.supervisor.watch()  # until Ctrl-C / SIGTERM, or a process exits (exit 2)
        try:
            with dep:
                options = _gate_options(dep, profile, strict, context_length, engine)
                report = run_check(options, observer=observer)
        except KvgateError as exc:
            report = fatal_report("up --gate", exc)
        finish(with_notes(report, logs_left("worker logs", dep.log_dir)), pairs, verbose)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (kvgate.deploy.supervisor.Stopped)
        sinks.echo("kvgate up: stopping", err=True)
        dep.stop()
        left = logs_left("worker logs", dep.log_dir)
        if gate:  # no verdict: the report says so (exit 130), and where the logs are
            finish(with_notes(fatal_report("up --gate", Interrupted("up")), left), pairs, verbose)
        for note in left:
            sinks.echo(f"kvgate up: {note}", err=True)
    finally:
        dep.stop()


def _gate_options(
    dep: PDDeployment, profile: str | None, strict: bool | None, context_length: int | None, engine: str
) -> CheckOptions:
    """What `up --gate` checks on the deployment it started: its URLs, the profile, the flags."""
    from kvgate.gates.base import CheckOptions
    from kvgate.gates.profiles import load as load_profile

    prof = load_profile(profile) if profile else None
    is_strict, strict_source = resolve_strict(strict, prof.strict if prof else None)
    return CheckOptions(
        prefill_urls=tuple(dep.prefill_urls),
        decode_urls=tuple(dep.decode_urls),
        router_url=dep.router_url,
        strict=is_strict,
        strict_source=strict_source,
        timeout=30.0,
        context_len=context_length,
        profile_name=prof.name if prof else None,
        headroom=prof.headroom if prof and prof.headroom else CheckOptions.headroom,
        probes=prof.probes if prof else {},
        # The simulator runs no sglang code: its emulated release is the evidence.
        defenses={**(prof.defenses if prof else {}), **({"trust_version": True} if engine == "sim" else {})},
        waivers=prof.waivers if prof else (),
        code=dep.code_sources(),
    )
