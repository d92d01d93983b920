"""Detection by behaviour (method 4): the installed sglang's real PD code executed on CPU.

The probes belong to the backport work: kvgate/backport/probe.py, a layer above, runs them and maps
their results with these functions (`detect_by_behaviour`); this module only turns results into
detections. Admission probe -> #38935 (a rejected request is retired at both doors while valid and
re-entering requests are kept). Hardening probe -> #38704's transferred-length check
(checklist item 3: a one-token handoff into a longer reservation is aborted, a full one committed).
A probe that could not run is "unknown", never a verdict.
"""

from __future__ import annotations

from typing import Any

from kvgate.catalogue.model import Detection, Presence


def admission_detection(result: Any) -> Detection:
    """Map a kvgate.backport.probe.DoorProbeReport to a detection of #38935."""
    where = f"{result.python}" + (f", sglang {result.version}" if result.version else "")
    ev = [f"admission probe ({where}, {result.duration_s}s): {result.status}"]
    for c in result.cases:
        ev.append(f"{c.name} at {c.door}: {c.outcome} (expected {c.expect})")
    if result.status == "RETIRED" and result.controls_ok:
        if result.client_error:
            ev.append(f"client receives {result.client_error}")
        return Detection("pr-38935", "behaviour", Presence.PRESENT, tuple(ev))
    if result.status == "RETIRED":
        ev.append("rejected requests are retired, but a control case misbehaved: not #38935's behaviour")
        return Detection("pr-38935", "behaviour", Presence.UNKNOWN, tuple(ev))
    if result.status in ("ADMITTED", "PARTIAL"):
        return Detection("pr-38935", "behaviour", Presence.ABSENT, tuple(ev))
    ev.append(f"probe error: {result.error}" + (f" (missing {result.missing})" if result.missing else ""))
    return Detection("pr-38935", "behaviour", Presence.UNKNOWN, tuple(ev))


def hardening_detection(result: Any) -> Detection:
    """Map a kvgate.backport.probe.HandoffProbeReport to a detection of #38704 (handoff coverage)."""
    ev = [f"handoff-coverage probe ({result.python}, {result.duration_s}s): {result.status}"]
    ev += [f"{c.name}: {c.outcome} (expected {c.expect})" for c in result.cases]
    if result.status == "VERIFIED":
        return Detection("pr-38704", "behaviour", Presence.PRESENT, tuple(ev))
    if result.status == "UNVERIFIED":
        return Detection("pr-38704", "behaviour", Presence.ABSENT, tuple(ev))
    ev.append(f"probe error: {result.error}" + (f" (missing {result.missing})" if result.missing else ""))
    return Detection("pr-38704", "behaviour", Presence.UNKNOWN, tuple(ev))
