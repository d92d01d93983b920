"""Apply, check and revert a backport series on a git checkout or an installed sglang.

Every run first finishes or rolls back an interrupted earlier one (`_recover`), then reads where the
target stands under the series (kvgate/backport/stages.py) and hands the writing to the target's kind:
kvgate/backport/gitrepo.py (commits on a branch) or kvgate/backport/sitepkg.py (journaled transactions).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from kvgate.backport.gitrepo import apply_git, backport_commits, recover_git, refuse_dirty, repo_of, revert_git
from kvgate.backport.journal import BACK, FORWARD, Recovery
from kvgate.backport.sitepkg import apply_site, recover_site, revert_site
from kvgate.backport.stages import (
    MARKER_FILE,
    BackportRefused,
    BackportResult,
    Layout,
    Target,
    applied_count,
    outcomes,
    read_current,
    render,
    result,
)
from kvgate.catalogue.series import Patch, Series
from kvgate.errors import UsageError


def _recover(target: Target, series: Series, forward_for: str | None) -> Recovery | None:
    """Every run starts here: an interrupted earlier run is finished (when it did what this run wants:
    `forward_for` names that action) or rolled back (otherwise, and always for --check and --verify)."""
    if target.layout is Layout.GIT:
        return recover_git(target, series, forward_for)
    return recover_site(target, series, forward_for)


# -- entry points -------------------------------------------------------------------------------------
def _validate(target: Target) -> None:
    if not target.root.is_dir():
        raise UsageError(f"{target.root}: no such directory")
    if not (target.root / ("python/sglang" if target.layout is Layout.GIT else "sglang")).is_dir():
        where = "python/sglang" if target.layout is Layout.GIT else "sglang/"
        raise UsageError(f"{target.root}: no {where} here; not an sglang {target.layout.value} layout")


def apply_series(
    target: Target, series: Series, with_hardening: bool = False, check: bool = False, until: str | None = None
) -> BackportResult:
    """Apply (or with check=True, only evaluate) the series; a second apply is a no-op.

    `until`: apply the series only up to and including that patch id (an optional patch named here is
    applied with what precedes it, whatever `with_hardening` says), so a tree can be taken through the
    series one patch at a time, as the per-patch isolation tests do. An unknown id is a UsageError.
    """
    _validate(target)
    patches = series.select(with_hardening) if until is None else series.patches[: _position(series, until) + 1]
    recovered = _recover(target, series, None if check else "apply")
    out = _apply(target, series, patches, check)
    return replace(out, recovered=recovered) if recovered else out


def _apply(target: Target, series: Series, patches: tuple[Patch, ...], check: bool) -> BackportResult:
    if target.layout is Layout.GIT:
        refuse_dirty(repo_of(target.root), target)
    # Stages are read against the whole series, so a tree patched with --with-hardening is "already
    # applied" for a later run without it, instead of "unknown".
    current = read_current(target, series.patches)
    k = applied_count(target, series, series.patches, current)
    if k >= len(patches):
        action, message = (
            "check" if check else "apply",
            f"already applied: {series.name} ({k} patch(es)) on {target.root}",
        )
        return result(action, target, series, outcomes(target, series.patches[:k], "already applied"), False, message)
    done = outcomes(target, patches[:k], "already applied")
    if check:
        render(target, series, patches, k, current)  # proves every hunk applies, writes nothing
        todo = outcomes(target, patches[k:], "would apply")
        message = f"{len(patches) - k} patch(es) would apply cleanly to {target.root}"
        return result("check", target, series, done + todo, False, message)
    if target.layout is Layout.GIT:
        return apply_git(target, series, patches, k, current)
    return apply_site(target, series, patches, k, current)


def _position(series: Series, patch_id: str) -> int:
    ids = [p.id for p in series.patches]
    if patch_id not in ids:
        raise UsageError(f"{series.name}: no patch {patch_id!r} in the series (it has {', '.join(ids)})")
    return ids.index(patch_id)


def revert_series(target: Target, series: Series) -> BackportResult:
    """Undo the series: byte-for-byte restore (site-packages) or a restoring commit (git)."""
    _validate(target)
    recovered = _recover(target, series, "revert")
    undone = recovered is not None and (recovered.direction, recovered.action) in ((BACK, "apply"), (FORWARD, "revert"))
    if recovered is not None and undone:
        # An interrupted apply undone, or an interrupted revert finished: what remains to revert is
        # what a completed run recorded.
        nothing = (
            not (target.marker_dir / MARKER_FILE).is_file()
            if target.layout is Layout.SITE
            else not backport_commits(repo_of(target.root), series)
        )
        if nothing:
            return replace(result("revert", target, series, (), True, recovered.message), recovered=recovered)
    if target.layout is Layout.GIT:
        out = revert_git(target, series, series.patches)
    else:
        out = revert_site(target, series)
    return replace(out, recovered=recovered) if recovered else out


def recover_interrupted(target: Target, series: Series) -> Recovery | None:
    """Roll an interrupted run back to the last completed state (what --verify does before it reads)."""
    _validate(target)
    return _recover(target, series, None)


def applied_patches(target: Target, series: Series) -> tuple[Patch, ...]:
    """The patches of the series the target carries (refuses a target at no known stage); an interrupted
    run is rolled back first, as --check does."""
    _validate(target)
    _recover(target, series, None)
    full = series.select(True)
    current = read_current(target, full)
    try:
        k = applied_count(target, series, full, current)
    except BackportRefused:
        base = series.select(False)
        k = applied_count(target, series, base, read_current(target, base))
        return base[:k]
    return full[:k]


def site_packages_of(python: str) -> Path:
    """The site-packages directory interpreter `python` imports sglang from (without importing sglang)."""
    from kvgate.catalogue.codescan import locate_package

    return locate_package(python).parent
