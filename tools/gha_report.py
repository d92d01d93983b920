"""The GitHub Action's report step (action.yml): the step summary and one annotation per finding to act on.

    python3 tools/gha_report.py REPORT.json MARKDOWN.md

Standard library only (it runs on the runner's python3, beside the single-file kvgate). It appends
the Markdown report to $GITHUB_STEP_SUMMARY and prints one workflow command per failed, errored or
inconclusive finding: `::error title=<check ID>::<node>: <summary>` (an inconclusive one is
`::warning` when the run opted out of strictness, since it did not block). Waived findings get none.
A report that is missing or not kvgate's JSON is itself an `::error` (the gate's exit status still
decides the step). Exits 0: the action exits with kvgate's own status afterwards.
"""

from __future__ import annotations

import json
import os
import sys

BLOCKING = {"failed", "error"}


def _escape_data(text: str) -> str:
    """GitHub workflow-command escaping of a message."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    """... and of a property value (title=...)."""
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotations(doc: dict) -> list[str]:
    """The workflow commands for one kvgate JSON report."""
    strict = bool(doc.get("strict", True))
    out = []
    for f in doc.get("findings", []):
        outcome = f.get("outcome")
        if f.get("waived") or outcome not in BLOCKING | {"inconclusive"}:
            continue
        level = "error" if outcome in BLOCKING or strict or f.get("blocking") else "warning"
        message = f"{f.get('node')}: {outcome}: {f.get('summary')}"
        if f.get("remedy"):
            message += f"\nfix: {f['remedy']}"
        if f.get("doc"):
            message += f"\nsee {f['doc']}"
        out.append(f"::{level} title={_escape_property(str(f.get('id')))}::{_escape_data(message)}")
    return out


def main(argv: list[str]) -> int:
    report, markdown = argv[1], argv[2]
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary and os.path.isfile(markdown):
        with open(markdown, encoding="utf-8") as src, open(summary, "a", encoding="utf-8") as dst:
            dst.write(src.read())
    try:
        with open(report, encoding="utf-8") as fh:
            doc = json.load(fh)
        lines = annotations(doc)
    except (OSError, ValueError, AttributeError) as exc:
        lines = [f"::error title=kvgate::{_escape_data(f'no readable kvgate report at {report}: {exc}')}"]
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
