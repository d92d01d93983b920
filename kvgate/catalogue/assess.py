"""From a target (version, checkout, installed package) to one assessment, and to findings."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from kvgate.catalogue.backports import detect_backports, unknown_markers
from kvgate.catalogue.codescan import CodeScan, all_series, scan_tree
from kvgate.catalogue.combine import FixStatus, combine
from kvgate.catalogue.git import detect_by_git
from kvgate.catalogue.model import Catalogue, Detection, Presence, load_catalogue
from kvgate.catalogue.scanprog import MARKER_PREFIX
from kvgate.catalogue.series import Series
from kvgate.catalogue.source import detect_by_source
from kvgate.catalogue.version import detect_by_version, parse_release
from kvgate.errors import UsageError
from kvgate.results.findings import Evidence, Finding, Outcome, failed, inconclusive, info, passed

GATE = "fixes"


@dataclass(frozen=True)
class Assessment:
    """Which catalogue entries the looked-at code carries, per entry with evidence."""

    target: str
    release: str | None
    backend: str | None
    statuses: tuple[FixStatus, ...]
    methods: tuple[str, ...]
    notes: tuple[str, ...] = ()
    catalogue: Catalogue = field(default_factory=load_catalogue, compare=False, repr=False)

    def status(self, fix_id: str) -> FixStatus:
        for s in self.statuses:
            if s.fix.id == fix_id:
                return s
        raise KeyError(fix_id)

    def backports_present(self) -> tuple[str, ...]:
        """Backports whose code was verified (a marker alone never counts)."""
        return tuple(s.fix.id for s in self.statuses if s.fix.is_backport and s.presence is Presence.PRESENT)

    def tampered(self) -> tuple[FixStatus, ...]:
        """Backports whose marker is in the code while their code is not (all) there."""
        return tuple(s for s in self.statuses if s.presence is Presence.TAMPERED)

    def reads_as(self) -> str:
        """'0.5.20', or '0.5.20 + kvgate backports (ids)' when the backports' code was verified."""
        base = self.release or "unknown release"
        bp = self.backports_present()
        return f"{base} + kvgate backports ({', '.join(bp)})" if bp else base

    def correctness(self) -> tuple[FixStatus, ...]:
        return tuple(s for s in self.statuses if s.fix.is_correctness_for(self.backend))

    def missing_correctness(self) -> tuple[FixStatus, ...]:
        return tuple(s for s in self.correctness() if s.presence is Presence.ABSENT)

    def unknown_correctness(self) -> tuple[FixStatus, ...]:
        return tuple(s for s in self.correctness() if s.presence is Presence.UNKNOWN)

    def unproven_correctness(self, require_code: bool = False) -> tuple[FixStatus, ...]:
        """Correctness fixes that cannot pass: unknown, present only by weak evidence, or (when the code
        is required) present only by a version string."""
        return tuple(
            s
            for s in self.correctness()
            if s.presence is Presence.UNKNOWN
            or (s.presence is Presence.PRESENT and (s.weak or (require_code and s.version_only)))
        )


@dataclass(frozen=True)
class CorrectnessVerdict:
    """The one answer about an assessment's correctness fixes, shared by `kvgate fixes` and `check`.

    `outcome` is failed (a fix missing, or a backport tampered), inconclusive or passed. `blocking`:
    the state of a correctness fix is unknown or only weakly evidenced, which blocks whatever the
    strictness (never a silent pass, in either command). `version_only` (only when the code is
    required): present by a version string alone, a doubt that --no-strict or --trust-version opts out of.
    """

    outcome: Outcome
    blocking: bool
    missing: tuple[FixStatus, ...]
    tampered: tuple[FixStatus, ...]
    unknown: tuple[FixStatus, ...]
    weak: tuple[FixStatus, ...]
    version_only: tuple[FixStatus, ...]


def entry_blocks(s: FixStatus, backend: str | None) -> bool:
    """A correctness fix (for this backend) whose presence is unknown or only weakly evidenced."""
    return s.fix.is_correctness_for(backend) and (
        s.presence is Presence.UNKNOWN or (s.presence is Presence.PRESENT and s.weak)
    )


def correctness_verdict(a: Assessment, *, require_code: bool = False) -> CorrectnessVerdict:
    """Decide the correctness fixes of one assessment (the only place that does)."""
    unproven = a.unproven_correctness(require_code)
    blocks = [s for s in unproven if entry_blocks(s, a.backend)]
    unknown = tuple(s for s in blocks if s.presence is Presence.UNKNOWN)
    weak = tuple(s for s in blocks if s.presence is Presence.PRESENT)
    version_only = tuple(s for s in unproven if s not in blocks)
    missing, tampered = a.missing_correctness(), a.tampered()
    if missing or tampered:
        outcome = Outcome.FAILED
    elif unproven:
        outcome = Outcome.INCONCLUSIVE
    else:
        outcome = Outcome.PASSED
    blocking = outcome is Outcome.INCONCLUSIVE and bool(unknown or weak)
    return CorrectnessVerdict(outcome, blocking, missing, tampered, unknown, weak, version_only)


def _version_detections(cat: Catalogue, raw: str | None, notes: list[str]) -> list[Detection]:
    """Method 1 on a declared version, upstream entries only (a version string cannot show backports)."""
    if not raw:
        return []
    try:
        rel = parse_release(raw)
    except UsageError:
        notes.append(f"declared version {raw!r} is not PEP 440; version method skipped")
        return []
    return [d for d in detect_by_version(cat, rel).values() if not cat.get(d.fix_id).is_backport]


def assess(
    detections: Iterable[Detection],
    *,
    target: str,
    release: str | None,
    backend: str | None = None,
    notes: Iterable[str] = (),
    catalogue: Catalogue | None = None,
) -> Assessment:
    """Combine detections (any methods, e.g. a behaviour probe's) into one assessment."""
    cat = catalogue or load_catalogue()
    dets = list(detections)
    methods = tuple(dict.fromkeys(d.method for d in dets))
    return Assessment(target, release, backend, combine(cat, dets), methods, tuple(notes), cat)


def assess_version(raw: str | None, *, backend: str | None = None, target: str | None = None) -> Assessment:
    """Method 1 only: what a release string says. A bad version string is a usage error (exit 2);
    no version at all leaves every entry unknown."""
    cat = load_catalogue()
    if not raw:
        return assess(
            [],
            target=target or "sglang (no version)",
            release=None,
            backend=backend,
            catalogue=cat,
            notes=["no version reported: nothing can be told without reading the code"],
        )
    rel = parse_release(raw)
    dets = [d for d in detect_by_version(cat, rel).values() if not cat.get(d.fix_id).is_backport]
    notes = [
        "version string only, code not read: kvgate backports and other patches are invisible; "
        "--site-packages PATH or --python COMMAND reads the code the server runs"
    ]
    return assess(dets, target=target or f"sglang {raw}", release=raw, backend=backend, notes=notes, catalogue=cat)


def assess_code(
    scan: CodeScan,
    *,
    backend: str | None = None,
    behaviour: Iterable[Detection] = (),
    series: tuple[Series, ...] | None = None,
) -> Assessment:
    """Method 3 (source signatures of upstream fixes, code of kvgate backports) on a code scan, plus
    method 1 on the package's declared version, plus any behaviour detections (method 4) the caller ran.

    The one assessment of code, whether it was read in this process, in a git commit or remotely.
    """
    cat = load_catalogue()
    series = series if series is not None else all_series()
    notes = [f"sglang package {scan.package_dir} ({scan.found_by}; read by {scan.source})"]
    dets = list(detect_by_source(cat, scan).values()) + detect_backports(cat, scan, "source", series)
    dets += list(behaviour) + _version_detections(cat, scan.version, notes)
    for pid, files in unknown_markers(cat, scan).items():
        notes.append(
            f"marker '{MARKER_PREFIX}{pid}' in {', '.join(files[:3])}: no kvgate backport has that "
            "id; a label, not evidence"
        )
    return assess(dets, target=str(scan.package_dir), release=scan.version, backend=backend, notes=notes, catalogue=cat)


assess_installed = assess_code  # the name callers of the site-packages path know


def assess_checkout(path: Path, rev: str = "HEAD", *, backend: str | None = None) -> Assessment:
    """Method 2 (tree signatures and squash-commit ancestry) at `rev`; backports verified by code."""
    cat = load_catalogue()
    co, by_git, tree = detect_by_git(cat, path, rev)
    notes = [f"checkout {path} at {co.hexsha[:12]} ({rev}): {co.subject}"]
    scan = scan_tree(tree, f"git {path}@{co.hexsha[:10]}", Path(path) / "python" / "sglang", co.version, cat)
    dets = [d for d in by_git.values() if not cat.get(d.fix_id).is_backport]
    dets += detect_backports(cat, scan, "git", all_series())
    dets += _version_detections(cat, co.version, notes)
    return assess(dets, target=f"{path}@{rev}", release=co.version, backend=backend, notes=notes, catalogue=cat)


def _backport_command() -> str:
    """The backport command line: `--to` takes the release whose series applies (one of those shipped)."""
    from kvgate.catalogue.series import available

    releases = ", ".join("v" + r for r in available())
    return f"kvgate backport --release RELEASE --site-packages PATH (or --repo PATH); RELEASE: {releases}"


def remedy_for(cat: Catalogue, status: FixStatus) -> str:
    """How to get a missing fix: upgrade, or the kvgate backport that stands in for it."""
    upgrade = f"upgrade sglang to {cat.recommended_minimum} or later"
    bps = cat.backport_for(status.fix.id)
    if bps:
        ids = " ".join(b.id for b in bps)
        return f"{upgrade}, or apply kvgate's backport ({ids}): {_backport_command()}"
    return f"{upgrade} (no kvgate backport covers {status.fix.label})"


def remedy_for_missing(cat: Catalogue, statuses: Iterable[FixStatus]) -> str:
    """One remedy for several missing fixes: upgrade, plus which kvgate backports cover which of them."""
    covered, uncovered = [], []
    for s in statuses:
        bps = cat.backport_for(s.fix.id)
        if bps:
            covered.append(f"{s.fix.label} ({', '.join(b.id for b in bps)})")
        else:
            uncovered.append(s.fix.label)
    text = f"upgrade sglang to {cat.recommended_minimum} or later"
    if covered:
        text += f"; kvgate backports cover {', '.join(covered)}: {_backport_command()}"
    if uncovered and covered:
        text += f"; no kvgate backport covers {', '.join(uncovered)}"
    return text


def describe(s: FixStatus) -> str:
    """One line for one entry, the same in `kvgate fixes` and in `check`'s defenses gate."""
    fix = s.fix
    state = s.presence.value
    if s.presence is Presence.TAMPERED:
        state = "tampered or partial backport"
    if fix.is_open_problem:  # its signatures are the affected code, not a fix
        state = {Presence.PRESENT: "still open here", Presence.ABSENT: "not affected"}.get(s.presence, state)
        return f"{state}: {fix.label} open upstream problem: {fix.title} ({fix.failure_class}; {s.how()})"
    return f"{state}: {fix.label} {fix.title} ({fix.failure_class}; {s.how()})"


def status_evidence(node: str, s: FixStatus, required: bool) -> list[Evidence]:
    """The evidence rows of one entry: the verdict, the method that decided, what every method said."""
    fix = s.fix
    first = f"first in {fix.first_release}" if fix.first_release else "in no verified release"
    if fix.first_release and fix.first_release_bound == "at-or-before":
        first += " or earlier"
    ev = [
        Evidence(node, "present", s.presence.value, "present" if required else None),
        Evidence(node, "decided_by", s.how()),
    ]
    if fix.is_open_problem:
        earlier = " or earlier" if fix.first_release_bound == "at-or-before" else ""
        first = f"its code first in {fix.first_release}{earlier}"
        ev.append(Evidence(node, "upstream", f"open problem (evidence {fix.state_evidence}), {first}; no fix released"))
    elif not fix.is_backport:
        ev.append(Evidence(node, "upstream", f"{fix.state} (evidence {fix.state_evidence}), {first}"))
    ev += [
        Evidence(node, f"by_{d.method}", f"{d.presence.value}{' (weak)' if d.weak else ''}: " + "; ".join(d.evidence))
        for d in s.detections
    ]
    if fix.uncertain:
        ev.append(Evidence(node, "uncertain", "; ".join(fix.uncertain)))
    if fix.notes:
        ev.append(Evidence(node, "notes", fix.notes))
    return ev


READ_THE_CODE = (
    "read the code the server runs: --site-packages PATH, or --python COMMAND (e.g. 'kubectl exec -i "
    "-n NS POD -- python3')"
)


def to_findings(
    a: Assessment,
    *,
    gate: str = GATE,
    node: str | None = None,
    require_code: bool = False,
    version_opt_out: str = "--trust-version",
) -> list[Finding]:
    """One finding per catalogue entry. Correctness fixes gate: absent -> failed; unknown, weak or (with
    `require_code`) version-only -> inconclusive, and unknown or weak blocks whatever the strictness
    (`entry_blocks`, as `correctness_verdict` decides for check). A tampered backport fails whatever it
    stands for. `version_opt_out` is the calling command's flag that accepts a version string alone."""
    node = node or a.target
    out: list[Finding] = []
    for s in a.statuses:
        fix = s.fix
        if fix.is_backport and a.methods == ("version",):
            continue  # a version string cannot show backports; the note says so
        required = fix.is_correctness_for(a.backend)
        role = "correctness" if required else "informational"
        if fix.correctness and not required:
            role = f"correctness only on {'/'.join(fix.backends)}"
        if fix.is_backport:
            role = f"kvgate backport of {a.catalogue.get(fix.backports).label}" if fix.backports else "kvgate backport"
        if fix.is_open_problem:
            role = "known open problem, not gated"
        summary = f"{describe(s)} ({role})"  # no square brackets: the table renders with Rich (markup)
        ev = status_evidence(node, s, required)
        if s.presence is Presence.TAMPERED:
            out.append(
                failed(
                    gate,
                    fix.id,
                    node,
                    summary,
                    *ev,
                    remedy="the marker claims a backport whose code is "
                    "not there: re-apply it (kvgate backport --release <release> ...) or remove the marker",
                )
            )
        elif s.presence is Presence.UNKNOWN:
            f = inconclusive(gate, fix.id, node, summary, *ev, remedy=READ_THE_CODE)
            out.append(replace(f, blocking=entry_blocks(s, a.backend)))
        elif s.presence is Presence.ABSENT and required:
            out.append(failed(gate, fix.id, node, summary, *ev, remedy=remedy_for(a.catalogue, s)))
        elif required and s.presence is Presence.PRESENT and s.weak:
            out.append(replace(inconclusive(gate, fix.id, node, summary, *ev, remedy=READ_THE_CODE), blocking=True))
        elif required and s.presence is Presence.PRESENT and require_code and s.version_only:
            out.append(
                inconclusive(
                    gate,
                    fix.id,
                    node,
                    summary,
                    *ev,
                    remedy=f"{READ_THE_CODE}; or accept the version string with {version_opt_out}",
                )
            )
        elif s.presence is Presence.ABSENT or fix.is_open_problem:
            # absent and not required here, or an open problem (present = still has it): never a pass
            out.append(info(gate, fix.id, node, summary, *ev))
        else:
            out.append(passed(gate, fix.id, node, summary, *ev))
    return out
