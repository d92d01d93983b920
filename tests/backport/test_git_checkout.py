"""`kvgate backport --repo` on git repositories built from the real sglang wheels (python/sglang layout)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgate.backport.engine import apply_series
from kvgate.backport.stages import Layout, Target
from kvgate.catalogue.scanprog import MARKER_PREFIX
from kvgate.catalogue.series import load_series
from kvgate.cli import app

from .conftest import tree_digest

pytestmark = [pytest.mark.slow, pytest.mark.wheels]
runner = CliRunner()


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def _kvgate(*args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, ["backport", *args])


def test_apply_commits_each_patch_with_its_trailer_then_is_a_no_op(checkout: Callable[[str], Path]) -> None:
    repo = checkout("0.5.20")
    base = _git(repo, "rev-parse", "HEAD")
    res = _kvgate("--release", "v0.5.20", "--repo", str(repo), "--with-hardening", "--format", "json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert [f["summary"].split(":")[0] for f in doc["findings"]] == ["applied"] * len(load_series("0.5.20").patches)
    assert _git(repo, "rev-parse", "--abbrev-ref", "HEAD") == "kvgate/backport-v0.5.20"
    log = _git(repo, "log", "--format=%(trailers:key=Kvgate-Patch,valueonly)", f"{base}..HEAD").split()
    assert log == [p.id for p in reversed(load_series("0.5.20").patches)]  # one commit per patch, in order
    # Each patch is its own commit touching exactly the files the manifest names, each marked.
    for patch in load_series("0.5.20").patches:
        sha = _git(repo, "log", "--format=%H", f"--grep=Kvgate-Patch: {patch.id}", "-1")
        files = _git(repo, "show", "--name-only", "--format=", sha).split()
        assert sorted(files) == sorted(f.path for f in patch.files)
        for f in files:
            assert f"{MARKER_PREFIX}{patch.id}" in (repo / f).read_text()
    head = _git(repo, "rev-parse", "HEAD")
    again = _kvgate("--release", "v0.5.20", "--repo", str(repo), "--with-hardening")
    assert again.exit_code == 0 and "already applied" in again.stdout
    assert _git(repo, "rev-parse", "HEAD") == head and _git(repo, "status", "--porcelain") == ""


def test_check_changes_nothing(checkout: Callable[[str], Path]) -> None:
    repo = checkout("0.5.20")
    before = (_git(repo, "rev-parse", "HEAD"), _git(repo, "branch", "--list"))
    res = _kvgate("--release", "v0.5.20", "--repo", str(repo), "--check", "--format", "json")
    assert res.exit_code == 0, res.output
    mandatory = len(load_series("0.5.20").select(False))
    assert [f["summary"].split(":")[0] for f in json.loads(res.stdout)["findings"]] == ["would apply"] * mandatory
    assert (_git(repo, "rev-parse", "HEAD"), _git(repo, "branch", "--list")) == before


def test_dirty_tree_is_refused_with_exit_2(checkout: Callable[[str], Path]) -> None:
    repo = checkout("0.5.20")
    f = repo / "python/sglang/srt/disaggregation/prefill.py"
    f.write_text(f.read_text() + "\n# local edit\n")
    res = _kvgate("--release", "v0.5.20", "--repo", str(repo))
    assert res.exit_code == 2
    assert "uncommitted changes" in res.stderr and "python/sglang/srt/disaggregation/prefill.py" in res.stderr
    assert _git(repo, "rev-parse", "--abbrev-ref", "HEAD") == "main"


def test_hash_mismatch_is_refused_naming_the_file(checkout: Callable[[str], Path]) -> None:
    repo = checkout("0.5.20")
    f = repo / "python/sglang/srt/environ.py"
    f.write_text(f.read_text() + "\n# a committed local change\n")
    _git(repo, "commit", "-qam", "local change")
    before = tree_digest(repo / "python")
    res = _kvgate("--release", "v0.5.20", "--repo", str(repo), "--with-hardening")
    assert res.exit_code == 2
    assert "python/sglang/srt/environ.py" in res.stderr and "sha256" in res.stderr
    assert tree_digest(repo / "python") == before
    assert "kvgate/backport-v0.5.20" not in _git(repo, "branch", "--list")


def test_wrong_release_is_refused(checkout: Callable[[str], Path]) -> None:
    repo = checkout("0.5.21")  # 0.5.21+ carry the fixes upstream; the 0.5.20 series must not touch them
    before = tree_digest(repo / "python")
    res = _kvgate("--release", "v0.5.20", "--repo", str(repo))
    assert res.exit_code == 2 and "does not match sglang 0.5.20" in res.stderr
    assert tree_digest(repo / "python") == before


def test_v0_5_19_series_applies_to_0_5_19_and_reverts(checkout: Callable[[str], Path]) -> None:
    repo = checkout("0.5.19")
    before = tree_digest(repo / "python")
    res = _kvgate("--release", "v0.5.19", "--repo", str(repo), "--with-hardening", "--format", "json")
    assert res.exit_code == 0, res.output
    assert [f["check"] for f in json.loads(res.stdout)["findings"]] == [p.id for p in load_series("0.5.19").patches]
    rev = _kvgate("--release", "v0.5.19", "--repo", str(repo), "--revert")
    assert rev.exit_code == 0, rev.output
    assert tree_digest(repo / "python") == before  # restored byte for byte, history kept
    assert "Kvgate-Revert:" in _git(repo, "log", "-1", "--format=%B")


def test_until_commits_a_prefix_and_a_later_run_continues_the_branch(checkout: Callable[[str], Path]) -> None:
    repo = checkout("0.5.20")
    target, series = Target(Layout.GIT, repo), load_series("0.5.20")
    ids = [p.id for p in series.patches]
    base = _git(repo, "rev-parse", "HEAD")
    apply_series(target, series, until="kvgate-ack-fanout")
    log = _git(repo, "log", "--format=%(trailers:key=Kvgate-Patch,valueonly)", f"{base}..HEAD").split()
    assert log == list(reversed(ids[:4]))
    assert _git(repo, "rev-parse", "--abbrev-ref", "HEAD") == "kvgate/backport-v0.5.20"
    apply_series(target, series)  # on the branch: the mandatory rest, one commit each
    log = _git(repo, "log", "--format=%(trailers:key=Kvgate-Patch,valueonly)", f"{base}..HEAD").split()
    assert log == list(reversed(ids[:6]))
