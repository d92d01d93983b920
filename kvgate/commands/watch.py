"""`kvgate watch`: keep gating a live PD deployment after promotion; metrics, liveness and a verdict over HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from kvgate.commands import options as opt
from kvgate.commands._common import deprecated_alias, handle_errors
from kvgate.errors import UsageError

DEFAULT_LISTEN = "127.0.0.1:9464"


def parse_listen(value: str) -> tuple[str, int]:
    """HOST:PORT (PORT 0: any free port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"--listen {value!r}: expected HOST:PORT, e.g. 0.0.0.0:9464")
    return host.strip("[]"), int(port)


@handle_errors
def watch(
    router_url: str = opt.router_url("Router URL: its workers are listed every interval.", default=...),
    listen: str = typer.Option(
        DEFAULT_LISTEN, "--listen", help="HOST:PORT serving /metrics, /healthz and /verdict (0.0.0.0 in a pod)."
    ),
    interval: float | None = typer.Option(
        None, "--interval", min=1.0, help="Seconds between metadata passes (default 30; profile watch.interval_s)."
    ),
    max_age: float | None = typer.Option(
        None, "--max-age", min=1.0, help="/verdict is 200 only for a passed gate younger than this (default 7200 s)."
    ),
    regate_every: float | None = typer.Option(
        None, "--regate-every", min=1.0, help="Run the full gate at least this often, changes or not (default 3600 s)."
    ),
    requests_per_min: int | None = typer.Option(
        None, "--requests-per-min", min=0, help="Probe budget: requests in any minute (default 6)."
    ),
    prefill_tokens_per_min: int | None = typer.Option(
        None, "--prefill-tokens-per-min", min=0, help="Probe budget: prompt tokens in any minute (default 32768)."
    ),
    intervals: int | None = typer.Option(
        None, "--stop-after", min=1, metavar="N", help="Stop after N intervals (default: run until stopped)."
    ),
    intervals_old: int | None = typer.Option(None, "--intervals", min=1, hidden=True),
    profile: str | None = opt.profile(),
    context_len: int | None = opt.context_length(),
    context_len_old: int | None = opt.context_len_old(),
    headroom: float | None = opt.headroom("Required pool / context ratio."),
    timeout: float | None = opt.timeout("Seconds per metadata request."),
    strict: bool | None = opt.strict(),
    token_env: str | None = opt.token_env(),
    router_token_env: str | None = opt.router_token_env(),
    quiet: bool = opt.quiet("No log lines on stderr."),
    probe_deadline: float | None = opt.probe_deadline("Seconds one probe may take before it counts as a hang."),
    tenants: int | None = opt.tenants("Concurrent canary tenants per gate round."),
    keep_going: bool = opt.keep_going("Full gates run every probe, even after a leak."),
    deferred_release_env: bool | None = opt.deferred_release(
        "What SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE is set to, when workers do not expose it."
    ),
    deferred_release_old: bool | None = opt.deferred_release_old(),
    model_arch: str | None = opt.model_arch("Model architecture, when workers do not say."),
    site_packages: str | None = opt.site_packages("Folder holding the sglang/ package every worker runs."),
    python: str | None = opt.python("Command running the workers' Python."),
    scan_timeout: float | None = opt.scan_timeout("Seconds --python may take."),
    trust_version: bool = opt.trust_version(),
    probes: bool = opt.probes("Probe through the router (gates and schedule)."),
    concurrency: int = opt.concurrency("Workers a full gate reads at once."),
    read_deadline: float | None = opt.read_deadline("Seconds a full gate's metadata read may take."),
    model_config: Path | None = opt.model_config("The model's config.json."),
) -> None:
    """Keep gating a live PD deployment: re-gate on every capacity change, probe within a traffic budget,
    and serve Prometheus metrics, /healthz and a promotion verdict (/verdict)."""
    import threading
    from dataclasses import replace

    from kvgate.commands.check import check_options, gate_flags
    from kvgate.extras import require_watch
    from kvgate.output.progress import LineObserver
    from kvgate.output.redact import token_from_env

    require_watch("kvgate watch")
    from kvgate.watch.loop import Watcher
    from kvgate.watch.settings import WatchSettings

    host, port = parse_listen(listen)
    context_len = deprecated_alias("--context-length", "--context-len", context_len, context_len_old)
    deferred_release_env = deprecated_alias(
        "--deferred-release", "--deferred-release-env", deferred_release_env, deferred_release_old
    )
    intervals = deprecated_alias("--stop-after", "--intervals", intervals, intervals_old)
    options = check_options(
        [],
        [],
        router_url,
        profile,
        context_len,
        headroom,
        timeout,
        strict,
        **gate_flags(locals()),
    )
    from kvgate.gates.profiles import load
    from kvgate.pipeline.check import node_specs

    node_specs(options)  # validates --router-url
    section = load(profile).watch if profile else {}
    settings = WatchSettings.from_mapping(section, options.profile_name or "watch settings")
    flags: dict[str, Any] = {
        "interval_s": interval,
        "max_age_s": max_age,
        "regate_every_s": regate_every,
        "requests_per_min": requests_per_min,
        "prefill_tokens_per_min": prefill_tokens_per_min,
    }
    settings = replace(settings, **{k: v for k, v in flags.items() if v is not None})
    settings.check("flags")
    log = (lambda _m: None) if quiet else LineObserver().log
    try:
        watcher = Watcher(
            options,
            settings,
            listen=(host, port),
            token=token_from_env(token_env),
            log=log,
            router_token=token_from_env(router_token_env, flag="--router-token-env"),
        )
    except OSError as exc:
        raise UsageError(f"--listen {listen}: cannot serve there: {exc}") from None
    try:
        watcher.run(threading.Event(), max_intervals=intervals)
    except KeyboardInterrupt:  # SIGTERM (kvgate.deploy.supervisor.Stopped) or Ctrl-C: the normal end of a watch
        pass
    raise typer.Exit(0)
