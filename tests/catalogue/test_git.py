"""Method 2: a small sglang repo built from two real releases' sources, squash-style subjects."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgate.catalogue import Presence, assess_checkout, load_catalogue
from kvgate.catalogue.git import detect_by_git
from kvgate.cli import app
from kvgate.errors import UsageError
from tests.catalogue.helpers import commit_release, init_repo, wheel

pytestmark = pytest.mark.wheels


@pytest.fixture(scope="module")
def sglang_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Commit 1: 0.5.20 sources; commit 2: 0.5.21 sources; commit 3: the #38935 door reverted."""
    path = tmp_path_factory.mktemp("sglang-repo")
    repo = init_repo(path)
    commit_release(repo, "0.5.20", "[VLM] Retire aborted disaggregated prefill results (#36988)")
    commit_release(repo, "0.5.21", "[PD] Do not admit intake-rejected requests to a PD handoff (#38935)")
    repo.create_tag("v0.5.21")
    # A revert that restores the 0.5.20 admission files: the squash commit stays an ancestor.
    src = wheel("0.5.20") / "sglang"
    for rel in (
        "srt/disaggregation/utils.py",
        "srt/disaggregation/prefill.py",
        "srt/disaggregation/decode.py",
        "srt/managers/scheduler.py",
    ):
        shutil.copy2(src / rel, path / "python" / "sglang" / rel)
    repo.git.add("-A")
    repo.git.commit("-q", "-m", "Revert the admission door for a local experiment")
    return path


def test_ancestry_and_signatures_at_the_0_5_21_commit(sglang_repo: Path) -> None:
    co, dets, _ = detect_by_git(load_catalogue(), sglang_repo, "v0.5.21")
    assert co.version == "0.5.21"
    door = dets["pr-38935"]
    assert door.presence is Presence.PRESENT
    assert any("carries (#38935)" in e and "Do not admit" in e for e in door.evidence)
    assert dets["pr-36988"].presence is Presence.PRESENT
    assert any("carries (#36988)" in e for e in dets["pr-36988"].evidence)
    # Present by signatures, no squash subject for it in this small history.
    assert dets["pr-40645"].presence is Presence.PRESENT
    assert any("no ancestor subject carries (#40645)" in e for e in dets["pr-40645"].evidence)


def test_the_0_5_20_commit_lacks_the_door_and_has_no_such_ancestor(sglang_repo: Path) -> None:
    co, dets, _ = detect_by_git(load_catalogue(), sglang_repo, "v0.5.21~1")
    assert co.version == "0.5.20"
    assert dets["pr-38935"].presence is Presence.ABSENT
    assert any("no ancestor subject carries (#38935)" in e for e in dets["pr-38935"].evidence)
    assert dets["pr-36988"].presence is Presence.PRESENT


def test_reverted_fix_with_squash_ancestor_is_unknown(sglang_repo: Path) -> None:
    _, dets, _ = detect_by_git(load_catalogue(), sglang_repo, "HEAD")
    door = dets["pr-38935"]
    assert door.presence is Presence.UNKNOWN
    assert any("signatures are gone" in e for e in door.evidence)


def test_assess_checkout_combines_git_and_tree_version(sglang_repo: Path) -> None:
    a = assess_checkout(sglang_repo, "v0.5.21")
    assert a.release == "0.5.21" and set(a.methods) == {"git", "version"}
    assert a.status("pr-38935").decided_by == "git"
    assert {s.fix.id for s in a.missing_correctness()} == {"ack-generations"}


def _clone_at_0_5_20(sglang_repo: Path, dest: Path) -> Any:
    shutil.copytree(sglang_repo, dest)
    from git import Repo

    repo = Repo(dest)
    repo.git.checkout("-q", "-b", "local", "v0.5.21~1")
    return repo


def test_backport_applied_in_a_commit_is_recognised_by_its_code(sglang_repo: Path, tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    _clone_at_0_5_20(sglang_repo, clone)
    res = CliRunner().invoke(app, ["backport", "--release", "v0.5.20", "--repo", str(clone)])
    assert res.exit_code == 0, res.output
    a = assess_checkout(clone, "HEAD")
    assert a.reads_as() == (
        "0.5.20 + kvgate backports (kvgate-admission-door, kvgate-deferred-release-default, "
        "kvgate-preserve-abort-ack, kvgate-ack-fanout, kvgate-force-arm-on-failure, kvgate-ack-generations)"
    )
    assert a.status("ack-generations").via_backport == "kvgate-ack-generations"
    door = a.status("pr-38935")
    assert door.presence is Presence.PRESENT and door.via_backport == "kvgate-admission-door"
    assert "code verified" in door.how()
    assert a.tampered() == ()


def test_backport_marker_without_code_in_a_commit_is_tampered(sglang_repo: Path, tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    repo = _clone_at_0_5_20(sglang_repo, clone)
    p = clone / "python" / "sglang" / "srt" / "disaggregation" / "prefill.py"
    p.write_text(p.read_text() + "\n# kvgate-backport: kvgate-admission-door\n")
    repo.git.commit("-q", "-am", "Apply kvgate-admission-door (the comment only)")
    a = assess_checkout(clone, "HEAD")
    assert a.reads_as() == "0.5.20"
    assert a.status("pr-38935").presence is Presence.ABSENT
    assert [s.fix.id for s in a.tampered()] == ["kvgate-admission-door"]


def test_bad_repo_and_rev_are_usage_errors(sglang_repo: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not a git repository"):
        detect_by_git(load_catalogue(), tmp_path, "HEAD")
    with pytest.raises(UsageError, match="cannot resolve"):
        detect_by_git(load_catalogue(), sglang_repo, "no-such-rev")
    empty = init_repo(tmp_path / "other")
    (tmp_path / "other" / "README").write_text("x")
    empty.git.add("-A")
    empty.git.commit("-q", "-m", "init")
    with pytest.raises(UsageError, match="not an sglang checkout"):
        detect_by_git(load_catalogue(), tmp_path / "other", "HEAD")


def test_a_body_mention_is_not_a_squash_commit(tmp_path: Path) -> None:
    from kvgate.catalogue.git import squash_commits

    repo = init_repo(tmp_path / "r")
    (tmp_path / "r" / "f").write_text("x")
    repo.git.add("-A")
    repo.git.commit("-q", "-m", "Tidy the scheduler\n\nFollow-up to (#38935).")
    assert squash_commits(repo, repo.head.commit, 38935) == []
    (tmp_path / "r" / "f").write_text("y")
    repo.git.commit("-q", "-am", "[PD] Do not admit intake-rejected requests to a PD handoff (#38935)")
    hits = squash_commits(repo, repo.head.commit, 38935)
    assert len(hits) == 1 and hits[0][1].endswith("(#38935)")
