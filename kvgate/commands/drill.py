"""`kvgate drill`: the whole gate against the embedded simulator, for demos, CI and operator drills.

Starts a simulated PD deployment (the release to reproduce, the real smg router in front), runs every
gate of `kvgate check` against it, tears it down, and exits as `check` would. With the defaults (the
incident's pool and context) and `--emulate 0.5.19` the gate must fail.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from kvgate.commands._common import STRICT_HELP, fatal_report, finish, handle_errors, resolve_strict
from kvgate.commands.check import _observer
from kvgate.errors import KvgateError, UsageError
from kvgate.formats import ReportFormat
from kvgate.gates.base import CheckOptions
from kvgate.reporting import pair_outputs


@handle_errors
def drill(
    emulate: str = typer.Option("0.5.19", "--emulate", help="SGLang release the simulator reproduces (0.5.19-0.5.23)."),
    context_length: int = typer.Option(1_048_576, "--context-length", min=16, help="Context of every worker."),
    prefill_pool: int = typer.Option(681_280, "--prefill-pool", min=16, help="Prefill KV pool in tokens."),
    decode_pool: int = typer.Option(2_097_152, "--decode-pool", min=16, help="Decode KV pool in tokens."),
    prefill: int = typer.Option(1, "--prefill", min=1, help="Prefill workers."),
    decode: int = typer.Option(1, "--decode", min=1, help="Decode workers."),
    page_size: int = typer.Option(16, "--page-size", min=1, help="KV page size in tokens."),
    deferred_release: Optional[bool] = typer.Option(
        None, "--deferred-release/--no-deferred-release",
        help="SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE of the workers (default: the release's)."),
    tenants: Optional[int] = typer.Option(None, "--tenants", min=1, help="Concurrent canary tenants per round."),
    keep_going: bool = typer.Option(False, "--keep-going", help="Run every probe even after a confirmed leak."),
    fmt: List[ReportFormat] = typer.Option([], "--format", "-f", help="Report format (repeatable)."),
    output: List[Path] = typer.Option([], "--output", "-o", help="File for the matching --format (repeatable)."),
    strict: Optional[bool] = typer.Option(None, "--strict/--no-strict", help=STRICT_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines on stderr."),
) -> None:
    """Run the full gate against a simulated PD deployment behind the real router."""
    from kvgate.check import run_check

    pairs = pair_outputs(list(fmt), list(output))
    probes: dict[str, object] = {}
    if tenants is not None:
        probes["tenants"] = tenants
    if keep_going:
        probes["early_stop"] = False
    observer = _observer(quiet)
    is_strict, strict_source = resolve_strict(strict)
    try:
        from kvgate.sim.deploy import SimDeployment
        from kvgate.sim.releases import SUPPORTED

        if emulate not in SUPPORTED:
            raise UsageError(f"--emulate {emulate!r}: choose one of {', '.join(SUPPORTED)}")
        dep = SimDeployment(
            emulate=emulate, prefill=prefill, decode=decode, context_length=context_length,
            prefill_pool=prefill_pool, decode_pool=decode_pool, page_size=page_size,
            deferred_release=deferred_release, expose_env_vars=True,
        )
        if observer:
            observer.log(f"starting a simulated SGLang {emulate} deployment: context {context_length:,}, "
                         f"prefill pool {prefill_pool:,}, decode pool {decode_pool:,}")
        with dep:
            options = CheckOptions(
                prefill_urls=tuple(dep.prefill_urls), decode_urls=tuple(dep.decode_urls),
                router_url=dep.router_url, timeout=30.0, strict=is_strict, strict_source=strict_source,
                profile_name=f"drill {emulate}",
                probes=probes,
            )
            report = run_check(options, observer=observer)
    except ImportError as exc:
        report = fatal_report("drill", UsageError(f"the simulator needs kvgate[sim,router]: {exc}"))
    except KvgateError as exc:
        report = fatal_report("drill", exc)
    finish(report, pairs)
