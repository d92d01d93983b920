"""`kvgate backport`: apply, check, verify or revert kvgate's patch series for an sglang release."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from kvgate.commands import options as opt
from kvgate.commands._common import (
    deprecated_alias,
    fatal_report,
    finish,
    handle_errors,
)
from kvgate.errors import KvgateError, UsageError
from kvgate.formats import ReportFormat
from kvgate.results.findings import Evidence, Finding, Report, failed, inconclusive, info, passed

if TYPE_CHECKING:  # the backport engine and probe load when the command runs, not for --help
    from kvgate.backport.journal import Recovery
    from kvgate.backport.stages import BackportResult, Target
    from kvgate.catalogue.series import Series
    from kvgate.output.progress import Observer

GATE = "backport"


@handle_errors
def backport(
    release: str | None = opt.release("Release whose series to use, e.g. v0.5.20 (required)."),
    to_old: str | None = typer.Option(None, "--to", hidden=True),
    repo: Path | None = opt.repo("A git checkout of sglang (python/sglang layout)."),
    site_packages: Path | None = opt.site_packages("A site-packages directory holding the installed sglang/."),
    python: str | None = opt.python(
        "An interpreter whose installed sglang to patch (or, with --site-packages, to run --verify's probe in)."
    ),
    with_hardening: bool = typer.Option(
        False, "--with-hardening", help="Also apply the opt-in decode-side handoff coverage check."
    ),
    check: bool = typer.Option(False, "--check", help="Say whether the series would apply; change nothing."),
    verify: bool = typer.Option(
        False, "--verify", help="Check the series is applied and run sglang's real admission code against it."
    ),
    revert: bool = typer.Option(False, "--revert", help="Undo the series (byte-for-byte restore)."),
    probe_timeout: float = opt.probe_timeout("Seconds per probe."),
    fmt: list[ReportFormat] = opt.format("Report format (repeatable)."),
    output: list[Path] = opt.output(),
    verbose: bool = opt.verbose(),
    quiet: bool = opt.quiet(opt.QUIET_HELP),
) -> None:
    """Apply kvgate's backport series to an sglang checkout or installation, atomically.

    Exit 0: done (or, with --check, it would apply; with --verify, applied and the probes agree).
    1: --verify found a patch missing or sglang's own code misbehaving. 2: usage error, or a target
    that is not what the series expects (nothing changed). 3: --verify's probes could not run.
    4: writing the target failed (disk full, permissions: it was restored, nothing changed), or the
    --python interpreter could not be run.
    """
    from kvgate.backport.engine import apply_series, revert_series
    from kvgate.catalogue.series import load_series
    from kvgate.formats.reporting import pair_outputs
    from kvgate.output.progress import NullObserver, terminal_observer

    observer = terminal_observer(quiet) or NullObserver()
    pairs = pair_outputs(list(fmt), list(output))
    action = "verify" if verify else "revert" if revert else "check" if check else "apply"
    try:
        if sum((check, verify, revert)) > 1:
            raise UsageError("--check, --verify and --revert are mutually exclusive")
        to = deprecated_alias("--release", "--to", release, to_old)
        if to is None:
            raise UsageError("give --release R: the release whose backport series to apply, e.g. v0.5.20")
        series = load_series(to)
        target, probe_python, probe_path = _target(repo, site_packages, python)
        if action == "verify":
            report = _verify(series, target, probe_python, probe_path, probe_timeout, observer)
        elif action == "revert":
            report = _report(series, target, revert_series(target, series))
        else:
            report = _report(series, target, apply_series(target, series, with_hardening, check=check))
    except KvgateError as exc:
        report = fatal_report(f"backport {action}", exc, strict=True)
    finish(report, pairs, verbose)


def _target(repo: Path | None, site: Path | None, python: str | None) -> tuple[Target, str | None, list[str]]:
    """The target to patch, and the interpreter + PYTHONPATH that import it (None: a CPU env will)."""
    from kvgate.backport.engine import site_packages_of
    from kvgate.backport.stages import Layout, Target

    if repo is not None and (site is not None or python is not None):
        raise UsageError("give one of --repo, --site-packages, --python (--python may accompany --site-packages)")
    if repo is not None:
        target = Target(Layout.GIT, repo.resolve())
        return target, None, [str(target.import_root)]
    if site is not None:
        target = Target(Layout.SITE, site.resolve())
        return target, python, [str(target.root)]
    if python is not None:
        return Target(Layout.SITE, site_packages_of(python)), python, []
    raise UsageError("say where sglang is: --repo PATH, --site-packages PATH or --python INTERPRETER")


def _recovery_finding(node: str, rec: Recovery) -> Finding:
    """An interrupted earlier run this one finished or rolled back: said, for the record."""
    return info(
        GATE,
        "recovery",
        node,
        f"{rec.direction}: {rec.message}",
        Evidence(node, "interrupted", rec.action),
        Evidence(node, "direction", rec.direction),
        Evidence(node, "files_rewritten", rec.files),
        Evidence(node, "temps_removed", rec.temps_removed),
    )


def _report(series: Series, target: Target, result: BackportResult) -> Report:
    node = str(target.root)
    findings = []
    if result.recovered is not None:
        findings.append(_recovery_finding(node, result.recovered))
    for p in result.patches:
        ev = [Evidence(node, "files", ", ".join(p.files))]
        if p.commit:
            ev.append(Evidence(node, "commit", p.commit))
        findings.append(passed(GATE, p.id, node, f"{p.status}: {p.title}", *ev))
    notes = [result.message]
    if result.recovered is not None:
        notes.insert(0, result.recovered.message)
    if result.branch:
        notes.append(f"branch: {result.branch}")
    if result.backup:
        notes.append(f"backup of the original files: {result.backup}")
    if result.marker:
        notes.append(f"marker listing what was applied: {result.marker}")
    return Report(
        command=f"backport {result.action} {series.name}",
        findings=tuple(findings),
        target={"layout": target.layout.value, "root": node, "series": series.name, "changed": result.changed},
        notes=tuple(notes),
    )


def _verify(
    series: Series, target: Target, python: str | None, extra: list[str], timeout: float, observer: Observer
) -> Report:
    """Applied? Then execute the target's own admission (and, if applied, decode commit) code."""
    from kvgate.backport.engine import applied_patches, recover_interrupted
    from kvgate.backport.probe import ERROR, RETIRED, VERIFIED, run_all_probes
    from kvgate.backport.stages import Layout

    node = str(target.root)
    recovered = recover_interrupted(target, series)
    have = applied_patches(target, series)
    have_ids = {p.id for p in have}
    findings: list[Finding] = []
    if recovered is not None:
        findings.append(_recovery_finding(node, recovered))
    for p in series.patches:
        if p.id in have_ids:
            findings.append(passed(GATE, p.id, node, f"applied: {p.title}"))
        elif p.optional:  # reported, not required: never shown as passed
            findings.append(info(GATE, p.id, node, f"not applied (opt-in, --with-hardening): {p.title}"))
        else:
            findings.append(
                failed(
                    GATE, p.id, node, f"not applied: {p.title}", remedy=f"kvgate backport --release {series.name} ..."
                )
            )
    with tempfile.TemporaryDirectory(prefix="kvgate-verify-") as tmp:
        if python is None:
            from kvgate.backport.cpuenv import cpu_env
            from kvgate.paths import cache_dir

            # Cold, this downloads and installs about 2.3 GB (a couple of minutes); warm, it is instant.
            with observer.step(
                f"preparing the CPU environment of sglang {series.base_release} in {cache_dir()} "
                "(first use: about 2.3 GB, a few minutes; then cached)"
            ):
                python = cpu_env(series.base_release).python
            if target.layout is Layout.SITE:
                # Expose only sglang/ from that site-packages: its own torch (often a CUDA build) must not
                # shadow the CPU environment's.
                (Path(tmp) / "sglang").symlink_to(target.root / "sglang", target_is_directory=True)
                extra = [tmp]
        with observer.step(f"running sglang's admission code on CPU ({python})"):
            suite = run_all_probes(python, extra, timeout=timeout)  # one import of sglang for every probe
        with observer.step(f"running sglang's transfer code on CPU: the page-lifetime probes ({python})"):
            lifetime = _lifetime_findings(series, node, python, extra, timeout)
    adm = suite.admission
    ev = [Evidence(c.door, f"{c.door}.{c.name}", c.outcome, c.expect) for c in adm.cases]
    if adm.client_error:
        ev.append(
            Evidence(node, "client_error", f"{adm.client_error.get('status_code')} {adm.client_error.get('message')}")
        )
    if adm.status == ERROR:
        findings.append(
            inconclusive(
                f"{GATE}-probe",
                "admission",
                node,
                f"probe error (no verdict): {adm.error}",
                *ev,
                remedy=f"missing: {adm.missing}" if adm.missing else None,
            )
        )
    elif adm.safe:
        findings.append(
            passed(
                f"{GATE}-probe",
                "admission",
                node,
                f"{adm.status}: a rejected request is retired at both PD doors with its original "
                f"error; valid and re-entering requests admitted",
                *ev,
            )
        )
    else:
        findings.append(
            failed(
                f"{GATE}-probe",
                "admission",
                node,
                f"{adm.status}: rejected request admitted or a control case misbehaved",
                *ev,
                remedy=f"kvgate backport --release {series.name}",
            )
        )
    if "kvgate-retire-aborted-results" in {p.id for p in series.patches}:
        ret = suite.result_retire
        rev = [Evidence("prefill", c.name, c.outcome, c.expect) for c in ret.cases]
        if ret.status == RETIRED:
            findings.append(
                passed(
                    f"{GATE}-probe",
                    "retire-aborted-results",
                    node,
                    "RETIRED: an aborted request's final prefill result is released and answered, no KV handoff",
                    *rev,
                )
            )
        elif ret.status == ERROR:
            findings.append(
                inconclusive(
                    f"{GATE}-probe", "retire-aborted-results", node, f"probe error (no verdict): {ret.error}", *rev
                )
            )
        else:
            findings.append(
                failed(
                    f"{GATE}-probe",
                    "retire-aborted-results",
                    node,
                    f"{ret.status}: an aborted request's KV is handed off after the forward",
                    *rev,
                )
            )
    if any(p.optional and p.id in have_ids for p in series.patches):
        hard = suite.hardening
        hev = [Evidence("decode", c.name, c.outcome, c.expect) for c in hard.cases]
        if hard.client_error:
            hev.append(
                Evidence(
                    node, "client_error", f"{hard.client_error.get('status_code')} {hard.client_error.get('message')}"
                )
            )
        if hard.status == VERIFIED:
            findings.append(
                passed(
                    f"{GATE}-probe",
                    "handoff-coverage",
                    node,
                    "VERIFIED: a short handoff is aborted before commit, a full one committed",
                    *hev,
                )
            )
        elif hard.status == ERROR:
            findings.append(
                inconclusive(f"{GATE}-probe", "handoff-coverage", node, f"probe error (no verdict): {hard.error}", *hev)
            )
        else:
            findings.append(
                failed(f"{GATE}-probe", "handoff-coverage", node, f"{hard.status}: a short handoff was committed", *hev)
            )
    findings += lifetime[0]
    from kvgate.paths import cache_dir, left_behind

    notes = (
        f"probes ran in {adm.python} (sglang {adm.version}, {suite.duration_s}s"
        f"{', torchvision STUB' if adm.torchvision_stub else ''})",
        left_behind(
            "kvgate cache (real sglang wheels, CPU environments)",
            cache_dir(),
            "rm -rf it to free the space; it is rebuilt on next use (KVGATE_CACHE_DIR moves it)",
        ),
    )
    return Report(
        command=f"backport verify {series.name}",
        findings=tuple(findings),
        strict=True,
        target={
            "layout": target.layout.value,
            "root": node,
            "series": series.name,
            "probe_status": adm.status,
            "client_error": adm.client_error,
            "applied": sorted(have_ids),
            "lifetime": lifetime[1],
        },
        notes=notes,
    )


def _lifetime_findings(
    series: Series, node: str, python: str, extra: list[str], timeout: float
) -> tuple[list[Finding], dict[str, str]]:
    """Provoke each page-lifetime race the series' patches close in the target's own code (one import)."""
    from kvgate.backport.probe import ERROR, INCONCLUSIVE, LIFETIME_PATCHES, RETIRED, run_lifetime_probe

    ids = [p.id for p in series.patches if p.id in LIFETIME_PATCHES]
    if not ids:
        return [], {}
    report = run_lifetime_probe(python, extra, timeout=timeout, patches=ids)
    findings: list[Finding] = []
    statuses: dict[str, str] = {}
    for pid in ids:
        name = pid.removeprefix("kvgate-")
        case = report.case(pid)
        if case is None:
            why = report.error or "the probe returned no result for this scenario"
            statuses[pid] = ERROR
            findings.append(
                inconclusive(
                    f"{GATE}-probe",
                    name,
                    node,
                    f"probe error (no verdict): {why}",
                    remedy=f"missing: {report.missing}" if report.missing else "rerun with a longer --probe-timeout",
                )
            )
            continue
        statuses[pid] = case.status
        obs = case.observed
        ev = [
            Evidence(node, "page_oracle", case.outcome, "SAFE"),
            Evidence(
                node,
                "drain_acks",
                [f"{a['t']}s->{a['dst']}{' (held)' if a['held'] else ''}" for a in obs.get("abort_acks", [])],
            ),
            Evidence(
                node,
                "pool_events",
                [f"{e['t']}s {e['event']} {e['req']} {e['pages']}" for e in obs.get("pool_events", [])],
            ),
            Evidence(node, "hold_timeouts", obs.get("timeout_warnings")),
        ]
        if case.status == RETIRED:
            findings.append(passed(f"{GATE}-probe", name, node, f"RETIRED: {case.why}", *ev))
        elif case.status == ERROR:
            findings.append(inconclusive(f"{GATE}-probe", name, node, f"probe error (no verdict): {case.why}", *ev))
        elif case.status == INCONCLUSIVE:
            findings.append(
                inconclusive(
                    f"{GATE}-probe",
                    name,
                    node,
                    f"race not staged (no verdict): {case.why}",
                    *ev,
                    remedy="rerun kvgate backport --verify (each try stages the race anew)",
                )
            )
        else:
            findings.append(
                failed(
                    f"{GATE}-probe",
                    name,
                    node,
                    f"NOT RETIRED ({case.outcome}): {case.why}",
                    *ev,
                    remedy=f"kvgate backport --release {series.name} ...",
                )
            )
    return findings, statuses


__all__ = ["backport"]
