"""Method 3 on the REAL sglang wheels 0.5.19-0.5.23: the presence table of upstream-fixes.md section 3."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvgate.catalogue import Presence, assess_installed
from kvgate.catalogue.codescan import locate_package
from kvgate.catalogue.source import from_python, from_site_packages, read_declared_version
from kvgate.errors import TransportError, UsageError
from kvgate.upstream.releases import RELEASES
from tests.catalogue.helpers import EXPECTED, add_marker, copy_signature_tree, wheel

pytestmark = pytest.mark.wheels


@pytest.mark.parametrize("release", RELEASES)
def test_presence_table_by_source_signatures(release: str) -> None:
    installed = from_site_packages(wheel(release))
    assert installed.version == release
    a = assess_installed(installed)
    for fid, releases in EXPECTED.items():
        s = a.status(fid)
        by_source = next(d for d in s.detections if d.method == "source")
        want = Presence.PRESENT if release in releases else Presence.ABSENT
        assert by_source.presence is want, (release, fid, by_source.evidence)
        assert s.presence is want and s.decided_by == "source"
        assert not s.disagreement, (release, fid)  # version and source agree on unpatched wheels


@pytest.mark.parametrize(
    "release, missing",
    [
        ("0.5.19", {"pr-36988", "pr-38935", "pr-40645", "pr-41402", "pr-41404", "pr-41023", "ack-generations"}),
        ("0.5.20", {"pr-38935", "pr-40645", "pr-41402", "pr-41404", "pr-41023", "ack-generations"}),
        ("0.5.21", {"ack-generations"}),
        ("0.5.22", set()),
        ("0.5.23", set()),
    ],
)
def test_missing_correctness_fixes(release: str, missing: set[str]) -> None:
    a = assess_installed(from_site_packages(wheel(release)))
    assert {s.fix.id for s in a.missing_correctness()} == missing
    assert a.reads_as() == release


def test_package_dir_itself_is_accepted() -> None:
    installed = from_site_packages(wheel("0.5.22") / "sglang")
    assert installed.package_dir.name == "sglang" and installed.version == "0.5.22"


def test_not_a_site_packages_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no sglang package"):
        from_site_packages(tmp_path)
    with pytest.raises(UsageError, match="no such directory"):
        from_site_packages(tmp_path / "nope")


def test_a_marker_is_never_the_fix(tmp_path: Path) -> None:
    """The comment alone, on every file the patches change: no fix counted, both backports tampered."""
    pkg = copy_signature_tree("0.5.20", tmp_path / "site" / "sglang")
    for rel in (
        "srt/disaggregation/utils.py",
        "srt/disaggregation/prefill.py",
        "srt/disaggregation/decode.py",
        "srt/managers/scheduler.py",
    ):
        add_marker(pkg, rel, "kvgate-admission-door")
    add_marker(pkg, "srt/environ.py", "kvgate-deferred-release-default")
    a = assess_installed(from_site_packages(tmp_path / "site"))
    assert a.reads_as() == "0.5.20"
    assert a.status("pr-38935").presence is Presence.ABSENT and a.status("pr-38935").via_backport is None
    assert [s.fix.id for s in a.tampered()] == ["kvgate-admission-door", "kvgate-deferred-release-default"]
    src = next(d for d in a.status("kvgate-admission-door").detections if d.method == "source")
    assert any("tampered or partial backport" in e and "srt/disaggregation/prefill.py" in e for e in src.evidence)


def test_python_interpreter_is_asked_where_sglang_is(tmp_path: Path) -> None:
    site = wheel("0.5.21")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(purelib, "sglang-wheel.pth").write_text(str(site) + "\n")
    installed = from_python(str(py))
    assert installed.package_dir == (site / "sglang").resolve()
    assert installed.version == "0.5.21" and installed.source == f"--python {str(py)!r}"
    assert "find_spec" in installed.found_by
    a = assess_installed(installed)
    assert a.status("pr-38935").presence is Presence.PRESENT


def test_the_scan_and_locate_package_agree_and_honour_pythonpath(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One "where is sglang" helper: the locate program and the scan find the same package, with the
    interpreter's own environment (an overlay on PYTHONPATH counts, as it does for the server)."""
    site = wheel("0.5.21")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    with pytest.raises(UsageError, match="not importable"):
        locate_package(py)
    monkeypatch.setenv("PYTHONPATH", str(site))
    assert locate_package(py) == from_python(py).package_dir == (site / "sglang").resolve()
    with pytest.raises(TransportError, match="no such program"):
        locate_package(str(tmp_path / "nope" / "python"))


def test_python_without_sglang_or_missing_interpreter(tmp_path: Path) -> None:
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    with pytest.raises(UsageError, match="not importable"):
        from_python(str(venv / "bin" / "python"))
    with pytest.raises(TransportError, match="no such program"):
        from_python(str(tmp_path / "nope" / "python"))


def test_declared_version_falls_back_to_dist_info(tmp_path: Path) -> None:
    pkg = tmp_path / "sglang"
    (pkg / "srt").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (tmp_path / "sglang-0.5.21.dist-info").mkdir()
    (tmp_path / "sglang-0.5.21.dist-info" / "METADATA").write_text("Name: sglang\nVersion: 0.5.21\n")
    assert read_declared_version(pkg) == "0.5.21"
