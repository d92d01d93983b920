"""`kvgate cache`: lists KVGATE_CACHE_DIR with sizes and clears it, never anything outside it."""

from __future__ import annotations

import os
from pathlib import Path

from typer.testing import CliRunner

from kvgate.cli import app

runner = CliRunner()


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    cache, outside = tmp_path / "cache", tmp_path / "outside"
    (cache / "wheels" / "sglang-0.5.22").mkdir(parents=True)
    (cache / "wheels" / "sglang-0.5.22" / "w.whl").write_bytes(b"x" * 3000)
    (cache / "cpuenv").mkdir()
    (cache / "cpuenv" / "env.txt").write_bytes(b"y" * 500)
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    # hostile links: an entry that points out, and a link inside a folder that points out
    (cache / "evil").symlink_to(outside)
    (cache / "cpuenv" / "escape").symlink_to(outside)
    return cache, outside


def _run(cache: Path, *args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, ["cache", *args], env={"KVGATE_CACHE_DIR": str(cache)})


def test_lists_each_entry_with_its_size(tmp_path: Path) -> None:
    cache, outside = _tree(tmp_path)
    res = _run(cache)
    assert res.exit_code == 0, res.output
    assert f"kvgate cache: {cache} (3." in res.output  # 3,500 bytes and the links themselves
    assert "3.0 KB  wheels  (folder)" in res.output and "500 B  cpuenv  (folder)" in res.output
    assert f"evil  (link -> {outside})" in res.output and "kvgate cache --clear" in res.output


def test_clear_removes_only_what_is_inside(tmp_path: Path) -> None:
    cache, outside = _tree(tmp_path)
    res = _run(cache, "--clear", "--entry", "wheels")
    assert res.exit_code == 0 and not (cache / "wheels").exists() and (cache / "cpuenv").is_dir(), res.output
    assert "freed 3.0 KB" in res.output
    res = _run(cache, "--clear")
    assert res.exit_code == 0, res.output
    assert list(cache.iterdir()) == []
    assert (outside / "precious").read_text() == "keep me"  # links were removed as links


def test_refuses_names_outside_and_a_linked_cache_folder(tmp_path: Path) -> None:
    cache, outside = _tree(tmp_path)
    for name in ("..", "../outside", "nope"):
        res = _run(cache, "--clear", "--entry", name)
        assert res.exit_code == 2 and "not an entry of the cache" in res.output, (name, res.output)
    res = _run(cache, "--entry", "wheels")  # without --clear: listed, nothing deleted
    assert res.exit_code == 0 and "wheels" in res.output and "cpuenv" not in res.output
    link = tmp_path / "cache-link"
    link.symlink_to(cache)
    res = _run(link, "--clear")
    assert res.exit_code == 2 and "symbolic link" in res.output
    assert (cache / "wheels").is_dir() and (outside / "precious").is_file() and os.path.islink(cache / "evil")
