"""`defenses.release` (per node): the code must carry every correctness fix of the catalogue for its backend.

The code is read where the node runs it (kvgate.gates.defenses.code) and trusted over the version
the worker reports, but only a scan that vouches for this node counts: where the code read for it
declares another version than the node reports, or one scan stood for several nodes and cannot be
matched to this one, the scan is set aside and named (`code_doubt`). The assessment, its verdict
(`catalogue.correctness_verdict`, the one `kvgate fixes` uses) and its rendering are `kvgate fixes`'s.
Without code, the version string decides what it shows missing (failed); what it shows present is
"version string only, code not read" (inconclusive) unless `trust_version`. A correctness fix whose
presence is unknown or only weakly evidenced blocks whatever the strictness, as in `kvgate fixes`.
"""

from __future__ import annotations

from dataclasses import replace

from kvgate.catalogue import Presence, assess_version, describe, load_catalogue
from kvgate.catalogue.assess import READ_THE_CODE, Assessment, correctness_verdict, remedy_for_missing
from kvgate.errors import UsageError
from kvgate.gates.defenses.code import CHECK_THE_SCAN
from kvgate.gates.defenses.common import GATE, DefenseInputs, backend_of
from kvgate.results.findings import Evidence, Finding, Outcome, error, failed, inconclusive, passed

CHECK = "release"
PROVE = "--site-packages PATH or --python COMMAND"
OWN_CODE = (
    "read this node's own code: a --python template with {url}, {role}-{index} or {host} (e.g. 'kubectl "
    "exec -i {role}-{index} -- python3'), or a profile code: entry for its URL"
)


def _blocking(f: Finding) -> Finding:
    return replace(f, blocking=True)


def check_release(n: DefenseInputs, trust_version: bool = False) -> Finding:
    """The correctness fixes this node's code carries: from its code when read, else its version string."""
    if n.code_error is not None:
        return error(
            GATE,
            CHECK,
            n.node,
            f"could not read the code this node runs: {n.code_error}",
            Evidence(n.node, "code", n.code_error, "a kvgate code scan"),
        )
    backend = backend_of(n)
    if n.fixes is not None:
        a = n.fixes
        how = f"code read ({a.notes[0] if a.notes else a.target}; reads as {a.reads_as()})"
        ev = [Evidence(n.node, "code", how), Evidence(n.node, "reported_version", n.version, a.release)]
        if n.version and a.release and n.version != a.release:
            how += f"; the worker reports {n.version}, the code it runs declares {a.release}: the code decides"
        if n.code_shared_by > 1:
            shared = (
                f"one scan for {n.code_shared_by} nodes, counted for this one because it reports the version "
                f"the scanned package declares ({a.release})"
            )
            ev.append(Evidence(n.node, "code_source", shared, "this node's own code"))
            how += f"; {shared}"
        return _judge(n, a, how, ev, require_code=False)
    try:
        a = assess_version(n.version, backend=backend)
    except UsageError:
        why = f"sglang version {n.version!r} is not a PEP 440 version: cannot tell which fixes run"
        if n.code_doubt:
            why = f"{n.code_doubt}; and {why}"
        return _blocking(
            inconclusive(
                GATE,
                CHECK,
                n.node,
                why,
                Evidence(n.node, "version", n.version, "PEP 440"),
                remedy=OWN_CODE if n.code_doubt else READ_THE_CODE,
            )
        )
    how = f"version string {n.version} only, code not read" if n.version else "no version reported, code not read"
    ev = [Evidence(n.node, "code", how, "code read by " + PROVE)]
    if n.code_scan is not None:
        return _mismatched(n, n.code_scan, ev)
    if n.code_doubt:
        return _doubted(n, a, how, ev)
    return _judge(n, a, how, ev, require_code=not trust_version)


def _groups(a: Assessment, require_code: bool) -> str:
    v = correctness_verdict(a, require_code=require_code)
    groups = (
        ("correctness fixes missing", [s.fix.label for s in v.missing]),
        ("tampered or partial backports (marker without the code)", [s.fix.id for s in v.tampered]),
        ("unknown", [s.fix.label for s in v.unknown]),
        ("assumed present by release order only (weak evidence)", [s.fix.label for s in v.weak]),
        ("present by the version string only, not counted without the code", [s.fix.label for s in v.version_only]),
    )
    return "; ".join(f"{what}: {', '.join(labels)}" for what, labels in groups if labels)


def _fix_rows(n: DefenseInputs, a: Assessment) -> list[Evidence]:
    return [Evidence(n.node, s.fix.id, describe(s), "present") for s in a.correctness() + a.tampered()]


def _judge(n: DefenseInputs, a: Assessment, how: str, ev: list[Evidence], require_code: bool) -> Finding:
    """One finding from one assessment, by catalogue.correctness_verdict (as `kvgate fixes` decides)."""
    v = correctness_verdict(a, require_code=require_code)
    ev = ev + _fix_rows(n, a)
    summary = f"{how}: {_groups(a, require_code)}"
    if v.missing or v.tampered:
        remedy = (
            remedy_for_missing(load_catalogue(), v.missing)
            if v.missing
            else "re-apply the backport or remove its marker"
        )
        if a.methods == ("version",):
            remedy += f"; a build that carries kvgate backports: prove it with {PROVE}"
        return failed(GATE, CHECK, n.node, summary, *ev, remedy=remedy)
    if v.outcome is Outcome.INCONCLUSIVE:
        # --trust-version resolves "code not read", never an unknown fix
        remedy = READ_THE_CODE + (
            "; or accept version strings with --trust-version" if a.methods == ("version",) and not v.blocking else ""
        )
        f = inconclusive(GATE, CHECK, n.node, summary, *ev, remedy=remedy)
        return _blocking(f) if v.blocking else f
    decided = ", ".join(sorted({s.decided_by or "?" for s in a.correctness()}))
    return passed(
        GATE,
        CHECK,
        n.node,
        f"{how}: every correctness fix present "
        f"({len(a.correctness())} for backend {backend_of(n) or 'unknown'}; decided by {decided})",
        *ev,
    )


def _mismatched(n: DefenseInputs, scan: Assessment, ev: list[Evidence]) -> Finding:
    """The node's own scan declares another release than the node reports: said plainly, with what
    that code lacks and how to check the scan reached the server. Failed when the code lacks a
    correctness fix, blocking inconclusive otherwise (which label is wrong is unknown): never a pass."""
    v = correctness_verdict(scan, require_code=True)
    lacks = [s.fix.label for s in v.missing] + [s.fix.id for s in v.tampered]
    unsure = [s.fix.label for s in v.unknown + v.weak]
    said = (
        f"that code lacks {', '.join(lacks)}"
        if lacks
        else "that code carries every correctness fix" + (f" (unknown: {', '.join(unsure)})" if unsure else "")
    )
    summary = f"{n.code_doubt}; {said}; {CHECK_THE_SCAN}"
    ev = [*ev, Evidence(n.node, "code_not_counted", n.code_doubt, "the release the node reports")]
    ev += _fix_rows(n, scan)
    remedy = f"{CHECK_THE_SCAN}; then redeploy the node with the release it should run"
    if lacks:
        return _blocking(failed(GATE, CHECK, n.node, summary, *ev, remedy=remedy))
    return _blocking(inconclusive(GATE, CHECK, n.node, summary, *ev, remedy=remedy))


def _doubted(n: DefenseInputs, a: Assessment, how: str, ev: list[Evidence]) -> Finding:
    """A scan was read but is not this node's evidence: the version string alone speaks, and what it
    shows present is never enough (which code runs here is unknown), whatever the strictness."""
    ev = [*ev, Evidence(n.node, "code_not_counted", n.code_doubt, "a scan of this node's own code")]
    v = correctness_verdict(a, require_code=True)
    groups = _groups(a, True)
    summary = f"{n.code_doubt}; {how}" + (f": {groups}" if groups else "")
    ev += _fix_rows(n, a)
    if v.missing:
        remedy = remedy_for_missing(load_catalogue(), v.missing) + f"; or {OWN_CODE}"
        return failed(GATE, CHECK, n.node, summary, *ev, remedy=remedy)
    present = all(s.presence is Presence.PRESENT for s in a.correctness())
    if present:
        summary += "; which code this node runs is unknown, so the version string is not enough"
    return _blocking(inconclusive(GATE, CHECK, n.node, summary, *ev, remedy=OWN_CODE))
