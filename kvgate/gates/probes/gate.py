"""The probing gates: what the deployment does at its limits, read from the bodies, not the status.

Order (cheapest that can fail first; incident.md sections 4-5):
1. tokenizer rejections: beyond the context and at the context (no prefill when correct);
2. canary round A: cheap plants (the tenants), then the abort-path probes (first rejected length of
   the pool bound, the middle of the reject band) together with fresh concurrent tenants;
1b. isolation under load (under_load.py): distinct prompts alone, then together in waves;
2b. isolation: greedy replay of one prompt around other tenants' traffic (needs no decodable text);
2c. handoff (handoff.py): decode's answer tokens against prefill's own first token of prompt + answer;
3. calibration (calibrate.py): the noise and the prefill time per token, measured through the router;
   then latency: one-page vs long prompts (sized from the calibration), one-sided KS;
4. abort mid-transfer (victim length and cancel points from the calibration, retried within budget);
5. canary round B: the longest accepted prompt as the plant (the one long prefill of the run), then
   the abort-path probes and fresh concurrent tenants again.
A confirmed leak (a foreign sentinel), or a deployment that stopped answering (STALL_AFTER
accepted-length requests in a row unanswered at their deadline), stops the run early unless
`early_stop` is false; what was not run or not sent is reported inconclusive, never passed.
"""

from __future__ import annotations

from collections.abc import Callable

from kvgate.gates.base import GateContext
from kvgate.gates.probes.abort import plan_abort, run_abort
from kvgate.gates.probes.calibrate import Calibration, calibrate, calibration_budget
from kvgate.gates.probes.canary import Sender, Sent
from kvgate.gates.probes.client import GenerateClient
from kvgate.gates.probes.codec_select import select_codec
from kvgate.gates.probes.contract import Classified, Verdict, classify
from kvgate.gates.probes.cost import CostMeter
from kvgate.gates.probes.engaged import Engagement
from kvgate.gates.probes.handoff import CHECK as HANDOFF_CHECK
from kvgate.gates.probes.handoff import Sample, run_handoff
from kvgate.gates.probes.isolation import run_isolation
from kvgate.gates.probes.latency import LatencyPlan, LatencySamples, latency_finding, run_latency
from kvgate.gates.probes.margin import deterministic
from kvgate.gates.probes.plan import (
    ABORT_PATH_PROBES,
    ACCEPT,
    LengthProbe,
    ProbeLimits,
    limits_from_readings,
    max_new_tokens_for,
    plan_length_probes,
)
from kvgate.gates.probes.sentinels import ByteCodec, Sighting, leading, owners
from kvgate.gates.probes.settings import ProbeSettings
from kvgate.gates.probes.under_load import CHECK as LOAD_CHECK
from kvgate.gates.probes.under_load import run_load
from kvgate.reading.node import DECODE, PREFILL
from kvgate.results.findings import Evidence, Finding, Outcome, error, failed, inconclusive, info, passed
from kvgate.upstream.releases import DP_RANK_CONFLICT_MARK, FORCE_QUERY_PREFILL_DP_RANK

GATE = "probes"
#: Accepted-length requests left unanswered in a row before the run stops sending (see Sender.stall_after).
STALL_AFTER = 3
REMEDY_REJECT = (
    "upgrade to SGLang 0.5.22+ (rejected requests retired at admission, #38935) or backport it; "
    "raise the KV pool to at least the context"
)
REMEDY_DP_RANK = (
    f"the prefill refused the DP rank the router chose ({DP_RANK_CONFLICT_MARK}): set "
    f"{FORCE_QUERY_PREFILL_DP_RANK}=1 on every worker, or route without picking ranks"
)
REMEDY_KEEP_GOING = "run every probe with --keep-going"
REMEDY_CODEC = "set the profile key probes.tokenizer: auto (token-space sentinels need no server tokenizer)"
REMEDY_UNTOLD_DECODE = (
    "raise the prefill's KV pool to at least the context (gate 1): an upgrade alone does not "
    "help, no SGLang release through 0.5.23 (nor kvgate's backport) tells the decode that the "
    "prefill retired a request"
)


class ProbeGate:
    """Gates 2-4 by probing through the router: exact-length contracts, canaries, latency, abort."""

    name = GATE

    def __init__(self, settings: ProbeSettings | None = None) -> None:
        self.settings = settings

    def run(self, ctx: GateContext) -> list[Finding]:
        """Probe the deployment behind `ctx.options.router_url`; never raises for target behaviour."""
        settings = self.settings or ProbeSettings.from_mapping(ctx.options.probes, ctx.options.profile_name or "probes")
        router = ctx.options.router_url
        node = f"router {router}" if router else "deployment"
        if not router:
            return [
                inconclusive(
                    GATE,
                    "setup",
                    node,
                    "probes need --router-url: nothing was probed",
                    remedy="give the router, or opt out with --no-probes",
                )
            ]
        limits, problems = limits_from_readings(ctx.readings)
        if limits is None:
            return [
                inconclusive(
                    GATE,
                    "setup",
                    node,
                    "cannot plan exact probe lengths: " + "; ".join(problems),
                    remedy="fix the readings gate 1 reports as missing",
                )
            ]
        return _Run(ctx, settings, limits, router.rstrip("/"), node).execute()


class _Run:
    """State of one probe run."""

    def __init__(self, ctx: GateContext, settings: ProbeSettings, limits: ProbeLimits, router: str, node: str) -> None:
        self.ctx = ctx
        self.settings = settings
        self.limits = limits
        self.node = node
        self.obs = ctx.observer
        self.meter = CostMeter(context=limits.context)
        codec, how = select_codec(ctx.client.http, ctx.readings, settings)
        self.codec_note = how
        self.can_decode = codec is not None
        # Without a codec the contract probes still run: byte ids are valid in every real vocabulary.
        self.sender = Sender(
            GenerateClient(ctx.client.http, router, settings.deadline_s),
            codec or ByteCodec(settings.byte_offset),
            self.meter,
            self.obs,
            stall_after=STALL_AFTER if settings.early_stop else 0,
        )
        self.findings: list[Finding] = []
        self.observations: dict[str, list[tuple[Sent, Classified]]] = {}
        self.answered: list[Sent] = []  # every classified request, phase by phase (a batch's requests together)
        self.stopped_by: str | None = None
        self.stalled_by: str | None = None
        #: every request of the handoff check (prompt, position, rid, what the answer says served it)
        self.handoff_samples: list[Sample] = []

    # -- orchestration -----------------------------------------------------------------------

    def execute(self) -> list[Finding]:
        s, lim = self.settings, self.limits
        probes = plan_length_probes(lim, s.max_new_tokens)
        by_name = {p.name: p for p in probes}
        over = [p for p in probes if p.name in ABORT_PATH_PROBES]
        self.obs.log(
            f"probes: context {lim.context:,}, max_req_input_len {lim.max_req_input_len:,}, "
            f"page {lim.page_size}; lengths "
            + ", ".join(p.label for p in probes)
            + f"; sentinels via {self.codec_note}"
        )
        tenant = self._tenant_probe()
        engagement = Engagement(self.ctx)  # every worker's own request counter, before any probe
        samples: list[LatencySamples | None] = [None]
        self.cal: Calibration | None = None
        self.latency_plan: LatencyPlan | None = None
        plant_b: list[Sent] = []

        def tokenizer_rejections() -> None:
            firsts = [by_name["beyond_context"], by_name["context_limit"]]
            for rec in self.sender.many(firsts, "rejections", "tokenizer rejections", streamed=firsts):
                self._contract(rec)

        def round_a() -> None:
            plants = self.sender.many(
                [tenant(f"plantA{i:02d}") for i in range(s.tenants)], "A-plant", f"round A: {s.tenants} small plants"
            )
            for rec in plants:
                self._contract(rec)
            self._round("A", over, tenant, plants)

        def isolation() -> None:
            if not s.isolation_probe:
                self.findings.append(
                    inconclusive(
                        GATE,
                        "isolation.greedy_replay",
                        self.node,
                        "not run: isolation_probe is false",
                        remedy="set the profile key probes.isolation_probe: true",
                    )
                )
                return
            self.findings.append(run_isolation(self.sender, lim, s, self.node, deterministic(self.ctx.readings)))

        def handoff() -> None:
            if not s.handoff_probe:
                self.findings.append(
                    inconclusive(
                        GATE,
                        HANDOFF_CHECK,
                        self.node,
                        "not run: handoff_probe is false",
                        remedy="set the profile key probes.handoff_probe: true",
                    )
                )
                return
            finding, self.handoff_samples = run_handoff(
                self.sender, lim, s, self.node, deterministic(self.ctx.readings)
            )
            self.findings.append(finding)

        def under_load() -> None:
            if not s.load_probe:
                self.findings.append(
                    inconclusive(
                        GATE,
                        LOAD_CHECK,
                        self.node,
                        "not run: load_probe is false",
                        remedy="set the profile key probes.load_probe: true",
                    )
                )
                return
            self.findings.extend(run_load(self.sender, lim, s, self.ctx.readings, self.node))

        def calibration() -> None:
            self.cal = calibrate(self.sender, lim, calibration_budget(lim.context))
            self.findings.append(self._calibration_finding(self.cal))

        def latency() -> None:
            if self.cal is None or not self.cal.ok:
                return
            samples[0], self.latency_plan = run_latency(self.sender, self.cal, lim, s)

        def abort() -> None:
            if not s.abort_probe:
                self.findings.append(
                    inconclusive(
                        GATE,
                        "abort.mid_transfer",
                        self.node,
                        "not run: abort_probe is false",
                        remedy="set the profile key probes.abort_probe: true",
                    )
                )
                return
            if self.cal is None or not self.cal.ok:
                self.findings.append(self._uncalibrated("abort.mid_transfer"))
                return
            decodes = [r.spec.url for r in self.ctx.nodes(DECODE)]
            f = run_abort(self.sender, decodes, lim, s, plan_abort(self.cal, lim, s), self.node)
            if not self.can_decode and f.outcome == Outcome.PASSED:
                f = inconclusive(
                    GATE,
                    f.check,
                    self.node,
                    "sentinels cannot be decoded: " + f.summary,
                    *f.evidence,
                    remedy=REMEDY_CODEC,
                )
            self.findings.append(f)
            if f.outcome == Outcome.FAILED:
                self.stopped_by = self.stopped_by or f"abort probe: {f.summary}"

        def round_b() -> None:
            with self.obs.step(
                f"round B: plant at the longest accepted length ({by_name['longest_accepted'].length:,} tokens)"
            ):
                plant = self.sender.one(by_name["longest_accepted"], "B-plant")
            plant_b.append(plant)
            self._contract(plant)
            self._round("B", over, tenant, [plant])

        phases: list[tuple[str, Callable[[], None]]] = [
            ("tokenizer rejections", tokenizer_rejections),
            ("isolation under load", under_load),
            ("canary round A (small plants)", round_a),
            ("isolation (greedy replay)", isolation),
            ("handoff (prefill is the oracle)", handoff),
            ("calibration", calibration),
            ("latency", latency),
            ("abort mid-transfer", abort),
            ("canary round B (at-limit plant)", round_b),
        ]
        skipped: list[str] = []
        for title, fn in phases:
            if (self.stopped_by or self.stalled_by) and s.early_stop:
                skipped.append(title)
                continue
            self.obs.log(f"probes: {title}")
            fn()
            if self.sender.stalled and not self.stalled_by:
                self.stalled_by = f"{title}: {self.sender.stalled}"
        self._contract_findings(probes)
        if "latency" not in skipped:
            served = [
                rec for name in ABORT_PATH_PROBES for rec, _ in self.observations.get(name, []) if rec.result.served
            ]
            if self.cal is None or not self.cal.ok:
                self.findings.append(self._uncalibrated("latency.prefill_scaling"))
            else:
                self.findings.append(
                    latency_finding(
                        samples[0],
                        s,
                        served,
                        plant_b[0] if plant_b else None,
                        self.node,
                        self.cal,
                        self.latency_plan,
                        lim.context,
                    )
                )
        lost = self.sender.transport_failures
        if lost and lost == self.meter.requests:
            self.findings.append(
                error(
                    GATE,
                    "transport",
                    self.node,
                    f"the router never answered: all {lost} probe requests failed at the transport level",
                )
            )
        if skipped:
            why = (
                f"a confirmed leak ({self.stopped_by})"
                if self.stopped_by
                else f"the deployment stopped answering ({self.stalled_by})"
            )
            self.findings.append(
                inconclusive(
                    GATE,
                    "skipped",
                    self.node,
                    f"not run after {why}: " + ", ".join(skipped) + " (run them with "
                    "--keep-going, or the profile's probes.early_stop: false)",
                    remedy=REMEDY_KEEP_GOING,
                )
            )
        self.findings.extend(engagement.judge(self.sender, self.answered, tenant, self.node))
        self.ctx.cost.update(self.meter.as_cost())
        return self.findings

    @property
    def _more_time(self) -> str:
        return f"give each probe more time: --probe-deadline {2 * self.settings.deadline_s:g}"

    def _calibration_finding(self, cal: Calibration) -> Finding:
        ev = Evidence(self.node, "calibration", cal.as_evidence())
        if not cal.ok:
            return inconclusive(
                GATE,
                "calibration",
                self.node,
                "could not measure the deployment's noise and prefill speed: "
                + ("; ".join(cal.failures[:3]) or "no answers"),
                ev,
                remedy=self._more_time,
            )
        speed = f"{cal.tokens_per_s:,.0f} tokens/s" if cal.tokens_per_s else "not measurable above the noise"
        return info(
            GATE,
            "calibration",
            self.node,
            f"one-page requests {cal.base_s * 1000:.1f} ms (noise {cal.jitter_s * 1000:.2f} ms); prefill "
            f"{speed} (end to end, {cal.requests} requests)",
            ev,
        )

    def _uncalibrated(self, check: str) -> Finding:
        return inconclusive(
            GATE,
            check,
            self.node,
            "not run: the calibration measured nothing to size it from (see probes.calibration)",
            remedy=self._more_time,
        )

    def _tenant_probe(self) -> Callable[[str], LengthProbe]:
        s, lim = self.settings, self.limits
        unit = len(self.sender.codec.encode("<KVG0000000000>\n"))
        length = s.tenant_tokens or max(2 * lim.page_size, 4 * unit, 32)
        length = min(length, lim.longest_accepted)
        mnt = max_new_tokens_for(lim, length, s.max_new_tokens)

        def make(name: str) -> LengthProbe:
            return LengthProbe(f"tenant-{name}", length, ACCEPT, "none", "concurrent canary tenant", mnt)

        return make

    def _round(
        self, tag: str, over: list[LengthProbe], tenant: Callable[[str], LengthProbe], plants: list[Sent]
    ) -> None:
        """After a plant: abort-path probes and fresh tenants, all at once; then scan every answer."""
        s = self.settings
        batch = list(over) + [tenant(f"{tag}{i:02d}") for i in range(s.tenants)]
        # Over-limit probes go both ways: non-streaming (the router may answer with the prefill's error)
        # and streaming (the router relays the decode, so a decode waiting for KV that never comes hangs).
        recs = self.sender.many(
            batch, f"{tag}", f"round {tag}: {len(over)} over-limit probe(s) x 2 + {s.tenants} tenants", streamed=over
        )
        tenants: list[tuple[Sent, Classified]] = []
        for rec in recs:
            c = self._contract(rec)
            if rec.probe.name.startswith("tenant-"):
                tenants.append((rec, c))
        sightings = self.sender.sightings(list(plants) + recs)
        self.findings.append(self._canary_finding(tag, plants, recs, sightings))
        self.findings.append(self._tenant_finding(tag, tenants, plants if tag == "A" else []))
        if sightings:
            self.stopped_by = self.stopped_by or f"round {tag}: {owners(sightings)[0]}"

    # -- findings ------------------------------------------------------------------------------

    def _contract(self, rec: Sent) -> Classified:
        lim = self.limits
        numbers = {lim.context, lim.max_req_input_len} | ({lim.pool} if lim.pool else set()) | lim.named_limits
        c = classify(rec.probe, rec.result, limit_numbers=numbers, reject_within_s=self.settings.reject_limit_s)
        self.observations.setdefault(rec.probe.name, []).append((rec, c))
        self.answered.append(rec)
        return c

    def _contract_findings(self, probes: list[LengthProbe]) -> None:
        for p in probes:
            obs = self.observations.get(p.name, [])
            check = f"contract.{p.name}"
            expect = (
                "HTTP 200, prompt_tokens == sent, finish reason"
                if p.expect == ACCEPT
                else "4xx promptly, error names the limit, no text"
            )
            ev = [
                Evidence(
                    self.node,
                    f"{rec.label}",
                    {
                        "verdict": c.verdict.value,
                        "detail": c.detail,
                        "status": rec.result.status,
                        "elapsed_s": round(rec.result.elapsed_s, 3),
                    },
                    expect,
                )
                for rec, c in obs
            ]
            if not obs:
                self.findings.append(
                    inconclusive(GATE, check, self.node, f"{p.label}: not run", *ev, remedy=REMEDY_KEEP_GOING)
                )
                continue
            bad = [(rec, c) for rec, c in obs if not c.verdict.ok and c.verdict != Verdict.NO_OBSERVATION]
            if bad:
                # An answer served for a length that must be rejected is the incident itself: it leads
                # whichever sample showed it, so the headline does not hang on the order samples ran in.
                bad.sort(key=lambda rc: rc[1].verdict != Verdict.SERVED_OVER_LIMIT)
                rec, c = bad[0]
                classes = sorted({c2.verdict.value for _, c2 in bad})
                why, remedy = self._untold_decode(p, obs, rec, c)
                self.findings.append(
                    failed(
                        GATE,
                        check,
                        self.node,
                        f"{c.verdict.value}: {rec.label}: {c.detail}"
                        + (f" (classes seen: {', '.join(classes)})" if len(classes) > 1 else "")
                        + why,
                        *ev,
                        remedy=remedy,
                    )
                )
            elif unseen := [(rec, c) for rec, c in obs if c.verdict == Verdict.NO_OBSERVATION]:
                self.findings.append(
                    inconclusive(
                        GATE,
                        check,
                        self.node,
                        f"{p.label}: nothing observed ({unseen[0][1].detail})",
                        *ev,
                        remedy=self._more_time,
                    )
                )
            else:
                self.findings.append(passed(GATE, check, self.node, f"{p.label}: {p.why}: {obs[-1][1].detail}", *ev))

    def _untold_decode(
        self, p: LengthProbe, obs: list[tuple[Sent, Classified]], first_rec: Sent, first: Classified
    ) -> tuple[str, str]:
        """Why a probe hangs when a prefill refuses a length that a decode admits, and the remedy.

        Measured on the real servers (0.5.20-0.5.23 behind smg 1.13.0): the prefill retires the request
        (after its forward on 0.5.20, at its admission door from 0.5.21) and tells the decode nothing;
        the decode keeps its reservation and waits for the KV until SGLANG_DISAGGREGATION_WAITING_TIMEOUT
        (300 s by default). smg answers a non-streaming client with the prefill's 400 but relays a
        streaming answer from the decode, so that client hangs; on a small decode pool the requests
        after it queue behind the held reservation (and hang too).
        """
        if first.verdict != Verdict.HANG:
            return "", (REMEDY_DP_RANK if DP_RANK_CONFLICT_MARK in first_rec.result.raw else REMEDY_REJECT)
        limits = self._prefill_rejects_decode_admits()
        if p.expect == ACCEPT:
            return self._queued_behind_hangs(first_rec, limits)
        if limits is None:
            return "", REMEDY_REJECT
        prefill_limit, decode_limit = limits
        if not prefill_limit <= p.length < decode_limit:
            return "", REMEDY_REJECT
        twin = next(
            (
                f" and gave the non-streaming request its {rec.result.status} in {rec.result.elapsed_s:.1f} s"
                for rec, c in obs
                if not rec.result.stream and c.verdict == Verdict.OK_REJECTED
            ),
            "",
        )
        why = (
            f"; the prefill rejects this length (its max_req_input_len is {prefill_limit:,}, the "
            f"decode's {decode_limit:,}){twin}, but the decode, which admitted it, is not told: it holds "
            "its KV reservation and waits for the KV until SGLANG_DISAGGREGATION_WAITING_TIMEOUT (300 s by "
            "default), and the router relays a streaming answer from the decode (what real SGLang "
            "0.5.20-0.5.23 behind smg 1.13.0 did)"
        )
        return why, REMEDY_UNTOLD_DECODE

    def _queued_behind_hangs(self, first_rec: Sent, limits: tuple[int, int] | None) -> tuple[str, str]:
        """An accepted request that hung after rejected ones hung: it may queue behind their reservations.

        Where the prefill rejects lengths the decode admits, only hangs in that band count and no upgrade
        helps. Where both reject alike (real 0.5.20, no #38935: the prefill retires the request after its
        forward and sends no KV), any hung abort-path request counts and the upgrade is the remedy.
        """
        at = next((i for i, r in enumerate(self.answered) if r is first_rec), 0)
        before = {id(r) for r in self.answered[:at]}
        hung = [
            rec
            for name in ABORT_PATH_PROBES
            for rec, c in self.observations.get(name, [])
            if c.verdict == Verdict.HANG
            and id(rec) in before
            and (limits is None or limits[0] <= rec.probe.length < limits[1])
        ]
        if not hung:
            return "", REMEDY_REJECT
        why = (
            "the prefill rejected them, the decode was not told"
            if limits is not None
            else "the prefill retired them without sending their KV, the decode, which admitted them, was not told"
        )
        return (
            f"; {len(hung)} rejected request(s) sent before or with it hung the same way ({hung[0].label}): "
            f"{why} and holds their KV reservations until SGLANG_DISAGGREGATION_WAITING_TIMEOUT (300 s by "
            "default), so on a small decode pool an accepted request can queue behind them"
        ), (REMEDY_UNTOLD_DECODE if limits is not None else REMEDY_REJECT)

    def _prefill_rejects_decode_admits(self) -> tuple[int, int] | None:
        """(the smallest prefill max_req_input_len, the largest decode one) when some lengths fall between."""
        prefill = [r.max_req_input_len for r in self.ctx.nodes(PREFILL) if r.max_req_input_len is not None]
        decode = [r.max_req_input_len for r in self.ctx.nodes(DECODE) if r.max_req_input_len is not None]
        if not (prefill and decode and min(prefill) < max(decode)):
            return None
        return min(prefill), max(decode)

    def _canary_finding(self, tag: str, plants: list[Sent], recs: list[Sent], sightings: list[Sighting]) -> Finding:
        check = f"canary.round_{tag.lower()}"
        answered = [r for r in list(plants) + recs if r.result.status is not None and r.result.raw]
        ev = [
            Evidence(self.node, "canary.plants", [p.label for p in plants]),
            Evidence(self.node, "canary.answers_scanned", len(answered)),
            Evidence(self.node, "canary.sentinels", len(self.sender.book)),
            Evidence(self.node, "canary.sentinels_via", self.codec_note),
        ]
        if sightings:
            what = owners(sightings)
            lead = leading(sightings)
            ev.append(Evidence(self.node, "canary.leaks", what, "every answer carries only its own sentinel"))
            return failed(
                GATE,
                check,
                self.node,
                f"cross-request content: {len(what)} foreign sentinel sighting(s); first: content of "
                f"{lead.source} leaked into {lead.victim}: {lead.shown}",
                *ev,
                remedy=REMEDY_REJECT,
            )
        if not self.can_decode:
            return inconclusive(
                GATE,
                check,
                self.node,
                f"sentinels cannot be decoded ({self.codec_note}): "
                "canary content was not checked; the isolation check does not need it",
                *ev,
                remedy=REMEDY_CODEC,
            )
        if not answered:
            return inconclusive(GATE, check, self.node, "no answer to scan", *ev, remedy=self._more_time)
        if not any(self.sender.readable(r.result) for r in answered if r.result.served):
            return inconclusive(
                GATE,
                check,
                self.node,
                "no answer carried readable text or output ids: canary content was not checked; "
                "the isolation check does not need it",
                *ev,
                remedy="set the profile key probes.tokenizer: ids (sentinels searched in output_ids)",
            )
        return passed(
            GATE,
            check,
            self.node,
            f"{len(answered)} answers after {len(plants)} plant(s) carry no foreign sentinel",
            *ev,
        )

    def _tenant_finding(self, tag: str, tenants: list[tuple[Sent, Classified]], plants: list[Sent]) -> Finding:
        check = f"tenants.round_{tag.lower()}"
        # Each tenant was classified once already, by _contract; reuse that verdict.
        all_tc = tenants + [
            (rec, c)
            for p in plants
            if p.probe.name.startswith("tenant-")
            for rec, c in self.observations.get(p.probe.name, [])
            if rec is p
        ]
        all_t = [r for r, _ in all_tc]
        bad = []
        unobserved = []
        for r, c in all_tc:
            if c.verdict == Verdict.NO_OBSERVATION:
                unobserved.append(f"{r.label}: {c.detail}")
            elif not c.verdict.ok:
                bad.append(f"{r.label}: {c.verdict.value}: {c.detail}")
        echoed = sum(1 for r in all_t if r.sentinel.found_in(r.result.text))
        ev = [
            Evidence(self.node, "tenants.sent", len(all_t)),
            # Not required (a real model need not repeat its prompt); the simulator echoes it.
            Evidence(self.node, "tenants.own_sentinel_echoed", echoed),
            Evidence(self.node, "tenants.bad", bad[:10], "every tenant answered 200 with its own prompt_tokens"),
        ]
        if not all_t:
            return inconclusive(GATE, check, self.node, "no tenant ran", *ev, remedy=self._more_time)
        if bad:
            return failed(
                GATE, check, self.node, f"{len(bad)} of {len(all_t)} tenant requests broke the contract: {bad[0]}", *ev
            )
        if unobserved:
            return inconclusive(
                GATE,
                check,
                self.node,
                f"{len(unobserved)} of {len(all_t)} tenant requests got no answer at all: {unobserved[0]}",
                *ev,
                remedy=self._more_time,
            )
        return passed(GATE, check, self.node, f"{len(all_t)} concurrent tenant requests answered in full", *ev)
