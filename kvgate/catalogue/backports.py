"""kvgate backports recognised by their code, never by their marker.

A backport counts as present only when every file its patch changes carries that file's code
signatures from the series manifest (backports/v<release>/manifest.yaml, `files[].code`). A file whose
sha256 equals what the series leaves is reported as byte-identical; any other hash (a hand-applied
equivalent, a later local change) is judged by the signatures alone, and says so. The marker line
`# kvgate-backport: <id>` is a label shown in the report: with the code it reads "marked"; without
the code it makes the backport TAMPERED (a marker claims a fix the code does not carry), a failure.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvgate.catalogue.codescan import CodeScan, code_pattern
from kvgate.catalogue.model import Catalogue, Detection, Presence
from kvgate.catalogue.series import Patch, Series


@dataclass(frozen=True)
class FileCheck:
    """One file a backport changes, as found in the scanned code."""

    path: str  # relative to the sglang/ package
    exists: bool
    missing: tuple[str, ...]  # code signatures not found
    identical: bool  # sha256 equals what the series leaves (this patch, or a later one on top)
    pristine: bool  # sha256 equals the release's file before the patch

    @property
    def code_ok(self) -> bool:
        return self.exists and not self.missing

    def describe(self) -> str:
        if not self.exists:
            return f"{self.path}: no such file"
        if self.missing:
            state = "unpatched release file" if self.pristine else "code missing"
            return f"{self.path}: {state} ({', '.join(repr(m) for m in self.missing)})"
        how = (
            "byte-identical to the series' output"
            if self.identical
            else "code signatures found; file differs from the series' output (hand-applied or changed since)"
        )
        return f"{self.path}: {how}"


@dataclass(frozen=True)
class BackportCheck:
    """One backport id against one scan: the best-matching series variant and its file checks."""

    id: str
    presence: Presence
    series: str | None
    files: tuple[FileCheck, ...]
    marker_files: tuple[str, ...]

    @property
    def marked(self) -> bool:
        return bool(self.marker_files)

    def label(self) -> str:
        if self.marked:
            return f"marker in {', '.join(self.marker_files[:3])}" + (" ..." if len(self.marker_files) > 3 else "")
        return "no marker"

    def evidence(self) -> tuple[str, ...]:
        head = {
            Presence.PRESENT: f"code verified against series {self.series} ({self.label()}"
            + ("" if self.marked else ": a hand-applied equivalent")
            + ")",
            Presence.TAMPERED: f"tampered or partial backport: {self.label()}, but the code of series "
            f"{self.series} is not (all) there",
            Presence.ABSENT: f"not applied (code of series {self.series} not found; {self.label()})",
        }[self.presence]
        return (head,) + tuple(f.describe() for f in self.files)


def _stage_hashes(series: Series, index: int, path: str) -> tuple[set[str], str | None]:
    """sha256 values of `path` once patch `index` and possibly later ones are applied; and the hash before."""
    before = next((f.sha256_before for f in series.patches[index].files if f.path == path), None)
    after = {f.sha256_after for p in series.patches[index:] for f in p.files if f.path == path}
    return after, before


def check_variant(scan: CodeScan, series: Series, index: int) -> tuple[FileCheck, ...]:
    """File checks of patch `index` of `series` against the scan."""
    patch: Patch = series.patches[index]
    out = []
    for f in patch.files:
        rel = f.site_path[len("sglang/") :]
        facts = scan.files.get(rel)
        if facts is None:
            out.append(FileCheck(rel, False, f.code, False, False))
            continue
        missing = tuple(c for c in f.code if not facts.hits.get(code_pattern(c), False))
        after, before = _stage_hashes(series, index, f.path)
        out.append(FileCheck(rel, True, missing, facts.sha256 in after, facts.sha256 == before))
    return tuple(out)


def check_backport(scan: CodeScan, backport_id: str, series: tuple[Series, ...]) -> BackportCheck:
    """Verify one backport id by code across every series that has it (the best variant wins)."""
    markers = tuple(scan.markers.get(backport_id, ()))
    variants = [(s, i) for s in series for i, p in enumerate(s.patches) if p.id == backport_id]
    if not variants:
        presence = Presence.TAMPERED if markers else Presence.ABSENT
        return BackportCheck(backport_id, presence, None, (), markers)
    declared = (scan.version or "").split("+")[0]

    def rank(v: tuple[Series, int]) -> tuple[bool, bool, int, int]:
        """Verified first, then the series of the declared release, then the closest to its output."""
        checks = check_variant(scan, *v)
        return (
            all(c.code_ok for c in checks),
            declared == v[0].base_release,
            sum(c.identical for c in checks),
            sum(c.code_ok for c in checks),
        )

    best = max(variants, key=rank)
    checks = check_variant(scan, *best)
    if all(c.code_ok for c in checks):
        presence = Presence.PRESENT
    elif markers:
        presence = Presence.TAMPERED
    else:
        presence = Presence.ABSENT
    return BackportCheck(backport_id, presence, best[0].name, checks, markers)


def detect_backports(cat: Catalogue, scan: CodeScan, method: str, series: tuple[Series, ...]) -> list[Detection]:
    """One detection per catalogue backport entry; markers of ids the catalogue does not know are tampering."""
    out = []
    for fix in cat.backports():
        bc = check_backport(scan, fix.id, series)
        out.append(Detection(fix.id, method, bc.presence, (f"{scan.source}",) + bc.evidence()))
    return out


def unknown_markers(cat: Catalogue, scan: CodeScan) -> dict[str, tuple[str, ...]]:
    """Marker ids in the code that no catalogue backport has: a claim nothing can verify."""
    known = {f.id for f in cat.backports()}
    return {k: v for k, v in scan.markers.items() if k not in known}
