"""A backport on an installed sglang (site-packages): the tree's own record of what was applied (the
marker), pristine backups beside it, and every write as one journaled transaction that a hard kill
leaves recoverable (kvgate/backport/journal.py).
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Callable
from pathlib import Path

from kvgate import __version__
from kvgate.backport.journal import Change, Journal, Recovery, Transaction, file_state, recover
from kvgate.backport.stages import (
    MARKER_DIR,
    MARKER_FILE,
    BackportFailed,
    BackportRefused,
    BackportResult,
    PatchOutcome,
    Target,
    files_of,
    outcomes,
    render,
    result,
)
from kvgate.catalogue.series import Patch, Series, sha256_bytes
from kvgate.output.safeio import confine, inside

JOURNAL_DIR = "journal"  # inside MARKER_DIR (site-packages) or the git directory's kvgate-backport/


def _read_marker(target: Target) -> dict | None:
    """The tree's own record of what was applied, validated: its shape, and that its folder is inside
    the target. Anything else refuses (exit 2) naming the file."""
    path = target.marker_dir / MARKER_FILE
    inside(target.root, target.marker_dir, target.marker_dir)
    if not path.is_file():
        return None
    try:
        marker = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BackportRefused(f"{path}: unreadable backport record: {exc}") from None
    files = marker.get("files") if isinstance(marker, dict) else None
    if (
        not isinstance(files, dict)
        or not isinstance(marker.get("patches"), list)
        or not all(isinstance(k, str) and isinstance(v, dict) for k, v in files.items())
    ):
        raise BackportRefused(f"{path}: not a kvgate backport record (expected 'patches' and 'files')")
    return marker


def site_journal(target: Target) -> Journal:
    """The journal of a site-packages target: inside the backport's own folder, pruned with it."""
    return Journal(target.root, target.marker_dir / JOURNAL_DIR, target.marker_dir)


def _rel(target: Target, path: Path) -> str:
    return path.relative_to(target.root).as_posix()


def _site_allowed(target: Target, series: Series) -> Callable[[str], bool]:
    """The paths a site-packages journal may name: the series' files and the backport's own folder."""
    files = {target.rel(pf) for pf in files_of(series.patches).values()}
    own = _rel(target, target.marker_dir) + "/"
    return lambda rel: rel in files or rel.startswith(own)


def _run(txn: Transaction, target: Target) -> None:
    """Run a journaled transaction; an OSError (disk full, permissions) becomes BackportFailed (exit 4)."""
    try:
        txn.run()
    except OSError as exc:
        raise BackportFailed(f"writing {target.root} failed, nothing changed: {exc}") from exc


def apply_site(
    target: Target, series: Series, patches: tuple[Patch, ...], k: int, current: dict[str, bytes | None]
) -> BackportResult:
    steps = render(target, series, patches, k, current)
    files = files_of(patches)
    final: dict[str, bytes] = {}
    for _, changed in steps:
        final.update(changed)
    backup_dir = target.marker_dir / "backup"
    marker_path = target.marker_dir / MARKER_FILE
    inside(target.root, target.marker_dir, target.marker_dir)
    old_record = file_state(marker_path)
    marker = _read_marker(target) or {
        "series": series.name,
        "base_release": series.base_release,
        "patches": [],
        "files": {},
    }
    changes: list[Change] = []
    for path in final:
        rel = target.rel(files[path])
        dest = backup_dir / rel
        if path in marker["files"] and dest.is_file():
            continue  # the original was saved by an earlier run; keep it
        base = current[path]
        assert base is not None
        if sha256_bytes(base) != files[path].sha256_before:
            raise BackportRefused(f"{rel}: no pristine backup recorded and the file is already patched")
        inside(target.root, dest.parent, dest)  # a link on the way to the backups: refused (the file is replaced)
        changes.append(Change(_rel(target, dest), file_state(dest), base))
        marker["files"][path] = {"site_path": rel, "sha256_original": files[path].sha256_before}
    changes += [Change(target.rel(files[p]), current[p], data) for p, data in final.items()]
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    for patch, _ in steps:
        marker["patches"].append(
            {"id": patch.id, "title": patch.title, "applied_at": now, "files": [target.rel(f) for f in patch.files]}
        )
    for p, data in final.items():
        marker["files"][p]["sha256_patched"] = sha256_bytes(data)
    marker["kvgate_version"] = __version__
    record = (json.dumps(marker, indent=2) + "\n").encode("utf-8")
    changes.append(Change(_rel(target, marker_path), old_record, record))
    _run(Transaction(site_journal(target), "apply", series.name, tuple(changes)), target)
    done = outcomes(target, patches[:k], "already applied") + outcomes(target, tuple(p for p, _ in steps), "applied")
    message = f"applied {len(steps)} patch(es) to {target.root}"
    return result("apply", target, series, done, True, message, backup=backup_dir, marker=marker_path)


def revert_site(target: Target, series: Series) -> BackportResult:
    marker = _read_marker(target)
    if marker is None:
        raise BackportRefused(f"{target.root}: no kvgate backport recorded ({MARKER_DIR}/{MARKER_FILE} missing)")
    if marker.get("base_release") != series.base_release:
        raise BackportRefused(
            f"{target.root}: the recorded backport is for {marker.get('base_release')}, not {series.base_release}"
        )
    record = target.marker_dir / MARKER_FILE
    known = files_of(series.patches)
    restores: list[Change] = []
    drops: list[Change] = []
    for key, info in marker["files"].items():
        # The record is data from the tree itself: every path in it stays inside the tree, and names
        # a file this series touches, before a byte is written.
        live = confine(target.root, info.get("site_path"), record)
        backup = confine(target.marker_dir / "backup", info["site_path"], record)
        if key not in known or known[key].site_path != info["site_path"]:
            raise BackportRefused(
                f"{record}: records {info['site_path']!r}, which {series.name} does not touch; refusing to revert"
            )
        patched = live.read_bytes() if live.is_file() else None
        if patched is None or sha256_bytes(patched) != info.get("sha256_patched"):
            raise BackportRefused(f"{info['site_path']}: changed since kvgate patched it; refusing to revert")
        data = backup.read_bytes() if backup.is_file() else b""
        if sha256_bytes(data) != info.get("sha256_original"):
            raise BackportRefused(f"{backup}: backup missing or damaged; refusing to revert")
        restores.append(Change(_rel(target, live), patched, data))
        drops.append(Change(_rel(target, backup), data, None))
    recorded = {str(p.get("id")): p for p in marker["patches"] if isinstance(p, dict)}
    undone = tuple(
        PatchOutcome(pid, str(p.get("title", pid)), "reverted", tuple(map(str, p.get("files") or ())))
        for pid, p in recorded.items()
    )
    changes = [*restores, Change(_rel(target, record), record.read_bytes(), None), *drops]
    _run(Transaction(site_journal(target), "revert", series.name, tuple(changes)), target)
    return result(
        "revert", target, series, undone, True, f"restored {len(restores)} file(s) in {target.root} byte for byte"
    )


def recover_site(target: Target, series: Series, forward_for: str | None) -> Recovery | None:
    """An interrupted earlier run on this tree, finished (when it did `forward_for`) or rolled back."""
    journal = site_journal(target)
    if not journal.pending():
        return None
    inside(target.root, target.marker_dir, target.marker_dir)
    allowed = _site_allowed(target, series)
    action = _journal_action(journal)
    return recover(journal, action is not None and action == forward_for, allowed)


def _journal_action(journal: Journal) -> str | None:
    try:
        doc = json.loads(journal.record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc.get("action") if isinstance(doc, dict) else None
