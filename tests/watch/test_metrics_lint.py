"""A promtool-style lint of the watcher's /metrics and the example alert rules: the exposition parses
(prometheus_client's own parser), names follow Prometheus' naming rules (base units, `_total` counters,
no unit a dashboard must convert), no label looks reserved (`le`, `quantile`, `bucket`), info has a
value of its own (not 0, which is passed), and the alert rules cover every role the metrics expose."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from kvgate.results.findings import Finding, Outcome, Report
from kvgate.watch.metrics import LENGTH_LABEL, OUTCOME_CODE, WatchMetrics

RULES = Path(__file__).resolve().parents[2] / "examples" / "kubernetes" / "watch" / "prometheusrule.yaml"
NAME = re.compile(r"^kvgate_[a-z][a-z0-9_]*$")
# Non-base units (promtool's "metric names should use base units"), and rates a dashboard must convert.
NOT_BASE = re.compile(r"_(milliseconds|microseconds|minutes|hours|days|per_minute|per_hour|percent|bytes_kb|kilobytes)")
RESERVED = {"le", "quantile", "bucket", "__name__"}
ROLES = ("prefill", "decode")


def _metrics() -> WatchMetrics:
    m = WatchMetrics(lambda: None)
    findings = tuple(Finding("g", f"c-{o.value}", "prefill[0] http://x", o, "s") for o in Outcome)
    m.set_report(Report(command="watch", findings=findings))
    m.set_ratios([("http://p", "prefill", 0.65), ("http://d", "decode", 2.0)])
    m.set_workers({"read": 2})
    m.requests.labels("long").inc()
    m.failures.labels("one_page").inc()
    m.durations.labels("long").observe(0.2)
    return m


def test_the_exposition_passes_the_lint() -> None:
    families = list(text_string_to_metric_families(_metrics().render().decode()))
    assert families
    for fam in families:
        assert NAME.match(fam.name), fam.name
        assert not NOT_BASE.search(fam.name), f"{fam.name}: not in base units"
        assert fam.documentation.strip(), f"{fam.name}: no help"
        if fam.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in fam.samples), fam.name
        for s in fam.samples:
            own = set(s.labels) - ({"le"} if fam.type == "histogram" and s.name.endswith("_bucket") else set())
            assert not own & RESERVED, f"{s.name}: reserved-looking label {own & RESERVED}"
    assert LENGTH_LABEL not in RESERVED


def test_info_is_not_passed() -> None:
    assert OUTCOME_CODE[Outcome.INFO] not in (OUTCOME_CODE[Outcome.PASSED], OUTCOME_CODE[Outcome.FAILED])
    assert len(set(OUTCOME_CODE.values())) == len(OUTCOME_CODE)  # one value per outcome
    text = _metrics().render().decode()
    assert 'kvgate_check_outcome{check="g.c-info",node="prefill[0] http://x"} 2.0' in text
    assert 'kvgate_check_outcome{check="g.c-passed",node="prefill[0] http://x"} 0.0' in text


def test_the_alert_rules_cover_every_role() -> None:
    rules = [
        r for doc in yaml.safe_load_all(RULES.read_text()) if doc for g in doc["spec"]["groups"] for r in g["rules"]
    ]
    exposed = {f.name for f in text_string_to_metric_families(_metrics().render().decode())}
    for rule in rules:
        used = set(re.findall(r"\bkvgate_[a-z0-9_]+", rule["expr"]))
        assert used and all(re.sub(r"_total$", "", u) in exposed for u in used), rule["alert"]
    pool = [r for r in rules if "kvgate_worker_kv_pool_context_ratio" in r["expr"]]
    assert pool, "no alert on the pool/context ratio"
    for role in ROLES:  # a rule that filters on one role leaves the other unwatched
        assert any(f'role="{role}"' in r["expr"] or "role=" not in r["expr"] for r in pool), role


def test_every_labelled_counter_starts_at_zero_for_every_label_it_can_have() -> None:
    """An alert on `increase(...) > 0` sees the first failure only if the series existed at 0 before it:
    a series born at 1 has no increase. Parsed with prometheus_client's own parser, before anything ran."""
    from kvgate.watch.fleetpass import CHANGE_KINDS
    from kvgate.watch.isolation import BURST_SKIPS, VIOLATION_KINDS
    from kvgate.watch.latency import BUCKETS
    from kvgate.watch.metrics import BURST_SKIP_PREFIX, GATE_REASONS
    from kvgate.watch.probes import SKIP_REASONS

    fresh = WatchMetrics(lambda: None).render().decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(fresh)
        for s in fam.samples
    }
    want = {
        "kvgate_changes_total": ("fact", CHANGE_KINDS),
        "kvgate_full_gates_total": ("reason", GATE_REASONS),
        "kvgate_probe_requests_total": (LENGTH_LABEL, BUCKETS),
        "kvgate_probe_failures_total": (LENGTH_LABEL, BUCKETS),
        "kvgate_probe_skipped_total": ("reason", (*SKIP_REASONS, *(BURST_SKIP_PREFIX + w for w in BURST_SKIPS))),
        "kvgate_isolation_violations_total": ("kind", VIOLATION_KINDS),
        "kvgate_probe_prefill_seconds_count": (LENGTH_LABEL, BUCKETS),
    }
    for name, (label, values) in want.items():
        assert values, name
        for value in values:
            assert samples.get((name, ((label, value),))) == 0.0, (name, value)
    assert {"process", "rank", "flag", "listing", "worker", "reachable"} <= set(CHANGE_KINDS)


def test_every_change_the_pass_can_log_has_a_counter_label() -> None:
    from kvgate.watch.fleetpass import CHANGE_KINDS, Change, FleetView, WorkerView, changes

    facts = {"pool": 1, "dp0 pool": 1, "problem x": "a", "flag y": 1, "process": {"startup_time": 1.0}}
    was = FleetView("ok", {"total": 1}, {"a": WorkerView((("r",),), facts, None), "b": WorkerView((), facts, None)})
    now_facts = {k: (v, 2) for k, v in facts.items()}
    now = FleetView(
        "partial: x", {"total": 2}, {"a": WorkerView((("s",),), now_facts, None), "c": WorkerView((), None, "down")}
    )
    found = changes(was, now)
    assert {c.kind for c in found} <= set(CHANGE_KINDS), {c.kind for c in found} - set(CHANGE_KINDS)
    assert (
        Change("w", "process", {"startup_time": 1}, {"startup_time": 2})
        .line()
        .endswith("(restarted: a new worker, gated whole again)")
    )
