"""`kvgate sim ...`: run the embedded PD simulator behind the real SGLang router.

Thin on purpose: parse, build a SimDeployment, print its URLs, wait for Ctrl-C/SIGTERM, tear down.
Heavy modules (numpy, fastapi) are never imported here: they load in the worker processes only.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from typer.core import TyperCommand

from kvgate.defaults import INCIDENT_RELEASE
from kvgate.errors import InternalError, KvgateError, UsageError
from kvgate.output import sinks

F = TypeVar("F", bound=Callable[..., Any])

sim_app = typer.Typer(
    name="sim",
    help="Embedded SGLang PD simulator (real paged KV pool, per-release behaviour, the real router in front).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


class _SimUpCommand(TyperCommand):
    """`sim up`, reading the old `--deferred-release on|off|default` form as the one flag pair every command
    shows (`--deferred-release` / `--no-deferred-release`, absent: the release's default), said once."""

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        new: list[str] = []
        rest = list(args)
        while rest:
            arg = rest.pop(0)
            value = arg.split("=", 1)[1] if arg.startswith("--deferred-release=") else None
            if arg == "--deferred-release" and rest and rest[0] in _OLD_DEFERRED:
                value = rest.pop(0)
            if value in _OLD_DEFERRED:
                flag = _OLD_DEFERRED[value]
                sinks.echo(
                    f"kvgate: warning: --deferred-release {value} is deprecated; use {flag or 'neither flag'}", err=True
                )
                new += [flag] if flag else []
                continue
            new.append(arg)
            if arg == "--":
                new += rest
                break
        return super().make_context(info_name, new, parent=parent, **extra)


_OLD_DEFERRED = {"on": "--deferred-release", "off": "--no-deferred-release", "default": ""}


def _exit_on_errors(func: F) -> F:
    """The simulator's fatal path (it writes no report): a domain error exits with its own status,
    anything else is kvgate's own crash (exit 5); one `kvgate: error:` line on stderr, no traceback.
    Kept here rather than borrowed from `kvgate.commands`, a layer above the simulator."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except Exception as exc:  # noqa: BLE001 - the one place `sim up` turns a crash into an exit status
            err = exc if isinstance(exc, KvgateError) else InternalError(func.__name__, exc)
            sinks.echo(f"kvgate: error: {err}", err=True)
            raise typer.Exit(int(err.exit_status)) from None

    return wrapper  # type: ignore[return-value]


@sim_app.command("up", cls=_SimUpCommand)
@_exit_on_errors
def up(
    release: str | None = typer.Option(
        None,
        "--release",
        metavar="R",
        help="SGLang release to reproduce, 0.5.19-0.5.23 (default 0.5.19, the incident's, as drill).",
    ),
    emulate_old: str | None = typer.Option(None, "--emulate", hidden=True),
    fixed_by: str | None = typer.Option(
        None, help="kvgate-backport or kvgate-backport-hardened: emulate kvgate's backport on 0.5.19/0.5.20."
    ),
    prefill: int = typer.Option(1, "--prefill", min=1, help="Number of prefill workers."),
    decode: int = typer.Option(1, "--decode", min=1, help="Number of decode workers."),
    context_length: int = typer.Option(8192, help="--context-length of every worker."),
    prefill_pool: int = typer.Option(4096, help="Prefill KV pool in tokens (--max-total-tokens)."),
    decode_pool: int = typer.Option(65536, help="Decode KV pool in tokens (--max-total-tokens)."),
    page_size: int = typer.Option(16, help="--page-size."),
    chunked_prefill_size: int = typer.Option(8192, help="--chunked-prefill-size."),
    waiting_timeout: float | None = typer.Option(
        None, help="Decode waiting timeout in seconds (SGLANG_DISAGGREGATION_WAITING_TIMEOUT; SGLang: 300)."
    ),
    deferred_release: bool | None = typer.Option(
        None,
        "--deferred-release/--no-deferred-release",
        help="SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE of the workers (default: the release's).",
    ),
    prefill_tokens_per_s: float = typer.Option(2_000_000.0, help="Simulated prefill speed (0 = instant)."),
    decode_tokens_per_s: float = typer.Option(0.0, help="Simulated decode speed (0 = as fast as possible)."),
    transfer_tokens_per_s: float = typer.Option(0.0, help="Simulated KV transfer bandwidth (0 = instant)."),
    e2e_factor: float = typer.Option(
        0.0,
        help="A slow end-to-end deployment: answers of more than one token take this many times their time "
        "to the KV (0 = off).",
    ),
    expose_env_vars: bool = typer.Option(False, help="SGLANG_EXPOSE_OWN_ENV_VARS=1 (env_vars in internal_states)."),
    inject_fault: str | None = typer.Option(
        None,
        help="An injected decode fault (not a release): under load meta-slot-shared, "
        "meta-slot-shared-unchecked or early-page-reuse; on every request handoff-layout; after "
        "--drift-after requests gradual-drift (kvgate/sim/faults.py).",
    ),
    drift_after: int | None = typer.Option(
        None, min=0, help="Decode requests gradual-drift answers right before its answers drift (default 100)."
    ),
    log_dir: Path | None = typer.Option(None, help="Where per-process logs go (default: a temp folder)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines on stderr (the URLs still print)."),
) -> None:
    """Start router + workers, print their URLs and one JSON line, stay up until Ctrl-C/SIGTERM."""
    from kvgate.deploy.supervisor import stop_on_sigterm
    from kvgate.extras import require_sim
    from kvgate.sim.deploy import SimDeployment
    from kvgate.upstream.releases import RELEASES

    require_sim("kvgate sim up")
    if release is not None and emulate_old is not None:
        raise UsageError("--emulate is the deprecated spelling of --release: give --release only")
    if emulate_old is not None:
        sinks.echo("kvgate: warning: --emulate is deprecated; use --release", err=True)
    emulate = release or emulate_old or INCIDENT_RELEASE
    if emulate not in RELEASES:
        raise UsageError(f"--release {emulate!r}: choose one of {', '.join(RELEASES)}")
    from kvgate.sim.releases import get_release

    try:
        get_release(emulate, fixed_by)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    from kvgate.sim import faults

    try:
        faults.check(inject_fault)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    dep = SimDeployment(
        emulate=emulate,
        fixed_by=fixed_by,
        prefill=prefill,
        decode=decode,
        context_length=context_length,
        prefill_pool=prefill_pool,
        decode_pool=decode_pool,
        page_size=page_size,
        chunked_prefill_size=chunked_prefill_size,
        waiting_timeout=waiting_timeout,
        deferred_release=deferred_release,
        prefill_tokens_per_s=prefill_tokens_per_s,
        decode_tokens_per_s=decode_tokens_per_s,
        transfer_tokens_per_s=transfer_tokens_per_s,
        e2e_factor=e2e_factor,
        expose_env_vars=expose_env_vars,
        log_dir=log_dir,
        extra_env={
            **({faults.ENV: inject_fault} if inject_fault else {}),
            **({faults.DRIFT_ENV: str(drift_after)} if drift_after is not None else {}),
        },
    )
    # Ctrl-C, and SIGTERM (stop_on_sigterm), arrive as KeyboardInterrupt: a clean stop, exit 0.
    with stop_on_sigterm():
        try:
            dep.start()
            info = dep.info()
            sinks.echo(f"kvgate sim: SGLang {emulate} PD deployment is up (logs: {info['logs']})")
            sinks.echo(f"  router : {info['router']}")
            for url, bport in zip(info["prefill"], info["bootstrap_ports"], strict=True):
                sinks.echo(f"  prefill: {url} (bootstrap port {bport})")
            for url in info["decode"]:
                sinks.echo(f"  decode : {url}")
            sinks.echo(json.dumps({"router": info["router"], "prefill": info["prefill"], "decode": info["decode"]}))
            if not quiet:
                sinks.echo("Press Ctrl-C to stop.", err=True)
            assert dep.supervisor is not None
            dep.supervisor.watch()  # until Ctrl-C / SIGTERM, or a process exits (SupervisorError, exit 2)
        except KeyboardInterrupt:
            if not quiet:
                sinks.echo("kvgate sim: stopping", err=True)
        finally:
            dep.stop()
