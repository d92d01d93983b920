"""The page-lifetime probes run sglang's real Mooncake control plane (ABORT/ACK threads, transfer worker,
scheduler abort, decode release) with an injected write delay, on the real installed release.

Negative control: the unpatched release frees or holds pages as the race allows (NOT RETIRED for every
stand-in); positive: the same tree with the series applied releases them only on the drain ACK, after
the late write (RETIRED). Each run imports sglang once (~30 s of one core) and plays four scenarios (~12 s).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvgate.backport.cpuenv import CpuEnv
from kvgate.backport.engine import Layout, Target, apply_series
from kvgate.backport.probe import LIFETIME_PATCHES, NOT_RETIRED, RETIRED, run_lifetime_probe
from kvgate.catalogue.series import load_series

pytestmark = [pytest.mark.slow, pytest.mark.wheels]


def _statuses(env: CpuEnv, patches: tuple[str, ...] = LIFETIME_PATCHES) -> dict[str, tuple[str, str, str]]:
    report = run_lifetime_probe(env.python, env.pythonpath, timeout=240, patches=patches)
    assert report.error is None, report.error
    return {c.patch: (c.status, c.outcome, c.why) for c in report.cases}


@pytest.mark.parametrize("release", ["0.5.20", "0.5.19"])
def test_lifetime_races_shown_unpatched_and_closed_by_the_series(release: str, site: Callable[[str], CpuEnv]) -> None:
    env = site(release)
    series = load_series(release)
    ids = tuple(p.id for p in series.patches if p.id in LIFETIME_PATCHES)
    assert ids == LIFETIME_PATCHES, "every page-lifetime stand-in is in the series"
    before = _statuses(env)
    for pid, (status, outcome, why) in before.items():
        assert status == NOT_RETIRED, (pid, outcome, why)
    # The race is a real one where sglang frees early: the next request's pages get the late write.
    assert before["kvgate-force-arm-on-failure"][1] == "EXPOSED"
    assert before["kvgate-ack-generations"][1] == "EXPOSED"
    apply_series(Target(Layout.SITE, env.site_packages), series)
    after = _statuses(env)
    for pid, (status, outcome, why) in after.items():
        assert status == RETIRED, (pid, outcome, why)
