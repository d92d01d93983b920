"""tools/busy_run.py: runs a command beside CPU hogs, repeats it, reports each run and stops the hogs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "busy_run.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=120)


def test_runs_the_command_beside_a_hog_and_reports_each_run(tmp_path: Path) -> None:
    marker = tmp_path / "runs"
    cmd = f"import pathlib; p = pathlib.Path({str(marker)!r}); p.write_text(p.read_text() + 'x' if p.exists() else 'x')"
    res = _run("--hogs", "1", "--repeat", "2", "--", sys.executable, "-c", cmd)
    assert res.returncode == 0, res.stderr
    assert marker.read_text() == "xx"  # the command really ran twice
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("busy_run: run ")]
    assert [ln.split()[2] for ln in lines] == ["1/2", "2/2"] and all(" exit 0 " in ln for ln in lines), res.stdout
    assert "1 hog(s)" in res.stdout


def test_the_first_failing_run_decides_the_exit_status() -> None:
    res = _run("--hogs", "0", "--repeat", "2", "--", sys.executable, "-c", "raise SystemExit(3)")
    assert res.returncode == 3, res.stdout + res.stderr
    assert res.stdout.count(" exit 3 ") == 2


def test_no_command_is_a_usage_error() -> None:
    assert _run("--hogs", "1").returncode == 2
