"""`kvgate check`: gate a live PD deployment before it takes traffic."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from kvgate.commands._common import STRICT_HELP, VERBOSE_HELP, fatal_report, finish, handle_errors, resolve_strict
from kvgate.defaults import DEFAULT_CONCURRENCY, NODE_DEADLINE_REQUESTS, SCAN_TIMEOUT_S
from kvgate.errors import KvgateError, UsageError
from kvgate.formats import ReportFormat

if TYPE_CHECKING:  # the pipeline (httpx, gates) loads when a command runs, not for --help
    from kvgate.gates.base import CheckOptions

DEFAULT_HEADROOM = 1.25
DEFAULT_TIMEOUT = 10.0
DEFAULT_READ_DEADLINE = 120.0


@handle_errors
def check(
    prefill_url: list[str] = typer.Option([], "--prefill-url", help="Prefill worker URL (repeatable)."),
    decode_url: list[str] = typer.Option([], "--decode-url", help="Decode worker URL (repeatable)."),
    router_url: str | None = typer.Option(
        None,
        "--router-url",
        help="Router URL: its worker list is gated (or cross-checked with the given URLs); enables the probe gates.",
    ),
    profile: str | None = typer.Option(None, "--profile", help="Gate profile: a YAML file or a bundled name."),
    context_len: int | None = typer.Option(
        None, "--context-len", min=1, help="Advertised context length the pool must hold (default: the engine's)."
    ),
    headroom: float | None = typer.Option(
        None,
        "--headroom",
        min=1.0,
        help=f"Required pool / context ratio (default {DEFAULT_HEADROOM}, the runbook's value).",
    ),
    timeout: float | None = typer.Option(
        None, "--timeout", min=0.1, help=f"Seconds per metadata request (default {DEFAULT_TIMEOUT:g})."
    ),
    fmt: list[ReportFormat] = typer.Option(
        [], "--format", "-f", help="Report format (repeatable): table, json, junit, markdown."
    ),
    output: list[Path] = typer.Option([], "--output", "-o", help="File for the matching --format (repeatable)."),
    strict: bool | None = typer.Option(None, "--strict/--no-strict", help=STRICT_HELP),
    token_env: str | None = typer.Option(
        None, "--token-env", help="Name of the environment variable holding the bearer token."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines on stderr."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help=VERBOSE_HELP),
    probe_deadline: float | None = typer.Option(
        None, "--probe-deadline", min=0.1, help="Seconds one probe may take before it counts as a hang (default 30)."
    ),
    tenants: int | None = typer.Option(
        None, "--tenants", min=1, help="Concurrent canary tenants per round (default 32)."
    ),
    keep_going: bool = typer.Option(
        False,
        "--keep-going",
        help="Run every probe even after a confirmed leak or once the deployment stopped answering.",
    ),
    deferred_release_env: bool | None = typer.Option(
        None,
        "--deferred-release-env/--no-deferred-release-env",
        help="What SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE is set to on the workers, when they do not "
        "expose it.",
    ),
    model_arch: str | None = typer.Option(
        None, "--model-arch", help="Model architecture (e.g. GlmMoeDsaForCausalLM) when workers do not report it."
    ),
    self_test: bool = typer.Option(
        False,
        "--self-test",
        help="First prove the probes see a known leak (simulated 0.5.19); needs kvgate[sim,router].",
    ),
    site_packages: str | None = typer.Option(
        None, "--site-packages", help="Folder holding the sglang/ package every worker runs (read for the fixes)."
    ),
    python: str | None = typer.Option(
        None,
        "--python",
        help="Command running the workers' Python, e.g. 'kubectl exec -i -n NS POD -- python3'; "
        "kvgate's scan program goes to its stdin.",
    ),
    scan_timeout: float | None = typer.Option(
        None, "--scan-timeout", min=1.0, help=f"Seconds the --python command may take (default {SCAN_TIMEOUT_S:g})."
    ),
    trust_version: bool = typer.Option(
        False, "--trust-version", help="Let a worker's version string alone decide its fixes (no code read)."
    ),
    probes: bool = typer.Option(
        True,
        "--probes/--no-probes",
        help="Send the probe requests through the router (--no-probes: metadata only, said in the report and "
        "the verdict line; without --router-url and without --no-probes the probes are inconclusive).",
    ),
    concurrency: int = typer.Option(
        DEFAULT_CONCURRENCY, "--concurrency", min=1, max=4096, help="Workers whose metadata is read at once."
    ),
    read_deadline: float | None = typer.Option(
        None,
        "--read-deadline",
        min=0.1,
        help=f"Seconds the whole metadata read may take (default {DEFAULT_READ_DEADLINE:g}); each worker's read "
        f"also ends within {NODE_DEADLINE_REQUESTS}x --timeout.",
    ),
    baseline: Path | None = typer.Option(
        None, "--baseline", help="Fail on any change since this baseline file (capacity drift, workers added/removed)."
    ),
    write_baseline: Path | None = typer.Option(
        None, "--write-baseline", help="Record this run's fleet as the baseline file (after comparing with --baseline)."
    ),
    model_config: Path | None = typer.Option(
        None, "--model-config", help="The model's config.json: explain a pool/context failure with kvgate plan's knobs."
    ),
) -> None:
    """Gate a live PD deployment: pool vs context, defenses, fleet consistency, and (with --router-url)
    the router's whole worker list and behavioural probes."""
    from kvgate.check import run_check
    from kvgate.progress import terminal_observer
    from kvgate.redact import token_from_env
    from kvgate.reporting import pair_outputs

    pairs = pair_outputs(list(fmt), list(output))
    try:
        options = _options(prefill_url, decode_url, router_url, profile, context_len, headroom, timeout, strict)
        probe_settings = dict(options.probes)
        if probe_deadline is not None:
            probe_settings["deadline_s"] = probe_deadline
        if tenants is not None:
            probe_settings["tenants"] = tenants
        if keep_going:
            probe_settings["early_stop"] = False
        defenses = dict(options.defenses)
        if deferred_release_env is not None:
            defenses["deferred_release_env"] = deferred_release_env
        if model_arch is not None:
            defenses["model_arch"] = model_arch
        if trust_version:
            defenses["trust_version"] = True
        code = dict(options.code)
        if site_packages is not None and python is not None:
            raise UsageError("give one of --site-packages, --python (per-role sources go in the profile's code:)")
        if site_packages is not None:
            code["*"] = {"site_packages": site_packages}
        if python is not None:
            code["*"] = {"python": python}
        if scan_timeout is not None:
            if "*" not in code:
                raise UsageError("--scan-timeout needs --python (per-source timeouts go in the profile's code:)")
            code["*"] = {**code["*"], "timeout": scan_timeout}
        options = replace(
            options,
            probes=probe_settings,
            defenses=defenses,
            code=code,
            probes_enabled=probes,
            concurrency=concurrency,
            read_deadline=read_deadline if read_deadline is not None else DEFAULT_READ_DEADLINE,
            baseline=str(baseline) if baseline else None,
            write_baseline=str(write_baseline) if write_baseline else None,
        )
        options = _with_model_config(options, model_config)
        token = token_from_env(token_env)
        report = run_check(options, token=token, observer=terminal_observer(quiet), self_test=self_test)
    except KvgateError as exc:
        report = fatal_report("check", exc)
    finish(report, pairs, verbose)


def _with_model_config(options: CheckOptions, flag: Path | None) -> CheckOptions:
    """The model config from the flag, else the profile's deployment; loaded now so a bad one exits 2 early."""
    from kvgate.plan.model import load_shape

    path = (
        str(flag)
        if flag is not None
        else next((d["model_config"] for d in options.deployment.values() if d.get("model_config")), None)
    )
    if path is None:
        return options
    load_shape(Path(path))
    return replace(options, model_config=path)


def _options(
    prefill_url: list[str],
    decode_url: list[str],
    router_url: str | None,
    profile_ref: str | None,
    context_len: int | None,
    headroom: float | None,
    timeout: float | None,
    strict: bool | None,
) -> CheckOptions:
    """Merge the profile and the flags: flags win, then the profile, then the defaults."""
    from kvgate.gates.base import CheckOptions
    from kvgate.profiles import Profile, load

    prof = load(profile_ref) if profile_ref else Profile(name="(none)", path="")
    is_strict, strict_source = resolve_strict(strict, prof.strict)
    return CheckOptions(
        prefill_urls=tuple(prefill_url),
        decode_urls=tuple(decode_url),
        router_url=router_url,
        context_len=context_len if context_len is not None else prof.context_length,
        headroom=headroom if headroom is not None else (prof.headroom or DEFAULT_HEADROOM),
        timeout=timeout if timeout is not None else (prof.timeout or DEFAULT_TIMEOUT),
        strict=is_strict,
        strict_source=strict_source,
        profile_name=prof.name if profile_ref else None,
        probes=prof.probes,
        defenses=prof.defenses,
        waivers=prof.waivers,
        code=prof.code,
        deployment=prof.deployment,
    )
