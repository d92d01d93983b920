"""SARIF 2.1.0 (GitHub code scanning and other SARIF readers): one result per finding that did not pass.

Each result's `ruleId` is the finding's check ID; its rule carries the check's page from docs/checks.md
(title as the short description, the page as help text, the page's reference as a property). Results
are located logically at the node they were observed on; where the evidence names the files a fix's
signature is missing from (`kvgate fixes --site-packages` / `--python`), physically at those files,
relative to the scanned sglang package (`uriBaseId` SGLANG, resolved in `originalUriBaseIds`). A
`check` run with `--profile FILE` anchors its other results at that file, the deployment's declared
gate in the repository (code scanning shows only results with a file).
Passed checks are results too, of kind `pass` and level `none` (SARIF's own way to say "checked, fine").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvgate import __version__
from kvgate.checkdocs import doc_for, page_text
from kvgate.exitcodes import ExitStatus
from kvgate.findings import Finding, Outcome, Report
from kvgate.formats.base import Formatter
from kvgate.formats.digest import evidence_line

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
# Where a fix's code signature is missing (relative to the sglang package), and the package scanned.
MISSING_IN = "missing_in"
PACKAGE_DIR = "package_dir"
PROFILE_FILE = "profile_file"
BASE_ID = "SGLANG"

# outcome -> (SARIF kind, SARIF level)
_KIND_LEVEL = {
    Outcome.FAILED: ("fail", "error"),
    Outcome.ERROR: ("fail", "error"),
    Outcome.INCONCLUSIVE: ("review", "warning"),
    Outcome.INFO: ("informational", "note"),
    Outcome.PASSED: ("pass", "none"),
}
# A verdict was reached (even a failing one): the tool ran successfully.
_RAN = {ExitStatus.PASSED, ExitStatus.GATE_FAILED, ExitStatus.INCONCLUSIVE}


def _rule(check_id: str) -> dict[str, Any]:
    doc = doc_for(check_id)
    rule: dict[str, Any] = {"id": check_id, "name": check_id}
    if doc is None:
        rule["shortDescription"] = {"text": check_id}
        return rule
    page = page_text(doc.anchor)
    rule["shortDescription"] = {"text": doc.title}
    rule["help"] = {"text": page, "markdown": page}
    rule["properties"] = {"doc": doc.ref}
    return rule


def _message(f: Finding) -> str:
    lines = [f"{f.node}: {f.summary}"]
    lines += [evidence_line(e, f.node) for e in f.evidence if e.field != MISSING_IN]
    if f.remedy:
        lines.append(f"fix: {f.remedy}")
    return "\n".join(lines)


def _locations(f: Finding, package_dir: str | None, profile_file: str | None) -> list[dict[str, Any]]:
    logical = {"logicalLocations": [{"name": f.node, "kind": "resource"}]}
    files: list[str] = []
    for e in f.evidence:
        if e.field == MISSING_IN and isinstance(e.value, (list, tuple)):
            files += [str(v) for v in e.value]
    if not files or package_dir is None:
        if profile_file:
            path = Path(profile_file)
            uri = path.as_uri() if path.is_absolute() else path.as_posix()  # relative: to the checkout
            return [{"physicalLocation": {"artifactLocation": {"uri": uri}}, **logical}]
        return [logical]
    return [
        {"physicalLocation": {"artifactLocation": {"uri": rel, "uriBaseId": BASE_ID}}, **logical}
        for rel in dict.fromkeys(files)
    ]


class SarifFormatter(Formatter):
    def render(self, report: Report) -> str:
        target = report.target if isinstance(report.target, dict) else {}
        package_dir = target.get(PACKAGE_DIR)
        profile_file = target.get(PROFILE_FILE)
        listed = [f for f in report.findings if f.outcome in _KIND_LEVEL]
        rule_ids = list(dict.fromkeys(f.test_id for f in listed))
        index = {rid: i for i, rid in enumerate(rule_ids)}
        results = []
        for f in listed:
            kind, level = _KIND_LEVEL[f.outcome]
            result: dict[str, Any] = {
                "ruleId": f.test_id,
                "ruleIndex": index[f.test_id],
                "kind": kind,
                "level": level,
                "message": {"text": _message(f)},
                "locations": _locations(f, package_dir, profile_file),
                "properties": {"outcome": f.outcome.value, "node": f.node, "blocking": f.blocking},
            }
            if f.waived:
                result["suppressions"] = [{"kind": "external", "justification": f.waived}]
            results.append(result)
        status = report.exit_status
        run: dict[str, Any] = {
            "tool": {
                "driver": {
                    "name": "kvgate",
                    "version": __version__,
                    "rules": [_rule(rid) for rid in rule_ids],
                }
            },
            "invocations": [
                {
                    "executionSuccessful": status in _RAN,
                    "exitCode": int(status),
                    "commandLine": f"kvgate {report.command}",
                    "startTimeUtc": report.started_at,
                    "endTimeUtc": report.finished_at,
                    "toolExecutionNotifications": [{"message": {"text": n}, "level": "note"} for n in report.notes],
                }
            ],
            "results": results,
            "properties": {
                "verdict": status.name.lower(),
                "counts": report.counts(),
                "strict": report.strict,
            },
        }
        if package_dir is not None and any("physicalLocation" in loc for r in results for loc in r["locations"]):
            run["originalUriBaseIds"] = {BASE_ID: {"uri": Path(str(package_dir)).resolve().as_uri() + "/"}}
        doc = {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": [run]}
        return json.dumps(doc, indent=2, default=str) + "\n"
