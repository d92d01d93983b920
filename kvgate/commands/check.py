"""`kvgate check`: gate a live PD deployment before it takes traffic."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from kvgate.commands import options as opt
from kvgate.commands._common import deprecated_alias, fatal_report, finish, handle_errors, resolve_strict, with_anchors
from kvgate.defaults import (
    DEFAULT_CONCURRENCY,
    DEFAULT_READ_DEADLINE,
    DEFAULT_TIMEOUT,
    NODE_DEADLINE_REQUESTS,
    SCAN_TIMEOUT_S,
)
from kvgate.errors import KvgateError, UsageError
from kvgate.formats import ReportFormat

if TYPE_CHECKING:  # the pipeline (httpx, gates) loads when a command runs, not for --help
    from kvgate.gates.base import CheckOptions
    from kvgate.gates.profiles import Profile

DEFAULT_HEADROOM = 1.25


@handle_errors
def check(
    prefill_url: list[str] = typer.Option([], "--prefill-url", help="Prefill worker URL (repeatable)."),
    decode_url: list[str] = typer.Option([], "--decode-url", help="Decode worker URL (repeatable)."),
    router_url: str | None = opt.router_url(
        "Router URL: its worker list is gated (or cross-checked with the given URLs); enables the probe gates."
    ),
    profile: str | None = opt.profile(),
    context_len: int | None = opt.context_length(),
    context_len_old: int | None = opt.context_len_old(),
    headroom: float | None = opt.headroom(
        f"Required pool / context ratio (default {DEFAULT_HEADROOM}, the runbook's value)."
    ),
    timeout: float | None = opt.timeout(
        f"Seconds one whole metadata answer may take, body included (default {DEFAULT_TIMEOUT:g})."
    ),
    fmt: list[ReportFormat] = opt.format(),
    output: list[Path] = opt.output(),
    strict: bool | None = opt.strict(),
    token_env: str | None = opt.token_env(),
    router_token_env: str | None = opt.router_token_env(
        "Name of the environment variable holding the router's control-plane key (smg "
        "--control-plane-api-keys), sent only to its /workers and /get_loads."
    ),
    router_health_url: str | None = typer.Option(
        None,
        "--router-health-url",
        help="Where the router serves its probes (smg --health-check-port): /readiness is read there.",
    ),
    quiet: bool = opt.quiet(),
    verbose: bool = opt.verbose(),
    probe_deadline: float | None = opt.probe_deadline(
        "Seconds one probe may take before it counts as a hang (default 30)."
    ),
    tenants: int | None = opt.tenants("Concurrent canary tenants per round (default 32)."),
    keep_going: bool = opt.keep_going(),
    deferred_release_env: bool | None = opt.deferred_release(
        "What SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE is set to on the workers, when they do not expose it."
    ),
    deferred_release_old: bool | None = opt.deferred_release_old(),
    model_arch: str | None = opt.model_arch(
        "Model architecture (e.g. GlmMoeDsaForCausalLM) when workers do not report it."
    ),
    self_test: bool = typer.Option(
        False,
        "--self-test",
        help="First prove the probes see a known leak (simulated 0.5.19); needs kvgate[sim,router].",
    ),
    site_packages: str | None = opt.site_packages(
        "Folder holding the sglang/ package every worker runs (read for the fixes)."
    ),
    python: str | None = opt.python(
        "Command running the workers' Python, e.g. 'kubectl exec -i -n NS POD -- python3'; "
        "kvgate's scan program goes to its stdin."
    ),
    scan_timeout: float | None = opt.scan_timeout(
        f"Seconds the --python command may take (default {SCAN_TIMEOUT_S:g})."
    ),
    trust_version: bool = opt.trust_version(),
    probes: bool = opt.probes(
        "Send the probe requests through the router (--no-probes: metadata only, said in the report and "
        "the verdict line; without --router-url and without --no-probes the probes are inconclusive)."
    ),
    concurrency: int = opt.concurrency("Workers whose metadata is read at once."),
    read_deadline: float | None = opt.read_deadline(
        f"Seconds the whole metadata read may take (default {DEFAULT_READ_DEADLINE:g}); each worker's read "
        f"also ends within {NODE_DEADLINE_REQUESTS}x --timeout."
    ),
    baseline: Path | None = typer.Option(
        None, "--baseline", help="Fail on any change since this baseline file (capacity drift, workers added/removed)."
    ),
    write_baseline: Path | None = typer.Option(
        None,
        "--write-baseline",
        help="Record this run's fleet as the baseline file, only if the run passes (compared with --baseline first).",
    ),
    model_config: Path | None = opt.model_config(
        "The model's config.json: explain a pool/context failure with kvgate plan's knobs."
    ),
    sarif_anchor: Path | None = opt.sarif_anchor(),
) -> None:
    """Gate a live PD deployment: pool vs context, defenses, fleet consistency, and (with --router-url)
    the router's whole worker list and behavioural probes."""
    from kvgate.formats.reporting import pair_outputs
    from kvgate.output.progress import terminal_observer
    from kvgate.output.redact import token_from_env
    from kvgate.pipeline.check import run_check

    pairs = pair_outputs(list(fmt), list(output))
    try:
        context_len = deprecated_alias("--context-length", "--context-len", context_len, context_len_old)
        deferred_release_env = deprecated_alias(
            "--deferred-release", "--deferred-release-env", deferred_release_env, deferred_release_old
        )
        options = check_options(
            prefill_url,
            decode_url,
            router_url,
            profile,
            context_len,
            headroom,
            timeout,
            strict,
            **gate_flags(locals()),
            baseline=baseline,
            write_baseline=write_baseline,
            router_health_url=router_health_url,
        )
        token = token_from_env(token_env)
        router_token = token_from_env(router_token_env, flag="--router-token-env")
        if self_test:
            from kvgate.extras import refuse_in_single_file

            refuse_in_single_file("kvgate check --self-test")
        report = run_check(
            options,
            token=token,
            observer=terminal_observer(quiet),
            self_test=self_test,
            router_token=router_token,
        )
        if not self_test:
            from kvgate.commands._common import raw_args
            from kvgate.commands.nextstep import next_step

            step = next_step(report, raw_args(), options.prefill_urls, options.decode_urls)
            if step:
                report = replace(report, notes=(*report.notes, step))
        # The files in the repository that declare this deployment's gate: where a code-scanning
        # reader (SARIF) can anchor findings that have no source file of their own.
        report = with_anchors(report, profile_file=profile, baseline_file=baseline, sarif_anchor=sarif_anchor)
    except KvgateError as exc:
        report = fatal_report("check", exc)
    finish(report, pairs, verbose)


#: the gate flags `check` and `watch` both take and pass to `check_options` by these names
GATE_FLAGS = (
    "probe_deadline",
    "tenants",
    "keep_going",
    "deferred_release_env",
    "model_arch",
    "site_packages",
    "python",
    "scan_timeout",
    "trust_version",
    "probes",
    "concurrency",
    "read_deadline",
    "model_config",
)


def gate_flags(values: Mapping[str, Any]) -> dict[str, Any]:
    """The GATE_FLAGS of a command's parsed values (its `locals()`), as check_options' keywords."""
    return {name: values[name] for name in GATE_FLAGS}


def check_options(
    prefill_url: list[str],
    decode_url: list[str],
    router_url: str | None,
    profile: str | None,
    context_len: int | None,
    headroom: float | None,
    timeout: float | None,
    strict: bool | None,
    *,
    probe_deadline: float | None = None,
    tenants: int | None = None,
    keep_going: bool = False,
    deferred_release_env: bool | None = None,
    model_arch: str | None = None,
    site_packages: str | None = None,
    python: str | None = None,
    scan_timeout: float | None = None,
    trust_version: bool = False,
    probes: bool = True,
    concurrency: int = DEFAULT_CONCURRENCY,
    read_deadline: float | None = None,
    baseline: Path | None = None,
    write_baseline: Path | None = None,
    model_config: Path | None = None,
    router_health_url: str | None = None,
) -> CheckOptions:
    """check's flags merged over the profile into CheckOptions (`kvgate watch` takes the same flags)."""
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
    if write_baseline is not None and str(write_baseline) == "-":
        raise UsageError("--write-baseline -: a baseline is a file (stdout carries the report); name a path")
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
        router_health_url=router_health_url.rstrip("/") if router_health_url else None,
    )
    return _with_model_config(options, model_config)


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


def _validate_sections(prof: Profile) -> None:
    """Validate the nested sections now, against the profile's FILE: a typo in `probes.tenantz` must name
    the file to edit, not the profile's name (the gates would otherwise validate them later by name)."""
    from kvgate.gates.defenses import code_sources, defense_options
    from kvgate.gates.probes.settings import ProbeSettings

    ProbeSettings.from_mapping(prof.probes, prof.path)
    defense_options(prof.defenses, prof.path)
    code_sources(prof.code, prof.path)


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
    from kvgate.gates.profiles import Profile, load

    prof = load(profile_ref) if profile_ref else Profile(name="(none)", path="")
    if profile_ref:
        _validate_sections(prof)
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
