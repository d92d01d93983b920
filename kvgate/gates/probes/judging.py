"""The probe run's judging: what the run observed, and the findings it makes of it.

The run (gate.py) decides what is sent, in which order, and when it stops; every request it classifies
is recorded here (`_contract`), and the findings are judged from that record: each length probe's
contract (and, for a hang, why: a prefill that rejects what the decode admits and does not tell it),
each canary round and its tenants, the calibration.
"""

from __future__ import annotations

from kvgate.gates.base import GateContext
from kvgate.gates.probes.calibrate import Calibration
from kvgate.gates.probes.canary import Sender, Sent
from kvgate.gates.probes.contract import Classified, Verdict, classify
from kvgate.gates.probes.plan import ABORT_PATH_PROBES, ACCEPT, LengthProbe, ProbeLimits
from kvgate.gates.probes.sentinels import Sighting, leading, owners
from kvgate.gates.probes.settings import ProbeSettings
from kvgate.reading.node import DECODE, PREFILL
from kvgate.results.findings import Evidence, Finding, failed, inconclusive, info, passed
from kvgate.upstream.releases import DP_RANK_CONFLICT_MARK, FORCE_QUERY_PREFILL_DP_RANK

GATE = "probes"
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


class Judging:
    """What one probe run observed (every classified request, by probe and in order) and its findings."""

    def __init__(
        self,
        ctx: GateContext,
        settings: ProbeSettings,
        limits: ProbeLimits,
        node: str,
        sender: Sender,
        codec_note: str,
        can_decode: bool,
    ) -> None:
        self.ctx, self.settings, self.limits, self.node = ctx, settings, limits, node
        self.sender, self.codec_note, self.can_decode = sender, codec_note, can_decode
        self.findings: list[Finding] = []
        self.observations: dict[str, list[tuple[Sent, Classified]]] = {}
        self.answered: list[Sent] = []  # every classified request, phase by phase (a batch's requests together)

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
