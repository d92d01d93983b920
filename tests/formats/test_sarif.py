"""`--format sarif`: valid SARIF 2.1.0 (the OASIS schema, vendored offline), check IDs as ruleId, rules carrying
the docs/checks.md page, and `fixes --site-packages` results located at the files a signature is missing from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.formats import ReportFormat
from kvgate.formats.checkdocs import doc_for
from kvgate.results.findings import Evidence, Finding, Outcome, Report
from tests.catalogue.helpers import copy_signature_tree

SCHEMA = Path(__file__).resolve().parent.parent / "assets" / "sarif" / "sarif-schema-2.1.0.json"
runner = CliRunner()


def validate(doc: dict[str, Any]) -> None:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    assert schema["id"].endswith("/sarif-schema-2.1.0.json")  # the real schema, not a stand-in
    jsonschema.Draft4Validator.check_schema(schema)
    jsonschema.Draft4Validator(schema).validate(doc)


def _report() -> Report:
    node = "prefill[0] http://10.0.0.1:30000"
    findings = [
        Finding(
            "pool-context",
            "headroom",
            node,
            Outcome.FAILED,
            "pool 681,280 < 1,310,720 required",
            (Evidence(node, "max_total_num_tokens", 681280, ">= 1,310,720"),),
            remedy="raise the pool",
        ),
        Finding("defenses", "kv-canary", node, Outcome.INFO, "canary off"),
        Finding("probes", "contract.pool_limit", "router http://r:8000", Outcome.INCONCLUSIVE, "not sent"),
        Finding("target", "reachable", node, Outcome.PASSED, "answered"),
        Finding("defenses", "kv-checksum", node, Outcome.FAILED, "off", waived="tracked in OPS-1 (until 2026-12-31)"),
        Finding("kvgate", "run", "kvgate", Outcome.ERROR, "decode unreachable"),
    ]
    return Report(command="check", findings=tuple(findings), notes=("a note",))


def test_sarif_validates_and_maps_every_finding() -> None:
    doc = json.loads(ReportFormat.SARIF.formatter().render(_report()))
    validate(doc)
    run = doc["runs"][0]
    results = run["results"]
    # a passed check is no result (GitHub ignores `kind`: it would be an alert)
    assert [r["ruleId"] for r in results] == [f.test_id for f in _report().findings if f.outcome is not Outcome.PASSED]
    by_id = {r["ruleId"]: r for r in results}
    assert (by_id["pool-context.headroom"]["level"], by_id["pool-context.headroom"]["kind"]) == ("error", "fail")
    assert by_id["probes.contract.pool_limit"]["level"] == "warning"
    assert by_id["defenses.kv-canary"]["level"] == "note" and "target.reachable" not in by_id
    assert run["properties"]["counts"]["passed"] == 1
    assert by_id["defenses.kv-checksum"]["suppressions"][0]["justification"].startswith("tracked in OPS-1")
    assert "fix: raise the pool" in by_id["pool-context.headroom"]["message"]["text"]
    rules = run["tool"]["driver"]["rules"]
    for r in results:
        rule = rules[r["ruleIndex"]]
        assert rule["id"] == r["ruleId"]
        doc_page = doc_for(r["ruleId"])
        assert doc_page is not None, r["ruleId"]
        assert rule["properties"]["doc"] == doc_page.ref and doc_page.title in rule["help"]["text"]
        assert "helpUri" not in rule and rule["fullDescription"]["text"]  # no published address known
        assert rule["name"] != rule["id"]
        assert "What" in rule["help"]["text"] or "what" in rule["help"]["text"]
    loc = by_id["pool-context.headroom"]["locations"][0]["logicalLocations"][0]
    assert loc["name"] == "prefill[0] http://10.0.0.1:30000"
    inv = run["invocations"][0]
    assert inv["exitCode"] == 1 and inv["executionSuccessful"] is True


def test_a_broken_run_is_not_a_successful_execution(tmp_path: Path) -> None:
    out = tmp_path / "r.sarif"
    res = runner.invoke(app, ["check", "--headroom", "-1", "-f", "sarif", "-o", str(out)])
    assert res.exit_code == 2
    doc = json.loads(out.read_text())
    validate(doc)
    inv = doc["runs"][0]["invocations"][0]
    assert inv["exitCode"] == 2 and inv["executionSuccessful"] is False
    assert doc["runs"][0]["results"][0]["ruleId"] == "kvgate.run"


@pytest.mark.wheels
def test_fixes_site_packages_results_point_at_the_files(tmp_path: Path) -> None:
    """0.5.20's tree lacks #38935's admission door: its result is located at the files whose signature is missing."""
    pkg = copy_signature_tree("0.5.20", tmp_path / "site" / "sglang")
    out = tmp_path / "fixes.sarif"
    res = runner.invoke(app, ["fixes", "--site-packages", str(tmp_path / "site"), "-q", "-f", "sarif", "-o", str(out)])
    assert res.exit_code == 1, res.output
    doc = json.loads(out.read_text())
    validate(doc)
    run = doc["runs"][0]
    door = next(r for r in run["results"] if r["ruleId"] == "fixes.pr-38935")
    assert door["level"] == "error"
    uris = [loc["physicalLocation"]["artifactLocation"]["uri"] for loc in door["relatedLocations"]]
    assert "srt/disaggregation/prefill.py" in uris
    assert {loc["physicalLocation"]["artifactLocation"]["uriBaseId"] for loc in door["relatedLocations"]} == {
        "SGLANG"
    }  # never read as a repository path: the alert itself sits at the anchor
    assert door["locations"][0]["physicalLocation"]["artifactLocation"]["uriBaseId"] == "%SRCROOT%"
    base = run["originalUriBaseIds"]["SGLANG"]["uri"]
    assert base == pkg.resolve().as_uri() + "/"
    for rel in uris:  # every location is a real file of the scanned tree that lacks the signature
        assert (pkg / rel).is_file(), rel
    assert all(r["kind"] != "pass" for r in run["results"])


def test_check_results_are_anchored_at_the_profile_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, payload_server: Any
) -> None:
    """Code scanning shows only results with a file: `check --profile FILE` anchors them at that file."""
    import tests.assets.sglang_payloads as P
    from tests.conftest import Route

    srv = payload_server({"/server_info": Route(P.server_info("0.5.20")), "/v1/models": Route(P.v1_models())})
    monkeypatch.chdir(tmp_path)
    Path("gate.yaml").write_text("schema: 1\nname: mine\nheadroom: 1.25\n")
    res = runner.invoke(
        app, ["check", "--prefill-url", srv.url, "--profile", "gate.yaml", "--no-probes", "-q", "-f", "sarif"]
    )
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)  # the one format, on stdout
    validate(doc)
    headroom = next(r for r in doc["runs"][0]["results"] if r["ruleId"] == "pool-context.headroom")
    (loc,) = headroom["locations"]
    assert loc["physicalLocation"]["artifactLocation"]["uri"] == "gate.yaml"
    assert loc["logicalLocations"][0]["name"].startswith("prefill[0] ")


def test_help_links_only_to_a_published_copy_the_operator_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """kvgate has no address of its own: a rule links only where KVGATE_DOCS_URL says the pages are."""
    monkeypatch.delenv("KVGATE_DOCS_URL", raising=False)
    rules = json.loads(ReportFormat.SARIF.formatter().render(_report()))["runs"][0]["tool"]["driver"]["rules"]
    assert rules and all("helpUri" not in r and r["help"]["text"] for r in rules)
    for bad in ("not a url", "ftp://x/y", "https://", "javascript:alert(1)"):
        monkeypatch.setenv("KVGATE_DOCS_URL", bad)
        rules = json.loads(ReportFormat.SARIF.formatter().render(_report()))["runs"][0]["tool"]["driver"]["rules"]
        assert all("helpUri" not in r for r in rules), bad
    monkeypatch.setenv("KVGATE_DOCS_URL", "https://git.example.com/ops/kvgate/blob/v1/docs/checks.md")
    rules = json.loads(ReportFormat.SARIF.formatter().render(_report()))["runs"][0]["tool"]["driver"]["rules"]
    for r in rules:
        doc_page = doc_for(r["id"])
        assert doc_page is not None
        assert r["helpUri"] == f"https://git.example.com/ops/kvgate/blob/v1/docs/checks.md#{doc_page.anchor}"


def test_a_sarif_anchor_that_does_not_exist_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GITHUB_WORKSPACE", str(tmp_path))
    args = ["fixes", "--release", "0.5.20", "-q", "-f", "sarif", "-o", "f.sarif", "-f", "json", "-o", "f.json"]
    res = runner.invoke(app, [*args, "--sarif-anchor", "deploy/missing.yaml"])
    assert res.exit_code == 1, res.output
    note = "--sarif-anchor deploy/missing.yaml does not exist"
    assert any(n.startswith(note) for n in json.loads(Path("f.json").read_text())["notes"])
    sarif = json.loads(Path("f.sarif").read_text())["runs"][0]
    assert note in json.dumps(sarif)  # said where code scanning shows the run's notes too
    assert note in res.stdout  # and in the table on the job log
    uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in sarif["results"]}
    assert uris == {".kvgate/deployment"}
