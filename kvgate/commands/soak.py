"""`kvgate soak`: sustained, production-shaped load through the router with the content checks
interleaved, judged per timeslice against the profile's service levels."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from kvgate.commands import options as opt
from kvgate.commands._common import fatal_report, finish, handle_errors
from kvgate.errors import KvgateError
from kvgate.formats import ReportFormat

#: environment variables that say the output is a CI log (no progress bar there, even on a pseudo-TTY)
CI_ENV = ("CI", "GITHUB_ACTIONS", "GITLAB_CI", "BUILDKITE", "JENKINS_URL", "TF_BUILD")


@handle_errors
def soak(
    router_url: str = opt.router_url("Router URL: the load and the checks go through it.", default=...),
    profile: str | None = opt.profile(),
    duration: float | None = typer.Option(
        None, "--duration", min=1.0, help="Seconds of load (default 300; profile soak.duration_s)."
    ),
    slice_s: float | None = typer.Option(
        None, "--slice", min=0.5, help="Seconds per judged timeslice (default 30; profile soak.slice_s)."
    ),
    concurrency: int | None = opt.concurrency(
        "Requests in flight at most (default 8; soak.concurrency).", default=None
    ),
    rate: float | None = typer.Option(
        None, "--rate", min=0.01, help="Requests started per second (open loop; default: closed loop)."
    ),
    ramp: float | None = typer.Option(
        None, "--ramp", min=0.0, help="Seconds the load takes to reach its full level (default 30)."
    ),
    cancel_share: float | None = typer.Option(
        None, "--cancel-share", min=0.0, max=0.9, help="Share of requests the client drops mid-flight (default 0.05)."
    ),
    fmt: list[ReportFormat] = opt.format(),
    output: list[Path] = opt.output(),
    timeout: float | None = opt.timeout("Seconds one whole metadata answer may take (default 10)."),
    probe_deadline: float | None = opt.probe_deadline(
        "Seconds one request may take before it counts as a hang (default 30)."
    ),
    strict: bool | None = opt.strict(),
    token_env: str | None = opt.token_env(),
    router_token_env: str | None = opt.router_token_env(),
    quiet: bool = opt.quiet("No progress bar and no log lines on stderr."),
    verbose: bool = opt.verbose(),
) -> None:
    """Drive sustained load through the router for --duration, with the handoff, isolation and canary
    checks interleaved; every timeslice gets a content verdict and is judged against the profile's SLOs."""
    from kvgate.commands.check import check_options
    from kvgate.formats.reporting import pair_outputs
    from kvgate.output.progress import LineObserver, RichObserver
    from kvgate.output.redact import token_from_env

    pairs = pair_outputs(list(fmt), list(output))
    try:
        options = check_options([], [], router_url, profile, None, None, timeout, strict, probe_deadline=probe_deadline)
        from kvgate.gates.profiles import load
        from kvgate.pipeline.check import node_specs
        from kvgate.soak.run import Soak
        from kvgate.soak.settings import SoakSettings

        node_specs(options)  # validates --router-url
        section = load(profile).soak if profile else {}
        settings = SoakSettings.from_mapping(section, options.profile_name or "soak settings").with_flags(
            duration_s=duration,
            slice_s=slice_s,
            concurrency=concurrency,
            rate_per_s=rate,
            ramp_s=ramp,
            cancel_share=cancel_share,
        )
        settings.check("flags")
        tty = sys.stderr.isatty() and not any(os.environ.get(v) for v in CI_ENV)
        observer = None if quiet else LineObserver()
        bar = RichObserver() if tty and not quiet else None
        report = Soak(
            options,
            settings,
            token=token_from_env(token_env),
            router_token=token_from_env(router_token_env, flag="--router-token-env"),
            observer=observer,
            bar=bar,
        ).run()
    except KvgateError as exc:
        report = fatal_report("soak", exc)
    finish(report, pairs, verbose)
