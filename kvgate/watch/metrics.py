"""The watcher's Prometheus metrics (prometheus_client, in a registry of its own).

Every name is listed in METRIC_NAMES (the README and the examples are tested against it). Series of
workers or checks that are gone are removed on each update, so the series count follows the fleet.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kvgate.output import sinks
from kvgate.output.redact import redact
from kvgate.results.findings import Finding, Outcome, Report
from kvgate.watch.budget import WINDOW_S
from kvgate.watch.fleetpass import CHANGE_KINDS
from kvgate.watch.handoff import ROUND_SKIPS
from kvgate.watch.isolation import BURST_SKIPS, VIOLATION_KINDS
from kvgate.watch.latency import BUCKETS
from kvgate.watch.probes import SKIP_REASONS

#: the outcome code of kvgate_check_outcome: the exit-status semantics of one finding, and 2 for info
#: (reported, not required: neither a pass nor a failure, never 0)
OUTCOME_CODE = {Outcome.PASSED: 0, Outcome.INFO: 2, Outcome.FAILED: 1, Outcome.INCONCLUSIVE: 3, Outcome.ERROR: 4}
#: which outcome of one (check, node) the series shows when several findings share it (a failure wins)
_RANK = {0: 0, 2: 1, 3: 2, 4: 3, 1: 4}
#: the label of the probes' prompt-length class (`one_page`, `long`); never `bucket`, which reads as a
#: histogram's own `le` bucket
LENGTH_LABEL = "prompt_length"

#: how the skip counter labels an isolation burst not sent
BURST_SKIP_PREFIX = "isolation burst: "
#: how the skip counter labels a handoff round not sent
ROUND_SKIP_PREFIX = "handoff round: "
#: why a full gate ran (`kvgate_full_gates_total`'s reasons)
GATE_REASONS = ("start", "change", "schedule", "leak")

#: latency buckets' histogram boundaries (seconds)
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

METRIC_NAMES = (
    "kvgate_verdict",
    "kvgate_verdict_age_seconds",
    "kvgate_worker_kv_pool_context_ratio",
    "kvgate_check_outcome",
    "kvgate_workers",
    "kvgate_metadata_pass_seconds",
    "kvgate_changes_total",
    "kvgate_full_gates_total",
    "kvgate_probe_requests_total",
    "kvgate_probe_prefill_tokens_total",
    "kvgate_probe_skipped_total",
    "kvgate_probe_failures_total",
    "kvgate_probe_leaks_total",
    "kvgate_probe_prefill_seconds",
    "kvgate_latency_too_good",
    "kvgate_latency_long_p5_seconds",
    "kvgate_latency_one_page_median_seconds",
    "kvgate_budget_window_seconds",
    "kvgate_budget_window_requests",
    "kvgate_budget_window_prefill_tokens",
    "kvgate_budget_peak_window_requests",
    "kvgate_budget_peak_window_prefill_tokens",
    "kvgate_isolation_ok",
    "kvgate_isolation_violations_total",
    "kvgate_isolation_bursts_total",
    "kvgate_isolation_confident_positions",
    "kvgate_handoff_ok",
    "kvgate_handoff_rounds_total",
    "kvgate_handoff_compared_positions_total",
    "kvgate_handoff_disagreements_total",
)


class WatchMetrics:
    """The metrics and the one registry /metrics renders."""

    def __init__(self, verdict_time: Callable[[], float | None]) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.verdict = Gauge(
            "kvgate_verdict",
            "Exit status of the last full gate: 0 passed, 1 failed, 3 inconclusive, 4 unreachable (-1: none yet)",
            registry=r,
        )
        self.verdict.set(-1)
        age = Gauge("kvgate_verdict_age_seconds", "Seconds since the last full gate (-1: none yet)", registry=r)

        def _age() -> float:
            t = verdict_time()
            return -1.0 if t is None else time.time() - t

        age.set_function(_age)
        self.ratio = Gauge(
            "kvgate_worker_kv_pool_context_ratio",
            "KV pool tokens / context length of each worker (the runbook wants >= the headroom, 1.25)",
            ["worker", "role"],
            registry=r,
        )
        self.outcome = Gauge(
            "kvgate_check_outcome",
            "Outcome of each check of the last full gate: 0 passed, 1 failed, 2 info (reported, not required), "
            "3 inconclusive, 4 error",
            ["check", "node"],
            registry=r,
        )
        self.workers = Gauge("kvgate_workers", "Workers listed, by the last pass", ["state"], registry=r)
        self.pass_seconds = Gauge("kvgate_metadata_pass_seconds", "Wall time of the last metadata pass", registry=r)
        self.changes = Counter("kvgate_changes", "Changes seen by the metadata pass", ["fact"], registry=r)
        self.full_gates = Counter("kvgate_full_gates", "Full gate runs, by what triggered them", ["reason"], registry=r)
        self.requests = Counter("kvgate_probe_requests", "Scheduled probes sent", [LENGTH_LABEL], registry=r)
        self.prefill_tokens = Counter(
            "kvgate_probe_prefill_tokens", "Prompt tokens of the scheduled probes sent", registry=r
        )
        self.skipped = Counter("kvgate_probe_skipped", "Scheduled probes not sent", ["reason"], registry=r)
        self.failures = Counter("kvgate_probe_failures", "Scheduled probes not served", [LENGTH_LABEL], registry=r)
        self.leaks = Counter("kvgate_probe_leaks", "Foreign sentinels seen in scheduled probes' answers", registry=r)
        self.durations = Histogram(
            "kvgate_probe_prefill_seconds",
            "Duration of served scheduled probes (time to a short answer), by prompt length",
            [LENGTH_LABEL],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.too_good = Gauge(
            "kvgate_latency_too_good",
            "1: the long bucket's p5 fell to the one-page median (latency too good); 0: not; -1: too few samples",
            registry=r,
        )
        self.too_good.set(-1)
        self.long_p5 = Gauge("kvgate_latency_long_p5_seconds", "p5 of the long bucket's durations", registry=r)
        self.short_median = Gauge(
            "kvgate_latency_one_page_median_seconds", "Median of the one-page bucket's durations", registry=r
        )
        window = Gauge("kvgate_budget_window_seconds", "Length of the probe budget's sliding window", registry=r)
        window.set(WINDOW_S)  # the budget gauges count what fits in (or was sent in) one window
        self.budget_requests = Gauge(
            "kvgate_budget_window_requests", "Probe budget: requests allowed in any one window", registry=r
        )
        self.budget_tokens = Gauge(
            "kvgate_budget_window_prefill_tokens", "Probe budget: prompt tokens allowed in any one window", registry=r
        )
        self.peak_requests = Gauge(
            "kvgate_budget_peak_window_requests", "Most probe requests sent in any one window so far", registry=r
        )
        self.peak_tokens = Gauge(
            "kvgate_budget_peak_window_prefill_tokens",
            "Most probe prompt tokens sent in any one window so far",
            registry=r,
        )

        self.isolation_ok = Gauge(
            "kvgate_isolation_ok",
            "Golden set sent together after the passed gate: 1 every burst kept its confident tokens, "
            "0 a corruption abort or a changed confident token was seen, -1 no golden set yet",
            registry=r,
        )
        self.isolation_ok.set(-1)
        self.isolation_violations = Counter(
            "kvgate_isolation_violations",
            "Golden-set answers under load that aborted as corruption or changed a confident token",
            ["kind"],
            registry=r,
        )
        self.isolation_bursts = Counter(
            "kvgate_isolation_bursts", "Golden-set bursts sent (all prompts at once)", registry=r
        )
        self.isolation_confident = Gauge(
            "kvgate_isolation_confident_positions",
            "Confident token positions of the golden set (0: only corruption aborts are judged)",
            registry=r,
        )

        self.handoff_ok = Gauge(
            "kvgate_handoff_ok",
            "Handoff rounds after the gate (prefill recomputing decode's confident tokens): 1 every compared "
            "position agreed, 0 a confident disagreement was seen, -1 no position compared yet",
            registry=r,
        )
        self.handoff_ok.set(-1)
        self.handoff_rounds = Counter(
            "kvgate_handoff_rounds", "Handoff rounds sent (one prompt answered, then replayed on prefill)", registry=r
        )
        self.handoff_compared = Counter(
            "kvgate_handoff_compared_positions",
            "Answer positions where decode's and prefill's tokens were both confident and compared",
            registry=r,
        )
        self.handoff_disagreements = Counter(
            "kvgate_handoff_disagreements",
            "Compared positions where prefill, on its own KV, computes another token than decode produced",
            registry=r,
        )

        # Every labelled counter starts at 0 for each label it can have, so an alert on its increase
        # sees the first one (a series born at 1 has no increase to see).
        for fact in CHANGE_KINDS:
            self.changes.labels(fact=fact)
        for reason in GATE_REASONS:
            self.full_gates.labels(reason=reason)
        for bucket in BUCKETS:
            self.requests.labels(bucket)
            self.failures.labels(bucket)
            self.durations.labels(bucket)
        skips = (
            *SKIP_REASONS,
            *(f"{BURST_SKIP_PREFIX}{why}" for why in BURST_SKIPS),
            *(f"{ROUND_SKIP_PREFIX}{why}" for why in ROUND_SKIPS),
        )
        for reason in skips:
            self.skipped.labels(reason=reason)
        for kind in VIOLATION_KINDS:
            self.isolation_violations.labels(kind=kind)

    def render(self) -> bytes:
        """The exposition text, through the output boundary (redacted; labels were neutralised when set)."""
        return sinks.http_body(generate_latest(self.registry).decode("utf-8"))

    def set_report(self, report: Report) -> None:
        """The verdict and one series per (check, node) of a full gate (the worst outcome of each)."""
        self.verdict.set(int(report.exit_status))
        worst: dict[tuple[str, str], int] = {}
        for f in report.findings:
            key = (f.test_id, f.node)
            if key not in worst or _RANK[_code(f)] > _RANK[worst[key]]:
                worst[key] = _code(f)
        self.outcome.clear()
        for (check, node), code in worst.items():
            self.outcome.labels(check=_label(check), node=_label(node)).set(code)

    def set_ratios(self, ratios: Iterable[tuple[str, str, float]]) -> None:
        self.ratio.clear()
        for worker, role, value in ratios:
            self.ratio.labels(worker=_label(worker), role=_label(role)).set(value)

    def set_workers(self, counts: Mapping[str, int]) -> None:
        self.workers.clear()
        for state, n in counts.items():
            self.workers.labels(state=_label(state)).set(n)


def _label(value: str) -> str:
    """A label value from a server (a worker URL, a node name): redacted, then one line of plain text."""
    return sinks.prom_label(redact(value))


def _code(f: Finding) -> int:
    return OUTCOME_CODE.get(f.outcome, 4)
