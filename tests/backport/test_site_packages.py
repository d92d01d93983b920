"""`kvgate backport --site-packages / --python` on a private copy of the really installed release."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgate.backport import journal
from kvgate.backport.cpuenv import CpuEnv
from kvgate.backport.engine import applied_patches, apply_series
from kvgate.backport.stages import BackportFailed, Layout, Target
from kvgate.catalogue.scanprog import MARKER_PREFIX
from kvgate.catalogue.series import load_series
from kvgate.cli import app
from kvgate.errors import UsageError
from kvgate.exitcodes import ExitStatus

from .conftest import tree_digest

pytestmark = [pytest.mark.slow, pytest.mark.wheels]
runner = CliRunner()


def _kvgate(*args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, ["backport", *args])


def test_apply_is_atomic_marked_idempotent_and_reverts_byte_for_byte(site: Callable[[str], CpuEnv]) -> None:
    env = site("0.5.20")
    root = env.site_packages
    pristine = tree_digest(root)
    res = _kvgate("--release", "v0.5.20", "--site-packages", str(root), "--with-hardening", "--format", "json")
    assert res.exit_code == 0, res.output
    marker = json.loads((root / "sglang/.kvgate-backport/applied.json").read_text())
    assert [p["id"] for p in marker["patches"]] == [p.id for p in load_series("0.5.20").patches]
    for info in marker["files"].values():  # the backup holds the original bytes
        backup = root / "sglang/.kvgate-backport/backup" / info["site_path"]
        assert tree_digest(backup.parent)[backup.name] == info["sha256_original"]
    door = (root / "sglang/srt/disaggregation/prefill.py").read_text()
    assert f"{MARKER_PREFIX}kvgate-admission-door" in door
    patched = tree_digest(root)
    # --verify without --python: the cached CPU environment imports only sglang/ from this folder.
    verify = _kvgate("--release", "v0.5.20", "--site-packages", str(root), "--verify", "--format", "json")
    assert verify.exit_code == 0, verify.output
    assert json.loads(verify.stdout)["target"]["probe_status"] == "RETIRED"
    again = _kvgate("--release", "v0.5.20", "--site-packages", str(root), "--with-hardening")
    assert again.exit_code == 0 and "already applied" in again.stdout
    assert tree_digest(root) == patched
    rev = _kvgate("--release", "v0.5.20", "--site-packages", str(root), "--revert")
    assert rev.exit_code == 0, rev.output
    assert tree_digest(root) == pristine


def test_corrupted_target_file_leaves_the_install_byte_identical(site: Callable[[str], CpuEnv]) -> None:
    root = site("0.5.20").site_packages
    victim = root / "sglang/srt/disaggregation/nixl/conn.py"  # touched only by the second patch
    victim.write_bytes(victim.read_bytes().replace(b"class NixlKVManager", b"class NixlKVManagr", 1))
    before = tree_digest(root)
    res = _kvgate("--release", "v0.5.20", "--site-packages", str(root))
    assert res.exit_code == 2
    assert "sglang/srt/disaggregation/nixl/conn.py" in res.stderr
    assert tree_digest(root) == before


def test_failure_while_writing_restores_every_file(
    site: Callable[[str], CpuEnv], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = site("0.5.20").site_packages
    before = tree_digest(root)
    real_replace = os.replace
    calls = {"n": 0}
    replaced: list[str] = []
    restored: list[str] = []

    def flaky(src: str | Path, dst: str | Path) -> None:
        if ".kvgate-backport" in str(dst):  # the backups (written atomically too) are not the eight files
            real_replace(src, dst)
            return
        if calls["n"] >= 4:  # after the failure: only the restore of what was replaced may write
            restored.append(str(dst))
            real_replace(src, dst)
            return
        calls["n"] += 1
        if calls["n"] == 4:  # half way through the eight files
            raise OSError(28, "No space left on device")
        replaced.append(str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(journal.os, "replace", flaky)
    with pytest.raises(BackportFailed, match="nothing changed"):
        apply_series(Target(Layout.SITE, root), load_series("0.5.20"))
    assert calls["n"] == 4
    # The three files replaced are restored from the journal; the fourth never changed, so it is not rewritten.
    assert len(replaced) == 3 and sorted(replaced) == sorted(restored), (replaced, restored)
    assert tree_digest(root) == before
    assert not (root / "sglang/.kvgate-backport").exists()


def test_a_full_disk_is_not_a_usage_error(
    site: Callable[[str], CpuEnv], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An I/O failure writing the target exits 4 (the target could not be written), never 2, with the
    report saying what failed; the target is left as it was."""
    root = site("0.5.20").site_packages
    before = tree_digest(root)

    real_replace = os.replace

    def full(src: str | Path, dst: str | Path) -> None:  # the target's disk is full; the report's is not
        if str(dst).startswith(str(root)):
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(journal.os, "replace", full)
    out = tmp_path / "r.json"
    res = _kvgate("--release", "v0.5.20", "--site-packages", str(root), "-f", "json", "-o", str(out))
    assert res.exit_code == ExitStatus.TRANSPORT_ERROR == 4, res.output
    doc = json.loads(out.read_text())
    assert doc["exit_status"] == 4 and doc["verdict"] == "transport_error"
    assert "No space left on device" in doc["findings"][0]["summary"] and "nothing changed" in res.stderr
    assert tree_digest(root) == before


def test_python_interpreter_finds_its_install(site: Callable[[str], CpuEnv], monkeypatch: pytest.MonkeyPatch) -> None:
    env = site("0.5.20")
    monkeypatch.setenv("PYTHONPATH", str(env.site_packages))
    res = _kvgate("--release", "v0.5.20", "--python", env.python, "--check", "--format", "json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["target"]["root"] == str(env.site_packages.resolve())
    assert [f["summary"].split(":")[0] for f in doc["findings"]] == ["would apply"] * 6  # the mandatory set


def test_revert_without_a_backport_is_refused(site: Callable[[str], CpuEnv]) -> None:
    root = site("0.5.20").site_packages
    res = _kvgate("--release", "v0.5.20", "--site-packages", str(root), "--revert")
    assert res.exit_code == 2 and "no kvgate backport recorded" in res.stderr


def test_until_applies_a_prefix_then_continues_and_reverts(site: Callable[[str], CpuEnv]) -> None:
    """`apply_series(until=...)`: the per-patch isolation walk's way through the series, one patch at a time."""
    root = site("0.5.20").site_packages
    target, series = Target(Layout.SITE, root), load_series("0.5.20")
    ids = [p.id for p in series.patches]
    pristine = tree_digest(root)
    with pytest.raises(UsageError, match="no patch 'kvgate-nope'"):
        apply_series(target, series, until="kvgate-nope")
    assert tree_digest(root) == pristine
    first = apply_series(target, series, until="kvgate-preserve-abort-ack")
    assert [p.id for p in first.patches if p.status == "applied"] == ids[:3]
    assert [p.id for p in applied_patches(target, series)] == ids[:3]
    middle = tree_digest(root)
    # Already past an earlier stop: nothing changes.
    assert not apply_series(target, series, until="kvgate-admission-door").changed
    assert tree_digest(root) == middle
    step = apply_series(target, series, until="kvgate-ack-fanout")
    assert [p.id for p in step.patches if p.status == "applied"] == ["kvgate-ack-fanout"]
    rest = apply_series(target, series)  # the mandatory remainder, optional hardening not included
    assert [p.id for p in rest.patches if p.status == "applied"] == ids[4:6]
    marker = json.loads((root / "sglang/.kvgate-backport/applied.json").read_text())
    assert [p["id"] for p in marker["patches"]] == ids[:6]
    rev = _kvgate("--release", "v0.5.20", "--site-packages", str(root), "--revert")
    assert rev.exit_code == 0, rev.output
    assert tree_digest(root) == pristine
