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
This module sends and orders; what the run observed is recorded and judged in judging.py.
"""

from __future__ import annotations

from collections.abc import Callable

from kvgate.gates.base import GateContext
from kvgate.gates.probes.abort import plan_abort, run_abort
from kvgate.gates.probes.calibrate import Calibration, calibrate, calibration_budget
from kvgate.gates.probes.canary import Sender, Sent
from kvgate.gates.probes.client import GenerateClient
from kvgate.gates.probes.codec_select import select_codec
from kvgate.gates.probes.contract import Classified
from kvgate.gates.probes.cost import CostMeter
from kvgate.gates.probes.engaged import Engagement
from kvgate.gates.probes.handoff import CHECK as HANDOFF_CHECK
from kvgate.gates.probes.handoff import Sample, run_handoff
from kvgate.gates.probes.isolation import run_isolation
from kvgate.gates.probes.judging import GATE, REMEDY_CODEC, REMEDY_KEEP_GOING, Judging
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
from kvgate.gates.probes.sentinels import ByteCodec, owners
from kvgate.gates.probes.settings import ProbeSettings
from kvgate.gates.probes.under_load import CHECK as LOAD_CHECK
from kvgate.gates.probes.under_load import run_load
from kvgate.reading.node import DECODE
from kvgate.results.findings import Finding, Outcome, error, inconclusive

#: Accepted-length requests left unanswered in a row before the run stops sending (see Sender.stall_after).
STALL_AFTER = 3


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


class _Run(Judging):
    """State of one probe run: what it sends and when it stops (what it observed, judged: Judging)."""

    def __init__(self, ctx: GateContext, settings: ProbeSettings, limits: ProbeLimits, router: str, node: str) -> None:
        self.obs = ctx.observer
        self.meter = CostMeter(context=limits.context)
        codec, how = select_codec(ctx.client.http, ctx.readings, settings)
        # Without a codec the contract probes still run: byte ids are valid in every real vocabulary.
        sender = Sender(
            GenerateClient(ctx.client.http, router, settings.deadline_s),
            codec or ByteCodec(settings.byte_offset),
            self.meter,
            self.obs,
            stall_after=STALL_AFTER if settings.early_stop else 0,
        )
        super().__init__(ctx, settings, limits, node, sender, how, codec is not None)
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
                self._off("isolation.greedy_replay", "isolation_probe")
                return
            self.findings.append(run_isolation(self.sender, lim, s, self.node, deterministic(self.ctx.readings)))

        def handoff() -> None:
            if not s.handoff_probe:
                self._off(HANDOFF_CHECK, "handoff_probe")
                return
            finding, self.handoff_samples = run_handoff(
                self.sender, lim, s, self.node, deterministic(self.ctx.readings)
            )
            self.findings.append(finding)

        def under_load() -> None:
            if not s.load_probe:
                self._off(LOAD_CHECK, "load_probe")
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
                self._off("abort.mid_transfer", "abort_probe")
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

    def _off(self, check: str, key: str) -> None:
        """A check the profile turned off: inconclusive, naming the key that turns it on."""
        self.findings.append(
            inconclusive(
                GATE, check, self.node, f"not run: {key} is false", remedy=f"set the profile key probes.{key}: true"
            )
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
