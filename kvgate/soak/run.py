"""The soak: the router's workers read once (the watch's fleet pass), the load planned on their limits,
then `duration_s` of load in timeslices; at the end of each slice, still under the load, the content
checks (content.py) run and the slice gets its verdict. A content failure ends the run at once.

A slice covers the load requests that STARTED in its window and every content check since the previous
slice's checks ended (`covered`): a fault that begins anywhere in that span is this slice's.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from kvgate.defaults import PROBE_BODY_CAP
from kvgate.errors import InternalError, TransportError
from kvgate.gates.base import CheckOptions
from kvgate.gates.probes.canary import Sender
from kvgate.gates.probes.client import GenerateClient
from kvgate.gates.probes.codec_select import select_codec
from kvgate.gates.probes.cost import CostMeter
from kvgate.gates.probes.plan import ACCEPT, LengthProbe, ProbeLimits, limits_from_readings, max_new_tokens_for
from kvgate.gates.probes.sentinels import TokenCodec
from kvgate.gates.probes.settings import SGLANG_WAITING_TIMEOUT_S, ProbeSettings
from kvgate.output.progress import NullObserver, Observer, StepHandle
from kvgate.reading.httpbounds import bounded_client
from kvgate.results.findings import Evidence, Finding, Outcome, Report, failed, inconclusive, passed
from kvgate.soak.content import ContentChecks, ContentResult
from kvgate.soak.load import Load, RequestRecord, bucket_lengths
from kvgate.soak.pool import PoolSampler
from kvgate.soak.settings import CANARY, CHECKS, SoakSettings
from kvgate.soak.slo import Allowance, Level, judge, measure, prefill_share
from kvgate.watch.fleetpass import read_fleet
from kvgate.watch.route import ProbeRoute

GATE = "soak"
CONTENT, SLO, PLAN = "content", "slo", "plan"
REMEDY_CONTENT = (
    "do not promote: answers changed under sustained load. The slice, the request and what changed are "
    "above; rerun `kvgate check` on the same fleet and compare the release's fixes (`kvgate fixes`)"
)
REMEDY_SLO = "the deployment misses the stated service levels under this load: add capacity, or restate soak.slo"


@dataclass
class SliceState:
    """One slice while the run goes on (frozen into findings at the end)."""

    index: int
    start_s: float
    end_s: float
    covered_from_s: float
    covered_to_s: float | None = None
    content: list[ContentResult] = field(default_factory=list)


def slice_of_time(settings: SoakSettings) -> Callable[[float], int]:
    last = settings.slices - 1
    return lambda t: min(last, max(0, int(t // settings.slice_s)))


class Soak:
    """One soak over one router (`run()` once)."""

    def __init__(
        self,
        options: CheckOptions,
        settings: SoakSettings,
        *,
        token: str | None = None,
        router_token: str | None = None,
        observer: Observer | None = None,
        bar: Observer | None = None,
    ) -> None:
        if not options.router_url:
            raise ValueError("a soak needs a router URL")
        self.options, self.settings = options, settings
        self.router = options.router_url.rstrip("/")
        self.token, self.router_token = token, router_token
        self.log = (observer or NullObserver()).log
        self.bar = bar
        self.probe_settings = ProbeSettings.from_mapping(options.probes, options.profile_name or "probe settings")
        self.records: dict[int, list[RequestRecord]] = defaultdict(list)
        self._lock = threading.Lock()

    def _record(self, r: RequestRecord) -> None:
        with self._lock:
            self.records[r.slice].append(r)

    def run(self) -> Report:
        started = time.time()
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        http = bounded_client(
            timeout=self.options.timeout, body_cap=PROBE_BODY_CAP, verify=httpx.create_ssl_context(), headers=headers
        )
        try:
            findings, data = self._run(http)
        finally:
            http.close()
        data["wall_s"] = round(time.time() - started, 3)
        return Report(
            command="soak",
            findings=tuple(findings),
            strict=self.options.strict,
            strict_source=self.options.strict_source,
            target={"router_url": self.router},
            cost={"wall_s": data["wall_s"], "soak": data},
        )

    def _run(self, http: httpx.Client) -> tuple[list[Finding], dict[str, Any]]:
        s = self.settings
        snap = read_fleet(
            self.router,
            timeout=self.options.timeout,
            token=self.token,
            concurrency=self.options.concurrency,
            deadline_s=max(self.options.timeout, self.options.read_deadline or self.options.timeout),
            router_token=self.router_token,
        )
        if snap.listing_error:
            raise TransportError(self.router, f"the router's worker list could not be read: {snap.listing_error}")
        if snap.errors:
            url, why = next(iter(snap.errors.items()))
            raise TransportError(url, f"a listed worker could not be read ({len(snap.errors)} in all): {why}")
        readings = list(snap.readings.values())
        data: dict[str, Any] = {"settings": s.to_dict(), "workers": [r.node for r in readings], "slices": []}
        limits, problems = limits_from_readings(readings)
        if limits is None:
            return [self._plan_doubt("cannot plan the load's prompt lengths: " + "; ".join(problems))], data
        codec, how = select_codec(http, readings, self.probe_settings)
        if codec is None:
            return [self._plan_doubt(f"sentinels cannot be encoded ({how})")], data
        data["lengths"] = bucket_lengths(limits)
        t0 = time.monotonic()
        content = ContentChecks(ProbeRoute(http, self.router, limits, codec, self.probe_settings), s.checks, t0)
        why_not = content.prepare()
        if why_not:
            self.log(f"isolation golden set not recorded: {why_not}")
        self.allowance = self._allowance(http, limits, codec, data["lengths"])
        data["prefill"] = self.allowance.as_dict()
        self.log(self.allowance.describe())
        t0 = time.monotonic()  # the load's clock starts after the golden set
        data["t0_unix"] = round(time.time(), 3)  # the same instant on the wall clock (for a server's log times)
        content.t0 = t0
        load = Load(
            http,
            self.router,
            limits,
            codec,
            s,
            self.probe_settings.deadline_s,
            self._record,
            allowance_s=self.allowance.extra_s,
        )
        load.t0 = t0
        pool = PoolSampler(http, [(r.node, r.spec.url) for r in readings], s.pool_every_s, t0)
        stop = threading.Event()
        driver = threading.Thread(target=load.run, args=(stop, slice_of_time(s)), name="soak-load", daemon=True)
        self.log(
            f"soak of {self.router}: {s.duration_s:g} s in {s.slices} slices of {s.slice_s:g} s, "
            + (f"{s.rate_per_s:g} requests/s" if s.rate_per_s else f"{s.concurrency} in flight")
            + f", prompt lengths {data['lengths']}"
        )
        slices: list[SliceState] = []
        pool.start()
        driver.start()
        try:
            with (self.bar or NullObserver()).step("soak", total=s.duration_s) as handle:
                self._slices(content, slices, t0, handle)
        finally:
            stop.set()
            driver.join()
            pool.stop()
        if load.crashed:
            raise InternalError("soak", RuntimeError(f"the load driver broke: {load.crashed}"))
        end_s = time.monotonic() - t0
        return self._judge(slices, pool, end_s, data)

    def _allowance(
        self, http: httpx.Client, limits: ProbeLimits, codec: TokenCodec, lengths: dict[str, int]
    ) -> Allowance:
        """The prefill rate that sizes each bucket's latency allowance: the profile's, or one request of
        the mix's longest bucket measured alone before the load (its length / its time to first token:
        the fixed cost of a request counted as prefill makes the rate lower, the allowance larger, never a
        false block). A request the deployment does not answer leaves the rate unknown."""
        s = self.settings
        share = prefill_share(s.concurrency)
        if s.prefill_tokens_per_s is not None:
            return Allowance(s.prefill_tokens_per_s, share, "stated in soak.prefill_tokens_per_s")
        length = max(lengths[b] for b, w in s.mix.items() if w > 0)
        new = max_new_tokens_for(limits, length, 1)
        probe = LengthProbe("soak_prefill_rate", length, ACCEPT, "none", "soak prefill rate", new)
        # alone, a prompt up to the context may take its whole prefill: SGLang's own waiting timeout bounds it
        client = GenerateClient(http, self.router, SGLANG_WAITING_TIMEOUT_S - 10)
        sender = Sender(client, codec, CostMeter(context=limits.context), NullObserver())
        res = sender.one(probe, "soak-rate", stream=True).result
        if not res.served or not res.ttft_s:
            why = res.transport_error or (f"HTTP {res.status}" if res.status else "no answer")
            fix = "state soak.prefill_tokens_per_s in the profile"
            return Allowance(None, share, f"the {length:,}-token rate request alone was not answered ({why}): {fix}")
        rate = length / res.ttft_s
        return Allowance(
            rate, share, f"measured alone before the load: {length:,} tokens, first token in {res.ttft_s:.3g} s"
        )

    def _plan_doubt(self, why: str) -> Finding:
        fix = "run `kvgate check` on the fleet and fix what it names"
        return inconclusive(GATE, PLAN, self.router, why, remedy=fix)

    def _slices(self, content: ContentChecks, slices: list[SliceState], t0: float, handle: StepHandle) -> None:
        s = self.settings
        shown = 0.0
        covered = 0.0
        for k in range(s.slices):
            end = (k + 1) * s.slice_s
            while (now := time.monotonic() - t0) < end:
                time.sleep(min(0.25, end - now))
                step = min(now, s.duration_s) - shown
                if step > 0:
                    handle.advance(step)
                    shown += step
            st = SliceState(k, k * s.slice_s, end, covered)
            st.content = content.run(k)
            st.covered_to_s = covered = time.monotonic() - t0
            st.content.insert(0, self._canary(st))
            slices.append(st)
            bad = [c for c in st.content if c.outcome is Outcome.FAILED]
            self.log(
                f"slice {k + 1}/{s.slices}: "
                + ("; ".join(f"{c.check}: {c.outcome.value}" for c in st.content) or "no content check")
            )
            if bad:
                self.log(f"slice {k + 1}: {bad[0].check} failed: {bad[0].summary}; the soak stops here")
                return

    def _canary(self, st: SliceState) -> ContentResult:
        """Every load request of the slice so far searched for others' sentinels."""
        with self._lock:
            recs = list(self.records.get(st.index, []))
        if CANARY not in self.settings.checks:
            return ContentResult(CANARY, Outcome.PASSED, "not asked (soak.checks)", st.end_s, 0.0)
        corrupt = [r for r in recs if r.corruption]
        if corrupt:
            why = f"was aborted as metadata/context corruption: {corrupt[0].corruption}"
            return ContentResult(CANARY, Outcome.FAILED, _first_of(corrupt, why), st.end_s, 0.0)
        leaky = [r for r in recs if r.leaks]
        if leaky:
            why = f"got another request's content in its answer: {', '.join(leaky[0].leaks[:3])}"
            return ContentResult(CANARY, Outcome.FAILED, _first_of(leaky, why), st.end_s, 0.0)
        answered = sum(1 for r in recs if r.served)
        if not answered:
            return ContentResult(
                CANARY, Outcome.INCONCLUSIVE, f"none of the slice's {len(recs)} load requests was answered", st.end_s, 0
            )
        return ContentResult(
            CANARY, Outcome.PASSED, f"{answered} answered load requests carry no foreign sentinel", st.end_s, 0.0
        )

    def _judge(
        self, slices: list[SliceState], pool: PoolSampler, end_s: float, data: dict[str, Any]
    ) -> tuple[list[Finding], dict[str, Any]]:
        s = self.settings
        findings: list[Finding] = []
        with self._lock:
            records = {k: list(v) for k, v in self.records.items()}
        for st in slices:
            st.content[0] = self._canary(st)  # again, with the requests that finished after the checks
            node = f"slice {st.index + 1} ({st.start_s:g}-{st.end_s:g} s)"
            recs = records.get(st.index, [])
            stats = measure(recs, st.end_s - st.start_s, s.slo, self.allowance)
            levels = judge(stats, s.slo, self.allowance)
            findings.append(_content_finding(node, st))
            findings.append(_slo_finding(node, levels, self.allowance))
            data["slices"].append(
                {
                    "index": st.index + 1,
                    "start_s": st.start_s,
                    "end_s": st.end_s,
                    "covered_s": [round(st.covered_from_s, 3), round(st.covered_to_s or st.end_s, 3)],
                    "verdict": _worst([findings[-2].outcome, findings[-1].outcome]).value,
                    "stats": stats.as_dict(),
                    "levels": [lv.as_dict() for lv in levels],
                    "content": [c.as_dict() for c in st.content],
                }
            )
        if len(slices) < s.slices:
            findings.append(
                failed(
                    GATE,
                    CONTENT,
                    "run",
                    f"stopped after slice {len(slices)} of {s.slices}: a content check failed there",
                    remedy=REMEDY_CONTENT,
                )
            )
        every = [r for k in sorted(records) for r in records[k]]
        run_stats = measure(every, max(end_s, 1e-9), s.slo, self.allowance)
        run_levels = judge(run_stats, s.slo, self.allowance)
        findings.append(_slo_finding("run", run_levels, self.allowance))
        data["run"] = {"stats": run_stats.as_dict(), "levels": [lv.as_dict() for lv in run_levels]}
        data["bins"] = _bins(every, s.slice_s)
        data["pool"] = {"samples": pool.samples, "problems": pool.problems}
        if pool.problems:
            first = next(iter(pool.problems.values()))
            data["pool"]["note"] = f"{len(pool.problems)} worker(s) report no pool use: {first}"
        return findings, data


def _first_of(bad: list[RequestRecord], why: str) -> str:
    """The first of the slice's failing load requests, what happened to it, and how many more did."""
    r = bad[0]
    return (
        f"request #{r.index} ({r.bucket}, {r.length:,} tokens, sentinel {r.sentinel}, sent at {r.start_s:.1f} s) "
        f"{why}" + (f" (+{len(bad) - 1} more request(s))" if len(bad) > 1 else "")
    )


def _worst(outcomes: list[Outcome]) -> Outcome:
    for o in (Outcome.ERROR, Outcome.FAILED, Outcome.INCONCLUSIVE):
        if o in outcomes:
            return o
    return Outcome.PASSED


def _content_finding(node: str, st: SliceState) -> Finding:
    ev = Evidence(node, "soak.content", [c.as_dict() for c in st.content])
    bad = [c for c in st.content if c.outcome is Outcome.FAILED]
    if bad:
        c = bad[0]
        return failed(GATE, CONTENT, node, f"{node}: {c.check} failed: {c.summary}", ev, remedy=REMEDY_CONTENT)
    doubt = [c for c in st.content if c.outcome is not Outcome.PASSED]
    if doubt:
        c = doubt[0]
        return inconclusive(
            GATE,
            CONTENT,
            node,
            f"{node}: {c.check} could not judge: {c.summary}",
            ev,
            remedy=(
                c.finding.remedy
                if c.finding is not None and c.finding.remedy
                else "rerun the soak with longer slices (--slice) so every check gets answers"
            ),
        )
    return passed(GATE, CONTENT, node, f"{node}: " + "; ".join(f"{c.check} passed" for c in st.content), ev)


def _slo_finding(node: str, levels: list[Level], allowance: Allowance) -> Finding:
    ev = Evidence(node, "soak.slo", [lv.as_dict() for lv in levels], expected=allowance.describe())
    bound = f" [{allowance.describe()}]"
    missed = [lv for lv in levels if lv.met is False]
    if missed:
        return failed(
            GATE, SLO, node, f"{node}: missed " + "; ".join(lv.line() for lv in missed) + bound, ev, remedy=REMEDY_SLO
        )
    unmeasured = [lv for lv in levels if lv.met is None]
    if unmeasured:
        why = dict.fromkeys(lv.why or "no answered load request" for lv in unmeasured)
        fix = "rerun with longer slices (--slice) or more load (--concurrency)"
        if allowance.tokens_per_s is None:
            fix = "state soak.prefill_tokens_per_s in the profile (the deployment's prefill speed for one request)"
        return inconclusive(
            GATE,
            SLO,
            node,
            f"{node}: unmeasured " + ", ".join(lv.name for lv in unmeasured) + " (" + "; ".join(why) + ")",
            ev,
            remedy=fix,
        )
    flat = [lv.line() for lv in levels if lv.bucket is None]
    scaled = [lv for lv in levels if lv.bucket is not None and lv.measured is not None]
    if scaled:  # every per-bucket level is in the evidence; the summary names the one closest to its bound
        near = max(scaled, key=lambda lv: (lv.measured or 0.0) / max(lv.stated, 1e-9))
        flat.append(f"{len(scaled)} per-bucket levels, the closest: {near.line()}")
    return passed(GATE, SLO, node, f"{node}: met " + "; ".join(flat) + bound, ev)


def _bins(records: list[RequestRecord], slice_s: float) -> list[dict[str, Any]]:
    """Load over time at a finer grain than the slices: requests started, errors and cancellations per bin."""
    width = max(0.5, slice_s / 5)
    out: dict[int, dict[str, Any]] = {}
    for r in records:
        b = out.setdefault(int(r.start_s // width), {"requests": 0, "errors": 0, "cancelled": 0, "tokens": 0})
        b["requests"] += 1
        b["errors"] += int(not r.served and not r.cancelled)
        b["cancelled"] += int(r.cancelled)
        b["tokens"] += r.tokens if r.served else 0
    return [{"t_s": round(i * width, 3), "width_s": width, **out[i]} for i in sorted(out)]


__all__ = ["CHECKS", "Soak"]
