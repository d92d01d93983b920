"""Results of a gate run: frozen findings with evidence, and the report that carries them.

A finding is one check on one node. Its outcome is one of five: passed, failed, inconclusive
(nothing could be observed, or a field needed for the verdict is unknown), error (the run broke
while checking: transport failure, or `internal` when kvgate itself crashed) and info (reported, not
required: an optional detection that is off, an informational fix that is absent). Inconclusive is
never passed: it blocks (exit 3) unless the operator opted out of strictness, and the report says
so; info is neither a pass nor a failure and never moves the exit status.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from kvgate.exitcodes import ExitStatus


class Outcome(str, Enum):
    """The verdict of one check."""

    PASSED = "passed"
    FAILED = "failed"
    INCONCLUSIVE = "inconclusive"
    ERROR = "error"
    INFO = "info"


@dataclass(frozen=True)
class Evidence:
    """One observed fact behind a verdict: where it was read, what it was, what was expected."""

    node: str
    field: str
    value: Any
    expected: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "field": self.field, "value": self.value, "expected": self.expected}


@dataclass(frozen=True)
class Finding:
    """One check on one node (or on the whole deployment, node="deployment")."""

    gate: str
    check: str
    node: str
    outcome: Outcome
    summary: str
    evidence: tuple[Evidence, ...] = ()
    remedy: str | None = None
    # Set when an unexpired profile waiver covers this finding: "reason (waived until DATE)".
    # The outcome stays what was observed; only the exit status ignores it.
    waived: str | None = None
    # An inconclusive the operator asked for explicitly (e.g. the --self-test control): it blocks even
    # with strictness opted out.
    blocking: bool = False

    @property
    def counts_toward_exit(self) -> bool:
        return self.waived is None

    @property
    def test_id(self) -> str:
        return f"{self.gate}.{self.check}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "gate": self.gate,
            "check": self.check,
            "node": self.node,
            "outcome": self.outcome.value,
            "summary": self.summary,
            "evidence": [e.to_dict() for e in self.evidence],
            "remedy": self.remedy,
            "waived": self.waived,
            "blocking": self.blocking,
        }


def passed(gate: str, check: str, node: str, summary: str, *evidence: Evidence) -> Finding:
    return Finding(gate, check, node, Outcome.PASSED, summary, tuple(evidence))


def failed(gate: str, check: str, node: str, summary: str, *evidence: Evidence, remedy: str | None = None) -> Finding:
    return Finding(gate, check, node, Outcome.FAILED, summary, tuple(evidence), remedy)


def inconclusive(
    gate: str, check: str, node: str, summary: str, *evidence: Evidence, remedy: str | None = None
) -> Finding:
    return Finding(gate, check, node, Outcome.INCONCLUSIVE, summary, tuple(evidence), remedy)


def error(gate: str, check: str, node: str, summary: str, *evidence: Evidence) -> Finding:
    return Finding(gate, check, node, Outcome.ERROR, summary, tuple(evidence))


def info(gate: str, check: str, node: str, summary: str, *evidence: Evidence) -> Finding:
    """Reported for the record, not required: neither a pass nor a failure."""
    return Finding(gate, check, node, Outcome.INFO, summary, tuple(evidence))


INTERNAL_CHECK = "internal"  # the check id of an error finding for a crash of kvgate itself


def exit_status_for(findings: tuple[Finding, ...] | list[Finding], strict: bool = True) -> ExitStatus:
    """Map findings to the process exit status.

    A confirmed gate failure wins over a run that broke: the deployment is known to be unsafe, and a
    retry would not change that. kvgate's own crash (5) wins over a transport error (4), which wins
    over inconclusive (3). A run with no finding at all observed nothing and is inconclusive.
    """
    counted = [f for f in findings if f.counts_toward_exit]
    outcomes = {f.outcome for f in counted}
    if Outcome.FAILED in outcomes:
        return ExitStatus.GATE_FAILED
    if any(f.outcome is Outcome.ERROR and f.check == INTERNAL_CHECK for f in counted):
        return ExitStatus.INTERNAL_ERROR
    if Outcome.ERROR in outcomes:
        return ExitStatus.TRANSPORT_ERROR
    if not findings or any(f.outcome is Outcome.INCONCLUSIVE and f.blocking for f in counted):
        return ExitStatus.INCONCLUSIVE  # nothing checked at all is no opt-out's business: it never passes
    if strict and Outcome.INCONCLUSIVE in outcomes:
        return ExitStatus.INCONCLUSIVE
    return ExitStatus.PASSED


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Report:
    """Everything a run found, in the order found, plus what the run cost."""

    command: str
    findings: tuple[Finding, ...]
    # Blocking on doubt is the default; False only when the operator opted out (strict_source says how).
    strict: bool = True
    strict_source: str = "default"
    target: dict[str, Any] = field(default_factory=dict)
    cost: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    started_at: str = field(default_factory=_now)
    finished_at: str = field(default_factory=_now)
    # Set when the run could not start or broke (bad profile, bad flags): the status it exits with.
    fatal_status: ExitStatus | None = None

    @property
    def exit_status(self) -> ExitStatus:
        if self.fatal_status is not None:
            return self.fatal_status
        return exit_status_for(self.findings, self.strict)

    @property
    def unobserved(self) -> list[str]:
        """The inconclusive checks that count toward the exit: what this run could not observe."""
        return [
            f"{f.test_id} ({f.node})"
            for f in self.findings
            if f.outcome is Outcome.INCONCLUSIVE and f.counts_toward_exit
        ]

    def strictness_note(self) -> str | None:
        """What opting out of strictness let through, for the report (None when strict)."""
        if self.strict:
            return None
        what = [
            f"{f.test_id} ({f.node})"
            for f in self.findings
            if f.outcome is Outcome.INCONCLUSIVE and f.counts_toward_exit and not f.blocking
        ]
        # A command whose own default is not strict (fixes) opted nothing out: say what the default is.
        label = "not strict" if self.strict_source.startswith("default") else "strictness opted out"
        return f"{label} ({self.strict_source}): {len(what)} inconclusive check(s) did not block" + (
            ": " + "; ".join(what) if what else ""
        )

    def counts(self) -> dict[str, int]:
        out = {o.value: 0 for o in Outcome}
        out["waived"] = 0
        for f in self.findings:
            out[f.outcome.value] += 1
            out["waived"] += f.waived is not None
        return out
