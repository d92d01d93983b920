"""docs/usage.md's three lines that get a release's source from the package index and try the series on it
run as written: the download (here from the cached wheel's folder, the same resolution pip does on the
index), the unpack, and `kvgate backport --check` on the folder (it would apply, exit 0)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.upstream.releases import wheel_path

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.wheels


def _documented() -> list[list[str]]:
    text = (ROOT / "docs" / "usage.md").read_text()
    block = re.search(r"\*\*A release's source from the package index\*\*.*?```bash\n(.*?)```", text, re.S)
    assert block, "docs/usage.md no longer shows how to get a release's source"
    return [shlex.split(line) for line in block.group(1).strip().splitlines()]


def test_the_documented_lines_fetch_unpack_and_check(tmp_path: Path) -> None:
    download, unpack, check = _documented()
    assert download[:4] == ["python3", "-m", "pip", "download"] and "sglang==0.5.20" in download
    assert unpack[:4] == ["python3", "-m", "zipfile", "-e"] and check[:2] == ["kvgate", "backport"]
    home = str(tmp_path)

    def here(argv: list[str]) -> list[str]:
        return [a.replace("~", home) for a in argv]

    cached = wheel_path("0.5.20").parent  # the package index, offline: the wheel pip fetched once
    proc = subprocess.run(
        [sys.executable, *here(download)[1:], "--no-index", "--find-links", str(cached)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = subprocess.run([sys.executable, *here(unpack)[1:]], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "src" / "sglang-0.5.20" / "sglang" / "srt").is_dir()
    res = CliRunner().invoke(app, here(check)[1:])
    assert res.exit_code == 0, res.output
