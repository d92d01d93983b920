"""The journal of a `--repo` backport run: where the checkout was, so a hard kill can be recovered.

Git holds every byte of a checkout (the commits are the backups), so the intent record only names where
the run started: the branch, its commit, and the branch kvgate created. It lives in the git directory
(never part of the tree, never in `git status`), written before the first change and removed last. A
later run finishes an interrupted apply from its last whole patch commit, or resets the checkout to
where the run started; either way it removes the temp files and the stale git locks the kill left.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from kvgate.backport.journal import BACK, FORWARD, RECORD, JournalRefused, Recovery, kill_point_test_only, sweep_temps
from kvgate.catalogue.series import sha256_bytes
from kvgate.output.safeio import write_atomic

if TYPE_CHECKING:  # GitPython loads only for a --repo target
    import git

_SHA_RX = re.compile(r"^[0-9a-f]{40}$")


def folder(repo: git.Repo) -> Path:
    """Inside the git directory."""
    return Path(repo.git_dir) / "kvgate-backport"


def begin(
    repo: git.Repo, action: str, series: str, ref: git.Head | None, head: git.Commit, created: str | None
) -> None:
    """Write the intent record before the first change."""
    where = folder(repo)
    if where.exists():
        raise JournalRefused(f"{where}: an interrupted run's journal is still there; recover it first")
    doc = {
        "kvgate_journal": 1,
        "layout": "git",
        "action": action,
        "series": series,
        "original_ref": None if ref is None else ref.name,
        "original_head": head.hexsha,
        "created_branch": created,
    }
    write_atomic(where / RECORD, json.dumps(doc, indent=2) + "\n")
    kill_point_test_only("intent")


def end(repo: git.Repo) -> None:
    """Remove the record (the commit of the run) and its folder."""
    where = folder(repo)
    (where / RECORD).unlink(missing_ok=True)
    sweep_temps([where / RECORD])
    if where.is_dir():
        where.rmdir()


def _intent(repo: git.Repo, series: str, branch: str) -> dict:
    """The record, validated: it names this series, a commit of this repository and kvgate's own branch."""
    import git

    record = folder(repo) / RECORD
    try:
        doc = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise JournalRefused(f"{record}: unreadable journal: {exc}; recover by hand") from None
    ok = (
        isinstance(doc, dict)
        and doc.get("kvgate_journal") == 1
        and doc.get("action") in ("apply", "revert")
        and isinstance(doc.get("original_head"), str)
        and _SHA_RX.match(doc["original_head"])
        and doc.get("created_branch") in (None, branch)
        and (doc.get("original_ref") is None or doc["original_ref"] in [h.name for h in repo.heads])
    )
    if not ok or doc.get("series") != series:
        raise JournalRefused(f"{record}: not a kvgate journal of {series} for this checkout; recover by hand")
    try:
        repo.commit(doc["original_head"])
    except (git.BadName, ValueError) as exc:
        raise JournalRefused(f"{record}: commit {doc['original_head'][:12]} is not in this repository") from exc
    return doc


def _state(paths: list[Path]) -> dict[Path, str | None]:
    return {p: sha256_bytes(p.read_bytes()) if p.is_file() else None for p in paths}


def recover(repo: git.Repo, series: str, branch: str, touched: list[Path], forward_for: str | None) -> Recovery | None:
    """Finish (an apply, when `forward_for` is "apply" and the checkout is on kvgate's branch) or undo a
    run that was killed; None when none was pending. An undone revert is redone whole by the caller."""
    where = folder(repo)
    if not where.exists():
        return None
    if not (where / RECORD).is_file():
        end(repo)
        return Recovery("(nothing changed)", BACK, 0, 0, f"an interrupted run had changed nothing; {where} removed")
    doc = _intent(repo, series, branch)
    gitdir = Path(repo.git_dir)
    branches = {doc.get("created_branch"), doc.get("original_ref")} - {None}
    for lock in ["index.lock", "HEAD.lock", *(f"refs/heads/{b}.lock" for b in branches)]:
        (gitdir / lock).unlink(missing_ok=True)  # the killed git step's own locks: nobody else holds them
    action = doc["action"]
    here = None if repo.head.is_detached else repo.head.reference.name
    before = _state(touched)
    if action == forward_for == "apply" and here == branch:
        repo.head.reset(repo.head.commit, index=True, working_tree=True)  # the last whole patch commit
        direction, done = FORWARD, f"kept its commits up to {repo.head.commit.hexsha[:12]}; the rest is applied now"
    else:
        original = repo.commit(doc["original_head"])
        repo.head.reference = repo.heads[doc["original_ref"]] if doc.get("original_ref") else original
        repo.head.reset(original, index=True, working_tree=True)
        created = doc.get("created_branch")
        if created and created in [h.name for h in repo.heads] and created != doc.get("original_ref"):
            repo.delete_head(created, force=True)
        direction = BACK
        done = f"the checkout is back at {doc.get('original_ref') or 'detached'} {original.hexsha[:12]}"
        if action == forward_for:
            done += "; this run then does it whole"
    rewritten = sum(before[p] != s for p, s in _state(touched).items())
    swept = sweep_temps(touched)
    end(repo)
    return Recovery(
        action,
        direction,
        rewritten,
        swept,
        f"an interrupted {action} of {series} was found ({where}) and {direction}: {done}; "
        f"{rewritten} file(s) rewritten from git, {swept} temp file(s) removed",
    )
