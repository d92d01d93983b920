"""SARIF 2.1.0 for GitHub code scanning: one result per finding that did not pass, each one an alert
GitHub accepts (a file, a line) and can track from run to run.

Every result is anchored at one file of the repository, line 1 (code scanning refuses a whole file
whose results lack a physical location): the first of the gate profile file, the baseline file, the
file named with `--sarif-anchor` (e.g. the deployment's manifest) that lies inside the repository,
else the pseudo-artifact `.kvgate/deployment` (a stable name, no file needed). The repository is
`$GITHUB_WORKSPACE` when set, else the current directory; URIs are relative to it (`uriBaseId`
`%SRCROOT%`). Where the evidence names the sglang files a fix's signature is missing from (`kvgate
fixes --site-packages` / `--python`), they are related locations relative to the scanned package
(`uriBaseId` SGLANG), never read as repository paths.

Alerts are tracked by `partialFingerprints` (the check ID and the node, by URL; a node kvgate started
itself, in `drill`, by role and index, since its port changes every run) and kept apart per gated
deployment by `automationDetails.id`, so two deployments never close each other's alerts. Passed
checks are no results (GitHub ignores `kind`: a pass would be an alert); the counts say how many.
Rules carry their page of docs/checks.md: `fullDescription` and `help`, and `helpUri` only where
KVGATE_DOCS_URL names a published copy (kvgate links to no address it does not own).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kvgate import __version__
from kvgate.exitcodes import ExitStatus
from kvgate.formats.base import Formatter
from kvgate.formats.checkdocs import doc_for, page_text
from kvgate.formats.digest import evidence_line
from kvgate.results.findings import Finding, Outcome, Report

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
# Where a fix's code signature is missing (relative to the sglang package), and the package scanned.
MISSING_IN = "missing_in"
PACKAGE_DIR = "package_dir"
# report.target keys naming candidate anchor files, in the order they are tried.
PROFILE_FILE = "profile_file"
BASELINE_FILE = "baseline_file"
SARIF_ANCHOR = "sarif_anchor"
ANCHOR_KEYS = (PROFILE_FILE, BASELINE_FILE, SARIF_ANCHOR)
# The anchor when no named file is in the repository: stable, so alerts still track across runs.
PSEUDO_ARTIFACT = ".kvgate/deployment"
BASE_ID = "SGLANG"
SRCROOT = "%SRCROOT%"
FINGERPRINT = "kvgateFinding/v1"
# Where a rule's page is published (helpUri): KVGATE_DOCS_URL names where your copy of docs/checks.md lives
# (an absolute http(s) URL). kvgate has no published address of its own, so without it a rule carries its
# page as `help` text only, never a link to a placeholder.
DOCS_URL_ENV = "KVGATE_DOCS_URL"

# outcome -> (SARIF kind, SARIF level); passed has none: it is no result.
_KIND_LEVEL = {
    Outcome.FAILED: ("fail", "error"),
    Outcome.ERROR: ("fail", "error"),
    Outcome.INCONCLUSIVE: ("review", "warning"),
    Outcome.INFO: ("informational", "note"),
}
# A verdict was reached (even a failing one): the tool ran successfully.
_RAN = {ExitStatus.PASSED, ExitStatus.GATE_FAILED, ExitStatus.INCONCLUSIVE}
_INDEX = re.compile(r"^(\w+)\[\d+\]")


def repository_root() -> Path:
    """The checkout code scanning reads URIs against: $GITHUB_WORKSPACE, else the current directory."""
    return Path(os.environ.get("GITHUB_WORKSPACE") or os.getcwd()).resolve()


def _in_repo(path: str, root: Path) -> str | None:
    """`path` relative to the repository root, POSIX-style, when it is a file inside it; else None."""
    p = Path(path)
    full = (p if p.is_absolute() else Path.cwd() / p).resolve()
    if not full.is_file():
        return None
    try:
        return full.relative_to(root).as_posix()
    except ValueError:
        return None


def anchor(target: dict[str, Any], root: Path) -> tuple[str, str | None]:
    """The repository-relative file every result is anchored at, and a note when a named one was passed over."""
    skipped = []
    for key in ANCHOR_KEYS:
        named = target.get(key)
        if not named:
            continue
        rel = _in_repo(str(named), root)
        if rel is not None:
            return rel, None
        skipped.append(str(named))
    note = None
    if skipped:
        where = f"is not a file inside the repository ({root})"
        note = f"SARIF: {', '.join(skipped)} {where}: results anchored at {PSEUDO_ARTIFACT}"
    return PSEUDO_ARTIFACT, note


def _docs_url() -> str | None:
    """The operator's published docs/checks.md, or None (no helpUri at all)."""
    url = os.environ.get(DOCS_URL_ENV, "").strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or any(c.isspace() for c in url):
        return None
    return url.split("#", 1)[0]


def _first_paragraph(page: str) -> str:
    """The page's first paragraph below its heading, as plain text (fullDescription)."""
    paras = [p.strip() for p in page.split("\n\n")[1:] if p.strip() and not p.lstrip().startswith(("#", "<"))]
    return " ".join(paras[0].split()) if paras else ""


def _rule(check_id: str) -> dict[str, Any]:
    doc = doc_for(check_id)
    # name: readable and distinct from the opaque id (SARIF1001), e.g. PoolContextHeadroom.
    rule: dict[str, Any] = {
        "id": check_id,
        "name": "".join(w[:1].upper() + w[1:] for w in re.split(r"[^A-Za-z0-9]+", check_id)),
    }
    if doc is None:  # tests/conftest.py keeps an undocumented ID from shipping; stay valid anyway
        text = f"kvgate check {check_id}."
        rule.update(shortDescription={"text": text}, fullDescription={"text": text}, help={"text": text})
        if (url := _docs_url()) is not None:
            rule["helpUri"] = url
        return rule
    page = page_text(doc.anchor)
    rule["shortDescription"] = {"text": doc.title}
    rule["fullDescription"] = {"text": _first_paragraph(page) or doc.title}
    rule["help"] = {"text": page, "markdown": page}
    if (url := _docs_url()) is not None:
        rule["helpUri"] = f"{url}#{doc.anchor}"
    rule["properties"] = {"doc": doc.ref}
    return rule


def _message(f: Finding) -> str:
    lines = [f"{f.node}: {f.summary}"]
    lines += [evidence_line(e, f.node) for e in f.evidence if e.field != MISSING_IN]
    if f.remedy:
        lines.append(f"fix: {f.remedy}")
    return "\n".join(lines)


def node_identity(node: str, started_by_kvgate: bool) -> str:
    """What names a node from run to run: its whole label, or its role and index where kvgate started it."""
    if started_by_kvgate:
        m = _INDEX.match(node)
        if m:
            return m.group(0)
    return node


def fingerprint(check_id: str, identity: str) -> str:
    return hashlib.sha256(f"{check_id}\0{identity}".encode()).hexdigest()[:32]


def _missing_files(f: Finding) -> list[str]:
    files: list[str] = []
    for e in f.evidence:
        if e.field == MISSING_IN and isinstance(e.value, (list, tuple)):
            files += [str(v) for v in e.value]
    return list(dict.fromkeys(files))


def deployment_key(report: Report) -> str:
    """One gated deployment, the same from run to run: its profile, router or workers (no port kvgate picked)."""
    t = report.target if isinstance(report.target, dict) else {}
    if report.command == "drill":
        parts: list[Any] = [t.get("profile")]
    elif report.command == "fixes":
        parts = [t.get("target")]
    else:
        nodes = t.get("nodes")
        nodes = nodes if isinstance(nodes, list) else []
        urls = sorted(str(n.get("url")) for n in nodes if isinstance(n, dict))
        parts = [t.get("profile"), t.get("router"), *urls]
    named = [str(p) for p in parts if p]
    if not named:
        return "default"
    readable = re.sub(r"[^A-Za-z0-9._-]+", "-", named[0]).strip("-")[:40] or "deployment"
    return f"{readable}-{hashlib.sha256(chr(0).join(named).encode()).hexdigest()[:12]}"


class SarifFormatter(Formatter):
    def render(self, report: Report) -> str:
        target = report.target if isinstance(report.target, dict) else {}
        package_dir = target.get(PACKAGE_DIR)
        root = repository_root()
        uri, anchor_note = anchor(target, root)
        started_by_kvgate = report.command == "drill"
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
                "locations": [
                    {
                        "physicalLocation": {
                            "artifactLocation": {"uri": uri, "uriBaseId": SRCROOT},
                            "region": {"startLine": 1},
                        },
                        "logicalLocations": [{"name": f.node, "kind": "resource"}],
                    }
                ],
                "partialFingerprints": {FINGERPRINT: fingerprint(f.test_id, node_identity(f.node, started_by_kvgate))},
                "properties": {"outcome": f.outcome.value, "node": f.node, "blocking": f.blocking},
            }
            files = _missing_files(f)
            if files and package_dir is not None:
                result["relatedLocations"] = [
                    {
                        "id": i,
                        "physicalLocation": {"artifactLocation": {"uri": rel, "uriBaseId": BASE_ID}},
                        "message": {"text": "the fix's code signature is missing here"},
                    }
                    for i, rel in enumerate(files)
                ]
            if f.waived:
                result["suppressions"] = [{"kind": "external", "justification": f.waived}]
            results.append(result)
        status = report.exit_status
        notes = list(report.notes) + ([anchor_note] if anchor_note else [])
        run: dict[str, Any] = {
            "tool": {
                "driver": {
                    "name": "kvgate",
                    "version": __version__,
                    "semanticVersion": __version__,
                    **({"informationUri": url} if (url := _docs_url()) is not None else {}),
                    "rules": [_rule(rid) for rid in rule_ids],
                }
            },
            "automationDetails": {"id": f"kvgate/{report.command}/{deployment_key(report)}/"},
            "originalUriBaseIds": {SRCROOT: {"uri": root.as_uri() + "/"}},
            "invocations": [
                {
                    "executionSuccessful": status in _RAN,
                    "exitCode": int(status),
                    "commandLine": f"kvgate {report.command}",
                    "startTimeUtc": report.started_at,
                    "endTimeUtc": report.finished_at,
                    "toolExecutionNotifications": [{"message": {"text": n}, "level": "note"} for n in notes],
                }
            ],
            "results": results,
            "properties": {
                "verdict": status.name.lower(),
                "counts": report.counts(),
                "strict": report.strict,
            },
        }
        if package_dir is not None and any("relatedLocations" in r for r in results):
            run["originalUriBaseIds"][BASE_ID] = {"uri": Path(str(package_dir)).resolve().as_uri() + "/"}
        doc = {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": [run]}
        return json.dumps(doc, indent=2, default=str) + "\n"
