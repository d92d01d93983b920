"""A backport on a git checkout: the series applied as one commit per patch on its own branch, reverted
by one commit that restores the base release's bytes (history is kept); an interrupted run is undone
from the git state it started from (kvgate/backport/gitjournal.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kvgate.backport import gitjournal
from kvgate.backport.journal import Recovery, kill_point_test_only, replace_file, sweep_temps
from kvgate.backport.stages import (
    BackportFailed,
    BackportRefused,
    BackportResult,
    PatchOutcome,
    Target,
    branch_name,
    files_of,
    manifest_of,
    outcomes,
    render,
    result,
)
from kvgate.catalogue.series import Patch, Series, sha256_bytes
from kvgate.errors import KvgateError, UsageError
from kvgate.output.safeio import confine

if TYPE_CHECKING:  # GitPython loads only for a --repo target
    import git


def _write_files(paths_and_data: list[tuple[Path, bytes]], counter: list[int]) -> None:
    """Replace each file in one rename from an exclusively created temp (`safeio.write_temp`): a planted
    temp name is never opened, and a rename replaces a symlink at the destination instead of following
    it. The caller's journal (the git state it started from) undoes a half-written run."""
    for path, data in paths_and_data:
        counter[0] += 1
        replace_file(path, data, counter[0])


def repo_of(root: Path) -> git.Repo:
    import git

    try:
        return git.Repo(root)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
        raise UsageError(f"--repo {root}: not a git repository") from exc


def refuse_dirty(repo: git.Repo, target: Target) -> None:
    if repo.is_dirty(index=True, working_tree=True, untracked_files=False):
        diffs = [*repo.index.diff(None), *repo.index.diff("HEAD")]
        changed = sorted({p for d in diffs for p in (d.a_path or d.b_path,) if p})
        shown = ", ".join(changed[:5]) + (" …" if len(changed) > 5 else "")
        raise BackportRefused(f"{target.root}: working tree has uncommitted changes ({shown}); commit or stash them")


def _commit_actor(repo: git.Repo) -> git.Actor | None:
    """Who kvgate's commits are by: the repository's configured identity (None lets git use it), else
    `kvgate <kvgate@localhost>` so a checkout without user.email can still take the series."""
    import git

    try:
        repo.config_reader().get_value("user", "email")
    except Exception:  # noqa: BLE001 - any unreadable or missing identity: fall back
        return git.Actor("kvgate", "kvgate@localhost")
    return None


def _commit_message(series: Series, patch: Patch) -> str:
    stands = ", ".join(patch.stands_in_for) or "none"
    return (
        f"kvgate backport {series.name}: {patch.title}\n\n{patch.fixes}\n\n"
        f"Stands in for: {stands}\n\nKvgate-Patch: {patch.id}\nKvgate-Series: {series.name}\n"
    )


def apply_git(
    target: Target, series: Series, patches: tuple[Patch, ...], k: int, current: dict[str, bytes | None]
) -> BackportResult:
    repo = repo_of(target.root)
    steps = render(target, series, patches, k, current)
    branch = branch_name(series)
    original_head = repo.head.commit
    original_ref = None if repo.head.is_detached else repo.head.reference
    on_branch = original_ref is not None and original_ref.name == branch
    created = None
    if not on_branch and branch in [h.name for h in repo.heads]:
        raise BackportRefused(f"{target.root}: branch {branch} already exists; check it out to continue or delete it")
    gitjournal.begin(repo, "apply", series.name, original_ref, original_head, None if on_branch else branch)
    done = list(outcomes(target, patches[:k], "already applied"))
    try:
        if not on_branch:
            created = repo.create_head(branch, original_head)
            created.checkout()
        actor = _commit_actor(repo)
        counter = [0]
        for patch, changed in steps:
            _write_files([(target.root / path, data) for path, data in changed.items()], counter)
            repo.index.add(list(changed))
            commit = repo.index.commit(_commit_message(series, patch), author=actor, committer=actor)
            kill_point_test_only(f"commit:{patch.id}")
            done.append(PatchOutcome(patch.id, patch.title, "applied", tuple(changed), commit.hexsha[:12]))
    except BaseException as exc:
        # Leave the checkout exactly as it was: original branch, commit, index and files.
        if original_ref is not None:
            repo.head.reference = original_ref
        else:
            repo.head.reference = original_head
        repo.head.reset(original_head, index=True, working_tree=True)
        if created is not None:
            repo.delete_head(created, force=True)
        sweep_temps(target.root / pf.path for pf in files_of(series.patches).values())
        gitjournal.end(repo)
        if isinstance(exc, (KvgateError, KeyboardInterrupt)):
            raise
        raise BackportFailed(f"applying {series.name} to {target.root} failed, checkout restored: {exc}") from exc
    gitjournal.end(repo)
    message = f"applied {len(steps)} patch(es) on branch {branch}"
    return result("apply", target, series, tuple(done), True, message, branch=branch)


def backport_commits(repo: git.Repo, series: Series) -> list[tuple[str, git.Commit]]:
    """The series' patch commits at the tip of HEAD, newest first: (patch id, commit)."""
    ours = []
    for commit in repo.iter_commits("HEAD"):
        message = commit.message if isinstance(commit.message, str) else commit.message.decode("utf-8", "replace")
        trailer = [ln for ln in message.splitlines() if ln.startswith("Kvgate-Patch: ")]
        series_ln = f"Kvgate-Series: {series.name}"
        if not trailer or series_ln not in message:
            break
        ours.append((trailer[0].split(": ", 1)[1], commit))
    return ours


def revert_git(target: Target, series: Series, patches: tuple[Patch, ...]) -> BackportResult:
    """Add one commit that restores every touched file to its pre-series bytes (history is kept)."""
    repo = repo_of(target.root)
    refuse_dirty(repo, target)
    ours = backport_commits(repo, series)
    if not ours:
        raise BackportRefused(f"{target.root}: HEAD carries no {series.name} backport commits to revert")
    base = ours[-1][1].parents[0]
    restores: list[tuple[Path, bytes]] = []
    for pf in files_of(patches).values():
        try:
            data = base.tree[pf.path].data_stream.read()
        except KeyError:
            continue
        if sha256_bytes(data) != pf.sha256_before:
            raise BackportRefused(f"{pf.path}: the commit before the backport is not sglang {series.base_release}")
        restores.append((confine(target.root, pf.path, manifest_of(patches, pf)), data))
    ref = None if repo.head.is_detached else repo.head.reference
    head = repo.head.commit
    gitjournal.begin(repo, "revert", series.name, ref, head, None)
    ids = [pid for pid, _ in reversed(ours)]
    try:
        _write_files(restores, [0])
        repo.index.add([str(p.relative_to(target.root)) for p, _ in restores])
        actor = _commit_actor(repo)
        commit = repo.index.commit(
            f"Revert kvgate backport {series.name}\n\nRestores the sglang "
            f"{series.base_release} files byte for byte.\n\nKvgate-Revert: {', '.join(ids)}\n",
            author=actor,
            committer=actor,
        )
    except BaseException as exc:
        repo.head.reset(head, index=True, working_tree=True)
        sweep_temps(p for p, _ in restores)
        gitjournal.end(repo)
        if isinstance(exc, (KvgateError, KeyboardInterrupt)):
            raise
        raise BackportFailed(f"reverting {series.name} in {target.root} failed, checkout restored: {exc}") from exc
    gitjournal.end(repo)
    undone = tuple(PatchOutcome(pid, pid, "reverted", (), commit.hexsha[:12]) for pid in ids)
    return result(
        "revert", target, series, undone, True, f"reverted {len(ids)} patch(es) in commit {commit.hexsha[:12]}"
    )


def recover_git(target: Target, series: Series, forward_for: str | None) -> Recovery | None:
    """An interrupted earlier run on this checkout, finished (when it did `forward_for`) or rolled back."""
    touched = [target.root / pf.path for pf in files_of(series.patches).values()]
    return gitjournal.recover(repo_of(target.root), series.name, branch_name(series), touched, forward_for)
