"""The GitHub Action's report step (action.yml): the step summary and one annotation per finding to act on.

    python3 tools/gha_report.py REPORT.json MARKDOWN.md

Standard library only (it runs on the runner's python3, beside the single-file kvgate), with kvgate's
output boundary (`kvgate/output/sinks.py`, standard library only too) from the action's checkout. It appends
the Markdown report to $GITHUB_STEP_SUMMARY and prints one workflow command per check ID that failed,
errored or was inconclusive: `::error title=<check ID>::<node>: <summary>` (an inconclusive one is
`::warning` when the run opted out of strictness, since it did not block), with how many more findings
that check has, at most 10 per level, a content leak first: past 10, nine and one saying how many more
and where they are. Waived findings get none. Server text in a
message is data: escaped as the runner unescapes it, controls shown as escapes, `##[` broken.
A report that is missing or not kvgate's JSON is itself an `::error` (the gate's exit status still
decides the step). Exits 0: the action exits with kvgate's own status afterwards.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# kvgate's own output boundary (kvgate/output/sinks.py: standard library only), from the action's checkout.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kvgate.output import sinks  # noqa: E402

BLOCKING = {"failed", "error"}
#: the most annotations of one level printed (GitHub shows 10 errors and 10 warnings per step); past it,
#: MAX_ANNOTATIONS - 1 findings and one line saying how many more there are and where they are listed
MAX_ANNOTATIONS = 10


def _escape_data(text: str) -> str:
    """GitHub workflow-command escaping of a message (sinks.workflow_data)."""
    return sinks.workflow_data(text)


def _shown(value: object) -> str:
    """A field of the report in a message: one line, controls shown as escapes (sinks.terminal)."""
    return sinks.terminal(value)


def _escape_property(text: str) -> str:
    """... and of a property value (title=...)."""
    return sinks.workflow_property(sinks.terminal(text))


#: which findings take the first annotation slots: a content leak (another tenant's text in an answer)
#: first, then the rest of the probes, the pool, the defenses and fixes, the fleet, anything else
_RANK_PREFIXES = (
    ("probes.canary", "probes.isolation"),
    ("probes.",),
    ("pool-context.",),
    ("defenses.", "fixes."),
    ("fleet.", "target."),
)


def _rank(finding_id: str) -> int:
    for rank, prefixes in enumerate(_RANK_PREFIXES):
        if finding_id.startswith(prefixes):
            return rank
    return len(_RANK_PREFIXES)


def annotations(doc: dict, where: str = "the step summary and the JSON report") -> list[str]:
    """The workflow commands for one kvgate JSON report: per level at most MAX_ANNOTATIONS lines.

    One annotation per check ID and level (the first finding's node and summary, and how many more
    nodes have it), ranked by `_rank`: a per-worker check failing on a thousand workers takes one slot,
    and a content leak is never left out for it."""
    strict = bool(doc.get("strict", True))
    groups: dict[tuple[str, str], list[dict]] = {}
    for f in doc.get("findings", []):
        outcome = f.get("outcome")
        if f.get("waived") or outcome not in BLOCKING | {"inconclusive"}:
            continue
        level = "error" if outcome in BLOCKING or strict or f.get("blocking") else "warning"
        groups.setdefault((level, str(f.get("id"))), []).append(f)
    by_level: dict[str, list[tuple[str, int]]] = {"error": [], "warning": []}
    for (level, fid), found in sorted(groups.items(), key=lambda kv: _rank(kv[0][1])):
        f = found[0]
        message = f"{_shown(f.get('node'))}: {_shown(f.get('outcome'))}: {_shown(f.get('summary'))}"
        if len(found) > 1:
            message += f"\n... and {len(found) - 1} more finding(s) of this check; all are in {where}"
        if f.get("remedy"):
            message += f"\nfix: {_shown(f['remedy'])}"
        if f.get("doc"):
            message += f"\nsee {_shown(f['doc'])}"
        line = f"::{level} title={_escape_property(fid)}::{_escape_data(message)}"
        by_level[level].append((line, len(found)))
    out: list[str] = []
    for level, entries in by_level.items():
        if len(entries) > MAX_ANNOTATIONS:
            more = sum(n for _, n in entries[MAX_ANNOTATIONS - 1 :])
            tail = _escape_data(f"{more} more findings at this level; all are in {where}")
            entries = [*entries[: MAX_ANNOTATIONS - 1], (f"::{level} title=kvgate::{tail}", 0)]
        out += [line for line, _ in entries]
    return out


def _summary_text(raw: str) -> str:
    """The Markdown report as the step summary gets it: only LF line ends (a lone CR would end a line
    there, as GitHub reads it, and forge one), no other control character."""
    lines = raw.replace("\r\n", "\n").split("\n")
    return "\n".join(sinks.visible(line) for line in lines)


def main(argv: list[str]) -> int:
    report, markdown = argv[1], argv[2]
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary and os.path.isfile(markdown):
        # newline="": no universal newlines, so a CR in the file is seen (and shown), never a line break.
        with open(markdown, encoding="utf-8", errors="replace", newline="") as src:
            text = _summary_text(src.read())
        with open(summary, "a", encoding="utf-8") as dst:
            dst.write(text)
    try:
        with open(report, encoding="utf-8") as fh:
            doc = json.load(fh)
        lines = annotations(doc, f"the step summary and {report}")
    except (OSError, ValueError, AttributeError, RecursionError) as exc:
        lines = [f"::error title=kvgate::{_escape_data(f'no readable kvgate report at {report}: {exc}')}"]
    for line in lines:
        sys.stdout.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
