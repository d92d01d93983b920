"""The probes execute sglang's real admission doors and decode commit path on CPU.

Positive and negative controls on real releases: unpatched 0.5.19/0.5.20 admit a rejected request,
the same code with the series applied retires it with the original 400, 0.5.21 retires it on its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from kvgate.backport.cpuenv import CpuEnv
from kvgate.backport.engine import BackportRefused, Layout, Target, apply_series
from kvgate.backport.manifest import load_series
from kvgate.backport.probe import (
    ADMITTED,
    ERROR,
    RETIRED,
    UNVERIFIED,
    VERIFIED,
    run_admission_probe,
    run_hardening_probe,
    run_result_retire_probe,
)

pytestmark = [pytest.mark.slow, pytest.mark.wheels]
REJECT = "Input length (8 tokens) exceeds the maximum allowed length (4 tokens)."


def _patched(site: Callable[[str], CpuEnv], version: str, hardening: bool = False) -> CpuEnv:
    env = site(version)
    apply_series(Target(Layout.SITE, env.site_packages), load_series(version), with_hardening=hardening)
    return env


def _by(result, name: str, door: str):  # type: ignore[no-untyped-def]
    return next(c for c in result.cases if c.name == name and c.door == door)


@pytest.mark.parametrize("version", ["0.5.19", "0.5.20"])
def test_unpatched_release_admits_the_rejected_request(cpu_envs: Callable[[str], CpuEnv], version: str) -> None:
    env = cpu_envs(version)
    r = run_admission_probe(env.python, env.pythonpath)
    assert r.version == version and r.error is None
    assert r.status == ADMITTED and r.controls_ok, r
    for door in ("prefill", "decode"):
        c = _by(r, "rejected", door)
        assert c.observed["queued"] and c.observed["transfer_endpoints_created"] == 1
        assert c.observed["streamed"] == 0 and c.observed["client_error"] is None
        assert c.observed["to_finish"]["status_code"] == 400  # the rejection is there, just unread
    assert _by(r, "rejected", "prefill").observed["metadata_slots_taken"] == 1
    assert r.torchvision_stub  # labelled: CPU torch cannot load PyPI's torchvision


@pytest.mark.parametrize("version", ["0.5.19", "0.5.20"])
def test_patched_release_retires_it_with_the_original_400(site: Callable[[str], CpuEnv], version: str) -> None:
    env = _patched(site, version)
    r = run_admission_probe(env.python, env.pythonpath)
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


@pytest.mark.parametrize("version", ["0.5.21", "0.5.22", "0.5.23"])
def test_later_releases_retire_already_and_the_series_leaves_them_alone(cpu_envs: Callable[[str], CpuEnv],
                                                                       version: str) -> None:
    env = cpu_envs(version)
    r = run_admission_probe(env.python, env.pythonpath)
    assert r.version == version
    assert r.status == RETIRED and r.controls_ok and r.client_error["status_code"] == 400, r
    assert r.client_error["message"] == REJECT
    # No upstream release checks the handoff's coverage (#38704 never merged): the short handoff commits.
    assert run_hardening_probe(env.python, env.pythonpath).status == UNVERIFIED
    for series in ("0.5.20", "0.5.19"):
        with pytest.raises(BackportRefused, match=f"does not match sglang {series}"):
            apply_series(Target(Layout.SITE, env.site_packages), load_series(series), check=True)


def test_hardening_probe_on_the_real_decode_commit_path(cpu_envs: Callable[[str], CpuEnv],
                                                        site: Callable[[str], CpuEnv]) -> None:
    env = cpu_envs("0.5.20")
    before = run_hardening_probe(env.python, env.pythonpath)
    assert before.status == UNVERIFIED, before  # no release checks coverage: the short handoff commits
    patched = _patched(site, "0.5.20", hardening=True)
    after = run_hardening_probe(patched.python, patched.pythonpath)
    assert after.status == VERIFIED, after
    assert after.client_error["status_code"] == 500
    assert "KV handoff coverage mismatch" in after.client_error["message"]
    assert next(c for c in after.cases if c.name == "full_handoff").outcome == "COMMITTED"


def test_post_forward_retire_on_the_real_result_path(cpu_envs: Callable[[str], CpuEnv],
                                                     site: Callable[[str], CpuEnv]) -> None:
    env = cpu_envs("0.5.19")
    before = run_result_retire_probe(env.python, env.pythonpath)
    assert before.status == "HANDED_OFF", before  # 0.5.19 sends the aborted stub's KV (#30233)
    aborted = next(c for c in before.cases if c.name == "aborted_final_result")
    assert aborted.observed["kv_chunks_sent"] == 1 and aborted.observed["client_error"] is None
    after = run_result_retire_probe(*_pythonpath(_patched(site, "0.5.19")))
    assert after.status == RETIRED, after
    aborted = next(c for c in after.cases if c.name == "aborted_final_result")
    assert aborted.observed["kv_chunks_sent"] == 0 and aborted.observed["metadata_slots_released"] == 1
    assert aborted.observed["sender_aborted"] and aborted.observed["streamed"] == 1
    assert after.client_error["status_code"] == 400 and after.client_error["message"] == REJECT
    # Positive control: upstream 0.5.20 carries #36988 and retires it on its own.
    env20 = cpu_envs("0.5.20")
    assert run_result_retire_probe(env20.python, env20.pythonpath).status == RETIRED


def _pythonpath(env: CpuEnv) -> tuple[str, tuple[str, ...]]:
    return env.python, env.pythonpath


def test_missing_code_is_a_probe_error_never_a_verdict(cpu_envs: Callable[[str], CpuEnv], tmp_path: Path) -> None:
    env = cpu_envs("0.5.20")
    fake = tmp_path / "sglang"
    fake.mkdir()
    (fake / "__init__.py").write_text("__version__ = '0.0.0'\n")
    r = run_admission_probe(env.python, [tmp_path, *env.pythonpath[1:]])
    assert r.status == ERROR and r.cases == () and not r.safe
    assert r.missing and r.missing.startswith("sglang.srt"), r
    h = run_hardening_probe(env.python, [tmp_path, *env.pythonpath[1:]])
    assert h.status == ERROR and h.missing
