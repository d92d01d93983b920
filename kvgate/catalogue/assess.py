"""From a target (version, checkout, installed package) to one assessment, and to findings."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from kvgate.catalogue.combine import FixStatus, combine
from kvgate.catalogue.git import detect_by_git
from kvgate.catalogue.model import Catalogue, Detection, Presence, load_catalogue
from kvgate.catalogue.source import InstalledSglang, detect_by_source
from kvgate.catalogue.version import detect_by_version, parse_release
from kvgate.errors import UsageError
from kvgate.findings import Evidence, Finding, failed, inconclusive, info, passed

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
        return tuple(s.fix.id for s in self.statuses if s.fix.is_backport and s.presence is Presence.PRESENT)

    def reads_as(self) -> str:
        """'0.5.20', or '0.5.20 + kvgate backports (ids)' when our markers are in the code."""
        base = self.release or "unknown release"
        bp = self.backports_present()
        return f"{base} + kvgate backports ({', '.join(bp)})" if bp else base

    def correctness(self) -> tuple[FixStatus, ...]:
        return tuple(s for s in self.statuses if s.fix.is_correctness_for(self.backend))

    def missing_correctness(self) -> tuple[FixStatus, ...]:
        return tuple(s for s in self.correctness() if s.presence is Presence.ABSENT)

    def unknown_correctness(self) -> tuple[FixStatus, ...]:
        return tuple(s for s in self.correctness() if s.presence is Presence.UNKNOWN)


def _version_detections(cat: Catalogue, raw: str | None, notes: list[str]) -> list[Detection]:
    if not raw:
        return []
    try:
        rel = parse_release(raw)
    except UsageError:
        notes.append(f"declared version {raw!r} is not PEP 440; version method skipped")
        return []
    return list(detect_by_version(cat, rel).values())


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


def assess_version(raw: str, *, backend: str | None = None, target: str | None = None) -> Assessment:
    """Method 1 only. A bad version string is a usage error (exit 2)."""
    cat = load_catalogue()
    rel = parse_release(raw)
    dets = [d for d in detect_by_version(cat, rel).values() if not cat.get(d.fix_id).is_backport]
    notes = ["by version only: kvgate backports and other patches are invisible; --site-packages or --python "
             "reads the code the server runs"]
    return assess(dets, target=target or f"sglang {raw}", release=raw, backend=backend, notes=notes, catalogue=cat)


def assess_installed(
    installed: InstalledSglang, *, backend: str | None = None, behaviour: Iterable[Detection] = ()
) -> Assessment:
    """Method 3 (source signatures), plus method 1 on the package's declared version, plus any
    behaviour detections (method 4, see kvgate.catalogue.behaviour) the caller ran."""
    cat = load_catalogue()
    notes = [f"sglang package {installed.package_dir} ({installed.found_by})"]
    dets = list(detect_by_source(cat, installed).values()) + list(behaviour)
    dets += [d for d in _version_detections(cat, installed.version, notes) if not cat.get(d.fix_id).is_backport]
    return assess(dets, target=str(installed.package_dir), release=installed.version, backend=backend,
                  notes=notes, catalogue=cat)


def assess_checkout(path: Path, rev: str = "HEAD", *, backend: str | None = None) -> Assessment:
    """Method 2 (tree signatures and squash-commit ancestry) at `rev`."""
    cat = load_catalogue()
    co, by_git = detect_by_git(cat, path, rev)
    notes = [f"checkout {path} at {co.hexsha[:12]} ({rev}): {co.subject}"]
    dets = list(by_git.values())
    dets += [d for d in _version_detections(cat, co.version, notes) if not cat.get(d.fix_id).is_backport]
    return assess(dets, target=f"{path}@{rev}", release=co.version, backend=backend, notes=notes, catalogue=cat)


def remedy_for(cat: Catalogue, status: FixStatus) -> str:
    """How to get a missing fix: upgrade, or the kvgate backport that stands in for it."""
    upgrade = f"upgrade sglang to {cat.recommended_minimum} or later"
    bps = cat.backport_for(status.fix.id)
    if bps:
        ids = " ".join(b.id for b in bps)
        return f"{upgrade}, or apply kvgate's backport: kvgate backport --to <sglang tree> ({ids})"
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
        text += f"; kvgate backports cover {', '.join(covered)}: kvgate backport --to <sglang tree>"
    if uncovered and covered:
        text += f"; no kvgate backport covers {', '.join(uncovered)}"
    return text


def to_findings(a: Assessment, *, gate: str = GATE, node: str | None = None) -> list[Finding]:
    """One finding per catalogue entry: correctness fixes gate (absent -> failed), the rest inform."""
    node = node or a.target
    out: list[Finding] = []
    for s in a.statuses:
        fix = s.fix
        if fix.is_backport and "version" in a.methods and len(a.methods) == 1:
            continue  # a version string cannot show backports; the note says so
        required = fix.is_correctness_for(a.backend)
        role = "correctness" if required else "informational"
        if fix.correctness and not required:
            role = f"correctness only on {'/'.join(fix.backends)}"
        state = s.presence.value + (f" via {s.via_backport}" if s.via_backport else "")
        # No square brackets anywhere: the table renders with Rich, which would read them as markup.
        summary = f"{state}: {fix.label} {fix.title} ({fix.failure_class}; {role}; {s.how()})"
        first = f"first in {fix.first_release}" if fix.first_release else "in no verified release"
        if fix.first_release and fix.first_release_bound == "at-or-before":
            first += " or earlier"
        ev = [
            Evidence(node, "present", s.presence.value, "present" if required else None),
            Evidence(node, "upstream", f"{fix.state} (evidence {fix.state_evidence}), {first}"),
        ]
        ev += [Evidence(node, f"by_{d.method}", f"{d.presence.value}: " + "; ".join(d.evidence)) for d in s.detections]
        if fix.uncertain:
            ev.append(Evidence(node, "uncertain", "; ".join(fix.uncertain)))
        if fix.notes:
            ev.append(Evidence(node, "notes", fix.notes))
        if s.presence is Presence.UNKNOWN:
            out.append(inconclusive(gate, fix.id, node, summary, *ev,
                                    remedy="read the code the server runs: kvgate fixes --site-packages PATH or --python INTERPRETER"))
        elif s.presence is Presence.ABSENT and required:
            out.append(failed(gate, fix.id, node, summary, *ev, remedy=remedy_for(a.catalogue, s)))
        elif s.presence is Presence.ABSENT:
            out.append(info(gate, fix.id, node, summary, *ev))  # absent and not required here: not a pass
        else:
            out.append(passed(gate, fix.id, node, summary, *ev))
    return out
