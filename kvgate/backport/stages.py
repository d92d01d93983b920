"""The tree a backport series is applied to, and where it stands under the series.

A target is a git checkout or a site-packages directory. Both share one rule: every file the series
touches must hash to a known stage of the series (the base release, or after patch k). Anything else is
refused before a byte is written, naming the file (exit 2). New contents are computed in memory and
checked against the manifest's sha256_after (`render`) before any target is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from kvgate.backport.diffapply import PatchApplyError, apply, parse
from kvgate.backport.journal import Recovery
from kvgate.catalogue.series import Patch, PatchFile, Series, sha256_bytes
from kvgate.errors import KvgateError, UsageError
from kvgate.exitcodes import ExitStatus
from kvgate.output.safeio import confine

MARKER_DIR = ".kvgate-backport"  # inside the installed `sglang/` package
MARKER_FILE = "applied.json"


class BackportRefused(UsageError):
    """The target is not what the series expects (dirty, modified, wrong release): exit 2."""


class BackportFailed(KvgateError):
    """Writing the target broke half way (disk full, permissions, a git error); it was restored.

    Exit 4, not 2: the flags were right, the target could not be written. Retry once the cause is fixed.
    """

    exit_status = ExitStatus.TRANSPORT_ERROR


class Layout(str, Enum):
    """Where sglang's sources are."""

    GIT = "git"
    SITE = "site-packages"


@dataclass(frozen=True)
class Target:
    """A git checkout (files under python/sglang) or a site-packages directory (files under sglang/)."""

    layout: Layout
    root: Path

    def rel(self, pf: PatchFile) -> str:
        return pf.path if self.layout is Layout.GIT else pf.site_path

    def file(self, pf: PatchFile) -> Path:
        return self.root / self.rel(pf)

    @property
    def import_root(self) -> Path:
        """The directory to put on PYTHONPATH to import this target's sglang."""
        return self.root / "python" if self.layout is Layout.GIT else self.root

    @property
    def marker_dir(self) -> Path:
        return self.root / "sglang" / MARKER_DIR


@dataclass(frozen=True)
class PatchOutcome:
    """What happened (or would happen) to one patch."""

    id: str
    title: str
    status: str  # applied | already applied | would apply | reverted | would revert | not applied
    files: tuple[str, ...]
    commit: str | None = None


@dataclass(frozen=True)
class BackportResult:
    """The outcome of one apply / check / revert run."""

    action: str
    layout: Layout
    root: Path
    series: str
    patches: tuple[PatchOutcome, ...]
    changed: bool
    message: str
    branch: str | None = None
    backup: Path | None = None
    marker: Path | None = None
    recovered: Recovery | None = None  # an interrupted earlier run this one finished or rolled back


def branch_name(series: Series) -> str:
    return f"kvgate/backport-v{series.base_release}"


def outcomes(target: Target, patches: tuple[Patch, ...], status: str) -> tuple[PatchOutcome, ...]:
    """Each patch with one status and the files it touches, as the target names them."""
    return tuple(PatchOutcome(p.id, p.title, status, tuple(target.rel(f) for f in p.files)) for p in patches)


def result(
    action: str,
    target: Target,
    series: Series,
    patches: tuple[PatchOutcome, ...],
    changed: bool,
    message: str,
    branch: str | None = None,
    backup: Path | None = None,
    marker: Path | None = None,
) -> BackportResult:
    """A run's result on `target`."""
    return BackportResult(
        action, target.layout, target.root, series.name, patches, changed, message, branch, backup, marker
    )


# -- state ----------------------------------------------------------------------------------------
def _stage_hashes(patches: tuple[Patch, ...], k: int) -> dict[str, str]:
    """The sha256 of every touched file after the first k patches."""
    out: dict[str, str] = {}
    for j, p in enumerate(patches):
        for f in p.files:
            if j < k:
                out[f.path] = f.sha256_after
            else:
                out.setdefault(f.path, f.sha256_before)
    return out


def files_of(patches: tuple[Patch, ...]) -> dict[str, PatchFile]:
    out: dict[str, PatchFile] = {}
    for p in patches:
        for f in p.files:
            out.setdefault(f.path, f)
    return out


def read_current(target: Target, patches: tuple[Patch, ...]) -> dict[str, bytes | None]:
    """The bytes of every file the series touches (None where missing).

    Each path comes from the series manifest: it must resolve inside the target (no symlink out), or
    the run stops before anything is written (UnsafePath, exit 2).
    """
    out: dict[str, bytes | None] = {}
    for path, pf in files_of(patches).items():
        fp = confine(target.root, target.rel(pf), manifest_of(patches, pf))
        out[path] = fp.read_bytes() if fp.is_file() else None
    return out


def manifest_of(patches: tuple[Patch, ...], pf: PatchFile) -> Path:
    """The manifest that named `pf` (for error messages)."""
    return next(p.file.parent / "manifest.yaml" for p in patches if pf in p.files)


def applied_count(target: Target, series: Series, patches: tuple[Patch, ...], current: dict[str, bytes | None]) -> int:
    """How many patches of `patches` the target already carries; refuse (naming the file) otherwise."""
    hashes = {p: (sha256_bytes(b) if b is not None else None) for p, b in current.items()}
    for k in range(len(patches), -1, -1):
        if all(hashes[p] == h for p, h in _stage_hashes(patches, k).items()):
            return k
    files = files_of(patches)
    known = {p: {h[p] for h in (_stage_hashes(patches, k) for k in range(len(patches) + 1))} for p in hashes}
    for path, h in hashes.items():
        shown = target.rel(files[path])
        if h is None:
            raise BackportRefused(f"{target.root / shown}: missing; not an sglang {series.base_release} tree")
        if h not in known[path]:
            raise BackportRefused(
                f"{shown}: sha256 {h[:12]}… does not match sglang {series.base_release} as the {series.name} "
                f"manifest expects (modified locally, or another release); refusing to patch"
            )
    stages = sorted(hashes)
    raise BackportRefused(
        f"{target.rel(files[stages[0]])} and others are at different stages of {series.name} "
        f"(partially patched by hand?); refusing to patch"
    )


def render(
    target: Target, series: Series, patches: tuple[Patch, ...], k: int, current: dict[str, bytes | None]
) -> list[tuple[Patch, dict[str, bytes]]]:
    """New contents after each pending patch, verified against the manifest, all in memory."""
    state = {p: b for p, b in current.items() if b is not None}
    steps: list[tuple[Patch, dict[str, bytes]]] = []
    for patch in patches[k:]:
        diffs = {d.path: d for d in parse(patch.diff_text())}
        changed: dict[str, bytes] = {}
        for pf in patch.files:
            if pf.path not in diffs:
                raise UsageError(f"{series.name}/{patch.file.name}: no diff for {pf.path} named in the manifest")
            try:
                text = apply(state[pf.path].decode("utf-8"), diffs[pf.path])
            except (PatchApplyError, UnicodeDecodeError) as exc:
                raise BackportRefused(f"{target.rel(pf)}: {patch.id} does not apply: {exc}") from exc
            data = text.encode("utf-8")
            if sha256_bytes(data) != pf.sha256_after:
                raise UsageError(
                    f"{series.name}: {patch.id} leaves {pf.path} with an unexpected sha256 "
                    f"(manifest and patch disagree)"
                )
            state[pf.path] = data
            changed[pf.path] = data
        steps.append((patch, changed))
    return steps
