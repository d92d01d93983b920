"""The CLI on real code: `kvgate drill --engine sglang` and `kvgate up --device cpu --gate`, in-process.

Each starts its own real pair (kvgate's launcher, the release's CPU environment, the tiny model), gates
it and tears it down: the incident on real 0.5.19 code blocks (exit 1, the over-limit request named as
served); a healthy real 0.5.22 pair gated at the defaults (no profile) passes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from tests.assets.real_sglang import server_env_or_skip

pytestmark = [pytest.mark.slow, pytest.mark.real]
runner = CliRunner()


def test_drill_on_real_0_5_19_blocks_and_names_the_served_request(tmp_path: Path) -> None:
    server_env_or_skip("0.5.19")
    out = tmp_path / "drill.json"
    res = runner.invoke(app, ["drill", "--engine", "sglang", "--release", "0.5.19", "-q", "-f", "json", "-o", str(out)])
    report = json.loads(out.read_text())
    failed = {f["check"]: f["summary"] for f in report["findings"] if f["outcome"] == "failed"}
    assert res.exit_code == 1, res.output
    assert failed["contract.pool_limit"].startswith("served_over_limit"), failed
    assert "stale KV" in failed["isolation.greedy_replay"], failed


def test_up_gate_on_a_healthy_real_0_5_22_pair_passes_at_the_defaults(tmp_path: Path) -> None:
    server_env_or_skip("0.5.22")
    out = tmp_path / "up.json"
    res = runner.invoke(
        app,
        [
            "up",
            "--device",
            "cpu",
            "--release",
            "0.5.22",
            "--context-length",
            "8192",
            "--prefill-pool",
            "10240",
            "--decode-pool",
            "10240",
            "--gate",
            "--log-dir",
            str(tmp_path / "logs"),
            "-q",
            "-f",
            "json",
            "-o",
            str(out),
        ],
    )
    report = json.loads(out.read_text())
    failed = [(f["check"], f["summary"]) for f in report["findings"] if f["outcome"] == "failed"]
    assert not failed, failed
    assert res.exit_code == 0, res.output  # at the defaults: no profile, nothing inconclusive
