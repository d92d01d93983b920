"""A backport killed hard (SIGKILL) at any write is recovered by the next run, both ways, byte for byte.

Each run is a real `kvgate backport` process on real files: a copy of the files the 0.5.20 series touches,
taken from the real wheel (site-packages layout), or a git checkout of the wheel's source. The process
SIGKILLs itself at one write through the TEST-ONLY hook `KVGATE_TEST_ONLY_SIGKILL_AT`
(kvgate/backport/journal.py): after the temp file of the n-th write ("temp:n", the rename not done) or
after the n-th rename ("renamed:n"), the last write being the applied record. The next run then finishes
(apply) or undoes (revert, check) the interrupted one, and the tree must equal, byte for byte, what a
completed apply or no apply at all leaves, with no `.kvgate-tmp` file anywhere.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgate.backport.journal import TEST_ONLY_SIGKILL_ENV
from kvgate.catalogue.series import load_series
from kvgate.cli import app
from tests.assets.real_sglang import wheel_or_skip

from .conftest import tree_digest

pytestmark = [pytest.mark.slow, pytest.mark.wheels]
runner = CliRunner()
SERIES = load_series("0.5.20")
RECORD = "sglang/.kvgate-backport/applied.json"


def _site(dest: Path) -> Path:
    """A site-packages folder holding the real 0.5.20 files the series touches (and nothing else)."""
    src = wheel_or_skip("0.5.20")
    for pf in {f.site_path for p in SERIES.patches for f in p.files}:
        (dest / pf).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / pf, dest / pf)
    return dest


def _killed_run(root: Path, point: str, *args: str, layout: str = "--site-packages") -> int:
    """`kvgate backport --release v0.5.20 <layout> root args` in its own process, killed at `point`."""
    code = "import sys; from kvgate.cli import main; sys.argv = ['kvgate', *sys.argv[1:]]; main()"
    env = {**os.environ, TEST_ONLY_SIGKILL_ENV: point}
    proc = subprocess.run(
        [sys.executable, "-c", code, "backport", "--release", "v0.5.20", layout, str(root), *args, "-q"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode


def _kvgate(*args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, ["backport", "--release", "v0.5.20", *args, "--format", "json"])


def _temps(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".kvgate-tmp")]


def _normalised(root: Path) -> dict[str, object]:
    """The tree's digest, with the applied record compared by content less its timestamps."""
    out: dict[str, object] = dict(tree_digest(root))
    rec = root / RECORD
    if rec.is_file():
        doc = json.loads(rec.read_text())
        for p in doc["patches"]:
            p.pop("applied_at")
        out[RECORD] = doc
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    """What no apply and a completed apply leave (the two states a recovery may end at)."""
    root = _site(tmp_path_factory.mktemp("reference"))
    pristine = _normalised(root)
    res = _kvgate("--site-packages", str(root))
    assert res.exit_code == 0, res.output
    return {"pristine": pristine, "patched": _normalised(root)}


def _writes(reference: dict[str, dict[str, object]]) -> int:
    """Writes in a fresh apply: one backup and one patched file per touched file, then the record."""
    files = {f.site_path for p in SERIES.select(False) for f in p.files}
    return 2 * len(files) + 1


def test_a_kill_at_every_rename_is_rolled_forward_by_apply_and_back_by_revert(
    reference: dict[str, dict[str, object]], tmp_path: Path
) -> None:
    n = _writes(reference)
    assert n == 19  # 9 files patched by the mandatory set, their 9 backups, the record
    for i in range(1, n + 1):
        for how in ("apply", "revert"):
            root = _site(tmp_path / f"renamed-{i}-{how}")
            rc = _killed_run(root, f"renamed:{i}")
            assert rc == -signal.SIGKILL, f"renamed:{i}: not killed (rc {rc})"
            assert (root / "sglang/.kvgate-backport/journal/intent.json").is_file()
            res = _kvgate("--site-packages", str(root), *(["--revert"] if how == "revert" else []))
            assert res.exit_code == 0, f"renamed:{i} {how}: {res.output}"
            doc = json.loads(res.stdout)
            rec = next(f for f in doc["findings"] if f["id"] == "backport.recovery")
            want = "rolled forward" if how == "apply" else "rolled back"
            assert rec["summary"].startswith(want), rec["summary"]
            state = "patched" if how == "apply" else "pristine"
            assert _normalised(root) == reference[state], f"renamed:{i} {how}: tree differs"
            assert not _temps(root), _temps(root)


def test_a_kill_with_a_temp_file_written_and_at_the_record(
    reference: dict[str, dict[str, object]], tmp_path: Path
) -> None:
    """Killed with the n-th temp file written but not renamed (the record last); and after the last
    rename, before the journal is dropped. check rolls back, apply forward."""
    n = _writes(reference)
    points = [f"temp:{i}" for i in (1, 9, 12, n)] + ["intent", "committed"]
    for point in points:
        for how in ("apply", "check"):
            root = _site(tmp_path / f"{point.replace(':', '-')}-{how}")
            assert _killed_run(root, point) == -signal.SIGKILL, point
            if point.startswith("temp:"):
                assert _temps(root), f"{point}: no temp file left to recover"
            res = _kvgate("--site-packages", str(root), *(["--check"] if how == "check" else []))
            assert res.exit_code == 0, f"{point} {how}: {res.output}"
            ids = [f["id"] for f in json.loads(res.stdout)["findings"]]
            assert "backport.recovery" in ids, ids  # even a kill before the record: its staging is removed
            state = "patched" if how == "apply" else "pristine"
            assert _normalised(root) == reference[state], f"{point} {how}: tree differs"
            assert not _temps(root), _temps(root)
            assert not (root / "sglang/.kvgate-backport/journal").exists()


def test_a_killed_revert_is_finished_by_revert_and_undone_by_apply(
    reference: dict[str, dict[str, object]], tmp_path: Path
) -> None:
    for i in (1, 4, 9, 10, 14):  # restored files (1-9), the record's removal (10), backups dropped (11-19)
        for how in ("revert", "apply"):
            root = _site(tmp_path / f"revert-{i}-{how}")
            assert _kvgate("--site-packages", str(root)).exit_code == 0
            patched = _normalised(root)
            assert _killed_run(root, f"renamed:{i}", "--revert") == -signal.SIGKILL
            res = _kvgate("--site-packages", str(root), *(["--revert"] if how == "revert" else []))
            assert res.exit_code == 0, f"revert renamed:{i} {how}: {res.output}"
            if how == "revert":
                assert _normalised(root) == reference["pristine"]
            else:
                assert _normalised(root) == patched  # the record and backups as the apply left them
            assert not _temps(root)


def test_a_record_naming_a_path_outside_the_series_is_refused(tmp_path: Path) -> None:
    """The journal is data from the tree: a path it names outside what the series writes is never written."""
    root = _site(tmp_path / "hostile")
    assert _killed_run(root, "renamed:3") == -signal.SIGKILL
    intent = root / "sglang/.kvgate-backport/journal/intent.json"
    doc = json.loads(intent.read_text())
    doc["changes"][0]["rel"] = "sglang/srt/server_args.py"
    intent.write_text(json.dumps(doc))
    before = tree_digest(root)
    res = _kvgate("--site-packages", str(root))
    assert res.exit_code == 2 and "does not write" in res.stderr, res.output
    assert tree_digest(root) == before


def test_a_file_changed_after_the_kill_is_refused_naming_it(tmp_path: Path) -> None:
    root = _site(tmp_path / "changed")
    assert _killed_run(root, "renamed:10") == -signal.SIGKILL
    victim = root / "sglang/srt/disaggregation/prefill.py"
    victim.write_bytes(victim.read_bytes() + b"\n# edited by hand after the kill\n")
    res = _kvgate("--site-packages", str(root), "--revert")
    assert res.exit_code == 2 and "changed since the interrupted apply" in res.stderr, res.output


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def test_a_killed_repo_apply_is_finished_by_apply_and_undone_by_revert(
    _base_checkouts: Callable[[str], Path], tmp_path: Path
) -> None:
    def clone(name: str) -> Path:
        dest = tmp_path / name
        subprocess.run(["git", "clone", "-q", str(_base_checkouts("0.5.20")), str(dest)], check=True)
        _git(dest, "config", "user.name", "tester")
        _git(dest, "config", "user.email", "tester@example.invalid")
        return dest

    done = clone("done")
    start = _git(done, "rev-parse", "HEAD")
    pristine = tree_digest(done / "python")
    assert _kvgate("--repo", str(done)).exit_code == 0
    patched = tree_digest(done / "python")
    for point in ("intent", "renamed:3", "commit:kvgate-preserve-abort-ack", "temp:12"):
        for how in ("apply", "revert"):
            repo = clone(f"{point.replace(':', '-')}-{how}")
            assert _killed_run(repo, point, layout="--repo") == -signal.SIGKILL, point
            res = _kvgate("--repo", str(repo), *(["--revert"] if how == "revert" else []))
            assert res.exit_code == 0, f"{point} {how}: {res.output}"
            assert not _temps(repo) and _git(repo, "status", "--porcelain") == ""
            assert not (repo / ".git/kvgate-backport").exists()
            if how == "apply":
                assert tree_digest(repo / "python") == patched, point
                assert _git(repo, "rev-parse", "--abbrev-ref", "HEAD") == "kvgate/backport-v0.5.20"
                trailers = _git(repo, "log", "--format=%(trailers:key=Kvgate-Patch,valueonly)", f"{start}..HEAD")
                assert trailers.split() == [p.id for p in reversed(SERIES.select(False))], point
            else:
                assert tree_digest(repo / "python") == pristine, point
                assert _git(repo, "rev-parse", "HEAD") == start


def test_verify_reads_the_tree_only_after_rolling_an_interrupted_apply_back(
    reference: dict[str, dict[str, object]], tmp_path: Path
) -> None:
    """--verify's first step (`recover_interrupted`) says what it undid; then no patch reads as applied."""
    from kvgate.backport.engine import applied_patches, recover_interrupted
    from kvgate.backport.stages import Layout, Target

    root = _site(tmp_path / "verify")
    assert _killed_run(root, "renamed:12") == -signal.SIGKILL
    target = Target(Layout.SITE, root)
    rec = recover_interrupted(target, SERIES)
    assert rec is not None and rec.direction == "rolled back" and rec.action == "apply" and rec.files == 12
    assert recover_interrupted(target, SERIES) is None  # nothing left pending
    assert applied_patches(target, SERIES) == ()
    assert _normalised(root) == reference["pristine"] and not _temps(root)
