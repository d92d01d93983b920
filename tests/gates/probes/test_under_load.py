"""probes.isolation.load: the margin rule and the verdicts (synthetic answers), then the whole probe
gate against simulated deployments behind the real router, healthy and with each injected fault."""

from __future__ import annotations

from typing import Any

import pytest

from kvgate.gates.probes import ProbeSettings
from kvgate.gates.probes.client import ProbeResult
from kvgate.gates.probes.load_plan import Plan, Prompt, plan_load
from kvgate.gates.probes.margin import score
from kvgate.gates.probes.plan import ProbeLimits
from kvgate.gates.probes.under_load import CHECK, CHECK_ERRORS, _judge
from kvgate.reading.node import NodeSpec, parse_node
from kvgate.results.findings import Outcome
from kvgate.sim import faults
from tests.assets.sglang_payloads import model_info, server_info, v1_models
from tests.gates.probes.test_probes_sim import check, probe

SETTINGS = ProbeSettings()
PLAN = Plan(short=3, long=0, copies=2, waves=1, short_len=32, long_len=512, limit=None)


def answer(ids: list[int], margins: list[float] | None = None, status: int = 200, raw: str = "") -> ProbeResult:
    """A /generate answer as SGLang shapes it: output_ids and per-token [logprob, id, text] top-2 lists."""
    if status != 200:
        return ProbeResult("p", 32, 4, status, 0.1, {"object": "error", "message": raw}, raw)
    tops = (
        [[[-0.01, t, None], [-0.01 - m, t + 1, None]] for t, m in zip(ids, margins, strict=True)]
        if margins is not None
        else None
    )
    meta: dict[str, Any] = {"finish_reason": {"type": "length"}, "completion_tokens": len(ids)}
    if tops is not None:
        meta["output_top_logprobs"] = tops
    return ProbeResult("p", 32, 4, 200, 0.1, {"output_ids": ids, "meta_info": meta}, "{}")


SURE = [5.0] * 4
REFS = {"a": [10, 11, 12, 13], "b": [20, 21, 22, 23], "c": [30, 31, 32, 33], "control": [40, 41, 42, 43]}


def run(wave: dict[str, ProbeResult], refs: dict[str, list[float]] | None = None) -> dict[str, Any]:
    solo = {k: answer(v, (refs or {}).get(k, SURE)) for k, v in REFS.items()}
    prompts = {k: Prompt(k, [1], 4) for k in REFS}
    batch = [(prompts[k.split("#")[0]], res) for k, res in wave.items()]
    found = _judge(PLAN, False, SETTINGS, solo, [batch], "router")
    return {f.check: f for f in found}


def healthy_wave() -> dict[str, ProbeResult]:
    return {k: answer(v, SURE) for k, v in REFS.items()} | {"control#2": answer(REFS["control"], SURE)}


def test_margin_rule_judges_only_confident_positions() -> None:
    sc = score(answer([1, 2, 3], [3.0, 0.5, 2.5]), margin=2.0)
    assert sc is not None and sc.confident == (True, False, True)
    assert sc.changed([1, 9, 3]) == []  # a near-tie flipped: noise, not judged
    assert sc.changed([1, 2, 4]) == [2]
    assert sc.changed([1]) == [2]  # ended early at a confident position
    # top-1 that is not the emitted token, or one entry only: not confident
    odd = answer([1], [3.0])
    odd.body["meta_info"]["output_top_logprobs"] = [[[-0.1, 7, None], [-5.0, 1, None]]]
    assert score(odd, 2.0).confident == (False,)  # type: ignore[union-attr]
    assert score(answer([1, 2], None), 2.0).scored is False  # type: ignore[union-attr]
    assert score(answer([1, 2], None), 2.0, exact=True).confident == (True, True)  # type: ignore[union-attr]


def test_healthy_wave_passes_and_counts_what_it_judged() -> None:
    f = run(healthy_wave())
    assert f[CHECK].outcome == Outcome.PASSED and "20 confident token positions kept" in f[CHECK].summary
    assert f[CHECK_ERRORS].outcome == Outcome.PASSED


def test_foreign_first_token_fails_naming_donor_and_victim() -> None:
    wave = healthy_wave() | {"a": answer([20, 11, 12, 13], SURE)}
    f = run(wave)[CHECK]
    assert f.outcome == Outcome.FAILED
    assert "a [wave 1] (victim) carried the first token of b (donor)" in f.summary


def test_corruption_abort_fails_naming_the_upstream_reports() -> None:
    wave = healthy_wave() | {"b": answer([], status=500, raw=faults.ABORT_MESSAGE)}
    f = run(wave)
    assert f[CHECK].outcome == Outcome.FAILED and "#17259/#22716" in f[CHECK].summary
    assert f[CHECK_ERRORS].outcome == Outcome.PASSED  # a corruption abort is judged once, as corruption


def test_control_noise_is_inconclusive_never_failed() -> None:
    wave = healthy_wave() | {"control#2": answer([40, 41, 99, 43], SURE), "c": answer([30, 31, 98, 33], SURE)}
    f = run(wave)[CHECK]
    assert f.outcome == Outcome.INCONCLUSIVE and "--enable-deterministic-inference" in (f.remedy or "")


def test_changed_confident_token_with_agreeing_control_fails() -> None:
    f = run(healthy_wave() | {"c": answer([30, 31, 98, 33], SURE)})[CHECK]
    assert f.outcome == Outcome.FAILED and "changed a token the model was confident of" in f.summary


def test_near_ties_never_fail_and_nothing_compared_passes_nothing() -> None:
    noisy = {k: [0.1] * 4 for k in REFS}
    wave = {k: answer([t + 1 for t in v], [0.1] * 4) for k, v in REFS.items()}
    f = run(wave, noisy)[CHECK]
    # Every token changed, but none was one the model was sure of: not a failure, and not a pass either,
    # since a request given another's tokens would have looked the same.
    assert f.outcome == Outcome.INCONCLUSIVE and "no token was compared" in f.summary
    assert "probes.load_new_tokens" in (f.remedy or "") and "--enable-deterministic-inference" in (f.remedy or "")


class Answers:
    """A stand-in for GenerateClient (not a server): greedy answers whose confidence the test chooses per
    request, in the order requests arrive; every answer is the prompt's own (no corruption)."""

    def __init__(self, sure_from: int | None, sure_names: tuple[str, ...] = ()) -> None:
        self.sure_from = sure_from  # requests from this index on are answered confidently (None: never)
        self.sure_names = sure_names  # and these prompts always
        self.sent: list[tuple[str, list[int]]] = []

    def generate(
        self, name: str, ids: list[int], max_new_tokens: int, rid: str = "", top_logprobs: int = 0
    ) -> ProbeResult:
        n = len(self.sent)
        self.sent.append((name, ids))
        sure = (self.sure_from is not None and n >= self.sure_from) or name in self.sure_names
        out = [ids[0] + j for j in range(max_new_tokens)]
        return answer(out, [5.0 if sure else 0.1] * max_new_tokens)


def load_run(sure_from: int | None, sure_names: tuple[str, ...] = (), **settings_: Any) -> tuple[Any, Answers]:
    from kvgate.gates.probes.canary import Sender
    from kvgate.gates.probes.cost import CostMeter
    from kvgate.gates.probes.sentinels import ByteCodec
    from kvgate.gates.probes.under_load import run_load
    from kvgate.output.progress import NullObserver

    client = Answers(sure_from, sure_names)
    lim = ProbeLimits(context=8192, max_req_input_len=8000, page_size=16)
    settings = ProbeSettings(**({"load_concurrency": 6, "load_waves": 1} | settings_))
    sender = Sender(client, ByteCodec(settings.byte_offset), CostMeter(context=8192), NullObserver())  # type: ignore[arg-type]
    found = run_load(sender, lim, settings, [reading_with(max_running_requests=None)], "router")
    return {f.check: f for f in found}[CHECK], client


def test_prompts_whose_answers_alone_hold_no_confident_token_are_replaced_once() -> None:
    f, client = load_run(sure_from=5)  # the first solo pass (4 distinct + control) all near-ties
    solo = [name for name, _ in client.sent[:10]]
    assert solo[:5] == ["load-short00", "load-short01", "load-short02", "load-long00", "load-control"]
    assert solo[5:] == solo[:5]  # each redrawn once, a fresh prompt of the same length
    assert [len(ids) for _, ids in client.sent[5:10]] == [len(ids) for _, ids in client.sent[:5]]
    assert all(a != b for (_, a), (_, b) in zip(client.sent[:5], client.sent[5:10], strict=True))
    assert f.outcome == Outcome.PASSED and "confident token positions kept" in f.summary
    assert {e.field: e.value for e in f.evidence}["isolation.load.redrawn"] == [
        "short00",
        "short01",
        "short02",
        "long00",
        "control",
    ]


def test_a_model_never_sure_of_a_token_gets_one_more_solo_pass_then_inconclusive() -> None:
    f, client = load_run(sure_from=None)
    assert len(client.sent) == 5 + 5 + 6  # alone, one fresh draw each, one wave of 6: no wave can add one
    assert f.outcome == Outcome.INCONCLUSIVE and "no token was compared" in f.summary


def test_a_few_judged_positions_pass_nothing() -> None:
    """Stop 53: a real decode whose room check was bypassed passed on 2 judged positions. Below
    probes.load_min_positions the waves showed too little, whatever else they showed."""
    sure_control = {k: SURE if k == "control" else [0.1] * 4 for k in REFS}
    f = run({k: answer(v, [0.1] * 4) for k, v in REFS.items()}, sure_control)[CHECK]
    ev = {e.field: e.value for e in f.evidence}
    assert ev["isolation.load.confident_positions_judged"] == 4
    assert f.outcome == Outcome.INCONCLUSIVE and "only 4 confident token positions" in f.summary
    assert "probes.load_min_positions (10)" in f.summary and "--enable-deterministic-inference" in (f.remedy or "")
    assert run(healthy_wave(), sure_control)[CHECK].outcome == Outcome.INCONCLUSIVE  # 8 judged
    one = ProbeSettings(load_min_positions=4)
    solo = {k: answer(v, sure_control[k]) for k, v in REFS.items()}
    batch = [(Prompt(k, [1], 4), answer(v, [0.1] * 4)) for k, v in REFS.items()]
    assert {g.check: g for g in _judge(PLAN, False, one, solo, [batch], "r")}[CHECK].outcome == Outcome.PASSED


def test_thin_evidence_sends_more_waves_until_enough_is_judged() -> None:
    """Only the control is sure of its tokens: a wave of 6 judges its 2 copies' 8 positions, below 10, so a
    second wave is sent and the check passes on 16."""
    f, client = load_run(None, ("load-control",))
    ev = {e.field: e.value for e in f.evidence}
    assert f.outcome == Outcome.PASSED and ev["isolation.load.waves_sent"] == 2, f.summary
    assert ev["isolation.load.confident_positions_judged"] == 16
    assert len(client.sent) == 5 + 5 + 2 * 6  # alone, one more solo pass of fresh draws, two waves


def test_thin_evidence_stops_at_four_times_the_waves_then_is_inconclusive() -> None:
    f, client = load_run(None, ("load-control",), load_min_positions=100)
    ev = {e.field: e.value for e in f.evidence}
    assert ev["isolation.load.waves_sent"] == 4 and len(client.sent) == 5 + 5 + 4 * 6
    assert f.outcome == Outcome.INCONCLUSIVE and "only 32 confident token positions" in f.summary
    assert "after 4 wave(s)" in f.summary


def test_other_errors_under_load_are_their_own_finding() -> None:
    f = run(healthy_wave() | {"a": answer([], status=502, raw="bad gateway")})
    assert f[CHECK_ERRORS].outcome == Outcome.FAILED and "HTTP 502" in f[CHECK_ERRORS].summary
    shed = run(healthy_wave() | {"a": answer([], status=503, raw="busy")})
    assert shed[CHECK_ERRORS].outcome == Outcome.INCONCLUSIVE


def test_waves_none_of_which_was_answered_compare_nothing_and_pass_nothing() -> None:
    late = ProbeResult("p", 32, 4, None, 20.0, timed_out=True, deadline_s=20.0)
    f = run({k: late for k in healthy_wave()})
    assert f[CHECK].outcome == Outcome.INCONCLUSIVE and "none of the 5 requests sent together" in f[CHECK].summary
    assert f[CHECK_ERRORS].outcome == Outcome.INCONCLUSIVE


def test_a_wave_request_not_sent_after_the_deployment_stopped_answering_is_no_error() -> None:
    unsent = ProbeResult("p", 32, 4, None, 0.0, not_sent="3 accepted-length requests in a row got no answer")
    f = run(healthy_wave() | {"a": unsent})
    assert f[CHECK_ERRORS].outcome == Outcome.INCONCLUSIVE and "not sent: 3 accepted" in f[CHECK_ERRORS].summary
    assert f[CHECK].outcome == Outcome.PASSED  # the four answered together were compared


def reading_with(**fields: Any) -> Any:
    info = server_info(mode="decode", context=8192, pool=65536, page_size=16) | fields
    return parse_node(NodeSpec("decode", "http://127.0.0.1:9"), "/server_info", info, v1_models(8192), model_info())


def test_wave_size_follows_the_running_request_limit() -> None:
    lim = ProbeLimits(context=8192, max_req_input_len=8000, page_size=16)
    assert plan_load(lim, SETTINGS, [reading_with(max_running_requests=None)]).per_wave == 20
    small = plan_load(lim, SETTINGS, [reading_with(max_running_requests=6)])
    assert small.per_wave == 6 and small.limit == 6
    assert small.short + small.long + small.copies == 6 and small.copies == 2


# -- against the simulator (slow) ----------------------------------------------------------------

LIGHT = {"abort_probe": False, "deadline_s": 20}


@pytest.mark.slow
@pytest.mark.parametrize("skip", [False, True], ids=["text", "skip-tokenizer-init"])
def test_healthy_release_passes(deployment: Any, skip: bool) -> None:
    dep = deployment(emulate="0.5.22", context_length=8192, prefill_pool=10240, skip_tokenizer_init=skip)
    report = check(dep, LIGHT)
    f = probe(report, CHECK)
    assert f.outcome == Outcome.PASSED, f.summary
    assert "confident token positions kept" in f.summary
    assert probe(report, CHECK_ERRORS).outcome == Outcome.PASSED


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "said"),
    [
        (faults.META_SLOT_SHARED, "aborted as metadata/context corruption"),
        (faults.META_SLOT_SHARED_UNCHECKED, "carried the first token of"),
        (faults.EARLY_PAGE_REUSE, "carried the tokens of"),
    ],
)
def test_each_injected_fault_fails_the_load_probe(deployment: Any, fault: str, said: str) -> None:
    dep = deployment(emulate="0.5.22", context_length=8192, prefill_pool=10240, extra_env={faults.ENV: fault})
    report = check(dep, {**LIGHT, "isolation_probe": False})
    f = probe(report, CHECK)
    assert f.outcome == Outcome.FAILED, f.summary
    assert said in f.summary and "(victim)" in f.summary if "carried" in said else said in f.summary
