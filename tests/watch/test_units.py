"""The watcher's parts without processes: budget, latency signal, change detection, settings, metrics, /verdict."""

from __future__ import annotations

import json
import re
import time
from dataclasses import astuple, replace
from pathlib import Path

import httpx
import pytest

from kvgate.errors import ProfileError
from kvgate.gates.base import CheckOptions
from kvgate.reading.discovery import RouterListing, RouterWorker
from kvgate.reading.node import NodeReading, NodeSpec, parse_node
from kvgate.results.findings import Report, failed, inconclusive, passed
from kvgate.watch.budget import TrafficBudget
from kvgate.watch.fleetpass import Change, FleetView, changes, view_of
from kvgate.watch.latency import ALERT, LONG, OK, ONE_PAGE, UNKNOWN, LatencySignal, percentile
from kvgate.watch.loop import Watcher
from kvgate.watch.metrics import METRIC_NAMES, WatchMetrics
from kvgate.watch.settings import WatchSettings


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_budget_never_exceeds_either_cap_in_any_minute() -> None:
    clock = Clock()
    b = TrafficBudget(requests_per_min=5, prefill_tokens_per_min=1000, clock=clock)
    sent: list[tuple[float, int]] = []
    for i in range(600):  # ten minutes, a try every second, lengths that sometimes hit the token cap
        tokens = 300 if i % 3 else 50
        if b.try_spend(tokens):
            sent.append((clock.t, tokens))
        clock.t += 1.0
    for t, _ in sent:  # every sliding minute, measured from the record
        window = [tok for s, tok in sent if t - 60 < s <= t]
        assert len(window) <= 5 and sum(window) <= 1000
    assert b.peak_requests <= 5 and b.peak_tokens <= 1000 and b.refused_total > 0
    assert b.requests_total == len(sent) and b.prefill_tokens_total == sum(t for _, t in sent)
    assert b.peak_requests == 5  # the budget was used, not merely respected


def test_budget_zero_sends_nothing() -> None:
    b = TrafficBudget(0, 1000)
    assert not b.try_spend(1) and b.per_interval(30) == 0


def test_latency_signal_states() -> None:
    sig = LatencySignal(window=50, min_samples=5)
    assert sig.state().state == UNKNOWN
    for i in range(10):
        sig.record(ONE_PAGE, 0.010 + i * 0.0001)
        sig.record(LONG, 0.050 + i * 0.001)
    assert sig.state().state == OK
    for _ in range(50):  # the long bucket collapses to the one-page level
        sig.record(LONG, 0.009)
    st = sig.state()
    assert st.state == ALERT and "latency too good" in st.reason
    assert st.long_p5_s is not None and st.one_page_median_s is not None and st.long_p5_s <= st.one_page_median_s
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0


def _info(pool: int, **extra: object) -> dict[str, object]:
    return {
        "version": "0.5.22",
        "disaggregation_mode": "prefill",
        "max_total_num_tokens": pool,
        "context_length": 4096,
        "max_req_input_len": min(4095, pool - 1) - 5,
        "page_size": 16,
        "startup_time": 1.0,
        "internal_states": [{"last_gen_throughput": 1.0, "memory_usage": {"token_capacity": pool, "kvcache": 0.1}}],
        **extra,
    }


def _models(context: int = 4096) -> dict[str, object]:
    return {"data": [{"id": "m", "max_model_len": context}]}


def _view(docs: dict[str, dict[str, object] | str], context: int = 4096) -> FleetView:
    """The fleet as a read of these server_info documents (or errors) and this served context sees it."""
    workers = [RouterWorker(u, u, "prefill", "ready", True) for u in docs]
    listing = RouterListing("http://router", "/workers", tuple(workers), total=len(workers))
    got: dict[str, NodeReading | str] = {
        u: d if isinstance(d, str) else parse_node(NodeSpec("prefill", u), "/server_info", d, _models(context), None)
        for u, d in docs.items()
    }
    return view_of(listing, got)


def test_changes_name_the_old_and_new_value() -> None:
    a = _view({"http://p:1": _info(8192), "http://p:2": _info(8192)})
    assert changes(None, a) == []
    # Volatile fields (load, live counters, a rank's live memory figures) are no change ...
    busy = _info(8192)
    busy["internal_states"] = [{"last_gen_throughput": 88.0, "memory_usage": {"token_capacity": 8192, "kvcache": 7}}]
    assert changes(a, _view({"http://p:1": busy, "http://p:2": _info(8192)})) == []
    # ... but a restart is: another process (startup time) is a new worker, whatever else it says.
    restarted = changes(a, _view({"http://p:1": _info(8192, startup_time=9.0), "http://p:2": _info(8192)}))
    assert [(c.worker, c.fact) for c in restarted] == [("http://p:1", "process")]
    assert "restarted: a new worker" in restarted[0].line()
    b = _view({"http://p:1": _info(2048), "http://p:3": _info(8192, tp_size=2)})
    lines = [c.line() for c in changes(a, b)]
    assert "http://p:1: pool 8192 -> 2048" in lines and "http://p:1: dp0 pool 8192 -> 2048" in lines
    assert "http://p:1: max_req_input_len 4090 -> 2042" in lines
    assert "http://p:2: worker listed -> gone" in lines and "http://p:3: worker absent -> listed" in lines
    assert "router: listing total 2 -> 2" not in lines
    c = _view({"http://p:1": _info(2048, tp_size=2), "http://p:3": "http://p:3/server_info: no answer in time"})
    lines = [x.line() for x in changes(b, c)]
    assert "http://p:1: flag tp_size (absent) -> 2" in lines
    assert any(x.startswith("http://p:3: reachable yes -> ") for x in lines)


def test_every_fact_the_gate_judges_is_compared() -> None:
    """One DP rank's pool, the served context (/v1/models), the router's entry: each a change."""
    two = _info(8192, dp_size=2)
    two["internal_states"] = [{"memory_usage": {"token_capacity": 8192}}, {"memory_usage": {"token_capacity": 8192}}]
    judged = _view({"http://p:1": two})
    low = json.loads(json.dumps(two))
    low["internal_states"][1]["memory_usage"]["token_capacity"] = 1000
    assert [c.line() for c in changes(judged, _view({"http://p:1": low}))] == ["http://p:1: dp1 pool 8192 -> 1000"]
    assert [c.line() for c in changes(judged, _view({"http://p:1": two}, context=16384))] == [
        "http://p:1: context 4096 -> 16384"
    ]
    moved = _view({"http://p:1": two})
    entry = RouterWorker("http://p:1", "http://p:1", "decode", "ready", True)
    moved = replace(moved, workers={"http://p:1": replace(moved.workers["http://p:1"], router=(astuple(entry),))})
    assert [c.fact for c in changes(judged, moved)] == ["router entry"]
    assert [c.kind for c in changes(judged, _view({"http://p:1": low}))] == ["rank"]


def test_settings_validate_every_key() -> None:
    assert WatchSettings.from_mapping({"interval_s": 10, "requests_per_min": 3}, "p").interval_s == 10
    with pytest.raises(ProfileError, match="watch.nope"):
        WatchSettings.from_mapping({"nope": 1}, "p")
    with pytest.raises(ProfileError, match="watch.requests_per_min"):
        WatchSettings.from_mapping({"requests_per_min": 1.5}, "p")
    with pytest.raises(ProfileError, match="watch.max_age_s"):
        WatchSettings.from_mapping({"interval_s": 60, "max_age_s": 30}, "p")


def _report(*findings: object) -> Report:
    return Report(command="check", findings=tuple(findings), strict=True)  # type: ignore[arg-type]


def test_metrics_carry_the_verdict_and_one_series_per_check() -> None:
    m = WatchMetrics(lambda: None)
    text = m.render().decode()
    for name in ("kvgate_verdict", "kvgate_verdict_age_seconds", "kvgate_latency_too_good"):
        assert re.search(rf"^{name} -1\.0$", text, re.M), name
    m.set_report(
        _report(
            passed("pool-context", "headroom", "prefill[0]", "ok"),
            inconclusive("pool-context", "headroom", "prefill[0]", "?"),
            failed("pool-context", "headroom", "prefill[0]", "no"),
            inconclusive("probes", "latency.prefill_scaling", "router", "?"),
        )
    )
    text = m.render().decode()
    assert "kvgate_verdict 1.0" in text
    assert 'kvgate_check_outcome{check="pool-context.headroom",node="prefill[0]"} 1.0' in text  # a failure wins
    assert 'kvgate_check_outcome{check="probes.latency.prefill_scaling",node="router"} 3.0' in text
    m.set_report(_report(passed("fleet", "router-list", "router", "ok")))
    assert "pool-context.headroom" not in m.render().decode()  # gone checks leave no stale series
    declared = set(METRIC_NAMES)
    rendered = {
        re.sub(r"_(total|bucket|count|sum|created)$", "", ln.split("{")[0].split()[0])
        for ln in text.splitlines()
        if ln.startswith("kvgate_")
    }
    assert rendered <= declared | {n.removesuffix("_total") for n in declared}


def test_verdict_is_200_only_for_a_fresh_pass(tmp_path: Path) -> None:
    settings = WatchSettings(interval_s=1, max_age_s=5)
    w = Watcher(CheckOptions(router_url="http://127.0.0.1:9"), settings, listen=("127.0.0.1", 0))
    w.endpoint.start()
    base = "http://{}:{}".format(*w.endpoint.address)
    try:
        r = httpx.get(base + "/verdict")
        assert r.status_code == 503 and r.json()["reason"] == "no full gate has finished yet"
        w.report, w.report_time = _report(passed("fleet", "router-list", "router", "ok")), time.time()
        r = httpx.get(base + "/verdict")
        assert r.status_code == 200 and r.json()["passed"] is True and r.json()["report"]["exit_status"] == 0
        w.report_time = time.time() - 60
        r = httpx.get(base + "/verdict")
        assert r.status_code == 503 and "older than the 5 s allowed" in r.json()["reason"]
        w.report, w.report_time = _report(inconclusive("probes", "setup", "router", "not run")), time.time()
        r = httpx.get(base + "/verdict")
        assert r.status_code == 503 and r.json()["exit_status"] == 3 and "probes.setup" in r.json()["reason"]
        assert httpx.get(base + "/healthz").status_code == 200
        assert httpx.get(base + "/nope").status_code == 404
        assert json.loads(httpx.get(base + "/verdict").text)["max_age_s"] == 5
    finally:
        w.endpoint.stop()
        w.http.close()


def test_a_change_makes_the_verdict_503_until_the_gate_it_triggers_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """A passed report stops vouching for the fleet the moment the pass sees its pool move: while the
    triggered gate runs (minutes on a real pair), /verdict is 503 "re-gating", not the stale 200."""
    import threading

    w = Watcher(CheckOptions(router_url="http://127.0.0.1:9"), WatchSettings(interval_s=1), listen=("127.0.0.1", 0))
    w.report, w.report_time, w.pending = _report(passed("fleet", "router-list", "router", "ok")), time.time(), None
    assert w.verdict_answer().status == 200
    moved = [Change("http://w", "pool", 10240, 4096)]
    during: list[tuple[int, str]] = []

    def gate(reason: str) -> None:
        answer = w.verdict_answer()
        during.append((answer.status, json.loads(answer.body)["reason"]))
        w.report, w.report_time, w.superseded = (
            _report(passed("fleet", "router-list", "router", "ok")),
            time.time(),
            None,
        )

    monkeypatch.setattr(w, "metadata_pass", lambda: moved)
    monkeypatch.setattr(w, "full_gate", gate)
    monkeypatch.setattr(w, "run_probes", lambda stop, end: None)
    stop = threading.Event()
    stop.set()
    w.interval(stop)
    w.http.close()
    assert during == [
        (503, "re-gating: a change seen: http://w: pool 10240 -> 4096; the last full gate (passed) predates it")
    ]
    assert w.verdict_answer().status == 200  # the new gate passed: 200 again


def test_a_foreign_sentinel_in_a_probe_answer_regates_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from kvgate.watch.probes import ProbeOutcome

    w = Watcher(
        CheckOptions(router_url="http://127.0.0.1:9"),
        WatchSettings(interval_s=1, requests_per_min=60),
        listen=("127.0.0.1", 0),
    )
    seen = ("tenant-A (64 tokens) -> watch_long (<KVGABCDEFGHIJKLM>)",)

    class Leaky:
        def send(self) -> ProbeOutcome:
            return ProbeOutcome("long", 128, True, True, 0.01, seen)

    gates: list[str] = []

    def gate(reason: str) -> None:
        gates.append(reason)
        w.pending = None

    w.probes = Leaky()  # type: ignore[assignment]
    w.report_time, w.pending = time.time(), None  # the start's gate has run
    monkeypatch.setattr(w, "metadata_pass", lambda: [])
    monkeypatch.setattr(w, "full_gate", gate)
    try:
        w.interval(threading.Event())
    finally:
        w.endpoint.stop()
        w.http.close()
    assert gates == ["leak"]
    assert "kvgate_probe_leaks_total 1.0" in w.metrics.render().decode()
