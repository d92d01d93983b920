"""probes.handoff.prefill_oracle: its plan and cost, then `kvgate check` against the simulator, healthy
and with the `handoff-layout` fault (its decode reads every received page in the wrong layout), switched
on at start and at run time, in both serving modes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.exitcodes import ExitStatus
from kvgate.gates.probes import ProbeSettings
from kvgate.gates.probes.handoff import NEAR_LIMIT_AUTO_MAX, pick, plan_handoff
from kvgate.gates.probes.plan import ProbeLimits
from kvgate.sim import faults
from tests.assets.sim_setup import doubt_opted_out_args

HANDOFF = "probes.handoff.prefill_oracle"
runner = CliRunner()


def limits(context: int, page: int = 64) -> ProbeLimits:
    return ProbeLimits(context=context, max_req_input_len=context - 6, page_size=page, pool=2 * context)


def test_plan_has_one_page_a_partial_last_page_and_the_near_limit_prompt() -> None:
    prompts, note = plan_handoff(limits(8192), ProbeSettings())
    by = {p.label: p for p in prompts}
    assert by["one_page"].length == 64 and by["one_page"].replays == 3
    assert by["pages_partial"].length % 64 and by["pages_partial"].length > 2 * 64
    # every replay (at most the answer's last position) stays within the longest accepted prompt
    assert by["near_limit"].length + 32 == limits(8192).longest_accepted
    assert "near-limit prompt 8,153 tokens" in note


def test_at_a_1m_context_the_near_limit_prompt_is_not_paid_for_unless_asked() -> None:
    prompts, note = plan_handoff(limits(1_048_576), ProbeSettings())
    assert [p.label for p in prompts] == ["one_page", "pages_partial"]
    assert "not sent" in note and "probes.handoff_long_tokens" in note
    # the whole check's prefill at most: each prompt once, one replay per position (no prefix cache counted)
    # (a model always confident: the replayed positions are the first, the last and the middle one)
    cost = sum(p.length * (1 + p.replays) + sum(pick(list(range(1, 32)), p.replays)) for p in prompts)
    assert cost == 1008 and cost < 0.001 * 1_048_576
    asked, _ = plan_handoff(limits(1_048_576), ProbeSettings(handoff_long_tokens=100_000))
    assert [p.length for p in asked if p.label == "near_limit"] == [100_000]
    assert limits(NEAR_LIMIT_AUTO_MAX + 7).longest_accepted == NEAR_LIMIT_AUTO_MAX
    assert "near_limit" in [p.label for p in plan_handoff(limits(NEAR_LIMIT_AUTO_MAX + 7), ProbeSettings())[0]]


def test_a_page_of_one_token_still_gets_many_pages() -> None:
    prompts, _ = plan_handoff(limits(4096, page=1), ProbeSettings())
    assert [p.length for p in prompts][:2] == [16, 51]


def test_replays_are_picked_early_and_late_among_confident_positions() -> None:
    assert pick([2, 3, 5, 9, 11], 3) == [2, 5, 11]
    assert pick([2, 3, 5, 9, 11], 2) == [2, 11]
    assert pick([4, 7], 1) == [7]
    assert pick([4], 3) == [4]
    assert pick([], 3) == []


# -- against the simulator (slow) ----------------------------------------------------------------


def _check(dep: Any, out: Path) -> tuple[int, dict[str, Any]]:
    # As tests/test_binary.py: the simulator runs no sglang code and does not expose its env, so doubt is
    # opted out of; a failure still exits 1.
    res = runner.invoke(app, doubt_opted_out_args(dep.router_url, dep, out))
    assert out.is_file(), res.output
    return res.exit_code, json.loads(out.read_text())


def _failed(report: dict[str, Any]) -> list[str]:
    return [f["id"] for f in report["findings"] if f["outcome"] == "failed"]


def _handoff(report: dict[str, Any]) -> dict[str, Any]:
    return next(f for f in report["findings"] if f["id"] == HANDOFF)


@pytest.mark.slow
@pytest.mark.parametrize("skip", [False, True], ids=["text", "skip-tokenizer-init"])
def test_sim_handoff_fault_at_start_fails_check_on_the_handoff_check(
    deployment: Any, tmp_path: Path, skip: bool
) -> None:
    dep = deployment(
        emulate="0.5.22",
        context_length=8192,
        prefill_pool=10240,
        skip_tokenizer_init=skip,
        extra_env={faults.ENV: faults.HANDOFF_LAYOUT},
    )
    code, report = _check(dep, tmp_path / "r.json")
    assert code == ExitStatus.GATE_FAILED, _failed(report)
    assert _failed(report) == [HANDOFF], _failed(report)
    f = _handoff(report)
    assert "position 1" in f["summary"] and "logprob" in f["summary"] and "rid kvgate-" in f["summary"]


@pytest.mark.slow
def test_sim_healthy_passes_then_the_fault_switched_on_at_run_time_fails(deployment: Any, tmp_path: Path) -> None:
    dep = deployment(emulate="0.5.22", context_length=8192, prefill_pool=10240)
    code, report = _check(dep, tmp_path / "healthy.json")
    f = _handoff(report)
    assert code == ExitStatus.PASSED and f["outcome"] == "passed", (_failed(report), f["summary"])
    assert "at all 6 compared positions" in f["summary"], f["summary"]
    requests = next(e["value"] for e in f["evidence"] if e["field"] == "handoff.requests")
    assert {r["prompt"] for r in requests} == {"one_page", "pages_partial", "near_limit"}
    assert all(r["rid"].startswith("kvgate-") and r["status"] == 200 for r in requests)
    for url in dep.decode_urls:
        r = httpx.post(url + "/sim/fault", json={"fault": faults.HANDOFF_LAYOUT}, timeout=10)
        assert r.json() == {"fault": faults.HANDOFF_LAYOUT}
    code, report = _check(dep, tmp_path / "faulty.json")
    assert code == ExitStatus.GATE_FAILED and _failed(report) == [HANDOFF], _failed(report)
