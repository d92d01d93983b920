"""What the human formats share: the verdict line, the few findings that decide it, readable evidence.

The machine formats (json, junit) carry everything; a person reads the verdict and the decisive
findings first, one line each, then the detail.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvgate.exitcodes import ExitStatus
from kvgate.formats.checkdocs import doc_for
from kvgate.results.findings import Evidence, Finding, Outcome, Report

# A leak seen in an answer outranks a pool that is too small, which outranks a missing fix.
_GATE_ORDER = {"probes": 0, "pool-context": 1, "defenses": 2, "fixes": 3, "backport-probe": 4}
_VERDICT = {
    ExitStatus.PASSED: "PASSED",
    ExitStatus.GATE_FAILED: "GATE FAILED: do not promote",
    ExitStatus.USAGE_ERROR: "USAGE ERROR: the gate did not run",
    ExitStatus.INCONCLUSIVE: "INCONCLUSIVE under --strict: something could not be observed",
    ExitStatus.TRANSPORT_ERROR: "TARGET UNREACHABLE: the gate could not finish",
    ExitStatus.INTERNAL_ERROR: "INTERNAL ERROR: kvgate itself broke, nothing was decided",
    ExitStatus.INTERRUPTED: "INTERRUPTED: stopped before the verdict, nothing was decided",
}
# "do not promote" is said only by a command that judged a deployment; these judged something else.
_FAILED_WITHOUT_DEPLOYMENT = {
    "plan": "GATE FAILED: this plan would not pass the gate",
    "fixes": "GATE FAILED: the code lacks a correctness fix or carries a tampered backport",
    "backport": "GATE FAILED: the backport is not in force",
}
# A note that starts so is the one command line that would resolve the run's doubt: the table shows it
# on the first screen, under the headlines (commands/nextstep.py writes it).
NEXT_STEP = "to turn this into evidence, run: "
MAX_HEADLINES = 6
MAX_LIST_ITEMS = 4


def verdict_line(report: Report) -> str:
    """`kvgate check: GATE FAILED: do not promote (exit 1)`."""
    status = report.exit_status
    said = _VERDICT[status]
    if status is ExitStatus.GATE_FAILED:
        said = _FAILED_WITHOUT_DEPLOYMENT.get(report.command.split()[0], said)
    if status is ExitStatus.INCONCLUSIVE and not report.strict:
        # strictness was off: what blocked is a check that blocks whatever the setting
        said = "INCONCLUSIVE: a check that blocks whatever the strictness could not be observed"
    return f"kvgate {report.command}: {said}{_opted_out(report)} (exit {int(status)})"


def _opted_out(report: Report) -> str:
    """An explicit opt-out that left part of the gate unrun, said where nobody misses it."""
    off = any(f.test_id == "probes.setup" and f.outcome is Outcome.INFO for f in report.findings)
    return "; probes opted out (--no-probes)" if off else ""


def counts_line(report: Report) -> str:
    c = report.counts()
    parts = [
        f"{c['failed']} failed",
        f"{c['error']} error" + ("" if c["error"] == 1 else "s"),
        f"{c['inconclusive']} inconclusive",
        f"{c['passed']} passed",
    ] + ([f"{c['info']} info"] if c["info"] else [])
    return ", ".join(parts) + (f" ({c['waived']} waived)" if c["waived"] else "")


def _deciding(report: Report) -> list[Finding]:
    """The findings that set the exit status (waived ones never do)."""
    status = report.exit_status
    want = {
        ExitStatus.GATE_FAILED: {Outcome.FAILED},
        ExitStatus.TRANSPORT_ERROR: {Outcome.ERROR},
        ExitStatus.INTERNAL_ERROR: {Outcome.ERROR},
        ExitStatus.INTERRUPTED: {Outcome.ERROR},
        ExitStatus.INCONCLUSIVE: {Outcome.INCONCLUSIVE},
        ExitStatus.USAGE_ERROR: {Outcome.ERROR, Outcome.FAILED, Outcome.INCONCLUSIVE},
    }.get(status, set())
    picked = [f for f in report.findings if f.outcome in want and f.counts_toward_exit]
    return sorted(picked, key=lambda f: _GATE_ORDER.get(f.gate, 9))  # stable: report order within a gate


@dataclass(frozen=True)
class Headline:
    """One line: the findings that say the same thing, on every node that says it."""

    outcome: Outcome
    check_id: str
    nodes: tuple[str, ...]
    summary: str

    @property
    def where(self) -> str:
        return self.nodes[0] + (f" (+{len(self.nodes) - 1} more)" if len(self.nodes) > 1 else "")


def headlines(report: Report) -> tuple[list[Headline], int]:
    """The decisive findings, duplicates across nodes and DP ranks merged; and how many were left off."""
    merged: dict[tuple[str, str], list[Finding]] = {}
    for f in _deciding(report):
        merged.setdefault((f.gate, f.summary), []).append(f)
    lines = []
    for group in merged.values():
        nodes = tuple(dict.fromkeys(f.node for f in group))
        lines.append(Headline(group[0].outcome, group[0].test_id, nodes, group[0].summary))
    return lines[:MAX_HEADLINES], max(0, len(lines) - MAX_HEADLINES)


def _said(f: Finding) -> tuple[object, ...]:
    """What a finding says, without the node it says it of."""
    ev = tuple(
        (e.node == f.node, e.field, json.dumps(e.value, sort_keys=True, default=str), e.expected) for e in f.evidence
    )
    return (f.gate, f.check, f.outcome, f.summary, f.remedy, f.waived, f.blocking, ev)


def same_on_nodes(findings: Sequence[Finding]) -> list[tuple[Finding, tuple[str, ...]]]:
    """Findings that say the same thing on several nodes, once each with every node that says it
    (in report order): identical detail is printed once, naming the nodes."""
    groups: dict[tuple[object, ...], list[Finding]] = {}
    for f in findings:
        groups.setdefault(_said(f), []).append(f)
    return [(g[0], tuple(dict.fromkeys(f.node for f in g))) for g in groups.values()]


def nodes_text(nodes: Sequence[str]) -> str:
    """`prefill[0] URL`, or `3 nodes: prefill[0] URL, prefill[1] URL, decode[0] URL`."""
    return nodes[0] if len(nodes) == 1 else f"{len(nodes)} nodes: " + ", ".join(nodes)


def format_value(value: Any, full: bool = False) -> str:
    """A value as a person reads it: 681,280 not 681280; lists and mappings flattened, long lists cut."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "not reported"}[value]
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, dict):
        return "; ".join(f"{k}: {format_value(v, full)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        if not value:
            return "none"
        items = [format_value(v, full) for v in value]
        if not full and len(items) > MAX_LIST_ITEMS:
            return ", ".join(items[:MAX_LIST_ITEMS]) + f", ... ({len(items) - MAX_LIST_ITEMS} more; --verbose)"
        return ", ".join(items)
    return str(value)


def evidence_line(e: Evidence, finding_node: str, full: bool = False) -> str:
    """`field = value (want ...)`, with the node when it is not the finding's own."""
    where = f"{e.node}: " if e.node != finding_node else ""
    want = f" (want {e.expected})" if e.expected else ""
    return f"{where}{e.field} = {format_value(e.value, full)}{want}"


def doc_ref(f: Finding) -> str | None:
    """Where the page of this finding's check lives (docs/checks.md#ID)."""
    doc = doc_for(f.test_id)
    return doc.ref if doc else None


def passed_digest(report: Report, outcome: Outcome = Outcome.PASSED) -> str:
    """`target.reachable x3, pool-context.role x2, ...`: the checks of one outcome in one line.

    An ID that has another outcome on some other node names the nodes it had this one on
    (`pool-context.headroom on decode[0] http://...`): a bare ID would read as "passed everywhere"
    next to its failure.
    """
    nodes: dict[str, list[str]] = {}
    for f in report.findings:
        if f.outcome is outcome and not f.waived:
            nodes.setdefault(f.test_id, []).append(f.node)
    mixed = {f.test_id for f in report.findings if f.test_id in nodes and (f.outcome is not outcome or f.waived)}
    parts = []
    for k, where in nodes.items():
        if k in mixed:
            parts.append(f"{k} on {format_value(list(dict.fromkeys(where)))}")
        else:
            parts.append(k + (f" x{len(where)}" if len(where) > 1 else ""))
    return ", ".join(parts)
