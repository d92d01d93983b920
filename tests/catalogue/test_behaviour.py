"""Method 4: the backport work's probes executing the real installed admission code, mapped to detections."""

from __future__ import annotations

import pytest

from kvgate.backport import probe
from kvgate.catalogue import Presence, assess_installed
from kvgate.catalogue.behaviour import admission_detection, hardening_detection
from kvgate.catalogue.source import from_site_packages
from tests.assets.real_sglang import cpu_env_or_skip


def _result(status: str, controls_ok: bool = True, **kw):  # type: ignore[no-untyped-def]
    cases = (probe.ProbeCase("rejected", "prefill", "RETIRED", "RETIRED" if status == "RETIRED" else "ADMITTED"),)
    base = dict(
        status=status,
        version="0.5.21",
        sglang_path="/x",
        cases=cases,
        controls_ok=controls_ok,
        client_error={"status_code": 400},
        error=None,
        missing=None,
        duration_s=1.0,
        torchvision_stub=True,
        python="/py",
    )
    base.update(kw)
    return probe.DoorProbeReport(**base)


def test_admission_mapping() -> None:
    assert admission_detection(_result("RETIRED")).presence is Presence.PRESENT
    assert admission_detection(_result("ADMITTED")).presence is Presence.ABSENT
    assert admission_detection(_result("PARTIAL")).presence is Presence.ABSENT
    over_eager = admission_detection(_result("RETIRED", controls_ok=False))
    assert over_eager.presence is Presence.UNKNOWN and any("control" in e for e in over_eager.evidence)
    err = admission_detection(_result("ERROR", error="AttributeError", missing="scheduler.foo"))
    assert err.presence is Presence.UNKNOWN and any("scheduler.foo" in e for e in err.evidence)


def test_hardening_mapping() -> None:
    def mk(status: str) -> probe.HandoffProbeReport:
        return probe.HandoffProbeReport(
            status=status,
            version="0.5.20",
            cases=(),
            client_error=None,
            error=None,
            missing=None,
            duration_s=1.0,
            python="/py",
        )

    assert hardening_detection(mk("VERIFIED")).presence is Presence.PRESENT
    assert hardening_detection(mk("UNVERIFIED")).presence is Presence.ABSENT
    assert hardening_detection(mk("ERROR")).presence is Presence.UNKNOWN


@pytest.mark.slow
@pytest.mark.wheels
@pytest.mark.parametrize("release, door", [("0.5.20", Presence.ABSENT), ("0.5.21", Presence.PRESENT)])
def test_real_admission_code_on_cpu(release: str, door: Presence) -> None:
    env = cpu_env_or_skip(release)
    installed = from_site_packages(env.site_packages)
    dets = probe.detect_by_behaviour(env.python, env.pythonpath)
    a = assess_installed(installed, behaviour=dets)
    s = a.status("pr-38935")
    assert s.presence is door and s.decided_by == "behaviour", [d.evidence for d in s.detections]
    by_source = next(d for d in s.detections if d.method == "source")
    assert by_source.presence is door  # behaviour and source signatures agree on the real releases
