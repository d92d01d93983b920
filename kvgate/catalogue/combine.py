"""One answer per fix from several detection methods.

The rule, once for every pair of methods (`decide`): code evidence outranks labels, both ways. Among
the methods that read or run the code (`CODE_METHODS`: git history and tree, the source files, sglang's
own behaviour), the most trusted one that knows (present or absent) decides: behaviour over source
over git. A label (the version string) decides only where no method read the code: where one did, a
label's "present" never turns the code's "absent" or "unknown" into present, and its "absent" never
turns the code's "unknown" into absent; the answer stays unknown, an inconclusive that blocks a
correctness fix. Where methods disagree, every answer stays in the status so reports show both. A
kvgate backport whose code a method verified (kvgate.catalogue.backports; a marker alone never counts)
stands in, for that method, for the upstream fix it backports.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kvgate.catalogue.model import METHODS, Catalogue, Detection, Fix, Presence

_TRUST = {m: i for i, m in enumerate(METHODS)}
#: The methods whose answer comes from the code itself; every other method reads a label.
CODE_METHODS = frozenset({"git", "source", "behaviour"})


def decide(detections: Iterable[Detection]) -> Detection | None:
    """The detection that decides one fix (None: unknown), by the module's one rule.

    Where any method read the code, only the code decides (the most trusted code method that knows);
    a label decides only where nothing read the code.
    """
    ds = sorted(detections, key=lambda d: _TRUST[d.method], reverse=True)
    code = [d for d in ds if d.method in CODE_METHODS]
    return next((d for d in (code or ds) if d.presence is not Presence.UNKNOWN), None)


@dataclass(frozen=True)
class FixStatus:
    """The combined answer for one fix, with every method's own answer."""

    fix: Fix
    presence: Presence
    decided_by: str | None
    detections: tuple[Detection, ...]
    via_backport: str | None = None

    @property
    def decided(self) -> Detection | None:
        return next((d for d in self.detections if d.method == self.decided_by), None)

    @property
    def weak(self) -> bool:
        """Decided only by an inference (release order), not by what a release or the code shows."""
        d = self.decided
        return d is not None and d.weak

    @property
    def version_only(self) -> bool:
        """Decided by a version string: the code itself was not read."""
        return self.decided_by == "version"

    @property
    def disagreement(self) -> bool:
        known = {d.presence for d in self.detections if d.presence is not Presence.UNKNOWN}
        return len(known) > 1

    def how(self) -> str:
        """One line: which method decided, and what the others said when they disagree."""
        if self.decided_by is None:
            labels = [d for d in self.detections if d.method not in CODE_METHODS and d.presence is not Presence.UNKNOWN]
            if labels and any(d.method in CODE_METHODS for d in self.detections):
                code = ", ".join(d.method for d in self.detections if d.method in CODE_METHODS)
                said = ", ".join(f"the {d.method} string says {d.presence.value}" for d in labels)
                return f"the code could not tell ({code}); {said}: a label, never evidence over the code"
            methods = ", ".join(d.method for d in self.detections) or "nothing"
            return f"no method could tell ({methods})"
        text = "by version string only, code not read" if self.version_only else f"by {self.decided_by}"
        if self.weak:
            text += " (weak evidence: assumed by release order)"
        if self.via_backport:
            text += f", by kvgate backport {self.via_backport}, code verified"
        others = [
            d
            for d in self.detections
            if d.method != self.decided_by and d.presence is not self.presence and d.presence is not Presence.UNKNOWN
        ]
        if others:
            text += " (trusted over " + ", ".join(f"{d.method}, which says {d.presence.value}" for d in others) + ")"
        return text


def apply_backports(
    cat: Catalogue, detections: Iterable[Detection]
) -> tuple[list[Detection], dict[tuple[str, str], str]]:
    """Let a backport found by a method count, for that method, as the upstream fix it stands in for.

    Returns the new detections and {(method, upstream fix id): backport id} for the substitutions made.
    """
    table = {(d.method, d.fix_id): d for d in detections}
    used: dict[tuple[str, str], str] = {}
    for (method, fid), d in list(table.items()):
        fix = cat.get(fid)
        if not fix.is_backport or d.presence is not Presence.PRESENT or fix.backports is None:
            continue
        up = table.get((method, fix.backports))
        used[(method, fix.backports)] = fix.id
        if up is not None and up.presence is Presence.PRESENT:
            continue  # the upstream signatures match too (the backport's code carries them): keep both
        upstream_ev = tuple(f"upstream signatures: {e}" for e in (up.evidence if up else ()))
        table[(method, fix.backports)] = Detection(
            fix.backports,
            method,
            Presence.PRESENT,
            (f"kvgate backport {fix.id} stands in for it (code verified)",) + d.evidence + upstream_ev,
        )
    return list(table.values()), used


def combine(cat: Catalogue, detections: Iterable[Detection]) -> tuple[FixStatus, ...]:
    """One FixStatus per catalogue entry, in catalogue order."""
    dets, via = apply_backports(cat, detections)
    by_fix: dict[str, list[Detection]] = {}
    for d in dets:
        if d.method not in _TRUST:
            raise ValueError(f"unknown detection method {d.method!r}")
        by_fix.setdefault(d.fix_id, []).append(d)
    out = []
    for fix in cat.fixes:
        ds = sorted(by_fix.get(fix.id, []), key=lambda d: _TRUST[d.method], reverse=True)
        decided = decide(ds)
        presence = decided.presence if decided else Presence.UNKNOWN
        backport = via.get((decided.method, fix.id)) if decided is not None else None
        out.append(FixStatus(fix, presence, decided.method if decided else None, tuple(ds), backport))
    return tuple(out)
