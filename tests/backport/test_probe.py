"""The probes execute sglang's real admission doors, post-forward result path and decode commit path on CPU.

Positive and negative controls on real releases: unpatched 0.5.19/0.5.20 admit a rejected request,
the same code with the series applied retires it with the original 400, 0.5.21+ retire it on their
own; 0.5.19 hands an aborted result's KV off where 0.5.20 (upstream #36988) and the patched 0.5.19
retire it; no release checks handoff coverage, the hardening patch does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kvgate.backport.cpuenv import CpuEnv
from kvgate.backport.engine import apply_series
from kvgate.backport.probe import (
    ADMITTED,
    ERROR,
    HANDED_OFF,
    RETIRED,
    UNVERIFIED,
    VERIFIED,
    DoorProbeReport,
    run_admission_probe,
    run_all_probes,
    run_hardening_probe,
    run_result_retire_probe,
)
from kvgate.backport.stages import BackportRefused, Layout, Target
from kvgate.catalogue.series import load_series

pytestmark = [pytest.mark.slow, pytest.mark.wheels]
REJECT = "Input length (8 tokens) exceeds the maximum allowed length (4 tokens)."


def _by(result: DoorProbeReport, name: str, door: str):  # type: ignore[no-untyped-def]
    return next(c for c in result.cases if c.name == name and c.door == door)


@pytest.mark.parametrize("version, post_forward", [("0.5.19", HANDED_OFF), ("0.5.20", RETIRED)])
def test_unpatched_release_admits_the_rejected_request(
    cpu_envs: Callable[[str], CpuEnv], version: str, post_forward: str
) -> None:
    env = cpu_envs(version)
    suite = run_all_probes(env.python, env.pythonpath)
    r = suite.admission
    assert r.version == version and r.error is None
    assert r.status == ADMITTED and r.controls_ok, r
    for door in ("prefill", "decode"):
        c = _by(r, "rejected", door)
        assert c.observed["queued"] and c.observed["transfer_endpoints_created"] == 1
        assert c.observed["streamed"] == 0 and c.observed["client_error"] is None
        assert c.observed["to_finish"]["status_code"] == 400  # the rejection is there, just unread
    assert _by(r, "rejected", "prefill").observed["metadata_slots_taken"] == 1
    assert r.torchvision_stub  # labelled: CPU torch cannot load PyPI's torchvision
    # No release checks the handoff's coverage (#38704 never merged): the short handoff commits.
    assert suite.hardening.status == UNVERIFIED, suite.hardening
    # 0.5.19 sends an aborted request's final result (#30233); 0.5.20 carries #36988 and retires it.
    assert suite.result_retire.status == post_forward, suite.result_retire
    aborted = next(c for c in suite.result_retire.cases if c.name == "aborted_final_result")
    assert aborted.observed["kv_chunks_sent"] == (1 if post_forward == HANDED_OFF else 0)


@pytest.mark.parametrize("version", ["0.5.19", "0.5.20"])
def test_patched_release_retires_it_with_the_original_400(site: Callable[[str], CpuEnv], version: str) -> None:
    env = site(version)
    apply_series(Target(Layout.SITE, env.site_packages), load_series(version), with_hardening=True)
    suite = run_all_probes(env.python, env.pythonpath)
    r = suite.admission
    assert r.status == RETIRED and r.controls_ok, r
    assert r.client_error["status_code"] == 400 and r.client_error["message"] == REJECT
    for door in ("prefill", "decode"):
        c = _by(r, "rejected", door)
        assert not c.observed["queued"] and c.observed["transfer_endpoints_created"] == 0
        assert c.observed["streamed"] == 1 and c.observed["metadata_slots_taken"] == 0
        assert c.observed["finished_reason"]["message"] == REJECT
    # Valid and re-entering, resource-holding requests are unchanged by the patch.
    assert _by(r, "valid", "prefill").outcome == _by(r, "valid", "decode").outcome == ADMITTED
    assert _by(r, "reentry_holding_resources", "prefill").outcome == ADMITTED
    assert _by(r, "reentry_retracted", "decode").observed["retracted_queue"] == 1
    # Hardening: the real decode commit path aborts the short handoff, commits the full one.
    h = suite.hardening
    assert h.status == VERIFIED, h
    assert h.client_error["status_code"] == 500 and "KV handoff coverage mismatch" in h.client_error["message"]
    assert next(c for c in h.cases if c.name == "full_handoff").outcome == "COMMITTED"
    # Post-forward: the aborted result is released and answered once, no KV chunk sent.
    rr = suite.result_retire
    assert rr.status == RETIRED, rr
    aborted = next(c for c in rr.cases if c.name == "aborted_final_result")
    assert aborted.observed["kv_chunks_sent"] == 0 and aborted.observed["metadata_slots_released"] == 1
    assert aborted.observed["sender_aborted"] and aborted.observed["streamed"] == 1
    assert rr.client_error["message"] == REJECT


@pytest.mark.parametrize("version", ["0.5.21", "0.5.22", "0.5.23"])
def test_later_releases_retire_already_and_the_series_leaves_them_alone(
    cpu_envs: Callable[[str], CpuEnv], version: str
) -> None:
    env = cpu_envs(version)
    suite = run_all_probes(env.python, env.pythonpath)
    r = suite.admission
    assert r.version == version
    assert r.status == RETIRED and r.controls_ok and r.client_error["status_code"] == 400, r
    assert r.client_error["message"] == REJECT
    assert suite.result_retire.status == RETIRED
    assert suite.hardening.status == UNVERIFIED  # not even the newest release checks coverage
    for series in ("0.5.20", "0.5.19"):
        with pytest.raises(BackportRefused, match=f"does not match sglang {series}"):
            apply_series(Target(Layout.SITE, env.site_packages), load_series(series), check=True)


def test_single_probe_entry_points_agree_with_the_suite(cpu_envs: Callable[[str], CpuEnv]) -> None:
    env = cpu_envs("0.5.21")
    r = run_admission_probe(env.python, env.pythonpath)
    assert r.status == RETIRED and r.controls_ok and r.safe
    suite = run_all_probes(env.python, env.pythonpath).admission
    assert (r.status, r.controls_ok, r.client_error) == (suite.status, suite.controls_ok, suite.client_error)
    assert [(c.name, c.door, c.outcome) for c in r.cases] == [(c.name, c.door, c.outcome) for c in suite.cases]


def test_missing_code_is_a_probe_error_never_a_verdict(cpu_envs: Callable[[str], CpuEnv], tmp_path: Path) -> None:
    env = cpu_envs("0.5.20")
    fake = tmp_path / "sglang"
    fake.mkdir()
    (fake / "__init__.py").write_text("__version__ = '0.0.0'\n")
    path = [tmp_path, *env.pythonpath[1:]]
    r = run_admission_probe(env.python, path)
    assert r.status == ERROR and r.cases == () and not r.safe
    assert r.missing and r.missing.startswith("sglang.srt"), r
    assert run_hardening_probe(env.python, path).status == ERROR
    assert run_result_retire_probe(env.python, path).status == ERROR
    suite = run_all_probes(env.python, path)
    assert {suite.admission.status, suite.hardening.status, suite.result_retire.status} == {ERROR}
