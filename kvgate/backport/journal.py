"""An intent record (journal) that lets a backport survive a hard kill, and its recovery.

A series run changes several files (the patched sources, their backups, the applied record). A
SIGKILL, an OOM kill or a power loss between two of those writes would leave a tree nobody can
recover. So before the first change, `Transaction.run` stages every file's bytes before AND after
into the journal folder and then writes the intent record naming each change by its sha256 on both
sides; only then does it change the tree, one atomic rename per file. The record is removed last
(removing it is the commit). A later run that finds it (`recover`) checks that every file is at one
of its two recorded states (anything else is refused, naming the file: someone changed it since) and
rolls the whole series forward or back from the staged bytes, byte for byte, then removes every
`.kvgate-tmp` file a write left beside the files it names. A journal folder without its record is a
run that was killed before it changed anything: its staging is removed.

The record is data from the tree itself: every path in it is confined to the target and must be one
the caller allows (`allowed`), and each staged file must hash to what the record says.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from kvgate.catalogue.series import sha256_bytes
from kvgate.errors import UsageError
from kvgate.output.safeio import inside, relative_part, write_atomic, write_temp

RECORD = "intent.json"
FORWARD = "rolled forward"
BACK = "rolled back"

# TEST-ONLY hook: with this variable set to a point name ("intent", "temp:<n>", "renamed:<n>",
# "committed"), the process SIGKILLs itself there, so a test can kill a real run at each write
# (tests/backport/test_hard_kill.py). Never set outside tests.
TEST_ONLY_SIGKILL_ENV = "KVGATE_TEST_ONLY_SIGKILL_AT"


def kill_point_test_only(point: str) -> None:
    """TEST-ONLY: SIGKILL this process at `point` when TEST_ONLY_SIGKILL_ENV names it (see above)."""
    if os.environ.get(TEST_ONLY_SIGKILL_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)


def replace_file(path: Path, data: bytes, n: int) -> None:
    """Write `path` in one rename from an exclusively created temp (`safeio.write_temp`), the temp removed
    if the rename fails; write number `n` for the test-only kill points."""
    tmp = write_temp(path, data)
    kill_point_test_only(f"temp:{n}")
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    kill_point_test_only(f"renamed:{n}")


class JournalRefused(UsageError):
    """An interrupted run's journal cannot be recovered safely (a file changed since, a damaged record)."""


@dataclass(frozen=True)
class Change:
    """One file of a series run: its bytes before and after (None: absent), by path relative to the root."""

    rel: str
    before: bytes | None
    after: bytes | None


@dataclass(frozen=True)
class Recovery:
    """What a later run did with an interrupted one."""

    action: str  # the interrupted run: apply | revert | (nothing changed)
    direction: str  # FORWARD | BACK
    files: int  # files rewritten to reach that state
    temps_removed: int
    message: str


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _sha(data: bytes | None) -> str | None:
    return None if data is None else sha256_bytes(data)


_TEMP_RX = re.compile(r"^\.(?P<name>.+)\.[0-9a-f]{12}\.kvgate-tmp$")


def sweep_temps(paths: Iterable[Path]) -> int:
    """Remove the temp files `safeio.write_temp` leaves beside each path when killed before its rename."""
    removed = 0
    for folder, names in _by_folder(paths).items():
        if not folder.is_dir():
            continue
        for entry in folder.iterdir():
            m = _TEMP_RX.match(entry.name)
            if m and m.group("name") in names and not entry.is_dir():
                entry.unlink(missing_ok=True)  # a link is removed, never followed
                removed += 1
    return removed


def _by_folder(paths: Iterable[Path]) -> dict[Path, set[str]]:
    out: dict[Path, set[str]] = {}
    for p in paths:
        out.setdefault(p.parent, set()).add(p.name)
    return out


def prune_empty(folder: Path) -> None:
    """Remove `folder` and the folders under it when they hold no file (never removes data)."""
    if not folder.is_dir() or folder.is_symlink():
        return
    for sub in sorted((p for p in folder.rglob("*") if p.is_dir() and not p.is_symlink()), reverse=True):
        with contextlib.suppress(OSError):
            sub.rmdir()
    with contextlib.suppress(OSError):
        folder.rmdir()


def _put(path: Path, data: bytes | None) -> None:
    if data is None:
        path.unlink(missing_ok=True)
    else:
        write_atomic(path, data)


def file_state(path: Path) -> bytes | None:
    """The bytes of a regular file at `path`; None when absent, or a link (never followed)."""
    return path.read_bytes() if path.is_file() and not path.is_symlink() else None


@dataclass(frozen=True)
class Journal:
    """The journal folder of one target (`folder`, inside `root`), and the folder to prune afterwards."""

    root: Path
    folder: Path
    prune: Path  # removed when it ends up holding no file (the backport's own folder)

    @property
    def record(self) -> Path:
        return self.folder / RECORD

    def pending(self) -> bool:
        return self.folder.exists()

    def _finish(self, changes: Iterable[Change]) -> int:
        """Commit: the record goes first, then the staging, the temps and any folder left empty."""
        self.record.unlink(missing_ok=True)
        _fsync_dir(self.folder)
        shutil.rmtree(self.folder, ignore_errors=True)
        swept = sweep_temps(self.root / c.rel for c in changes)
        prune_empty(self.prune)
        return swept


@dataclass(frozen=True)
class Transaction:
    """A series run's changes under one journal: all of them happen, or (recovered) none."""

    journal: Journal
    action: str  # apply | revert
    series: str
    changes: tuple[Change, ...]

    def run(self) -> None:
        """Stage, record the intent, change the tree one rename at a time, commit.

        An exception (a full disk, SIGTERM, Ctrl-C) rolls back in this process; a hard kill leaves the
        journal for the next run's `recover`.
        """
        j = self.journal
        if j.folder.exists():
            raise JournalRefused(f"{j.folder}: an interrupted run's journal is still there; recover it first")
        inside(j.root, j.folder, j.folder)
        entries = []
        for i, c in enumerate(self.changes):
            inside(j.root, (j.root / c.rel).parent, j.record)  # a link AT the name is replaced, never followed
            for side, data in (("before", c.before), ("after", c.after)):
                if data is not None:
                    write_atomic(j.folder / f"{i}.{side}", data)
            entries.append({"rel": c.rel, "before": _sha(c.before), "after": _sha(c.after)})
        doc = {"kvgate_journal": 1, "action": self.action, "series": self.series, "changes": entries}
        tmp = write_temp(j.record, json.dumps(doc, indent=2) + "\n")
        kill_point_test_only("intent")
        os.replace(tmp, j.record)
        _fsync_dir(j.folder)
        try:
            for n, c in enumerate(self.changes, 1):
                path = j.root / c.rel
                if c.after is None:
                    path.unlink(missing_ok=True)
                    kill_point_test_only(f"renamed:{n}")
                else:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    replace_file(path, c.after, n)
            kill_point_test_only("committed")
        except BaseException:
            self.rollback()
            raise
        j._finish(self.changes)

    def rollback(self) -> None:
        """Put every file back as it was (in this process, after a failure), then drop the journal."""
        for c in reversed(self.changes):
            path = self.journal.root / c.rel
            if file_state(path) != c.before or (c.before is None and path.exists()):
                _put(path, c.before)
        self.journal._finish(self.changes)


def recover(journal: Journal, want_forward: bool | None, allowed: Callable[[str], bool]) -> Recovery | None:
    """Finish (`want_forward` True) or roll back (False) a run that was killed; None: nothing was pending.

    `want_forward=None` rolls back: the last state a completed run left. A forward recovery of a revert
    or a backward one of an apply both end at a state some completed run produced.
    """
    j = journal
    if not j.folder.exists():
        return None
    inside(j.root, j.folder, j.folder)
    if not j.record.is_file():
        swept = sweep_temps([j.record])
        shutil.rmtree(j.folder, ignore_errors=True)
        prune_empty(j.prune)
        return Recovery(
            "(nothing changed)",
            BACK,
            0,
            swept,
            f"an interrupted run had staged files but changed nothing; its staging in {j.folder} was removed",
        )
    doc = _doc(j)
    changes = _load(j, doc, allowed)
    action = doc["action"] if doc.get("action") in ("apply", "revert") else "run"
    series = str(doc.get("series", "a series"))
    forward = bool(want_forward)
    rewritten = 0
    for c in changes:
        target = c.after if forward else c.before
        path = j.root / c.rel
        if file_state(path) != target or (target is None and path.exists()):
            _put(path, target)
            rewritten += 1
    swept = j._finish(changes)
    which = FORWARD if forward else BACK
    done = "finished" if forward else "undone"
    return Recovery(
        action,
        which,
        rewritten,
        swept,
        f"an interrupted {action} of {series} was found ({j.record}) and {which} ({done}): "
        f"{rewritten} file(s) rewritten byte for byte from the journal, {swept} temp file(s) removed",
    )


def _doc(j: Journal) -> dict:
    try:
        doc = json.loads(j.record.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise JournalRefused(f"{j.record}: unreadable journal: {exc}; recover by hand") from None
    if not isinstance(doc, dict) or doc.get("kvgate_journal") != 1 or not isinstance(doc.get("changes"), list):
        raise JournalRefused(f"{j.record}: not a kvgate journal; recover by hand")
    return doc


def _load(j: Journal, doc: dict, allowed: Callable[[str], bool]) -> list[Change]:
    """The recorded changes with their staged bytes, each checked; and every file at one of its two states."""
    out = []
    action = doc.get("action")
    for i, e in enumerate(doc["changes"]):
        if not isinstance(e, dict):
            raise JournalRefused(f"{j.record}: change {i} is not an object; recover by hand")
        rel = relative_part(e.get("rel"), j.record, j.root)
        path = j.root / rel
        inside(j.root, path.parent, j.record)  # a link at the name itself is replaced, never followed
        if not allowed(rel):
            raise JournalRefused(f"{j.record}: names {rel!r}, which this series does not write; recover by hand")
        sides: dict[str, bytes | None] = {}
        for side in ("before", "after"):
            want = e.get(side)
            staged = j.folder / f"{i}.{side}"
            if want is None:
                sides[side] = None
                continue
            data = staged.read_bytes() if staged.is_file() else None
            if not isinstance(want, str) or data is None or sha256_bytes(data) != want:
                raise JournalRefused(f"{staged}: staged copy missing or damaged; recover {rel} by hand")
            sides[side] = data
        now = _sha(file_state(path))
        if now not in (e.get("before"), e.get("after")):
            raise JournalRefused(
                f"{rel}: changed since the interrupted {action} (sha256 {str(now)[:12]}… is neither the "
                f"state before nor after it); refusing to recover; the journal is in {j.folder}"
            )
        out.append(Change(rel, sides["before"], sides["after"]))
    return out
