"""The catalogue's data model (frozen dataclasses) and the loader of `fixes.yaml`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml
from packaging.version import InvalidVersion, Version

from kvgate.errors import KvgateError

_KINDS = {"issue", "pr", "change", "subsystem", "backport", "open-problem"}
_STATES = {"merged", "open", "not-merged", "closed", "not-established", "n/a"}
_EVIDENCE = {"W", "T", "3P", "inferred"}
_CLASSES = {"admission", "short-handoff", "abort-cleanup", "page-lifetime", "detection"}
_BOUNDS = {"exact", "at-or-before"}


class CatalogueError(KvgateError):
    """fixes.yaml does not validate (a packaging bug, not a user error)."""


class Presence(str, Enum):
    """Whether a fix is in the code we looked at."""

    PRESENT = "present"
    ABSENT = "absent"
    UNKNOWN = "unknown"
    # A kvgate backport whose marker is in the code but whose code is not (all) there: a failure of its own.
    TAMPERED = "tampered"


#: Detection methods, least to most trusted; the combiner trusts the later ones.
METHODS = ("version", "git", "source", "behaviour")


@dataclass(frozen=True)
class Detection:
    """What one method says about one fix, and why. `weak`: an inference (release order beyond the
    verified releases), reported as such and never enough to pass a correctness fix."""

    fix_id: str
    method: str
    presence: Presence
    evidence: tuple[str, ...] = ()
    weak: bool = False


@dataclass(frozen=True)
class Signature:
    """One string that must be in a file's code for a fix to count as present.

    `file` is relative to the `sglang/` package root and may be a glob (`**/*.py`), meaning "any file".
    `context` says where it must stand (`scanprog`'s code view: comments and docstrings never count):
    "code" outside any string literal (a definition, a call), "string" inside a string literal the code
    uses (a message the fixed code raises or logs), "text" the raw bytes (kvgate's own marker comment).
    """

    file: str
    substring: str | None = None
    regex: str | None = None
    context: str = "code"

    @property
    def is_glob(self) -> bool:
        return any(c in self.file for c in "*?[")

    @property
    def pattern(self) -> str:
        return self.substring if self.substring is not None else f"re:{self.regex}"

    def compiled(self) -> re.Pattern[str]:
        """A regex for this signature (substring escaped); MULTILINE so ^ anchors lines."""
        return re.compile(re.escape(self.substring) if self.substring is not None else str(self.regex), re.MULTILINE)

    @property
    def scan_pattern(self) -> str:
        """The scan program's pattern string (`scanprog.pattern_matcher`)."""
        kind = {"code": ("sub", "re"), "string": ("ssub", "sre"), "text": ("txt", "txt")}[self.context]
        return f"{kind[0]}:{self.substring}" if self.substring is not None else f"{kind[1]}:{self.regex}"

    def describe(self) -> str:
        where = "" if self.context == "code" else f" (in a {self.context})"
        what = repr(self.substring) if self.substring is not None else f"/{self.regex}/"
        return f"{self.file}: {what}{where}"


@dataclass(frozen=True)
class Fix:
    """One catalogue entry: an upstream record or one of kvgate's own backports."""

    id: str
    number: int | None
    kind: str
    title: str
    state: str
    state_evidence: str
    failure_class: str
    first_release: Version | None
    first_release_bound: str
    correctness: bool
    signatures: tuple[Signature, ...]
    backends: tuple[str, ...] = ()
    uncertain: tuple[str, ...] = ()
    notes: str = ""
    backports: str | None = None

    @property
    def label(self) -> str:
        """How a human names it: '#38935', or the id for entries without an upstream number."""
        if self.kind == "backport":
            return self.id
        labelled = ("pr", "issue", "open-problem")
        return f"#{self.number}" if self.number is not None and self.kind in labelled else self.id

    @property
    def is_open_problem(self) -> bool:
        """Its signatures are the code a known open upstream problem lives in: present = still has it."""
        return self.kind == "open-problem"

    @property
    def is_backport(self) -> bool:
        return self.kind == "backport"

    def is_correctness_for(self, backend: str | None) -> bool:
        """True when missing this fix is a gate failure for a deployment on `backend` (None = unknown).

        A backend-specific fix counts only when the backend is known to be one it applies to.
        """
        if not self.correctness:
            return False
        if not self.backends:
            return True
        return backend is not None and backend in self.backends


@dataclass(frozen=True)
class Catalogue:
    """All entries, in file order, plus the release facts they were verified against."""

    fixes: tuple[Fix, ...]
    verified_releases: tuple[Version, ...]
    recommended_minimum: Version
    _by_id: dict[str, Fix] = field(default_factory=dict, compare=False, repr=False)

    def get(self, fix_id: str) -> Fix:
        return self._by_id[fix_id]

    def upstream(self) -> tuple[Fix, ...]:
        return tuple(f for f in self.fixes if not f.is_backport)

    def backports(self) -> tuple[Fix, ...]:
        return tuple(f for f in self.fixes if f.is_backport)

    def backport_for(self, fix_id: str) -> tuple[Fix, ...]:
        """kvgate backports that stand in for upstream entry `fix_id`."""
        return tuple(f for f in self.fixes if f.backports == fix_id)

    def correctness_ids(self, backend: str | None = None) -> tuple[str, ...]:
        return tuple(f.id for f in self.fixes if f.is_correctness_for(backend))


def _req(entry: dict[str, Any], key: str, where: str) -> Any:
    if key not in entry:
        raise CatalogueError(f"fixes.yaml: {where}: missing key '{key}'")
    return entry[key]


def _choice(value: Any, allowed: set[str], key: str, where: str) -> str:
    if value not in allowed:
        raise CatalogueError(f"fixes.yaml: {where}: {key}={value!r}, expected one of {sorted(allowed)}")
    return str(value)


def _version(value: Any, where: str) -> Version | None:
    if value is None:
        return None
    try:
        return Version(str(value))
    except InvalidVersion as exc:
        raise CatalogueError(f"fixes.yaml: {where}: bad release {value!r}") from exc


def _signature(raw: dict[str, Any], where: str) -> Signature:
    sub, rx = raw.get("substring"), raw.get("regex")
    if (sub is None) == (rx is None):
        raise CatalogueError(f"fixes.yaml: {where}: a signature needs exactly one of substring/regex")
    context = raw.get("in", "code")
    if context not in ("code", "string"):
        raise CatalogueError(f"fixes.yaml: {where}: 'in' must be code or string, not {context!r}")
    sig = Signature(file=str(_req(raw, "file", where)), substring=sub, regex=rx, context=context)
    try:
        sig.compiled()
    except re.error as exc:
        raise CatalogueError(f"fixes.yaml: {where}: bad regex {rx!r}: {exc}") from exc
    return sig


def parse_catalogue(doc: dict[str, Any]) -> Catalogue:
    """Validate a parsed fixes.yaml document and build the catalogue."""
    if doc.get("schema") != 1:
        raise CatalogueError(f"fixes.yaml: unsupported schema {doc.get('schema')!r}")
    fixes: list[Fix] = []
    for i, e in enumerate(_req(doc, "fixes", "top level")):
        where = f"fixes[{i}] ({e.get('id', '?')})"
        sigs = tuple(_signature(s, f"{where} signature {j}") for j, s in enumerate(e.get("signatures") or ()))
        kind = _choice(_req(e, "kind", where), _KINDS, "kind", where)
        if not sigs and kind != "backport":
            raise CatalogueError(f"fixes.yaml: {where}: no signatures")
        if sigs and kind == "backport":
            raise CatalogueError(
                f"fixes.yaml: {where}: a backport is recognised by the code signatures of its "
                "series manifest (backports/), not by catalogue signatures"
            )
        fixes.append(
            Fix(
                id=str(_req(e, "id", where)),
                number=e.get("number"),
                kind=kind,
                title=str(_req(e, "title", where)),
                state=_choice(_req(e, "state", where), _STATES, "state", where),
                state_evidence=_choice(_req(e, "state_evidence", where), _EVIDENCE, "state_evidence", where),
                failure_class=_choice(_req(e, "failure_class", where), _CLASSES, "failure_class", where),
                first_release=_version(e.get("first_release"), where),
                first_release_bound=_choice(
                    e.get("first_release_bound", "exact"), _BOUNDS, "first_release_bound", where
                ),
                correctness=bool(_req(e, "correctness", where)),
                signatures=sigs,
                backends=tuple(e.get("backends") or ()),
                uncertain=tuple(e.get("uncertain") or ()),
                notes=str(e.get("notes") or ""),
                backports=e.get("backports"),
            )
        )
    by_id: dict[str, Fix] = {}
    for f in fixes:
        if f.id in by_id:
            raise CatalogueError(f"fixes.yaml: duplicate id {f.id}")
        by_id[f.id] = f
    for f in fixes:
        if f.is_backport and f.backports not in by_id:
            raise CatalogueError(f"fixes.yaml: {f.id}: backports unknown entry {f.backports!r}")
    verified = tuple(sorted(Version(v) for v in _req(doc, "verified_releases", "top level")))
    return Catalogue(
        fixes=tuple(fixes),
        verified_releases=verified,
        recommended_minimum=Version(str(_req(doc, "recommended_minimum", "top level"))),
        _by_id=by_id,
    )


@lru_cache(maxsize=1)
def load_catalogue() -> Catalogue:
    """The catalogue shipped in the package (kvgate/catalogue/fixes.yaml)."""
    text = resources.files("kvgate.catalogue").joinpath("fixes.yaml").read_text(encoding="utf-8")
    return parse_catalogue(yaml.safe_load(text))
