"""Waivers: a profile may accept a known finding for a while, with a reason and an expiry.

A waived finding keeps the outcome that was observed and stays in every report; only the exit status
ignores it. Transport errors cannot be waived, and an expired waiver is not applied (the finding blocks
again and the report says why). Every waiver needs a reason and an expiry date no further than
MAX_HORIZON_DAYS ahead, and must name its gate: a pattern that could waive every gate is a profile
error. Pool/context, correctness-fix and leak-probe checks (PROTECTED) can only be waived by their exact
id, never by a wildcard; checks that mean a worker went ungated (UNWAIVABLE) cannot be waived at all, so
a pattern that reaches one (`fleet.*`, `fleet.router-membership`, `fleet.router-identity`) is a profile
error.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from typing import Any

from kvgate.errors import ProfileError
from kvgate.results.findings import Finding, Outcome

_KEYS = {"check", "node", "reason", "expires"}
MAX_HORIZON_DAYS = 90
# Checks a wildcard must never reach: the incident's own hazard (pool vs context), the fixes that close
# it, and the probes that observe cross-request content (a `probes.*` waiver would wave a confirmed leak
# through). Each is a gate, or a gate.check id.
PROTECTED = ("pool-context", "fixes", "defenses.release", "probes")
# Checks that mean a worker went ungated (the router routes to a worker the gate did not read, or its
# list may be partial, or a worker could not be read): no waiver reaches them, not even by exact id.
UNWAIVABLE = (
    "fleet.router-membership",
    "fleet.router-url",
    "fleet.stable",
    "fleet.router-list",
    "fleet.router-identity",
    "target.reachable",
)
_GLOB = set("*?[")


def is_wildcard(pattern: str) -> bool:
    return bool(_GLOB & set(pattern))


def is_protected(test_id: str) -> bool:
    """True for a pool/context or correctness-fix check id."""
    return any(test_id == p or test_id.startswith(p + ".") for p in PROTECTED)


@dataclass(frozen=True)
class Waiver:
    """Accept findings whose `gate.check` id (and node) match these glob patterns, until `expires`."""

    check: str
    reason: str
    expires: dt.date
    node: str = "*"

    def matches(self, finding: Finding) -> bool:
        if finding.test_id in UNWAIVABLE:
            return False  # a worker that went ungated is never accepted (parse refuses such patterns too)
        if is_wildcard(self.check) and is_protected(finding.test_id):
            return False  # only an exact id waives a protected check (parse refuses such patterns too)
        return fnmatchcase(finding.test_id, self.check) and fnmatchcase(finding.node, self.node)


def _check_pattern(path: str, key: str, pattern: str) -> None:
    """A waiver names its gate exactly; a wildcard never reaches a protected check."""
    if "." not in pattern:
        raise ProfileError(path, key, f"expected 'gate.check' (e.g. defenses.kv-canary), got {pattern!r}")
    gate = pattern.split(".", 1)[0]
    if is_wildcard(gate):
        raise ProfileError(path, key, f"{pattern!r} would waive every gate: name the gate (e.g. defenses.kv-canary)")
    ungated = [u for u in UNWAIVABLE if fnmatchcase(u, pattern)]
    if ungated:
        raise ProfileError(
            path,
            key,
            f"{pattern!r} reaches {ungated[0]}, which means a worker went ungated: it cannot be waived "
            "(gate that worker instead)",
        )
    if is_wildcard(pattern):
        reached = [p for p in PROTECTED if ((gate == p) if "." not in p else fnmatchcase(p, pattern))]
        if reached:
            raise ProfileError(
                path,
                key,
                f"{pattern!r} is a wildcard over {reached[0]}: pool/context and "
                "correctness-fix checks can only be waived one exact id at a time",
            )


def parse_waivers(raw: Any, path: str, today: dt.date | None = None) -> tuple[Waiver, ...]:
    """Validate a profile's `waivers:` list (expiries at most MAX_HORIZON_DAYS after `today`)."""
    today = today or dt.date.today()
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ProfileError(path, "waivers", f"expected a list of waivers, got {raw!r}")
    out: list[Waiver] = []
    for i, entry in enumerate(raw):
        key = f"waivers[{i}]"
        if not isinstance(entry, dict):
            raise ProfileError(path, key, f"expected a mapping with check, reason, expires, got {entry!r}")
        unknown = sorted(set(entry) - _KEYS)
        if unknown:
            raise ProfileError(path, f"{key}.{unknown[0]}", f"unknown key; expected one of {', '.join(sorted(_KEYS))}")
        for name in ("check", "reason"):
            if not isinstance(entry.get(name), str) or not entry[name].strip():
                raise ProfileError(path, f"{key}.{name}", "required: a non-empty string")
        _check_pattern(path, f"{key}.check", entry["check"])
        expires = entry.get("expires")
        if isinstance(expires, str):
            try:
                expires = dt.date.fromisoformat(expires)
            except ValueError:
                expires = None
        if not isinstance(expires, dt.date) or isinstance(expires, dt.datetime):
            raise ProfileError(path, f"{key}.expires", f"required: a date YYYY-MM-DD, got {entry.get('expires')!r}")
        horizon = today + dt.timedelta(days=MAX_HORIZON_DAYS)
        if expires > horizon:
            raise ProfileError(
                path,
                f"{key}.expires",
                f"{expires.isoformat()} is more than {MAX_HORIZON_DAYS} days "
                f"ahead (latest allowed: {horizon.isoformat()}); waivers are temporary",
            )
        node = entry.get("node", "*")
        if not isinstance(node, str) or not node:
            raise ProfileError(path, f"{key}.node", f"expected a glob pattern string, got {node!r}")
        out.append(Waiver(check=entry["check"], reason=entry["reason"].strip(), expires=expires, node=node))
    return tuple(out)


def apply_waivers(
    findings: Sequence[Finding], waivers: Sequence[Waiver], today: dt.date | None = None
) -> tuple[list[Finding], list[str]]:
    """Mark findings covered by an unexpired waiver; return them and notes about the waivers."""
    today = today or dt.date.today()
    notes: list[str] = []
    used = [False] * len(waivers)
    out: list[Finding] = []
    for f in findings:
        if f.outcome in (Outcome.FAILED, Outcome.INCONCLUSIVE):
            for i, w in enumerate(waivers):
                if w.matches(f):
                    used[i] = True
                    if w.expires >= today:
                        f = replace(f, waived=f"{w.reason} (waived until {w.expires.isoformat()})")
                        break
        out.append(f)
    for i, w in enumerate(waivers):
        if w.expires < today:
            notes.append(f"waiver {w.check} ({w.node}) expired on {w.expires.isoformat()}: not applied")
        elif not used[i]:
            notes.append(f"waiver {w.check} ({w.node}) matched nothing: remove it from the profile")
    return out, notes
