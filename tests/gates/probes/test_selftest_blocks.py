"""Issue 10 route 1: `check --self-test` never exits 0 unless its positive control saw the known leak.

The simulator and the probe run are replaced here only to force the two ways a control can fail
(it could not start; it ran and saw nothing); the real end-to-end control runs in
tests/commands/test_drill_cli.py and tests/gates/probes/test_probes_sim.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.exitcodes import ExitStatus
from kvgate.results.findings import Report, passed

runner = CliRunner()


def _self_test(tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "r.json"
    res = runner.invoke(app, ["check", "--self-test", "-q", *extra, "-f", "json", "-o", str(out)])
    return res.exit_code, json.loads(out.read_text())


class _NoRouter:
    """Stands in for SimDeployment when kvgate[router] is not installed: start() raises as the real one would."""

    def __init__(self, **kwargs: Any) -> None:
        pass

    def start(self) -> _NoRouter:
        raise ImportError("No module named 'smg'")


class _Blind:
    """A deployment that starts (nothing listens at its URLs); the probe run is replaced below."""

    prefill_urls = ["http://127.0.0.1:9"]
    decode_urls = ["http://127.0.0.1:10"]
    router_url = "http://127.0.0.1:11"
    log_dir = None  # as SimDeployment's before start() picks one: nothing left behind

    def __init__(self, **kwargs: Any) -> None:
        pass

    def start(self) -> _Blind:
        return self

    def stop(self) -> None:
        pass


@pytest.mark.parametrize("strictness", [(), ("--no-strict",), ("--strict",)])
def test_control_that_could_not_run_blocks_even_without_strict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strictness: tuple[str, ...]
) -> None:
    import kvgate.sim.deploy as deploy

    monkeypatch.setattr(deploy, "SimDeployment", _NoRouter)
    code, doc = _self_test(tmp_path, *strictness)
    assert code == doc["exit_status"] == ExitStatus.INCONCLUSIVE
    (f,) = doc["findings"]
    assert f["outcome"] == "inconclusive" and f["blocking"] and "smg" in f["summary"]


def test_control_that_did_not_see_the_leak_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kvgate.pipeline.check as check
    import kvgate.sim.deploy as deploy

    monkeypatch.setattr(deploy, "SimDeployment", _Blind)
    # Every probe "passes" against the known-leaky release: exactly what a blind probe set reports.
    real = check.run_check

    def blind(*a: Any, **k: Any) -> Report:
        if k.get("gates") is None:  # the command's own run (it imports run_check when it runs)
            return real(*a, **k)
        return Report("check", (passed("probes", "canary.rounds", "router", "no foreign sentinel"),))

    monkeypatch.setattr(check, "run_check", blind)
    code, doc = _self_test(tmp_path, "--no-strict")
    assert code == doc["exit_status"] == ExitStatus.GATE_FAILED
    assert doc["findings"][0]["outcome"] == "failed" and "did NOT see" in doc["findings"][0]["summary"]


def test_a_control_that_misses_once_looks_again_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kvgate.pipeline.check as check
    import kvgate.sim.deploy as deploy
    from kvgate.results.findings import failed

    monkeypatch.setattr(deploy, "SimDeployment", _Blind)
    real = check.run_check
    runs: list[int] = []

    def miss_then_see(*a: Any, **k: Any) -> Report:
        if k.get("gates") is None:
            return real(*a, **k)
        runs.append(1)
        if len(runs) == 1:  # a run under a load spike: its over-limit probes unanswered, nothing seen
            return Report("check", (passed("probes", "canary.round_a", "router", "no foreign sentinel"),))
        return Report("check", (failed("probes", "canary.round_a", "router", "cross-request content: <KVGX>"),))

    monkeypatch.setattr(check, "run_check", miss_then_see)
    code, doc = _self_test(tmp_path, "--no-strict")
    assert len(runs) == 2
    assert code == doc["exit_status"] == ExitStatus.PASSED, doc["findings"]
    s = doc["findings"][0]["summary"]
    assert "run 2; run 1 saw nothing" in s and "<KVGX>" in s, s
