"""`kvgate sim ...`: run the embedded PD simulator behind the real SGLang router.

Thin on purpose: parse, build a SimDeployment, print its URLs, wait for Ctrl-C/SIGTERM, tear down.
Heavy modules (torch, fastapi) are never imported here: they load in the worker processes only.
"""

from __future__ import annotations

import json
import signal
import time
from enum import Enum
from pathlib import Path
from types import FrameType
from typing import Optional

import typer

from kvgate.commands._common import handle_errors
from kvgate.errors import UsageError

sim_app = typer.Typer(
    name="sim",
    help="Embedded SGLang PD simulator (real paged KV pool, per-release behaviour, the real router in front).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


class Deferred(str, Enum):
    """--deferred-release: SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE for every worker."""

    on = "on"
    off = "off"
    default = "default"


class _Stop(Exception):
    """Raised from the SIGTERM handler to unwind into the teardown."""


def _on_sigterm(signum: int, frame: Optional[FrameType]) -> None:
    raise _Stop()


@sim_app.command("up")
@handle_errors
def up(
    emulate: str = typer.Option("0.5.20", help="SGLang release to reproduce: 0.5.19 .. 0.5.23."),
    fixed_by: Optional[str] = typer.Option(
        None, help="kvgate-backport or kvgate-backport-hardened: emulate kvgate's backport on 0.5.19/0.5.20."),
    prefill: int = typer.Option(1, "--prefill", min=1, help="Number of prefill workers."),
    decode: int = typer.Option(1, "--decode", min=1, help="Number of decode workers."),
    context_length: int = typer.Option(8192, help="--context-length of every worker."),
    prefill_pool: int = typer.Option(4096, help="Prefill KV pool in tokens (--max-total-tokens)."),
    decode_pool: int = typer.Option(65536, help="Decode KV pool in tokens (--max-total-tokens)."),
    page_size: int = typer.Option(16, help="--page-size."),
    chunked_prefill_size: int = typer.Option(8192, help="--chunked-prefill-size."),
    waiting_timeout: Optional[float] = typer.Option(
        None, help="Decode waiting timeout in seconds (SGLANG_DISAGGREGATION_WAITING_TIMEOUT; SGLang: 300)."),
    deferred_release: Deferred = typer.Option(
        Deferred.default, help="Deferred decode KV release: on, off, or the release's default."),
    prefill_tokens_per_s: float = typer.Option(2_000_000.0, help="Simulated prefill speed (0 = instant)."),
    decode_tokens_per_s: float = typer.Option(0.0, help="Simulated decode speed (0 = as fast as possible)."),
    transfer_tokens_per_s: float = typer.Option(0.0, help="Simulated KV transfer bandwidth (0 = instant)."),
    seed: int = typer.Option(0, help="--random-seed."),
    expose_env_vars: bool = typer.Option(False, help="SGLANG_EXPOSE_OWN_ENV_VARS=1 (env_vars in internal_states)."),
    log_dir: Optional[Path] = typer.Option(None, help="Where per-process logs go (default: a temp folder)."),
) -> None:
    """Start router + workers, print their URLs and one JSON line, stay up until Ctrl-C/SIGTERM."""
    from kvgate.sim.deploy import SimDeployment
    from kvgate.sim.releases import SUPPORTED
    from kvgate.supervisor import SupervisorError

    from kvgate.extras import require_sim

    require_sim("kvgate sim up")
    if emulate not in SUPPORTED:
        raise UsageError(f"--emulate {emulate!r}: choose one of {', '.join(SUPPORTED)}")
    from kvgate.sim.releases import get_release

    try:
        get_release(emulate, fixed_by)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    dep = SimDeployment(
        emulate=emulate, fixed_by=fixed_by, prefill=prefill, decode=decode, context_length=context_length,
        prefill_pool=prefill_pool, decode_pool=decode_pool, page_size=page_size,
        chunked_prefill_size=chunked_prefill_size, waiting_timeout=waiting_timeout,
        deferred_release=None if deferred_release is Deferred.default else deferred_release is Deferred.on,
        prefill_tokens_per_s=prefill_tokens_per_s, decode_tokens_per_s=decode_tokens_per_s,
        transfer_tokens_per_s=transfer_tokens_per_s, seed=seed,
        expose_env_vars=expose_env_vars, log_dir=log_dir,
    )
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        dep.start()
        info = dep.info()
        typer.echo(f"kvgate sim: SGLang {emulate} PD deployment is up (logs: {info['logs']})")
        typer.echo(f"  router : {info['router']}")
        for url, bport in zip(info["prefill"], info["bootstrap_ports"]):
            typer.echo(f"  prefill: {url} (bootstrap port {bport})")
        for url in info["decode"]:
            typer.echo(f"  decode : {url}")
        typer.echo(json.dumps({"router": info["router"], "prefill": info["prefill"], "decode": info["decode"]}),
                   nl=True)
        typer.echo("Press Ctrl-C to stop.", err=True)
        while True:
            time.sleep(0.5)
            assert dep.supervisor is not None
            dead = [p for p in dep.supervisor.processes if not p.alive()]
            if dead:
                names = ", ".join(p.name for p in dead)
                raise SupervisorError(f"{names} exited unexpectedly; see {dep.log_dir}")
    except (KeyboardInterrupt, _Stop):
        typer.echo("kvgate sim: stopping", err=True)
    finally:
        dep.stop()
        signal.signal(signal.SIGTERM, previous)
