"""Paths read from a state file or manifest stay inside their root (issue 20, case 6).

`backport --revert` reads `site_path` from the tree's own `.kvgate-backport/applied.json`: whoever
can write the tree can write that record. A path with `..`, an absolute path, or one that leaves the
tree through a symlink exits 2 naming the record, before a byte is written anywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvgate.backport.engine import revert_series
from kvgate.backport.stages import Layout, Target
from kvgate.catalogue.series import load_series
from kvgate.cli import app
from kvgate.errors import UsageError
from kvgate.exitcodes import ExitStatus
from kvgate.output.safeio import UnsafePath, confine

from .series_fixture import make_series, make_site, tree

runner = CliRunner()
EXAMPLES = int(os.environ.get("KVGATE_FUZZ_EXAMPLES", "200"))
VICTIM = b"precious: must never be overwritten\n"
PAYLOAD = b"written by a hostile applied.json\n"
# A file the bundled v0.5.20 series touches (git path -> site path).
KEY = "python/sglang/srt/disaggregation/prefill.py"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _world(tmp_path: Path) -> tuple[Path, Path]:
    """A site-packages folder with an (empty) sglang/, and a victim file beside it, outside."""
    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)
    victim = tmp_path / "x"
    victim.write_bytes(VICTIM)
    return site, victim


def _record(site: Path, files: Any, patches: Any = None) -> Path:
    marker = site / "sglang" / ".kvgate-backport"
    marker.mkdir(parents=True, exist_ok=True)
    doc = {
        "series": "v0.5.20",
        "base_release": "0.5.20",
        "patches": patches if patches is not None else [{"id": "p", "title": "t", "files": ["f"]}],
        "files": files,
    }
    path = marker / "applied.json"
    path.write_text(json.dumps(doc))
    return path


def _hostile(site_path: str) -> dict[str, Any]:
    """An entry that, unconfined, restores PAYLOAD over whatever `site_path` reaches (its hashes match)."""
    return {KEY: {"site_path": site_path, "sha256_patched": _sha(VICTIM), "sha256_original": _sha(PAYLOAD)}}


def _revert(site: Path, report: Path) -> Any:
    return runner.invoke(
        app,
        ["backport", "--release", "v0.5.20", "--site-packages", str(site), "--revert", "-f", "json", "-o", str(report)],
    )


def _everything(root: Path, skip: Path) -> dict[str, Any]:
    """Every entry under root, with its inode (a rename would change it), except the report `skip`."""
    out: dict[str, Any] = {}
    for p in sorted(root.rglob("*")):
        if p == skip:
            continue
        st_ = p.lstat()
        out[str(p.relative_to(root))] = (st_.st_ino, p.readlink() if p.is_symlink() else None, tree_bytes(p))
    return out


def tree_bytes(p: Path) -> bytes | None:
    return p.read_bytes() if p.is_file() and not p.is_symlink() else None


# -- case 6, rebuilt --------------------------------------------------------------------------------
def test_case6_revert_with_dotdot_site_path_writes_nothing(tmp_path: Path) -> None:
    """applied.json names `../x`: the victim beside the tree keeps its bytes and inode; exit 2 names the file."""
    site, victim = _world(tmp_path)
    record = _record(site, _hostile("../x"))
    (record.parent / "backup").mkdir()
    (record.parent / "x").write_bytes(PAYLOAD)  # where backup/../x points: the "original" to restore
    report = tmp_path / "report.json"
    before = _everything(tmp_path, report)
    res = _revert(site, report)
    assert res.exit_code == ExitStatus.USAGE_ERROR, res.output
    assert str(record) in res.stderr and "'../x'" in res.stderr
    assert _everything(tmp_path, report) == before
    assert victim.read_bytes() == VICTIM
    doc = json.loads(report.read_text())  # the report is still written, before the exit
    assert doc["exit_status"] == 2 and str(record) in doc["findings"][0]["summary"]


def test_case6_revert_with_an_absolute_site_path_writes_nothing(tmp_path: Path) -> None:
    site, victim = _world(tmp_path)
    record = _record(site, _hostile(str(victim)))
    report = tmp_path / "report.json"
    before = _everything(tmp_path, report)
    res = _revert(site, report)
    assert res.exit_code == ExitStatus.USAGE_ERROR, res.output
    assert str(record) in res.stderr and "absolute" in res.stderr
    assert _everything(tmp_path, report) == before


def test_case6_revert_through_a_symlink_out_writes_nothing(tmp_path: Path) -> None:
    """The recorded path is the series' own file, but in this tree it is a link to a file outside."""
    site, victim = _world(tmp_path)
    live = site / "sglang/srt/disaggregation/prefill.py"
    live.parent.mkdir(parents=True)
    live.symlink_to(victim)
    record = _record(site, _hostile("sglang/srt/disaggregation/prefill.py"))
    backup = record.parent / "backup/sglang/srt/disaggregation/prefill.py"
    backup.parent.mkdir(parents=True)
    backup.write_bytes(PAYLOAD)
    report = tmp_path / "report.json"
    before = _everything(tmp_path, report)
    res = _revert(site, report)
    assert res.exit_code == ExitStatus.USAGE_ERROR, res.output
    assert str(record) in res.stderr and "symlink" in res.stderr
    assert _everything(tmp_path, report) == before


def test_a_recorded_path_the_series_does_not_touch_is_refused(tmp_path: Path) -> None:
    """Inside the tree but not a file of the series (e.g. sglang/__init__.py): refused, nothing written."""
    site, _ = _world(tmp_path)
    (site / "sglang/__init__.py").write_bytes(VICTIM)
    record = _record(site, _hostile("sglang/__init__.py"))
    (record.parent / "backup/sglang").mkdir(parents=True)
    (record.parent / "backup/sglang/__init__.py").write_bytes(PAYLOAD)
    report = tmp_path / "report.json"
    before = _everything(tmp_path, report)
    res = _revert(site, report)
    assert res.exit_code == ExitStatus.USAGE_ERROR, res.output
    assert "does not touch" in res.stderr and str(record) in res.stderr
    assert _everything(tmp_path, report) == before


@pytest.mark.parametrize(
    "files",
    [
        [],
        {"k": "not an object"},
        {KEY: {"site_path": 7}},
        {KEY: {"site_path": None}},
        {KEY: {"site_path": ["sglang", "x"]}},
        {KEY: {}},
    ],
)
def test_a_malformed_record_exits_2_not_5(tmp_path: Path, files: Any) -> None:
    site, _ = _world(tmp_path)
    record = _record(site, files)
    report = tmp_path / "report.json"
    before = _everything(tmp_path, report)
    res = _revert(site, report)
    assert res.exit_code == ExitStatus.USAGE_ERROR, res.output
    assert str(record) in res.stderr
    assert _everything(tmp_path, report) == before


def test_an_unreadable_record_exits_2(tmp_path: Path) -> None:
    site, _ = _world(tmp_path)
    record = _record(site, {})
    record.write_text("{not json")
    res = _revert(site, tmp_path / "report.json")
    assert res.exit_code == ExitStatus.USAGE_ERROR and str(record) in res.stderr


# -- any recorded path, through the engine ------------------------------------------------------------
SEGMENTS = ["..", ".", "", "sglang", "srt", "door.py", "x", "~", "..."]
hostile_paths = st.one_of(
    st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=6).map("/".join),
    st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=6).map(lambda s: "/" + "/".join(s)),
    st.text(alphabet="./\\\x00:Cx", max_size=12),
)


@settings(
    max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(site_path=hostile_paths)
def test_any_recorded_path_that_is_not_the_series_file_changes_nothing(
    tmp_path_factory: pytest.TempPathFactory, site_path: str
) -> None:
    """For any recorded path but the series' own (sglang/srt/door.py, applied), revert refuses (exit 2)
    and nothing anywhere under the test's folder changes, whatever the hashes say."""
    root = tmp_path_factory.mktemp("c")
    series = make_series(root / "backports")
    site = make_site(root / "site")
    (root / "x").write_bytes(VICTIM)
    marker = site / "sglang/.kvgate-backport"
    (marker / "backup").mkdir(parents=True)
    (marker / "x").write_bytes(PAYLOAD)
    (marker / "backup/x").write_bytes(PAYLOAD)
    entry = {"site_path": site_path, "sha256_patched": _sha(VICTIM), "sha256_original": _sha(PAYLOAD)}
    doc = {"base_release": "0.5.20", "patches": [], "files": {"python/sglang/srt/door.py": entry}}
    (marker / "applied.json").write_text(json.dumps(doc))
    before = tree(root)
    with pytest.raises(UsageError):
        revert_series(Target(Layout.SITE, site.resolve()), series)
    assert tree(root) == before


@pytest.mark.parametrize("value", ["../x", "a/../../x", "/etc/passwd", "C:\\x", "a\\..\\x", "a\x00b", "", " "])
def test_confine_refuses_and_names_the_source(tmp_path: Path, value: str) -> None:
    with pytest.raises(UnsafePath, match="state.json"):
        confine(tmp_path, value, tmp_path / "state.json")


def test_confine_accepts_a_path_inside(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    assert confine(tmp_path, "a/b.py", "state.json") == tmp_path / "a/b.py"
    (tmp_path / "a/link").symlink_to(tmp_path / "a")  # a link that stays inside is fine
    assert confine(tmp_path, "a/link/b.py", "state.json") == tmp_path / "a/link/b.py"


# -- the series manifest is a file too ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("key", "value"),
    [("file", "../../outside.patch"), ("file", "/etc/passwd"), ("path", "../../../x.py"), ("path", "/tmp/x.py")],
)
def test_a_manifest_path_out_of_its_root_exits_2_naming_the_manifest(tmp_path: Path, key: str, value: str) -> None:
    series = make_series(tmp_path / "backports")
    manifest = series.directory / "manifest.yaml"
    doc = yaml.safe_load(manifest.read_text())
    if key == "file":
        doc["patches"][0]["file"] = value
    else:
        doc["patches"][0]["files"][0]["path"] = value
    manifest.write_text(yaml.safe_dump(doc))
    with pytest.raises(UsageError, match="manifest.yaml"):
        load_series("0.5.20", root=tmp_path / "backports")
