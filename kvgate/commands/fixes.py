"""`kvgate fixes`: which of the incident's fixes the code carries; exits 1 when a correctness fix is missing."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from kvgate.commands import options as opt
from kvgate.commands._common import deprecated_alias, fatal_report, finish, handle_errors, resolve_strict, with_anchors
from kvgate.defaults import SCAN_TIMEOUT_S
from kvgate.errors import KvgateError, UsageError
from kvgate.formats import ReportFormat
from kvgate.results.findings import Report

if TYPE_CHECKING:  # the catalogue loads when the command runs, not for --help
    from kvgate.catalogue import Assessment
    from kvgate.catalogue.codescan import CodeScan
    from kvgate.results.findings import Finding


def read_server_version(url: str, *, token: str | None, timeout: float) -> tuple[str | None, str | None, str]:
    """`version` and transfer backend from the worker's server_info (TargetClient.server_info reads it:
    the same fallback, timeouts, auth and error mapping as `check`); transport failures exit 4."""
    from kvgate.reading.target import TargetClient

    with TargetClient(timeout=timeout, token=token) as client:
        path, info = client.server_info(url)
    version = info.get("version") if isinstance(info.get("version"), str) else None
    backend = info.get("disaggregation_transfer_backend")
    return version, backend if isinstance(backend, str) else None, path


FIXES_STRICT_HELP = (
    "--strict: every entry whose presence is unknown blocks (exit 3). Default: a correctness fix unknown or "
    "only weakly evidenced blocks, informational entries do not (with --url: strict, as check is)."
)


def _assess_url(url: str, *, backend: str | None, token: str | None, timeout: float) -> Assessment:
    from kvgate.catalogue import assess_version
    from kvgate.reading.target import validate_url

    validate_url("--url", url)
    version, reported_backend, path = read_server_version(url, token=token, timeout=timeout)
    target = f"{url} (sglang {version})" if version else url
    read = f"version read from {url}{path}" if version else f"{url}{path} reports no 'version'"
    try:
        a = assess_version(version, backend=backend or reported_backend, target=target)
    except UsageError:
        # The server's string, not the user's typo: every fix unknown (exit 3), as check judges it.
        a = assess_version(None, backend=backend or reported_backend, target=target)
        read = f"{url}{path} reports version {version!r}, which is not a PEP 440 version"
    return replace(a, notes=a.notes + (read,))


def _with_missing_files(findings: list[Finding], a: Assessment, scan: CodeScan | None) -> list[Finding]:
    """Each fix that is not present gets the files (relative to the sglang package) where its code
    signature is missing: where a reader (or SARIF's locations) should look."""
    if scan is None:
        return findings
    from kvgate.catalogue.source import signature_results
    from kvgate.results.findings import Evidence, Outcome

    results = signature_results(a.catalogue, scan)
    out = []
    for f in findings:
        r = results.get(f.check)
        if r is not None and f.outcome is not Outcome.PASSED:
            files = tuple(dict.fromkeys(h.signature.file for h in r.hits if not h.matched and not h.signature.is_glob))
            if files:
                f = replace(f, evidence=f.evidence + (Evidence(f.node, "missing_in", files),))
        out.append(f)
    return out


@handle_errors
def fixes(
    version: str | None = opt.release("Judge a release string (PEP 440), e.g. 0.5.20."),
    version_old: str | None = typer.Option(None, "--version", hidden=True),
    repo: Path | None = opt.repo("An sglang git checkout (python/sglang layout)."),
    rev: str | None = typer.Option(None, "--rev", help="Commit to judge in --repo (default HEAD)."),
    site_packages: str | None = opt.site_packages(
        "Folder holding the installed sglang/ package, or 'auto' (this interpreter)."
    ),
    python: str | None = opt.python(
        "Command running the server's Python, e.g. 'kubectl exec -i -n NS POD -- python3'; "
        "kvgate's scan program goes to its stdin."
    ),
    url: str | None = typer.Option(None, "--url", help="A running SGLang worker: reads `version` from /server_info."),
    backend: str | None = typer.Option(
        None, "--backend", help="Transfer backend (mooncake, nixl, ascend, mori) for backend-specific fixes."
    ),
    formats: list[ReportFormat] = opt.format("table (default), json, junit, markdown, sarif."),
    outputs: list[Path] = opt.output("Write the i-th --format to this file."),
    token_env: str | None = opt.token_env("Env var holding a bearer token for --url."),
    timeout: float = opt.timeout("Seconds per HTTP request (--url).", default=10.0),
    strict: bool | None = opt.strict(FIXES_STRICT_HELP),
    scan_timeout: float = opt.scan_timeout("Seconds the --python scan may take.", default=SCAN_TIMEOUT_S),
    verbose: bool = opt.verbose(),
    quiet: bool = opt.quiet(opt.QUIET_HELP),
    probe: bool = typer.Option(
        False, "--probe", help="Also run the installed admission code on CPU (needs --python; slow: seconds)."
    ),
    probe_timeout: float = opt.probe_timeout("Seconds for the behaviour probes (one interpreter runs them all)."),
    sarif_anchor: Path | None = opt.sarif_anchor(),
) -> None:
    """Which of the incident's upstream fixes (and kvgate backports) the code carries.

    Exit 0: every correctness fix present. 1: one is missing, or a backport is tampered. 2: usage error.
    3: an entry is unknown (unless --no-strict; a correctness fix unknown or only weakly evidenced
    blocks even then). 4: --url unreachable, or the --python command failed.
    """
    from kvgate.backport.probe import detect_by_behaviour
    from kvgate.catalogue import assess_checkout, assess_code, assess_version, to_findings
    from kvgate.catalogue.assess import correctness_verdict
    from kvgate.catalogue.codescan import command_argv
    from kvgate.catalogue.source import auto_detect, from_python, from_site_packages
    from kvgate.formats.reporting import pair_outputs
    from kvgate.output.progress import NullObserver, terminal_observer
    from kvgate.output.redact import token_from_env

    observer = terminal_observer(quiet) or NullObserver()

    pairs = pair_outputs(list(formats), list(outputs))
    try:
        version = deprecated_alias("--release", "--version", version, version_old)
        chosen = [
            name
            for name, val in (
                ("--release", version),
                ("--repo", repo),
                ("--site-packages", site_packages),
                ("--python", python),
                ("--url", url),
            )
            if val is not None
        ]
        # --site-packages PATH --python INTERP --probe: read PATH, probe it with INTERP (e.g. a CPU environment).
        probe_pair = probe and set(chosen) == {"--site-packages", "--python"} and site_packages != "auto"
        if len(chosen) > 1 and not probe_pair:
            raise UsageError(
                f"give one of --release, --repo, --site-packages, --python, --url (got {', '.join(chosen)})"
            )
        if probe and (python is None or len(command_argv(python)) != 1):
            raise UsageError(
                "--probe needs --python INTERPRETER, a local interpreter path (one that imports sglang, "
                "with --site-packages PATH when the package is not on its own path)"
            )
        if rev is not None and repo is None:
            raise UsageError("--rev needs --repo")
        token = token_from_env(token_env)
        if token_env and url is None:
            raise UsageError("--token-env is only used with --url")
        backend = backend.strip().lower() if backend else None
        started = time.time()
        scan: CodeScan | None = None
        if version is not None:
            a = assess_version(version, backend=backend)
        elif repo is not None:
            a = assess_checkout(repo, rev or "HEAD", backend=backend)
        elif url is not None:
            a = _assess_url(url, backend=backend, token=token, timeout=timeout)
        elif probe_pair:
            scan = from_site_packages(Path(str(site_packages)))
            with observer.step(f"running sglang's admission code on CPU with {python}"):
                behaviour = detect_by_behaviour(str(python), [str(scan.package_dir.parent)], timeout=probe_timeout)
            a = assess_code(scan, backend=backend, behaviour=behaviour)
        elif python is not None:
            with observer.step(f"scanning the sglang code that {python} imports"):
                scan = from_python(python, timeout=scan_timeout)
            behaviour = []
            if probe:
                with observer.step(f"running sglang's admission code on CPU with {python}"):
                    behaviour = detect_by_behaviour(python, timeout=probe_timeout)
            a = assess_code(scan, backend=backend, behaviour=behaviour)
        elif site_packages is not None and site_packages != "auto":
            scan = from_site_packages(Path(site_packages))
            a = assess_code(scan, backend=backend)
        else:
            scan = auto_detect()
            a = assess_code(scan, backend=backend)
        notes = list(a.notes)
        notes.append(f"reads as: {a.reads_as()}")
        if a.backend is None:
            notes.append("transfer backend unknown: backend-specific fixes (mori) are not required; pass --backend")
        # A correctness fix whose presence is unknown (or only weakly evidenced) is never a silent pass:
        # its finding blocks whatever the setting (catalogue.correctness_verdict decides, as for check);
        # here strictness is about informational entries only, and --strict adds them.
        verdict = correctness_verdict(a)
        unproven = a.unproven_correctness()
        # --url gates one running worker as `check` does: its version string alone proves no fix (the
        # code is not read), so a correctness fix known only by version is inconclusive and blocks at the
        # default, as check's does on the same node (exit 3 there and here).
        gates_worker = url is not None
        if strict is not None:
            is_strict, strict_source = resolve_strict(strict)
        elif gates_worker:
            is_strict, strict_source = True, "default"
        else:
            is_strict, strict_source = False, "default for fixes: correctness fixes block, informational entries do not"
        if verdict.blocking and not is_strict:
            strict_source += "; a correctness fix is unproven, which blocks whatever the setting"
        report = Report(
            command="fixes",
            findings=tuple(
                _with_missing_files(
                    to_findings(
                        a,
                        node=f"sglang {a.release}" if a.release else a.target,
                        require_code=gates_worker,
                        # `fixes` has no --trust-version: its opt-out from "version string only" is --no-strict
                        version_opt_out="--no-strict",
                    ),
                    a,
                    scan,
                )
            ),
            strict=is_strict,
            strict_source=strict_source,
            target={
                "target": a.target,
                "release": a.release,
                "reads_as": a.reads_as(),
                "backend": a.backend,
                "methods": list(a.methods),
                "backports": list(a.backports_present()),
                "missing_correctness": [s.fix.id for s in a.missing_correctness()],
                "unproven_correctness": [s.fix.id for s in unproven],
                "tampered_backports": [s.fix.id for s in a.tampered()],
                **({"package_dir": str(scan.package_dir)} if scan is not None else {}),
            },
            cost={"wall_s": round(time.time() - started, 3)},
            notes=tuple(notes),
        )
    except KvgateError as exc:
        report = fatal_report("fixes", exc)
    finish(with_anchors(report, sarif_anchor=sarif_anchor), pairs, verbose)
