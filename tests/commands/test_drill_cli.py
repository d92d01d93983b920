"""`kvgate drill` and `kvgate check --self-test`, in-process, against real simulator processes and the real router."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.exitcodes import ExitStatus

pytestmark = pytest.mark.slow
runner = CliRunner()

# The incident's ratio (681,280 / 1,048,576) at 1/16 scale.
SCALED = ["--context-length", "65536", "--prefill-pool", "42580", "--decode-pool", "131072"]


def _findings(path: Path) -> list[dict]:
    return json.loads(path.read_text())["findings"]


def test_drill_on_leaky_release_fails_with_the_leak(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    res = runner.invoke(app, ["drill", "--release", "0.5.19", *SCALED, "-q", "-f", "json", "-o", str(out)])
    assert res.exit_code == ExitStatus.GATE_FAILED, res.output
    failed = {(f["gate"], f["check"]) for f in _findings(out) if f["outcome"] == "failed"}
    assert ("pool-context", "headroom") in failed
    assert ("defenses", "release") in failed
    assert any(g == "probes" and c.startswith("canary.") for g, c in failed), failed
    (logs,) = [n for n in json.loads(out.read_text())["notes"] if n.startswith("simulator logs: ")]
    assert " B); delete with rm -rf " in logs or "B); delete with rm -rf " in logs  # where, and how big


def test_readme_main_command_shows_the_leak_in_the_first_lines() -> None:
    """The Quick start's command, exactly: the verdict first, then the leak, before any detail."""
    import re
    import shlex

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = readme.split("## Quick start", 1)[1].split("```bash\n")[1:]
    block = next(b.split("```", 1)[0] for b in blocks if "kvgate drill" in b.split("```", 1)[0])
    argv = shlex.split(re.search(r"kvgate (drill[^&\n]*)", block).group(1))  # type: ignore[union-attr]
    assert argv[:3] == ["drill", "--release", "0.5.19"], argv
    res = runner.invoke(app, [*argv, "-q"], env={"COLUMNS": "80"})
    assert res.exit_code == ExitStatus.GATE_FAILED, res.output
    first = res.stdout.splitlines()[:8]
    assert first[0] == "kvgate drill: GATE FAILED: do not promote (exit 1)"
    assert first[2].startswith("FAIL probes.canary.") and "leaked into" in " ".join(first[2:5]), first
    assert all(len(ln) <= 80 for ln in res.stdout.splitlines())


def test_drill_on_fixed_release_with_doubled_pool_passes(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    res = runner.invoke(
        app,
        [
            "drill",
            "--release",
            "0.5.22",
            "--context-length",
            "65536",
            "--prefill-pool",
            "131072",
            "--decode-pool",
            "131072",
            "--tenants",
            "8",
            "-q",
            "-f",
            "json",
            "-o",
            str(out),
        ],
    )
    outcomes = {f["outcome"] for f in _findings(out)}
    assert "failed" not in outcomes and "error" not in outcomes
    assert any(f["gate"] == "probes" and f["outcome"] == "passed" for f in _findings(out))
    # Strict by default: it passes only if every probe observed something (on a busy machine the abort
    # or latency probe may not, and then the drill says so with exit 3 instead of passing).
    unobserved = [f"{f['gate']}.{f['check']}" for f in _findings(out) if f["outcome"] == "inconclusive"]
    assert res.exit_code == (ExitStatus.INCONCLUSIVE if unobserved else ExitStatus.PASSED), res.output


def test_self_test_sees_the_known_leak(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    res = runner.invoke(app, ["check", "--self-test", "-q", "-f", "json", "-o", str(out)])
    assert res.exit_code == ExitStatus.PASSED, res.output
    (f,) = _findings(out)
    assert f["check"] == "selftest.positive_control" and f["outcome"] == "passed"
    # Issue 23: the simulator's logs stay behind, and the report says where, as the drill's does.
    notes = json.loads(out.read_text())["notes"]
    assert any(n.startswith("self-test simulator logs: ") and "rm -rf" in n for n in notes), notes


def test_an_interrupted_drill_says_where_its_logs_are(tmp_path: Path) -> None:
    """SIGTERM (a pipeline's timeout) mid-drill: exit 130, no verdict, and the report names the log
    folder the simulator left, as a finished drill does."""
    out = tmp_path / "r.json"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    argv = [sys.executable, "-c", "from kvgate.cli import main; main()", "drill", "-q", "-f", "json", "-o", str(out)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("kvgate-sim-*/*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    (folder,) = list(tmp_path.glob("kvgate-sim-*"))
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == ExitStatus.INTERRUPTED, err
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "interrupted"
    assert any(n.startswith(f"simulator logs: {folder} (") and f"rm -rf {folder}" in n for n in doc["notes"]), doc
