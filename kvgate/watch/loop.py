"""The watch loop: every interval a metadata pass; a full gate at start, on any change, on a leak
and on schedule; the scheduled probes spread over what is left of the interval.

The verdict is the last full gate's report (kvgate.pipeline.check.run_check over the router's whole worker
list: the fleet gate fails a run through the router that leaves listed workers out, so a change
re-gates the whole fleet, changed workers included, at once). The pass and the probes only decide
when the gate runs and feed the metrics.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import httpx

from kvgate.defaults import PROBE_BODY_CAP
from kvgate.exitcodes import ExitStatus
from kvgate.formats.json_report import JsonFormatter
from kvgate.gates.base import CheckOptions
from kvgate.gates.probes.codec_select import select_codec
from kvgate.gates.probes.margin import deterministic
from kvgate.gates.probes.plan import limits_from_readings
from kvgate.gates.probes.settings import ProbeSettings
from kvgate.pipeline.check import default_gates, run_check
from kvgate.reading.httpbounds import bounded_client
from kvgate.reading.node import DECODE, PREFILL, NodeReading
from kvgate.results.findings import INTERNAL_CHECK, Finding, Outcome, Report
from kvgate.watch import handoff, isolation
from kvgate.watch.budget import TrafficBudget
from kvgate.watch.endpoint import Answer, Endpoint, json_answer
from kvgate.watch.fleetpass import Change, FleetSnapshot, FleetView, ReadingsTap, changes, read_fleet
from kvgate.watch.heap import limit_arenas, release_heap
from kvgate.watch.latency import ALERT, UNKNOWN, LatencySignal
from kvgate.watch.metrics import BURST_SKIP_PREFIX, ROUND_SKIP_PREFIX, WatchMetrics
from kvgate.watch.probes import ScheduledProbes
from kvgate.watch.route import ProbeRoute
from kvgate.watch.settings import WatchSettings

Log = Callable[[str], None]


class Watcher:
    """One watch over one router. `run()` blocks until `stop` is set (or SIGTERM unwinds it)."""

    def __init__(
        self,
        options: CheckOptions,
        settings: WatchSettings,
        *,
        listen: tuple[str, int],
        token: str | None = None,
        log: Log = lambda _m: None,
        clock: Callable[[], float] = time.monotonic,
        router_token: str | None = None,
    ) -> None:
        if not options.router_url:
            raise ValueError("kvgate watch needs a router URL")
        limit_arenas()
        self.options = options
        self.router = options.router_url.rstrip("/")
        self.settings = settings
        self.token = token
        self.router_token = router_token  # the router's control-plane key: /workers and /get_loads only
        self.log = log
        self.probe_settings = ProbeSettings.from_mapping(options.probes, options.profile_name or "probe settings")
        default_gates(options)  # a bad profile section is a usage error before anything starts
        self.clock = clock  # the schedule's clock (bench/watch_soak.py runs an hour on a simulated one)
        self.budget = TrafficBudget(settings.requests_per_min, settings.prefill_tokens_per_min, clock=clock)
        self.latency = LatencySignal(settings.latency_window, settings.latency_min_samples)
        self.report: Report | None = None
        self.report_time: float | None = None
        self.last: FleetSnapshot | None = None
        self.judged: FleetView | None = None  # the fleet as the last full gate judged it
        self.probes: ScheduledProbes | None = None
        self.probes_note = "no full gate yet"
        self._probe_problem: str | None = None  # why the last scheduled probe was not served
        # The golden set of the last passed gate (isolation.py), and the violation it saw: it stays in
        # the report (/verdict 503) until a gate that a fleet change triggered passes, or the watch restarts.
        self.isolation: isolation.IsolationWatch | None = None
        self.isolation_finding: Finding | None = None
        self.isolation_note = "no full gate yet"
        self.isolation_every = isolation.burst_every(settings.requests_per_min, settings.interval_s)
        self.isolation_since = 0  # the interval the golden set was recorded in
        # The handoff rounds (handoff.py) and the disagreement they saw: it stands as the isolation
        # finding does. A due round takes the scheduled probes' slots until the budget has room for it.
        self.handoff: handoff.HandoffWatch | None = None
        self.handoff_finding: Finding | None = None
        self.handoff_note = "no full gate yet"
        self.handoff_every = handoff.round_every(settings.requests_per_min, settings.interval_s)
        self.handoff_since = 0  # the interval the rounds were planned in
        self.handoff_due = False
        self.pending: str | None = "start"
        # Why the last report no longer describes the fleet (a change or a leak seen since), until the
        # gate that re-judges it ends: /verdict is then 503, however the last report came out.
        self.superseded: str | None = None
        self.last_pass: float | None = None
        self.in_gate = False
        self.intervals = 0
        self.latency_state = UNKNOWN
        self.metrics = WatchMetrics(lambda: self.report_time)
        self.metrics.budget_requests.set(settings.requests_per_min)
        self.metrics.budget_tokens.set(settings.prefill_tokens_per_min)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # The probes (scheduled and the codec's tokenize round trip) go through check's bounded client:
        # identity bodies only, a body cap, the whole exchange within the timeout.
        self.http = bounded_client(
            timeout=options.timeout, body_cap=PROBE_BODY_CAP, verify=httpx.create_ssl_context(), headers=headers
        )
        self.endpoint = Endpoint(
            listen[0],
            listen[1],
            {"/metrics": self._metrics, "/healthz": self._healthz, "/verdict": self.verdict_answer},
        )

    # -- HTTP -----------------------------------------------------------------------------

    def _metrics(self) -> Answer:
        return Answer(200, "text/plain; version=0.0.4; charset=utf-8", self.metrics.render())

    def _healthz(self) -> Answer:
        stale = max(3 * self.settings.interval_s, 60.0)
        age = None if self.last_pass is None else time.monotonic() - self.last_pass
        ok = self.in_gate or age is None or age <= stale
        return json_answer(
            200 if ok else 503,
            {"ok": ok, "last_pass_age_s": None if age is None else round(age, 3), "in_full_gate": self.in_gate},
        )

    def verdict_answer(self) -> Answer:
        """200 only for a passed full gate younger than max_age_s; else 503 with the reason."""
        max_age = self.settings.max_age_s
        report, at = self.report, self.report_time
        if report is None or at is None:
            return json_answer(
                503, {"passed": False, "reason": "no full gate has finished yet", "max_age_s": max_age, "report": None}
            )
        age = time.time() - at
        status = report.exit_status
        if self.isolation_finding is not None:
            reason = f"isolation under load failed after the gate passed: {self.isolation_finding.summary}"
        elif self.handoff_finding is not None:
            reason = f"the handoff check failed after the gate: {self.handoff_finding.summary}"
        elif self.superseded is not None:
            reason = f"re-gating: {self.superseded}; the last full gate ({status.name.lower()}) predates it"
        elif status is not ExitStatus.PASSED:
            reason = f"the last full gate did not pass: {status.name.lower()} (exit {int(status)})"
            firsts = [f"{f.test_id} {f.node}: {f.summary}" for f in report.findings if f.outcome in _BLOCKING][:3]
            if firsts:
                reason += ": " + "; ".join(firsts)
        elif age > max_age:
            reason = f"the last full gate passed {age:.0f} s ago, older than the {max_age:g} s allowed"
        else:
            reason = "passed"
        passed = reason == "passed"
        return json_answer(
            200 if passed else 503,
            {
                "passed": passed,
                "reason": reason,
                "exit_status": int(status),
                "verdict": status.name.lower(),
                "age_s": round(age, 3),
                "max_age_s": max_age,
                "report": json.loads(JsonFormatter().render(report)),
            },
        )

    # -- the loop ---------------------------------------------------------------------------

    def run(self, stop: threading.Event, max_intervals: int | None = None) -> None:
        self.endpoint.start()
        host, port = self.endpoint.address
        self.log(
            f"watching {self.router} every {self.settings.interval_s:g} s; /metrics /healthz /verdict on "
            f"http://{host}:{port}; probe budget {self.settings.requests_per_min} requests and "
            f"{self.settings.prefill_tokens_per_min:,} prefill tokens per minute"
        )
        try:
            while not stop.is_set() and (max_intervals is None or self.intervals < max_intervals):
                self.interval(stop)
        finally:
            self.endpoint.stop()
            self.http.close()
            self.log("watch stopped")

    def interval(self, stop: threading.Event) -> None:
        t0 = self.clock()
        end = t0 + self.settings.interval_s
        found = self.metadata_pass()
        if found:
            self.pending = self.pending or "change"
            more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
            self.superseded = self.superseded or "a change seen: " + "; ".join(c.line() for c in found[:3]) + more
        if self.pending is None and self.report_time is not None:
            if time.time() - self.report_time >= self.settings.regate_every_s:
                self.pending = "schedule"
        if self.pending is not None:
            self.full_gate(self.pending)
        self.run_isolation()
        if self.handoff is not None and self.handoff_finding is None:
            if (self.intervals - self.handoff_since) % self.handoff_every == 0:
                self.handoff_due = True
        self.run_probes(stop, end)
        if self.pending == "leak":  # a foreign sentinel in a probe's answer: re-gate now, not next interval
            self.full_gate("leak")
        stop.wait(max(0.0, end - self.clock()))
        self.intervals += 1

    def metadata_pass(self) -> list[Change]:
        snap = read_fleet(
            self.router,
            timeout=self.options.timeout,
            token=self.token,
            concurrency=self.settings.pass_concurrency,
            deadline_s=max(self.options.timeout, self.settings.interval_s),
            expected=self.last.specs if self.last else (),
            router_token=self.router_token,
        )
        found = changes(self.judged, snap.view)
        for c in found:
            self.log(f"change: {c.line()}")
            self.metrics.changes.labels(fact=c.kind).inc()
        self.last = snap
        self.last_pass = time.monotonic()
        self.metrics.pass_seconds.set(snap.elapsed_s)
        self.metrics.set_workers({"read": len(snap.readings), "unreadable": len(snap.errors)})
        self._set_ratios()
        if snap.listing_error:
            self.log(f"router listing failed: {snap.listing_error}")
        return found

    def _set_ratios(self) -> None:
        rows = []
        for url, r in (self.last.readings if self.last else {}).items():
            if r.max_total_num_tokens and r.context_length:
                rows.append(
                    (
                        url,
                        r.role if r.role in (PREFILL, DECODE) else "worker",
                        r.max_total_num_tokens / r.context_length,
                    )
                )
        self.metrics.set_ratios(rows)

    def full_gate(self, reason: str) -> None:
        self.pending = None
        self.in_gate = True
        tap = ReadingsTap()
        try:
            report = run_check(
                self.options,
                token=self.token,
                gates=[*default_gates(self.options), tap],
                router_token=self.router_token,
            )
        except Exception as exc:  # noqa: BLE001 - a broken run is kvgate's error (exit 5), never a pass
            report = Report(
                command="watch",
                findings=(Finding("kvgate", INTERNAL_CHECK, "kvgate", Outcome.ERROR, f"{type(exc).__name__}: {exc}"),),
                strict=self.options.strict,
                fatal_status=ExitStatus.INTERNAL_ERROR,
            )
        finally:
            self.in_gate = False
        report = replace(report, command="watch")
        if self.isolation_finding is not None:
            if reason == "change" and report.exit_status is ExitStatus.PASSED:
                self.log("isolation: the changed fleet passed a full gate; the golden set is recorded again")
                self.isolation_finding = None
            else:
                report = replace(report, findings=(*report.findings, self.isolation_finding))
        if self.handoff_finding is not None:
            if reason == "change" and report.exit_status is ExitStatus.PASSED:
                self.log("handoff: the changed fleet passed a full gate; the handoff rounds start again")
                self.handoff_finding = None
            else:
                report = replace(report, findings=(*report.findings, self.handoff_finding))
        self.report, self.report_time, self.superseded = report, time.time(), None
        self.metrics.set_report(report)
        self.metrics.full_gates.labels(reason=reason).inc()
        status = report.exit_status
        self.log(f"full gate ({reason}): {status.name.lower()} (exit {int(status)}), {len(tap.readings)} workers read")
        for f in report.findings:
            if f.outcome in _BLOCKING and f.counts_toward_exit:
                self.log(f"  {f.outcome.value}: {f.test_id} {f.node}: {f.summary}")
        self.judged = tap.view(self.judged)
        self._set_ratios()
        self._plan_probes(tap.readings)
        release_heap()

    def _plan_probes(self, readings: Sequence[NodeReading]) -> None:
        self.probes = None
        self.isolation = None
        self.handoff = None
        self.handoff_due = False
        if not self.options.probes_enabled:
            self.probes_note = "probes are off (--no-probes)"
            return
        limits, problems = limits_from_readings(readings)
        if limits is None:
            self.probes_note = "cannot plan probe lengths: " + "; ".join(problems)
            self.log(f"scheduled probes paused: {self.probes_note}")
            return
        codec, how = select_codec(self.http, readings, self.probe_settings)
        if codec is None:
            self.probes_note = f"sentinels cannot be encoded ({how})"
            self.log(f"scheduled probes paused: {self.probes_note}")
            return
        route = ProbeRoute(self.http, self.router, limits, codec, self.probe_settings)
        self._record_golden(route)
        self._plan_handoff(route, deterministic(readings))
        probes = ScheduledProbes(route, self.budget)
        if not probes.enabled:
            self.probes_note = probes.why_disabled
            self.log(f"scheduled probes paused: {self.probes_note}")
            return
        self.probes = probes
        self.probes_note = f"one-page {probes.one_page} and long {probes.long:,} tokens"

    def _record_golden(self, route: ProbeRoute) -> None:
        """After a passed gate (with the load probe on and no violation standing): a new golden set."""
        if not self.probe_settings.load_probe:
            self.isolation_note = "probes.load_probe is off"
            return
        if not self.isolation_every:
            self.isolation_note = (
                f"a burst of {isolation.GOLDEN} requests does not fit watch.requests_per_min "
                f"({self.settings.requests_per_min}): raise it to check isolation under load"
            )
            self.log(f"isolation golden set not recorded: {self.isolation_note}")
            return
        if self.isolation_finding is not None or self.report is None:
            return
        if self.report.exit_status is not ExitStatus.PASSED:
            self.isolation_note = "the last full gate did not pass: no golden set"
            return
        iso = isolation.IsolationWatch(route, self.budget)
        why = iso.record()
        if why is not None:
            self.isolation_note = why
            self.log(f"isolation golden set not recorded: {why}")
            return
        self.isolation, self.isolation_since = iso, self.intervals
        self.metrics.isolation_confident.set(iso.confident)
        self.isolation_note = f"{len(iso.golden)} golden prompts, {iso.confident} confident positions"
        self.log(f"isolation golden set recorded: {self.isolation_note}")

    def _plan_handoff(self, route: ProbeRoute, exact: bool) -> None:
        """The handoff rounds: every `handoff_every` intervals, from this interval on."""
        if not self.probe_settings.handoff_probe:
            self.handoff_note = "probes.handoff_probe is off"
            return
        if not self.handoff_every:
            self.handoff_note = (
                f"a round of {handoff.ROUND_REQUESTS} requests does not fit watch.requests_per_min "
                f"({self.settings.requests_per_min}): raise it to run the handoff check after promotion"
            )
            self.log(f"handoff rounds not scheduled: {self.handoff_note}")
            return
        if self.handoff_finding is not None:
            return
        hw = handoff.HandoffWatch(route, self.budget, exact)
        why = hw.why_disabled
        if why is not None:
            self.handoff_note = why
            self.log(f"handoff rounds not scheduled: {why}")
            return
        self.handoff, self.handoff_since = hw, self.intervals
        self.handoff_note = f"a round every {self.handoff_every} interval(s), prompts " + ", ".join(
            f"{p.label} {p.length:,}" for p in hw.prompts
        )
        self.log(f"handoff rounds scheduled: {self.handoff_note}")

    def run_handoff(self) -> bool:
        """The due handoff round, in a probe slot; False when the budget has no room for it yet."""
        hw = self.handoff
        if hw is None or self.handoff_finding is not None:
            self.handoff_due = False
            return True
        out = hw.round()
        if not out.sent:
            self.metrics.skipped.labels(reason=f"{ROUND_SKIP_PREFIX}{out.problem or '?'}").inc()
            return False
        self.handoff_due = False
        self.metrics.handoff_rounds.inc()
        self.metrics.handoff_compared.inc(out.compared)
        self.metrics.peak_requests.set(self.budget.peak_requests)
        self.metrics.peak_tokens.set(self.budget.peak_tokens)
        if not out.disagreements:
            if out.compared:
                self.metrics.handoff_ok.set(1)
            return True
        self.metrics.handoff_disagreements.inc(len(out.disagreements))
        self.metrics.handoff_ok.set(0)
        found = handoff.finding(out, hw.rounds)
        self.handoff_finding = found
        self.log(f"HANDOFF: {found.summary}")
        if self.report is not None:
            self.report = replace(self.report, findings=(*self.report.findings, found))
            self.metrics.set_report(self.report)
        return True

    def run_isolation(self) -> None:
        """This interval's golden-set burst, when the budget affords all of it."""
        iso = self.isolation
        if iso is None or self.isolation_finding is not None:
            return
        if (self.intervals - self.isolation_since) % self.isolation_every:
            return
        out = iso.burst()
        if not out.sent:
            self.metrics.skipped.labels(reason=f"{BURST_SKIP_PREFIX}{out.problem or '?'}").inc()
            return
        self.metrics.isolation_bursts.inc()
        self.metrics.peak_requests.set(self.budget.peak_requests)
        self.metrics.peak_tokens.set(self.budget.peak_tokens)
        if not out.violations:
            self.metrics.isolation_ok.set(1)
            return
        for kind, _line in out.violations:
            self.metrics.isolation_violations.labels(kind=kind).inc()
        self.metrics.isolation_ok.set(0)
        found = isolation.finding(out, len(iso.golden))
        self.isolation_finding = found
        self.log(f"ISOLATION: {found.summary}")
        if self.report is not None:
            self.report = replace(self.report, findings=(*self.report.findings, found))
            self.metrics.set_report(self.report)

    def run_probes(self, stop: threading.Event, end: float) -> None:
        """This interval's share of the budget, one probe per slot, slots spread evenly until `end`."""
        probes = self.probes
        if probes is None and not self.handoff_due:
            return
        n = self.budget.per_interval(self.settings.interval_s)
        start = self.clock()
        span = max(0.0, end - start)
        for i in range(n):
            if stop.wait(max(0.0, start + span * i / n - self.clock())):
                return
            if self.handoff_due:  # the due round first: while the budget has no room for it, no probe either
                self.run_handoff()
                continue
            if probes is None:
                continue
            out = probes.send()
            if not out.sent:
                self.metrics.skipped.labels(reason=out.problem or "?").inc()
                continue
            self.metrics.requests.labels(out.bucket).inc()
            self.metrics.prefill_tokens.inc(out.length)
            self.metrics.peak_requests.set(self.budget.peak_requests)
            self.metrics.peak_tokens.set(self.budget.peak_tokens)
            if out.seconds is not None:
                self.latency.record(out.bucket, out.seconds)
                self.metrics.durations.labels(out.bucket).observe(out.seconds)
            else:
                self.metrics.failures.labels(out.bucket).inc()
                if out.problem != self._probe_problem:  # say why once, not every probe
                    self.log(f"scheduled {out.bucket} probe not served: {out.problem}")
            self._probe_problem = out.problem
            if out.leaks:
                self.metrics.leaks.inc(len(out.leaks))
                self.log(f"LEAK: a scheduled probe's answer carries foreign sentinels: {list(out.leaks)[:3]}")
                self.pending = "leak"
                self.superseded = "a foreign sentinel in a scheduled probe's answer"
            self._update_latency()
            if self.pending == "leak":
                return

    def _update_latency(self) -> None:
        st = self.latency.state()
        before, self.latency_state = self.latency_state, st.state
        self.metrics.too_good.set(st.state)
        if st.long_p5_s is not None and st.one_page_median_s is not None:
            self.metrics.long_p5.set(st.long_p5_s)
            self.metrics.short_median.set(st.one_page_median_s)
        if st.state != before and (st.state == ALERT or before == ALERT):
            self.log(f"latency signal: {st.reason}")


_BLOCKING = (Outcome.FAILED, Outcome.ERROR, Outcome.INCONCLUSIVE)


__all__ = ["Watcher"]
