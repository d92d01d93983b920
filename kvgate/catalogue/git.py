"""Detection by git ancestry in an sglang checkout (method 2), with GitPython.

A commit contains a fix when its tree carries the fix's signatures under `python/sglang/` (read from
the commit's blobs, nothing is checked out). Where the upstream PR number is known, `git log --grep
'(#NNNNN)'` from the commit also looks for the squash-merge commit among its ancestors: SGLang squash
subjects end with `(#PR)` (seen in 2025; not re-verified for 2026). The tree decides; a squash commit
among the ancestors whose signatures are gone (reverted or refactored) makes the answer unknown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvgate.catalogue.model import Catalogue, Detection, Presence, Signature
from kvgate.catalogue.scanprog import Code, pattern_matcher
from kvgate.catalogue.signatures import SourceTree, glob_prefix, glob_regex
from kvgate.catalogue.source import _VERSION_RX
from kvgate.errors import UsageError

if TYPE_CHECKING:  # GitPython runs `git version` when imported: only load it when a checkout is read.
    import git

PACKAGE_PREFIX = "python/sglang/"


class GitTree(SourceTree):
    """The `python/sglang/` tree of one commit."""

    def __init__(self, repo: git.Repo, commit: git.Commit, prefix: str = PACKAGE_PREFIX) -> None:
        self.repo = repo
        self.commit = commit
        self.prefix = prefix

    def read_bytes(self, rel: str) -> bytes | None:
        try:
            blob = self.commit.tree / (self.prefix + rel)
        except KeyError:
            return None
        if blob.type != "blob":
            return None
        return bytes(blob.data_stream.read())

    def search_globs(self, signatures: Sequence[Signature]) -> dict[Signature, tuple[str, ...]]:
        import git

        out: dict[Signature, tuple[str, ...]] = {}
        for sig in signatures:
            rx = glob_regex(sig.file)
            args = ["-l", "-I"]
            args += ["-F", "-e", sig.substring] if sig.substring is not None else ["-P", "-e", str(sig.regex)]
            try:
                text = self.repo.git.grep(*args, self.commit.hexsha, "--", self.prefix + glob_prefix(sig.file))
            except git.GitCommandError:  # exit 1: no match
                text = ""
            files = []
            match = pattern_matcher(sig.scan_pattern)  # git grep found the text; the code view decides
            for line in text.splitlines():
                path = line.split(":", 1)[1] if ":" in line else line
                rel = path[len(self.prefix) :] if path.startswith(self.prefix) else path
                if rx.match(rel) and match(Code(self.read_bytes(rel) or b"")):
                    files.append(rel)
            out[sig] = tuple(sorted(files))
        return out


@dataclass(frozen=True)
class Checkout:
    """A resolved sglang checkout at one commit."""

    path: Path
    rev: str
    hexsha: str
    subject: str
    version: str | None


def open_checkout(path: Path, rev: str = "HEAD") -> tuple[git.Repo, git.Commit, Checkout]:
    """Open the repository and resolve `rev`; anything wrong is a usage error (exit 2)."""
    import git

    try:
        repo = git.Repo(Path(path).expanduser(), search_parent_directories=False)
    except (git.NoSuchPathError, git.InvalidGitRepositoryError):
        raise UsageError(f"--repo {path}: not a git repository") from None
    try:
        commit = repo.commit(rev)
    except (git.BadName, ValueError, git.GitCommandError):
        raise UsageError(f"--repo {path}: cannot resolve --rev {rev!r}") from None
    try:
        commit.tree / (PACKAGE_PREFIX + "srt")
    except KeyError:
        raise UsageError(f"--repo {path} at {rev}: no {PACKAGE_PREFIX}srt (not an sglang checkout)") from None
    tree = GitTree(repo, commit)
    version = None
    for name in ("version.py", "_version.py"):
        text = tree.read_text(name)
        m = _VERSION_RX.search(text or "")
        if m:
            version = m.group(1)
            break
    message = commit.message if isinstance(commit.message, str) else commit.message.decode("utf-8", "replace")
    subject = message.strip().splitlines()[0] if message.strip() else ""
    return repo, commit, Checkout(Path(path), rev, commit.hexsha, subject, version)


def squash_commits(repo: git.Repo, commit: git.Commit, number: int) -> list[tuple[str, str]]:
    """Ancestors of `commit` (itself included) whose SUBJECT carries `(#number)`: (short sha, subject).

    A body that merely mentions the PR (a follow-up, a revert) does not count.
    """
    import git

    needle = f"(#{number})"
    try:
        text = repo.git.log(commit.hexsha, "-F", f"--grep={needle}", "--format=%h%x09%s")
    except git.GitCommandError:
        return []
    out = []
    for line in text.splitlines():
        sha, _, subject = line.partition("\t")
        if needle in subject:
            out.append((sha, subject))
    return out


def detect_by_git(cat: Catalogue, path: Path, rev: str = "HEAD") -> tuple[Checkout, dict[str, Detection], GitTree]:
    """Method 2 for every upstream entry at `rev` of the checkout at `path` (backports are verified by
    their code, kvgate.catalogue.backports, on the returned tree)."""
    repo, commit, co = open_checkout(path, rev)
    tree = GitTree(repo, commit)
    results = tree.scan(cat.upstream())
    at = f"{co.hexsha[:10]} ({rev})"
    out: dict[str, Detection] = {}
    for fix in cat.upstream():
        r = results[fix.id]
        ev = [f"tree at {at}: " + "; ".join(r.evidence())]
        presence = r.presence
        if fix.kind == "pr" and fix.number is not None:
            hits = squash_commits(repo, commit, fix.number)
            if hits:
                sha, subject = hits[0]
                ev.append(f"ancestor {sha} {subject!r} carries (#{fix.number})")
                if presence is Presence.ABSENT:
                    presence = Presence.UNKNOWN
                    ev.append("its squash commit is an ancestor but the signatures are gone (reverted or refactored?)")
            else:
                cherry = "; present by signatures (cherry-pick or other subject)"
                ev.append(
                    f"no ancestor subject carries (#{fix.number})" + (cherry if presence is Presence.PRESENT else "")
                )
        out[fix.id] = Detection(fix.id, "git", presence, tuple(ev))
    return co, out, tree
