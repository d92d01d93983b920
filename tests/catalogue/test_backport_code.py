"""Backports recognised by their code on REAL wheel source with the REAL series applied (never by a comment)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgate.catalogue import Presence, assess_code
from kvgate.catalogue.backports import check_backport
from kvgate.catalogue.codescan import all_series
from kvgate.catalogue.scanprog import MARKER_PREFIX
from kvgate.catalogue.series import load_series
from kvgate.catalogue.source import from_site_packages
from kvgate.cli import app
from tests.catalogue.helpers import add_marker, copy_signature_tree

pytestmark = pytest.mark.wheels
runner = CliRunner()


def _applied(tmp_path: Path, release: str, *extra: str) -> Path:
    site = tmp_path / f"site-{release}"
    copy_signature_tree(release, site / "sglang")
    res = runner.invoke(app, ["backport", "--release", f"v{release}", "--site-packages", str(site), *extra])
    assert res.exit_code == 0, res.output
    return site


@pytest.mark.parametrize("release", ["0.5.19", "0.5.20"])
def test_the_applied_series_reads_as_present_byte_identical(tmp_path: Path, release: str) -> None:
    site = _applied(tmp_path, release, "--with-hardening")
    scan = from_site_packages(site)
    for patch in load_series(release).patches:
        bc = check_backport(scan, patch.id, all_series())
        assert bc.presence is Presence.PRESENT and bc.series == f"v{release}" and bc.marked, patch.id
        assert all(f.identical for f in bc.files), bc.evidence()
    a = assess_code(scan)
    assert set(a.backports_present()) == {p.id for p in load_series(release).patches}
    assert a.status("pr-38704").via_backport == "kvgate-verify-handoff-coverage"


def test_a_hand_applied_equivalent_without_markers_is_recognised(tmp_path: Path) -> None:
    site = _applied(tmp_path, "0.5.20")
    for patch in load_series("0.5.20").select(False):
        for f in patch.files:
            p = site / f.site_path
            p.write_text(re.sub(rf"^[ \t]*{re.escape(MARKER_PREFIX)}{patch.id}\n", "", p.read_text(), flags=re.M))
    scan = from_site_packages(site)
    assert scan.markers == {}
    bc = check_backport(scan, "kvgate-admission-door", all_series())
    assert bc.presence is Presence.PRESENT and not bc.marked
    assert not any(f.identical for f in bc.files)  # the hash differs: the signatures decided, and it says so
    assert "hand-applied equivalent" in bc.evidence()[0]
    assert "file differs from the series' output" in bc.evidence()[1]
    assert assess_code(scan).status("pr-38935").via_backport == "kvgate-admission-door"


def test_code_missing_from_one_file_is_a_partial_backport(tmp_path: Path) -> None:
    site = _applied(tmp_path, "0.5.20")
    door = site / "sglang/srt/disaggregation/decode.py"
    door.write_text(door.read_text().replace("and kvgate_is_unadmitted_rejection(req)", "and False"))
    scan = from_site_packages(site)
    bc = check_backport(scan, "kvgate-admission-door", all_series())
    assert bc.presence is Presence.TAMPERED
    assert any("srt/disaggregation/decode.py: code missing" in e for e in bc.evidence())
    a = assess_code(scan)
    assert a.status("pr-38935").presence is Presence.ABSENT  # a partial backport is not the fix
    assert [s.fix.id for s in a.tampered()] == ["kvgate-admission-door"]


def test_upstream_code_alone_is_not_a_backport(tmp_path: Path) -> None:
    """0.5.21 carries `EnvBool(True)` natively: one matching file without a marker is not a partial backport."""
    site = tmp_path / "site"
    copy_signature_tree("0.5.21", site / "sglang")
    a = assess_code(from_site_packages(site))
    assert a.tampered() == () and a.backports_present() == ()
    assert a.status("kvgate-deferred-release-default").presence is Presence.ABSENT


def test_markers_only_on_the_real_source(tmp_path: Path) -> None:
    pkg = copy_signature_tree("0.5.19", tmp_path / "site" / "sglang")
    for patch in load_series("0.5.19").patches:
        for f in patch.files:
            add_marker(pkg, f.site_path[len("sglang/") :], patch.id)
    a = assess_code(from_site_packages(tmp_path / "site"))
    assert a.backports_present() == ()
    assert {s.fix.id for s in a.tampered()} == {p.id for p in load_series("0.5.19").patches}
    assert {"pr-36988", "pr-38935", "pr-41023"} <= {s.fix.id for s in a.missing_correctness()}


def test_an_unknown_marker_id_is_noted_not_counted(tmp_path: Path) -> None:
    pkg = copy_signature_tree("0.5.20", tmp_path / "site" / "sglang")
    add_marker(pkg, "srt/environ.py", "kvgate-made-up")
    a = assess_code(from_site_packages(tmp_path / "site"))
    assert any("kvgate-made-up" in n and "not evidence" in n for n in a.notes)
    assert a.backports_present() == () and a.tampered() == ()
    assert any(f"marker '{MARKER_PREFIX}kvgate-made-up'" in n for n in a.notes)
