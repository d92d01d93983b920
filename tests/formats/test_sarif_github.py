"""Every SARIF shape the CLI writes is one GitHub code scanning accepts: the SARIF multitool's GitHub rules
(`Sarif;Gh`) report 0 errors on a leaky drill (exit 1), an inconclusive check (exit 3), a usage error
(exit 2) and `fixes` (exit 1); every result has a file and a line, none is a passed check, and the
fingerprints and automation id are the same from run to run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.exitcodes import ExitStatus
from kvgate.formats.sarif import FINGERPRINT, PSEUDO_ARTIFACT, SRCROOT
from tests.formats import sarif_multitool

pytestmark = pytest.mark.slow
runner = CliRunner()
_UNREACHABLE = ("ENOTFOUND", "EAI_AGAIN", "ETIMEDOUT", "ECONNREFUSED", "ECONNRESET", "network")
SCALED = ["--context-length", "65536", "--prefill-pool", "42580", "--decode-pool", "131072"]


@pytest.fixture(scope="module")
def multitool() -> Path:
    try:
        return sarif_multitool.multitool()
    except sarif_multitool.Unavailable as exc:
        if any(m in str(exc) for m in _UNREACHABLE):
            pytest.skip(f"!!! the npm registry is unreachable, GitHub's SARIF rules NOT run: {exc}")
        raise


def _accepted(path: Path, tmp_path: Path, multitool: Path) -> dict[str, Any]:
    errors = sarif_multitool.github_errors(path, tmp_path)
    assert errors == [], json.dumps(errors, indent=1)[:4000]
    doc = json.loads(path.read_text())
    (run,) = doc["runs"]
    assert run["automationDetails"]["id"].startswith("kvgate/")
    for r in run["results"]:
        assert r["kind"] != "pass" and r["properties"]["outcome"] != "passed"
        (loc,) = r["locations"]
        phys = loc["physicalLocation"]
        assert phys["artifactLocation"]["uriBaseId"] == SRCROOT
        assert not phys["artifactLocation"]["uri"].startswith(("file:", "/"))
        assert phys["region"]["startLine"] >= 1
        assert len(r["partialFingerprints"][FINGERPRINT]) == 32
    for rule in run["tool"]["driver"]["rules"]:
        assert rule["fullDescription"]["text"] and rule["help"]["text"]
        # A link only to where the operator published the pages (KVGATE_DOCS_URL), never a placeholder.
        assert rule.get("helpUri", "https://").startswith("https://") and "your-org" not in rule.get("helpUri", "")
    return doc


def test_usage_error(tmp_path: Path, multitool: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GITHUB_WORKSPACE", raising=False)
    res = runner.invoke(app, ["check", "--headroom", "-1", "-f", "sarif", "-o", "u.sarif"])
    assert res.exit_code == ExitStatus.USAGE_ERROR
    doc = _accepted(tmp_path / "u.sarif", tmp_path, multitool)
    (r,) = doc["runs"][0]["results"]
    assert r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == PSEUDO_ARTIFACT


def test_fixes(tmp_path: Path, multitool: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GITHUB_WORKSPACE", raising=False)
    Path("deploy.yaml").write_text("kind: Deployment\n")
    res = runner.invoke(
        app, ["fixes", "--release", "0.5.20", "-q", "-f", "sarif", "-o", "f.sarif", "--sarif-anchor", "deploy.yaml"]
    )
    assert res.exit_code == ExitStatus.GATE_FAILED, res.output
    doc = _accepted(tmp_path / "f.sarif", tmp_path, multitool)
    uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in doc["runs"][0]["results"]}
    assert uris == {"deploy.yaml"}
    again = tmp_path / "g.sarif"
    assert runner.invoke(app, ["fixes", "--release", "0.5.20", "-q", "-f", "sarif", "-o", str(again)]).exit_code == 1
    first, second = doc["runs"][0], json.loads(again.read_text())["runs"][0]
    assert [r["partialFingerprints"] for r in first["results"]] == [r["partialFingerprints"] for r in second["results"]]
    assert first["automationDetails"] == second["automationDetails"]


def test_inconclusive_check(
    tmp_path: Path, multitool: Path, monkeypatch: pytest.MonkeyPatch, payload_server: Any
) -> None:
    """A healthy 0.5.23 pair without a router: the probes are not sent, so the strict check blocks (exit 3)."""
    import tests.assets.sglang_payloads as P
    from tests.conftest import Route

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GITHUB_WORKSPACE", str(tmp_path))
    routes = {"/v1/models": Route(P.v1_models())}
    pre = payload_server({"/server_info": Route(P.server_info("0.5.23", pool=2_097_152)), **routes})
    dec = payload_server({"/server_info": Route(P.server_info("0.5.23", mode="decode", pool=2_097_152)), **routes})
    Path("gate.yaml").write_text("schema: 1\nname: mine\n")
    args = ["check", "--prefill-url", pre.url, "--decode-url", dec.url, "--profile", "gate.yaml", "-q"]
    res = runner.invoke(app, [*args, "-f", "sarif", "-o", "c.sarif", "-f", "json", "-o", "c.json"])
    assert res.exit_code == ExitStatus.INCONCLUSIVE, res.output
    doc = _accepted(tmp_path / "c.sarif", tmp_path, multitool)
    results = doc["runs"][0]["results"]
    assert results and {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in results} == {
        "gate.yaml"
    }
    passed = [f for f in json.loads((tmp_path / "c.json").read_text())["findings"] if f["outcome"] == "passed"]
    assert passed and len(results) == len(json.loads((tmp_path / "c.json").read_text())["findings"]) - len(passed)


def test_leaky_drill(tmp_path: Path, multitool: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GITHUB_WORKSPACE", raising=False)
    res = runner.invoke(app, ["drill", "--release", "0.5.19", *SCALED, "-q", "-f", "sarif", "-o", "d.sarif"])
    assert res.exit_code == ExitStatus.GATE_FAILED, res.output
    doc = _accepted(tmp_path / "d.sarif", tmp_path, multitool)
    assert any(r["ruleId"].startswith("probes.canary.") and r["level"] == "error" for r in doc["runs"][0]["results"])


def test_the_multitool_is_not_vacuous(tmp_path: Path, multitool: Path) -> None:
    """A rule without fullDescription (what kvgate wrote before) is an error to GitHub's rules."""
    bad = {
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": {"name": "kvgate", "rules": [{"id": "x.y", "shortDescription": {"text": "x"}}]}},
                "results": [{"ruleId": "x.y", "message": {"text": "m"}}],
            }
        ],
    }
    path = tmp_path / "bad.sarif"
    path.write_text(json.dumps(bad))
    assert sarif_multitool.github_errors(path, tmp_path)
