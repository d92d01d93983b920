"""Apply, check and revert a backport series on a git checkout or an installed sglang.

Both targets share one rule: every file the series touches must hash to a known stage of the series
(the base release, or after patch k). Anything else is refused before a byte is written, naming the
file (exit 2). New contents are computed in memory and checked against the manifest's sha256_after;
only then is the target written, and a failure while writing restores what was there.

Over 500 lines on purpose: apply, check and revert share the stage-hash rule and the
write-then-restore transaction, on both kinds of target; split, each half would need the other's internals.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from kvgate import __version__
from kvgate.backport import gitjournal
from kvgate.backport.diffapply import PatchApplyError, apply, parse
from kvgate.backport.journal import (
    BACK,
    FORWARD,
    Change,
    Journal,
    Recovery,
    Transaction,
    file_state,
    kill_point_test_only,
    recover,
    replace_file,
    sweep_temps,
)
from kvgate.catalogue.series import Patch, PatchFile, Series, sha256_bytes
from kvgate.errors import KvgateError, UsageError
from kvgate.exitcodes import ExitStatus
from kvgate.output.safeio import confine, inside

if TYPE_CHECKING:  # GitPython loads only for a --repo target
    import git

MARKER_DIR = ".kvgate-backport"  # inside the installed `sglang/` package
MARKER_FILE = "applied.json"
JOURNAL_DIR = "journal"  # inside MARKER_DIR (site-packages) or the git directory's kvgate-backport/


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


def _files(patches: tuple[Patch, ...]) -> dict[str, PatchFile]:
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
    for path, pf in _files(patches).items():
        fp = confine(target.root, target.rel(pf), _manifest(patches, pf))
        out[path] = fp.read_bytes() if fp.is_file() else None
    return out


def _manifest(patches: tuple[Patch, ...], pf: PatchFile) -> Path:
    """The manifest that named `pf` (for error messages)."""
    return next(p.file.parent / "manifest.yaml" for p in patches if pf in p.files)


def applied_count(target: Target, series: Series, patches: tuple[Patch, ...], current: dict[str, bytes | None]) -> int:
    """How many patches of `patches` the target already carries; refuse (naming the file) otherwise."""
    hashes = {p: (sha256_bytes(b) if b is not None else None) for p, b in current.items()}
    for k in range(len(patches), -1, -1):
        if all(hashes[p] == h for p, h in _stage_hashes(patches, k).items()):
            return k
    files = _files(patches)
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


def _render(
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


# -- git working-tree writes ----------------------------------------------------------------------
def _write_files(paths_and_data: list[tuple[Path, bytes]], counter: list[int]) -> None:
    """Replace each file in one rename from an exclusively created temp (`safeio.write_temp`): a planted
    temp name is never opened, and a rename replaces a symlink at the destination instead of following
    it. The caller's journal (the git state it started from) undoes a half-written run."""
    for path, data in paths_and_data:
        counter[0] += 1
        replace_file(path, data, counter[0])


# -- site-packages ------------------------------------------------------------------------------------
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


def _journal(target: Target) -> Journal:
    """The journal of a site-packages target: inside the backport's own folder, pruned with it."""
    return Journal(target.root, target.marker_dir / JOURNAL_DIR, target.marker_dir)


def _rel(target: Target, path: Path) -> str:
    return path.relative_to(target.root).as_posix()


def _site_allowed(target: Target, series: Series) -> Callable[[str], bool]:
    """The paths a site-packages journal may name: the series' files and the backport's own folder."""
    files = {target.rel(pf) for pf in _files(series.patches).values()}
    own = _rel(target, target.marker_dir) + "/"
    return lambda rel: rel in files or rel.startswith(own)


def _run(txn: Transaction, target: Target) -> None:
    """Run a journaled transaction; an OSError (disk full, permissions) becomes BackportFailed (exit 4)."""
    try:
        txn.run()
    except OSError as exc:
        raise BackportFailed(f"writing {target.root} failed, nothing changed: {exc}") from exc


def _apply_site(
    target: Target, series: Series, patches: tuple[Patch, ...], k: int, current: dict[str, bytes | None]
) -> BackportResult:
    steps = _render(target, series, patches, k, current)
    files = _files(patches)
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
    _run(Transaction(_journal(target), "apply", series.name, tuple(changes)), target)
    outcomes = tuple(
        PatchOutcome(p.id, p.title, "already applied", tuple(target.rel(f) for f in p.files)) for p in patches[:k]
    )
    outcomes += tuple(PatchOutcome(p.id, p.title, "applied", tuple(target.rel(f) for f in p.files)) for p, _ in steps)
    return BackportResult(
        "apply",
        target.layout,
        target.root,
        series.name,
        outcomes,
        True,
        f"applied {len(steps)} patch(es) to {target.root}",
        backup=backup_dir,
        marker=marker_path,
    )


def _revert_site(target: Target, series: Series) -> BackportResult:
    marker = _read_marker(target)
    if marker is None:
        raise BackportRefused(f"{target.root}: no kvgate backport recorded ({MARKER_DIR}/{MARKER_FILE} missing)")
    if marker.get("base_release") != series.base_release:
        raise BackportRefused(
            f"{target.root}: the recorded backport is for {marker.get('base_release')}, not {series.base_release}"
        )
    record = target.marker_dir / MARKER_FILE
    known = _files(series.patches)
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
    outcomes = tuple(
        PatchOutcome(pid, str(p.get("title", pid)), "reverted", tuple(map(str, p.get("files") or ())))
        for pid, p in recorded.items()
    )
    changes = [*restores, Change(_rel(target, record), record.read_bytes(), None), *drops]
    _run(Transaction(_journal(target), "revert", series.name, tuple(changes)), target)
    return BackportResult(
        "revert",
        target.layout,
        target.root,
        series.name,
        outcomes,
        True,
        f"restored {len(restores)} file(s) in {target.root} byte for byte",
    )


# -- git ------------------------------------------------------------------------------------------------
def _repo(root: Path) -> git.Repo:
    import git

    try:
        return git.Repo(root)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
        raise UsageError(f"--repo {root}: not a git repository") from exc


def _refuse_dirty(repo: git.Repo, target: Target) -> None:
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


def _apply_git(
    target: Target, series: Series, patches: tuple[Patch, ...], k: int, current: dict[str, bytes | None]
) -> BackportResult:
    repo = _repo(target.root)
    steps = _render(target, series, patches, k, current)
    branch = branch_name(series)
    original_head = repo.head.commit
    original_ref = None if repo.head.is_detached else repo.head.reference
    on_branch = original_ref is not None and original_ref.name == branch
    created = None
    if not on_branch and branch in [h.name for h in repo.heads]:
        raise BackportRefused(f"{target.root}: branch {branch} already exists; check it out to continue or delete it")
    gitjournal.begin(repo, "apply", series.name, original_ref, original_head, None if on_branch else branch)
    outcomes = [PatchOutcome(p.id, p.title, "already applied", tuple(p_.path for p_ in p.files)) for p in patches[:k]]
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
            outcomes.append(PatchOutcome(patch.id, patch.title, "applied", tuple(changed), commit.hexsha[:12]))
    except BaseException as exc:
        # Leave the checkout exactly as it was: original branch, commit, index and files.
        if original_ref is not None:
            repo.head.reference = original_ref
        else:
            repo.head.reference = original_head
        repo.head.reset(original_head, index=True, working_tree=True)
        if created is not None:
            repo.delete_head(created, force=True)
        sweep_temps(target.root / pf.path for pf in _files(series.patches).values())
        gitjournal.end(repo)
        if isinstance(exc, (KvgateError, KeyboardInterrupt)):
            raise
        raise BackportFailed(f"applying {series.name} to {target.root} failed, checkout restored: {exc}") from exc
    gitjournal.end(repo)
    return BackportResult(
        "apply",
        target.layout,
        target.root,
        series.name,
        tuple(outcomes),
        True,
        f"applied {len(steps)} patch(es) on branch {branch}",
        branch=branch,
    )


def _backport_commits(repo: git.Repo, series: Series) -> list[tuple[str, git.Commit]]:
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


def _revert_git(target: Target, series: Series, patches: tuple[Patch, ...]) -> BackportResult:
    """Add one commit that restores every touched file to its pre-series bytes (history is kept)."""
    repo = _repo(target.root)
    _refuse_dirty(repo, target)
    ours = _backport_commits(repo, series)
    if not ours:
        raise BackportRefused(f"{target.root}: HEAD carries no {series.name} backport commits to revert")
    base = ours[-1][1].parents[0]
    restores: list[tuple[Path, bytes]] = []
    for pf in _files(patches).values():
        try:
            data = base.tree[pf.path].data_stream.read()
        except KeyError:
            continue
        if sha256_bytes(data) != pf.sha256_before:
            raise BackportRefused(f"{pf.path}: the commit before the backport is not sglang {series.base_release}")
        restores.append((confine(target.root, pf.path, _manifest(patches, pf)), data))
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
    outcomes = tuple(PatchOutcome(pid, pid, "reverted", (), commit.hexsha[:12]) for pid in ids)
    return BackportResult(
        "revert",
        target.layout,
        target.root,
        series.name,
        outcomes,
        True,
        f"reverted {len(ids)} patch(es) in commit {commit.hexsha[:12]}",
    )


def _recover(target: Target, series: Series, forward_for: str | None) -> Recovery | None:
    """Every run starts here: an interrupted earlier run is finished (when it did what this run wants:
    `forward_for` names that action) or rolled back (otherwise, and always for --check and --verify)."""
    if target.layout is Layout.GIT:
        touched = [target.root / pf.path for pf in _files(series.patches).values()]
        return gitjournal.recover(_repo(target.root), series.name, branch_name(series), touched, forward_for)
    journal = _journal(target)
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
    result = _apply(target, series, patches, check)
    return replace(result, recovered=recovered) if recovered else result


def _apply(target: Target, series: Series, patches: tuple[Patch, ...], check: bool) -> BackportResult:
    if target.layout is Layout.GIT:
        _refuse_dirty(_repo(target.root), target)
    # Stages are read against the whole series, so a tree patched with --with-hardening is "already
    # applied" for a later run without it, instead of "unknown".
    current = read_current(target, series.patches)
    k = applied_count(target, series, series.patches, current)
    if k >= len(patches):
        done = tuple(
            PatchOutcome(p.id, p.title, "already applied", tuple(target.rel(f) for f in p.files))
            for p in series.patches[:k]
        )
        return BackportResult(
            "check" if check else "apply",
            target.layout,
            target.root,
            series.name,
            done,
            False,
            f"already applied: {series.name} ({k} patch(es)) on {target.root}",
        )
    done = tuple(
        PatchOutcome(p.id, p.title, "already applied", tuple(target.rel(f) for f in p.files)) for p in patches[:k]
    )
    if check:
        _render(target, series, patches, k, current)  # proves every hunk applies, writes nothing
        todo = tuple(
            PatchOutcome(p.id, p.title, "would apply", tuple(target.rel(f) for f in p.files)) for p in patches[k:]
        )
        return BackportResult(
            "check",
            target.layout,
            target.root,
            series.name,
            done + todo,
            False,
            f"{len(patches) - k} patch(es) would apply cleanly to {target.root}",
        )
    if target.layout is Layout.GIT:
        return _apply_git(target, series, patches, k, current)
    return _apply_site(target, series, patches, k, current)


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
            else not _backport_commits(_repo(target.root), series)
        )
        if nothing:
            return BackportResult(
                "revert", target.layout, target.root, series.name, (), True, recovered.message, recovered=recovered
            )
    if target.layout is Layout.GIT:
        result = _revert_git(target, series, series.patches)
    else:
        result = _revert_site(target, series)
    return replace(result, recovered=recovered) if recovered else result


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
