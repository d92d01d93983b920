"""The published JSON schema (`kvgate schema`) and the check-ID pages (docs/checks.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.formats import ReportFormat
from kvgate.formats.checkdocs import doc_for, entries
from kvgate.results.findings import Evidence, Finding, Outcome, Report

ROOT = Path(__file__).resolve().parents[2]


def _validator():  # type: ignore[no-untyped-def]
    try:
        import jsonschema
    except ImportError:
        pytest.fail("jsonschema is missing: pip install -e '.[test]' (every JSON report in the tests is validated)")
    res = CliRunner().invoke(app, ["schema"])
    assert res.exit_code == 0, res.output
    schema = json.loads(res.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _report() -> Report:
    return Report(
        command="check",
        findings=tuple(
            Finding(
                "pool-context",
                "headroom",
                "prefill[0] http://x",
                o,
                f"summary {o.value}",
                (
                    Evidence("prefill[0] http://x", "max_total_num_tokens", 681280, ">= 1,310,720"),
                    Evidence("decode[0] http://y", "env", {"A": None}, None),
                ),
                remedy="raise the pool" if o is Outcome.FAILED else None,
                waived="accepted (waived until 2099-01-01)" if o is Outcome.INCONCLUSIVE else None,
            )
            for o in Outcome
        ),
        cost={"wall_s": 1.0},
        notes=("n",),
    )


def test_every_outcome_validates_and_a_broken_report_does_not() -> None:
    v = _validator()
    doc = json.loads(ReportFormat.JSON.formatter().render(_report()))
    assert list(v.iter_errors(doc)) == []
    assert {f["id"] for f in doc["findings"]} == {"pool-context.headroom"}
    assert doc["findings"][0]["doc"] == "docs/checks.md#pool-context.headroom"
    del doc["findings"][0]["outcome"]
    doc["exit_status"] = 7
    errors = {tuple(e.absolute_path) for e in v.iter_errors(doc)}
    assert ("findings", 0) in errors and ("exit_status",) in errors


def test_check_pages_have_unique_anchors_and_cover_every_gate() -> None:
    docs = entries()
    anchors = [d.anchor for d in docs]
    assert len(anchors) == len(set(anchors)), anchors
    text = (ROOT / "docs" / "checks.md").read_text()
    # Every gate constant in the code has at least one page.
    gates = set(
        re.findall(
            r'^GATE = "([a-z-]+)"', "\n".join(p.read_text() for p in (ROOT / "kvgate").rglob("*.py")), flags=re.M
        )
    )
    assert gates, "no GATE constants found"
    for g in gates:
        assert any(d.pattern.startswith(g + ".") for d in docs), f"gate {g} has no page in docs/checks.md"
    for ref in re.findall(r"docs/checks\.md#([\w.-]+)", text):
        assert ref in anchors, ref


@pytest.mark.parametrize(
    ("check_id", "anchor"),
    [
        ("pool-context.headroom-dp3", "pool-context.headroom"),
        ("probes.contract.pool_limit", "probes.contract"),
        ("fixes.pr-38935", "fixes"),
        ("defenses.transport", "transport"),
        ("probes.canary.round_b", "probes.canary"),
    ],
)
def test_family_ids_find_their_page(check_id: str, anchor: str) -> None:
    doc = doc_for(check_id)
    assert doc is not None and doc.anchor == anchor


def test_an_undocumented_check_is_caught(tmp_path: Path) -> None:
    import io

    import kvgate.formats.reporting
    from tests import conftest

    assert doc_for("nosuch.check") is None
    kvgate.formats.reporting.emit(
        Report(command="x", findings=(Finding("nosuch", "check", "n", Outcome.PASSED, "s"),)),
        [(ReportFormat.JSON, tmp_path / "r.json")],
        stdout=io.StringIO(),
    )
    assert conftest._report_problems == ["check ID nosuch.check has no page in docs/checks.md"]
    conftest._report_problems.clear()
