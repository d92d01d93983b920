"""Execute sglang's real PD admission doors (and decode commit path) in the interpreter that has it.

`run_admission_probe(python, extra_pythonpath)` runs `_probe_payload.py` in that interpreter and turns
what it observed into a `DoorProbeReport`. The verdict comes from observed effects only (transfer
endpoints created, queue contents, metadata slots, what the client was sent); a missing attribute or
import is an ERROR naming it, never a verdict. `detect_by_behaviour` hands the results to the catalogue
as method-4 detections (kvgate/catalogue/behaviour.py maps them). `run_lifetime_probe` runs
`_lifetime_payload.py`: each page-lifetime patch's race, provoked in the release's real Mooncake
control plane with an injected write delay, judged by a page oracle (RETIRED / NOT RETIRED).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kvgate.catalogue.behaviour import admission_detection, hardening_detection
from kvgate.catalogue.model import Detection

_HERE = Path(__file__).resolve().parent
PAYLOAD = _HERE / "_probe_payload.py"
LIFETIME_PAYLOAD = _HERE / "_lifetime_payload.py"
STUB_FILE = _HERE / "_stub" / "sitecustomize.py"
RESULT_TAG = "KVGATE-PROBE-RESULT:"

ADMITTED = "ADMITTED"
RETIRED = "RETIRED"
PARTIAL = "PARTIAL"  # one door retires, the other admits
ERROR = "ERROR"
VERIFIED = "VERIFIED"
UNVERIFIED = "UNVERIFIED"


@dataclass(frozen=True)
class ProbeCase:
    """One request pushed through one real door (or the real commit path) and what was observed."""

    name: str
    door: str
    expect: str
    outcome: str
    observed: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.outcome == self.expect


@dataclass(frozen=True)
class DoorProbeReport:
    """What the admission probe saw at sglang's real PD doors.

    status: RETIRED (a rejected request is retired at both doors), ADMITTED (both doors admit it),
    PARTIAL (one door each way) or ERROR (the probe could not run; `error` / `missing` say why).
    controls_ok: the valid request was admitted and the re-entering, resource-holding requests kept.
    client_error: what the rejected request's client receives when retired (message, status_code).
    """

    status: str
    version: str | None
    sglang_path: str | None
    cases: tuple[ProbeCase, ...]
    controls_ok: bool
    client_error: dict[str, Any] | None
    error: str | None
    missing: str | None
    duration_s: float
    torchvision_stub: bool
    python: str

    @property
    def safe(self) -> bool:
        """Rejected requests retired and every control case behaved."""
        return self.status == RETIRED and self.controls_ok


@dataclass(frozen=True)
class CaseProbeReport:
    """What a probe judged by its cases saw: a status, the cases, and what the rejected request's client
    was sent; `error` / `missing` say why a probe could not run."""

    status: str
    version: str | None
    cases: tuple[ProbeCase, ...]
    client_error: dict[str, Any] | None
    error: str | None
    missing: str | None
    duration_s: float
    python: str


@dataclass(frozen=True)
class HandoffProbeReport(CaseProbeReport):
    """What the decode-commit probe saw: VERIFIED (a short handoff is aborted, a full one committed),
    UNVERIFIED (a short handoff is committed), or ERROR."""


def _run_payload(
    mode: str,
    python: str,
    extra_pythonpath: Sequence[str | os.PathLike[str]],
    timeout: float,
    payload: Path = PAYLOAD,
    argv: Sequence[str] | None = None,
) -> tuple[dict[str, Any], float]:
    if os.sep in python and not os.path.isabs(python):
        python = os.path.abspath(python)  # the payload runs in another directory; keep venv symlinks as given
    env = dict(os.environ)
    paths = [os.path.abspath(str(p)) for p in extra_pythonpath]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop("SGLANG_USE_CPU_ENGINE", None)  # makes decode import sgl_kernel (cpu-sglang.md)
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [python, str(payload), *(argv if argv is not None else (mode, str(STUB_FILE)))],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            cwd=str(_HERE),
        )
    except FileNotFoundError:
        return {"status": "error", "error": f"interpreter not found: {python}", "missing": python}, 0.0
    except subprocess.TimeoutExpired:
        return {"status": "error", "error": f"probe timed out after {timeout:.0f}s", "missing": None}, timeout
    elapsed = time.monotonic() - started
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG) :]), elapsed
    tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
    return {
        "status": "error",
        "error": f"probe exited {proc.returncode} without a result: {tail}",
        "missing": None,
    }, elapsed


def _cases(raw: dict[str, Any]) -> tuple[ProbeCase, ...]:
    out = []
    for c in raw.get("cases", []):
        observed = {k: v for k, v in c.items() if k not in ("name", "door", "expect", "outcome")}
        out.append(
            ProbeCase(
                name=c["name"],
                door=c.get("door", "decode-commit"),
                expect=c["expect"],
                outcome=c["outcome"],
                observed=observed,
            )
        )
    return tuple(out)


def _named_pair(raw: dict[str, Any], first: str, second: str) -> tuple[tuple[ProbeCase, ...], ProbeCase, ProbeCase]:
    """The payload's cases, and the two a two-case probe is judged by."""
    cases = _cases(raw)
    return cases, next(c for c in cases if c.name == first), next(c for c in cases if c.name == second)


def run_admission_probe(
    python: str, extra_pythonpath: Sequence[str | os.PathLike[str]] = (), timeout: float = 300.0
) -> DoorProbeReport:
    """Push a rejected, a valid and re-entering requests through the real PD doors of the sglang that
    `python` imports (with `extra_pythonpath` first on its path)."""
    return _admission(*_run_payload("admission", python, extra_pythonpath, timeout), python)


def _admission(raw: dict[str, Any], elapsed: float, python: str) -> DoorProbeReport:
    if raw.get("status") != "ok":
        return DoorProbeReport(
            status=ERROR,
            version=raw.get("version"),
            sglang_path=raw.get("sglang_path"),
            cases=(),
            controls_ok=False,
            client_error=None,
            error=raw.get("error"),
            missing=raw.get("missing"),
            duration_s=round(elapsed, 2),
            torchvision_stub=bool(raw.get("torchvision_stub")),
            python=python,
        )
    cases = _cases(raw)
    rejected = [c for c in cases if c.name == "rejected"]
    outcomes = {c.outcome for c in rejected}
    if outcomes == {RETIRED}:
        status = RETIRED
    elif outcomes == {ADMITTED}:
        status = ADMITTED
    elif outcomes <= {RETIRED, ADMITTED}:
        status = PARTIAL
    else:  # DROPPED: neither admitted nor answered
        status = ERROR
    controls = [c for c in cases if c.name != "rejected"]
    client_error = next((c.observed.get("client_error") for c in rejected if c.observed.get("client_error")), None)
    return DoorProbeReport(
        status=status,
        version=raw.get("version"),
        sglang_path=raw.get("sglang_path"),
        cases=cases,
        controls_ok=bool(controls) and all(c.ok for c in controls),
        client_error=client_error,
        error=None if status != ERROR else "a rejected request was neither admitted nor answered",
        missing=None,
        duration_s=round(elapsed, 2),
        torchvision_stub=bool(raw.get("torchvision_stub")),
        python=python,
    )


def run_hardening_probe(
    python: str, extra_pythonpath: Sequence[str | os.PathLike[str]] = (), timeout: float = 300.0
) -> HandoffProbeReport:
    """Publish a short (1-token) and a full handoff with the real `MetadataBuffers.set_buf` and commit
    each through the real `DecodeTransferQueue._commit_transfer_to_req`."""
    return _hardening(*_run_payload("hardening", python, extra_pythonpath, timeout), python)


def _hardening(raw: dict[str, Any], elapsed: float, python: str) -> HandoffProbeReport:
    if raw.get("status") != "ok":
        return _not_run(HandoffProbeReport, raw, elapsed, python)
    cases, short, full = _named_pair(raw, "short_handoff", "full_handoff")
    if short.outcome == "ABORTED" and full.outcome == "COMMITTED":
        status = VERIFIED
    elif short.outcome == "COMMITTED":
        status = UNVERIFIED
    else:
        status = ERROR
    error = None if status != ERROR else f"unexpected outcomes: short={short.outcome} full={full.outcome}"
    return HandoffProbeReport(
        status, raw.get("version"), cases, short.observed.get("client_error"), error, None, round(elapsed, 2), python
    )


HANDED_OFF = "HANDED_OFF"


@dataclass(frozen=True)
class RetireProbeReport(CaseProbeReport):
    """What the post-forward probe saw in the real `process_batch_result_disagg_prefill`: RETIRED (an
    aborted request's final result is released and answered, no KV chunk sent; a valid one is handed
    off), HANDED_OFF (the aborted result's KV is sent anyway: the #30233 short handoff), or ERROR."""


def run_result_retire_probe(
    python: str, extra_pythonpath: Sequence[str | os.PathLike[str]] = (), timeout: float = 300.0
) -> RetireProbeReport:
    """Feed an aborted and a valid final prefill result through the real post-forward path."""
    return _result_retire(*_run_payload("retire_results", python, extra_pythonpath, timeout), python)


def _result_retire(raw: dict[str, Any], elapsed: float, python: str) -> RetireProbeReport:
    if raw.get("status") != "ok":
        return _not_run(RetireProbeReport, raw, elapsed, python)
    cases, aborted, valid = _named_pair(raw, "aborted_final_result", "valid_final_result")
    if valid.outcome != HANDED_OFF or aborted.outcome not in (RETIRED, HANDED_OFF):
        status, error = ERROR, f"unexpected outcomes: aborted={aborted.outcome} valid={valid.outcome}"
    else:
        status, error = aborted.outcome, None
    return RetireProbeReport(
        status, raw.get("version"), cases, aborted.observed.get("client_error"), error, None, round(elapsed, 2), python
    )


_Report = TypeVar("_Report", bound=CaseProbeReport)


def _not_run(cls: type[_Report], raw: dict[str, Any], elapsed: float, python: str) -> _Report:
    """The report of a probe that could not run: ERROR, with the payload's error and what was missing."""
    return cls(ERROR, raw.get("version"), (), None, raw.get("error"), raw.get("missing"), round(elapsed, 2), python)


@dataclass(frozen=True)
class ProbeSuite:
    """Every probe, run on one import of sglang (one subprocess): what `--verify` and tests use."""

    admission: DoorProbeReport
    hardening: HandoffProbeReport
    result_retire: RetireProbeReport
    duration_s: float


def run_all_probes(
    python: str, extra_pythonpath: Sequence[str | os.PathLike[str]] = (), timeout: float = 300.0
) -> ProbeSuite:
    """Run the admission, hardening and post-forward probes in one interpreter process."""
    raw, elapsed = _run_payload("all", python, extra_pythonpath, timeout)
    suite = raw.get("suite") if raw.get("status") == "ok" else None
    shared = {k: raw.get(k) for k in ("version", "sglang_path", "torchvision_stub")}

    def part(name: str) -> dict[str, Any]:
        if suite is None:
            return raw  # the import itself failed: every probe reports that error
        return {**suite[name], **shared}

    def took(name: str) -> float:
        return float(suite[name].get("duration_s", 0.0)) if suite else elapsed

    return ProbeSuite(
        admission=_admission(part("admission"), took("admission"), python),
        hardening=_hardening(part("hardening"), took("hardening"), python),
        result_retire=_result_retire(part("retire_results"), took("retire_results"), python),
        duration_s=round(elapsed, 2),
    )


def detect_by_behaviour(
    python: str, extra_pythonpath: Sequence[str | os.PathLike[str]] = (), timeout: float = 300.0
) -> list[Detection]:
    """Method 4 of the catalogue: run the probes in `python` (with `extra_pythonpath` first on its path)
    and map their results to detections (kvgate.catalogue.behaviour).

    One interpreter runs every probe, so sglang and torch are imported once; `timeout` bounds it.
    """
    if os.sep in python:  # the probe runs in another working directory; keep venv symlinks unresolved
        python = os.path.abspath(python)
    suite = run_all_probes(python, extra_pythonpath, timeout=timeout)
    return [admission_detection(suite.admission), hardening_detection(suite.hardening)]


# -- page lifetime: sglang's real Mooncake control plane with an injected write delay ---------------
NOT_RETIRED = "NOT RETIRED"
INCONCLUSIVE = "INCONCLUSIVE"  # the race was not staged (or nothing was observed): no verdict
LIFETIME_PATCHES = (
    "kvgate-preserve-abort-ack",
    "kvgate-ack-fanout",
    "kvgate-force-arm-on-failure",
    "kvgate-ack-generations",
)
"""The patches whose race `run_lifetime_probe` provokes, one scenario each (see _lifetime_races.py)."""


@dataclass(frozen=True)
class LifetimeCase:
    """One page-lifetime scenario: RETIRED (pages released only on the drain ACK, after the late write),
    NOT RETIRED (released before the write landed, or on the timeout without a drain ACK), INCONCLUSIVE
    (the payload could not stage the race in its tries, or observed nothing: no verdict) or ERROR."""

    patch: str
    status: str
    outcome: str  # SAFE | EXPOSED | UNPROVEN | INCONCLUSIVE | ERROR (what the page oracle saw)
    why: str
    observed: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class LifetimeProbeReport:
    """Every scenario on one import of sglang; `error` when the probe could not run at all."""

    version: str | None
    cases: tuple[LifetimeCase, ...]
    error: str | None
    missing: str | None
    duration_s: float
    python: str

    def case(self, patch: str) -> LifetimeCase | None:
        return next((c for c in self.cases if c.patch == patch), None)


def run_lifetime_probe(
    python: str,
    extra_pythonpath: Sequence[str | os.PathLike[str]] = (),
    timeout: float = 300.0,
    patches: Sequence[str] = LIFETIME_PATCHES,
) -> LifetimeProbeReport:
    """Provoke each patch's page-lifetime race in the sglang that `python` imports: an abort or failure
    while a KV write is held back by an injected delay, then the page handed to the next request."""
    raw, elapsed = _run_payload(
        "lifetime", python, extra_pythonpath, timeout, LIFETIME_PAYLOAD, (str(STUB_FILE), ",".join(patches))
    )
    if raw.get("status") != "ok":
        return LifetimeProbeReport(
            raw.get("version"), (), raw.get("error") or "probe failed", raw.get("missing"), round(elapsed, 2), python
        )
    cases = []
    for patch, sc in raw.get("scenarios", {}).items():
        outcome = str(sc.get("outcome"))
        status = (
            RETIRED
            if outcome == "SAFE"
            else NOT_RETIRED
            if outcome in ("EXPOSED", "UNPROVEN")
            else INCONCLUSIVE
            if outcome == "INCONCLUSIVE"
            else ERROR
        )
        why = str(sc.get("why") or sc.get("error") or "no observation")
        observed = {k: v for k, v in sc.items() if k not in ("outcome", "why")}
        cases.append(LifetimeCase(patch, status, outcome, why, observed))
    return LifetimeProbeReport(raw.get("version"), tuple(cases), None, None, round(elapsed, 2), python)
