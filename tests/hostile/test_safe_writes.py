"""Writes never follow a planted path (issue 20, case 5): reports, baselines, backups and markers.

Someone who can write to the output folder plants a symlink (or a file) at a name kvgate might use as
its temp file, or at the destination itself. The file it points to must stay byte-identical, the
planted entry must stay as it was, and the report must still be written where it was asked.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvgate.backport.engine import apply_series, revert_series
from kvgate.backport.stages import Layout, Target
from kvgate.cli import app
from kvgate.exitcodes import ExitStatus
from kvgate.formats import ReportFormat
from kvgate.output import safeio
from kvgate.output.safeio import UnsafePath, write_atomic
from tests.assets import sglang_payloads as P
from tests.conftest import PayloadServer, Route

from .series_fixture import make_series, make_site, tree

runner = CliRunner()
VICTIM = "precious: must never be overwritten\n"
EXAMPLES = int(os.environ.get("KVGATE_FUZZ_EXAMPLES", "200"))


def _victim(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    victim = outside / "victim.txt"
    victim.write_text(VICTIM)
    return victim


# -- case 5, rebuilt --------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", list(ReportFormat))
def test_case5_a_symlink_at_output_tmp_is_not_followed(tmp_path: Path, fmt: ReportFormat) -> None:
    victim = _victim(tmp_path)
    out = tmp_path / "shared" / f"report.{fmt.value}"
    out.parent.mkdir()
    planted = out.with_name(out.name + ".tmp")
    planted.symlink_to(victim)
    res = runner.invoke(app, ["fixes", "--release", "0.5.20", "-f", fmt.value, "-o", str(out)])
    assert res.exit_code == ExitStatus.GATE_FAILED, res.output  # 0.5.20 lacks correctness fixes
    assert victim.read_text() == VICTIM
    assert planted.is_symlink() and planted.readlink() == victim
    assert "kvgate fixes" in out.read_text() or "kvgate" in out.read_text()
    if fmt is ReportFormat.JSON:
        assert json.loads(out.read_text())["exit_status"] == 1
    assert sorted(p.name for p in out.parent.iterdir()) == sorted([out.name, planted.name])  # no temp left


def _worker(make: Callable[..., PayloadServer], mode: str) -> PayloadServer:
    return make(
        {
            "/server_info": Route(P.server_info("0.5.23", mode=mode, context=1_048_576, pool=2_040_000)),
            "/v1/models": Route(P.v1_models(1_048_576)),
            "/model_info": Route(P.model_info("0.5.23", mode)),
        }
    )


def test_case5_a_symlink_at_the_baselines_temp_name_is_not_followed(
    tmp_path: Path, payload_server: Callable[..., PayloadServer]
) -> None:
    victim = _victim(tmp_path)
    base = tmp_path / "shared" / "fleet.baseline.json"
    base.parent.mkdir()
    planted = base.with_name(base.name + ".tmp")
    planted.symlink_to(victim)
    p, d = _worker(payload_server, "prefill"), _worker(payload_server, "decode")
    res = runner.invoke(
        app,
        ["check", "--quiet", "--prefill-url", p.url, "--decode-url", d.url, "--trust-version"]
        + ["--deferred-release", "--no-probes", "--write-baseline", str(base), "-f", "json"],
    )
    doc = json.loads(res.stdout)
    write = [f for f in doc["findings"] if f["id"] == "baseline.write"]
    assert write and write[0]["outcome"] == "passed", write
    assert victim.read_text() == VICTIM
    assert planted.is_symlink() and planted.readlink() == victim
    assert json.loads(base.read_text())["kind"] == "kvgate-baseline"


def test_a_symlink_at_the_destination_is_replaced_not_followed(tmp_path: Path) -> None:
    """`-o link` where someone made `link` point elsewhere: the report lands at `link`, the target is untouched."""
    victim = _victim(tmp_path)
    link = tmp_path / "report.json"
    link.symlink_to(victim)
    res = runner.invoke(app, ["fixes", "--release", "0.5.20", "-f", "json", "-o", str(link)])
    assert res.exit_code == 1
    assert victim.read_text() == VICTIM
    assert not link.is_symlink() and json.loads(link.read_text())["command"].startswith("fixes")


# -- the helper itself --------------------------------------------------------------------------------
PLANTS = ("link-to-victim", "dangling-link", "file", "directory", "link-to-dir")


def _plant(path: Path, kind: str, victim: Path) -> None:
    if kind == "link-to-victim":
        path.symlink_to(victim)
    elif kind == "dangling-link":
        path.symlink_to(victim.parent / "does-not-exist")
    elif kind == "file":
        path.write_text(VICTIM)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to(victim.parent, target_is_directory=True)


@settings(
    max_examples=EXAMPLES // 2,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(plants=st.lists(st.sampled_from(PLANTS), max_size=6), data=st.binary(max_size=4096), also_tmp=st.booleans())
def test_write_atomic_never_opens_a_planted_name(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    plants: list[str],
    data: bytes,
    also_tmp: bool,
) -> None:
    """Every temp name write_atomic tries first is taken by a plant: it takes the next, and every plant and
    what it points to is left exactly as it was; no temp file is left behind."""
    root = tmp_path_factory.mktemp("w")
    victim = _victim(root)
    folder = root / "shared"
    folder.mkdir()
    dest = folder / "report.json"
    names = [f"{i:012x}" for i in range(len(plants) + 1)]
    for name, kind in zip(names, plants, strict=False):
        _plant(folder / f".{dest.name}.{name}.kvgate-tmp", kind, victim)
    if also_tmp:
        (folder / "report.json.tmp").symlink_to(victim)
    seq = iter(names)
    monkeypatch.setattr(safeio.secrets, "token_hex", lambda n: next(seq))
    before = tree(root)
    write_atomic(dest, data)
    after = tree(root)
    assert dest.read_bytes() == data
    del after["shared/report.json"]
    assert after == {k: v for k, v in before.items() if k != "shared/report.json"}
    monkeypatch.undo()


def test_write_atomic_keeps_the_mode_of_the_file_it_replaces(tmp_path: Path) -> None:
    dest = tmp_path / "baseline.json"
    dest.write_text("{}")
    dest.chmod(0o640)
    write_atomic(dest, "{}\n")
    assert stat.S_IMODE(dest.stat().st_mode) == 0o640


def test_write_atomic_failure_leaves_nothing(tmp_path: Path) -> None:
    """A destination that cannot be replaced (a directory): the error surfaces, no temp file is left."""
    dest = tmp_path / "report.json"
    dest.mkdir()
    (dest / "inside").write_text("x")
    with pytest.raises(OSError):
        write_atomic(dest, "data")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
    assert (dest / "inside").read_text() == "x"


# -- backport backups, markers and patched files -------------------------------------------------------
def _engine(tmp_path: Path) -> tuple[Target, Any]:
    series = make_series(tmp_path / "backports")
    site = make_site(tmp_path / "site")
    return Target(Layout.SITE, site.resolve()), series


def test_backport_ignores_links_planted_at_every_name_it_writes(tmp_path: Path) -> None:
    """Links at the old fixed temp names of the patched files and of applied.json, and at a backup's own
    name: apply and revert both go through, and every victim is byte-identical."""
    victim = _victim(tmp_path)
    target, series = _engine(tmp_path)
    marker = target.marker_dir
    (marker / "backup" / "sglang" / "srt").mkdir(parents=True)
    planted = [
        target.root / "sglang/srt/.door.py.kvgate-tmp",
        target.root / "sglang/srt/.conn.py.kvgate-tmp",
        marker / "applied.json.tmp",
        marker / "backup" / "sglang" / "srt" / "door.py",
    ]
    for p in planted:
        p.symlink_to(victim)
    apply_series(target, series)
    assert victim.read_text() == VICTIM
    assert "req.ok" in (target.root / "sglang/srt/door.py").read_text()
    assert not (marker / "backup/sglang/srt/door.py").is_symlink()  # replaced by the real backup
    revert_series(target, series)
    assert victim.read_text() == VICTIM
    assert (target.root / "sglang/srt/door.py").read_text() == "def admit(req):\n    return True\n"
    for p in planted[:2]:
        assert p.is_symlink()


def test_backport_refuses_a_backup_folder_that_links_out(tmp_path: Path) -> None:
    """`.kvgate-backport/backup` planted as a link to a folder outside: exit 2 naming it, nothing written
    there or in the tree."""
    victim = _victim(tmp_path)
    target, series = _engine(tmp_path)
    target.marker_dir.mkdir()
    (target.marker_dir / "backup").symlink_to(victim.parent, target_is_directory=True)
    before, outside = tree(target.root), tree(victim.parent)
    with pytest.raises(UnsafePath) as err:
        apply_series(target, series)
    assert "backup" in str(err.value)
    assert tree(target.root) == before and tree(victim.parent) == outside


def test_backport_refuses_a_marker_folder_that_links_out(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    target, series = _engine(tmp_path)
    target.marker_dir.symlink_to(victim.parent, target_is_directory=True)
    before, outside = tree(target.root), tree(victim.parent)
    with pytest.raises(UnsafePath, match=".kvgate-backport"):
        apply_series(target, series)
    assert tree(target.root) == before and tree(victim.parent) == outside
