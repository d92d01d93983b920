"""Did the probes go through a prefill and a KV transfer, and did every worker the router lists serve some?

`fleet.router-role` reads what the router and the workers say their roles are; this reads what they
did. Each worker's own request counter is read before and after the probe run: SGLang's
`sglang:num_requests_total` on `/metrics` (every release 0.5.19-0.5.23, when the worker runs with
`--enable-metrics`; the tokenizer manager counts each finished request whose `log_metrics` is true,
which the router's requests are and the `/health` generation is not). In PD serving each request
finishes on one prefill (after its forward and the KV send) and on one decode, so both roles' counters
move. Where a worker has no such counter, `/v1/loads`' cumulative step counters
(`total_prefill_uncached_tokens` on a prefill, `decode_moments[0]` on a decode) can prove it served
something; they skip a step after an idle gap, so they never prove that it served nothing.

- `probes.pd.engaged`: answers came through a prefill and a decode. Fails when one role served while
  the other (every one of its workers counted) served nothing, when a worker with no PD role served
  probes (a router in regular mode), or when the router served answers and no worker counted any.
- `probes.pd.coverage`: every listed prefill and decode served probes. After the run, small distinct
  probes are sent (within TOP_UP_MAX requests) while some readable worker is still at zero; a worker
  none reached is named, inconclusive, never a silent pass.

Counters cannot tell the probes from other traffic, nor which prefill a decode was paired with, nor
which DP rank served (SGLang's counter is per worker): docs/checks.md says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeGuard

from kvgate.gates.base import GateContext
from kvgate.gates.probes.canary import Sender, Sent
from kvgate.gates.probes.plan import LengthProbe
from kvgate.reading.httpbounds import parse_json
from kvgate.reading.node import DECODE, PREFILL, SANE_MAX, NodeReading
from kvgate.results.findings import Evidence, Finding, failed, inconclusive, passed

GATE = "probes"
ENGAGED = "pd.engaged"
COVERAGE = "pd.coverage"
METRICS_PATH = "/metrics"
LOADS_PATH = "/v1/loads"
REQUESTS = "sglang:num_requests_total"
#: Extra small probes sent per worker still at zero after the run, and at most in all.
TOP_UP_PER_WORKER = 4
TOP_UP_MAX = 32
#: Served answers a role's summed counter may fall short by (or a tenth of them, whichever is more): a
#: request the router answered may finish on a prefill a moment after its answer reached kvgate.
SHORTFALL_SLACK = 2
REMEDY_METRICS = "start every worker with --enable-metrics (SGLang's request counter on /metrics)"
REMEDY_ROUTE = (
    "check the router's pool and policy for the named worker(s): listed but given no request (smg #2375: "
    "listed healthy, never in the pool), or remove them from the router"
)
REMEDY_PD = (
    "route through a PD router (smg --pd-disaggregation with --prefill and --decode), and check that no "
    "gateway in front of it sends the traffic elsewhere"
)


@dataclass(frozen=True)
class Count:
    """One read of one worker: its request counter, or the step counters that can prove it served."""

    requests: float | None = None
    prefill_tokens: float | None = None
    decode_steps: float | None = None
    problem: str | None = None


@dataclass(frozen=True)
class Served:
    """What a worker's counters say it did during the run: `served` None when they cannot tell."""

    reading: NodeReading
    role: str
    served: bool | None
    requests: float | None
    how: str

    @property
    def label(self) -> str:
        return self.reading.node


def parse_metrics(body: bytes) -> tuple[float | None, str | None]:
    """The sum of every `sglang:num_requests_total` sample in a Prometheus text page, or why not.

    A page with SGLang metrics but no sample of the counter is 0 (the labelled counter appears with
    its first finished request); a page with no `sglang:` metric at all is not SGLang's.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None, "/metrics is not UTF-8 text"
    total, seen_sglang = 0.0, False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, rest = _split_sample(line)
        if name.startswith("sglang:"):
            seen_sglang = True
        if name != REQUESTS:
            continue
        fields = rest.split()
        if not fields:
            return None, f"/metrics: a {REQUESTS} sample has no value"
        try:
            value = float(fields[0])
        except ValueError:
            return None, f"/metrics: {REQUESTS} value {fields[0][:40]!r} is not a number"
        if not math.isfinite(value) or value < 0 or value > SANE_MAX:
            return None, f"/metrics: {REQUESTS} value {fields[0][:40]!r} is not a sane count"
        total += value
    if not seen_sglang:
        return None, "/metrics carries no sglang: metric (not SGLang's page)"
    return total, None


def _split_sample(line: str) -> tuple[str, str]:
    """(metric name, what follows its labels) of one sample line; quoted label values may hold braces."""
    brace = line.find("{")
    space = line.find(" ")
    if brace < 0 or (0 <= space < brace):
        return (line[:space], line[space:]) if space >= 0 else (line, "")
    quoted = escaped = False
    for i in range(brace + 1, len(line)):
        ch = line[i]
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == "}" and not quoted:
            return line[:brace], line[i + 1 :]
    return line[:brace], ""


def parse_loads(body: bytes) -> Count:
    """`/v1/loads`' cumulative step counters, summed over the DP ranks it lists."""
    try:
        doc = parse_json(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return Count(problem="/v1/loads is not JSON")
    loads = doc.get("loads") if isinstance(doc, dict) else None
    if not isinstance(loads, list) or not loads:
        return Count(problem="/v1/loads lists no rank")
    tokens = steps = 0.0
    seen_tokens = seen_steps = False
    for load in loads:
        if not isinstance(load, dict):
            continue
        t = load.get("total_prefill_uncached_tokens")
        if _sane(t):
            tokens, seen_tokens = tokens + float(t), True
        moments = load.get("decode_moments")
        if isinstance(moments, list) and moments and _sane(moments[0]):
            steps, seen_steps = steps + float(moments[0]), True
        elif moments is None:
            seen_steps = True  # SGLang omits it until the rank's first counted decode step
    return Count(prefill_tokens=tokens if seen_tokens else None, decode_steps=steps if seen_steps else None)


def _sane(v: object) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= SANE_MAX


def read_counts(ctx: GateContext, workers: Sequence[NodeReading]) -> list[Count]:
    """One bounded read of every worker: /metrics, then /v1/loads where /metrics has no request counter."""
    from kvgate.reading.http11 import Answer

    answers = ctx.client.get_raw([(w.spec.url, METRICS_PATH) for w in workers])
    counts: list[Count] = []
    for ans in answers:
        if not isinstance(ans, Answer):
            counts.append(Count(problem=f"/metrics: {ans.reason}"))
        elif ans.status != 200:
            counts.append(Count(problem=f"/metrics answered HTTP {ans.status}"))
        else:
            value, why = parse_metrics(ans.body)
            counts.append(Count(requests=value, problem=why))
    lacking = [i for i, c in enumerate(counts) if c.requests is None]
    if lacking:
        loads = ctx.client.get_raw([(workers[i].spec.url, LOADS_PATH) for i in lacking])
        for i, ans in zip(lacking, loads, strict=True):
            if isinstance(ans, Answer) and ans.status == 200:
                got = parse_loads(ans.body)
                counts[i] = Count(
                    prefill_tokens=got.prefill_tokens, decode_steps=got.decode_steps, problem=counts[i].problem
                )
    return counts


def _served(reading: NodeReading, role: str, before: Count, after: Count) -> Served:
    if before.requests is not None and after.requests is not None:
        delta = after.requests - before.requests
        if delta < 0:
            return Served(
                reading,
                role,
                None,
                None,
                f"{REQUESTS} went back ({before.requests:g} -> {after.requests:g}): restarted during the run",
            )
        return Served(reading, role, delta > 0, delta, f"{REQUESTS} {before.requests:g} -> {after.requests:g}")
    why = after.problem or before.problem or "no request counter"
    step = (
        ("prefill_tokens", "total_prefill_uncached_tokens")
        if role == PREFILL
        else ("decode_steps", "decode_moments[0]")
    )
    b, a = getattr(before, step[0]), getattr(after, step[0])
    if b is not None and a is not None and a > b:
        return Served(reading, role, True, None, f"{why}; /v1/loads {step[1]} {b:g} -> {a:g}")
    return Served(reading, role, None, None, why)


class Engagement:
    """Counters of every worker read before the probe run; `judge` reads them again and decides."""

    def __init__(self, ctx: GateContext) -> None:
        self.ctx = ctx
        self.workers = list(ctx.readings)
        self.before = read_counts(ctx, self.workers) if self.workers else []

    def judge(
        self, sender: Sender, answered: Sequence[Sent], tenant: Callable[[str], LengthProbe], node: str
    ) -> list[Finding]:
        """Read the counters again, top up probes for workers still at zero, and return both findings."""
        states = self._states(read_counts(self.ctx, self.workers))
        sent_extra = 0
        while sent_extra < TOP_UP_MAX:
            zero = [s for s in states if s.role in (PREFILL, DECODE) and s.served is False]
            if not zero or not any(s.served for s in states) or sender.stalled:
                break  # nothing to cover, nothing served to cover it with, or the deployment stopped answering
            n = min(TOP_UP_PER_WORKER * len(zero), TOP_UP_MAX - sent_extra)
            recs = sender.many(
                [tenant(f"cover{sent_extra + i:02d}") for i in range(n)],
                "coverage",
                f"coverage: {n} small probes for {len(zero)} worker(s) no probe reached yet",
            )
            sent_extra += n
            answered = [*answered, *recs]
            states = self._states(read_counts(self.ctx, self.workers))
        served_answers = sum(1 for r in answered if r.result.served)
        return [self._engaged(states, served_answers, node), self._coverage(states, sent_extra, node)]

    def _states(self, after: list[Count]) -> list[Served]:
        return [_served(w, _role(w), b, a) for w, b, a in zip(self.workers, self.before, after, strict=True)]

    def _engaged(self, states: list[Served], served_answers: int, node: str) -> Finding:
        ev = [Evidence(s.label, "pd.served", s.how, "served probes") for s in states]
        ev.append(Evidence(node, "pd.answers_served", served_answers))
        prefills = [s for s in states if s.role == PREFILL]
        decodes = [s for s in states if s.role == DECODE]
        stray = [s for s in states if s.role not in (PREFILL, DECODE) and s.served]

        def fail(summary: str) -> Finding:
            return failed(GATE, ENGAGED, node, summary, *ev, remedy=REMEDY_PD)

        if stray:
            return fail(
                f"{stray[0].label}, which reports no PD role ({stray[0].role}), served probes ({stray[0].how}): "
                "answers that did not come through a prefill and a KV transfer"
            )
        if not prefills or not decodes:
            return fail(
                f"no worker read reports the {'prefill' if not prefills else 'decode'} role: the answers "
                "cannot have come through a prefill and a KV transfer"
            )
        listing = self.ctx.listing
        if listing is not None and listing.workers:
            roles = {w.role for w in listing.workers}
            if None not in roles and not {PREFILL, DECODE} <= roles:  # /list_workers says no roles
                return fail(
                    f"the router ({listing.endpoint}) lists its workers as {', '.join(sorted(map(str, roles)))}: "
                    "it does not send a request to a prefill and a decode (regular mode)"
                )
        p_any, d_any = any(s.served for s in prefills), any(s.served for s in decodes)
        p_none = all(s.served is False for s in prefills)
        d_none = all(s.served is False for s in decodes)
        if d_any and p_none:
            return fail(
                f"decodes served probes but no prefill counted a request ({_tally(prefills)}): the answers "
                "came without a prefill (everything sent straight to decode?)"
            )
        if p_any and d_none:
            return fail(
                f"prefills served probes but no decode counted a request ({_tally(decodes)}): the answers "
                "did not come through a KV transfer (a router in regular mode?)"
            )
        counted = [s.requests for s in prefills + decodes]
        if served_answers and all(c is not None for c in counted):
            p = sum(s.requests or 0.0 for s in prefills)
            d = sum(s.requests or 0.0 for s in decodes)
            floor = served_answers - max(SHORTFALL_SLACK, served_answers // 10)
            short = [(name, n) for name, n in (("prefills", p), ("decodes", d)) if n < floor]
            if short:
                name, n = short[0]
                return fail(
                    f"the router served {served_answers} answers but the {name} counted {n:g} requests: "
                    "answers that did not come through a prefill and a decode each (a router in regular mode, "
                    "or another path)"
                )
        if p_none and d_none and served_answers:
            return fail(
                f"the router served {served_answers} answers and none of the {len(states)} workers read "
                "counted a request: the answers came from somewhere else"
            )
        if p_any and d_any and served_answers:
            return passed(
                GATE,
                ENGAGED,
                node,
                f"the probes went through a prefill and a KV transfer: served on "
                f"{sum(1 for s in prefills if s.served)} prefill(s) and {sum(1 for s in decodes if s.served)} "
                "decode(s), by their own counters",
                *ev,
            )
        if not served_answers:
            return inconclusive(
                GATE,
                ENGAGED,
                node,
                "no probe was served: nothing shows that answers come through a prefill and a KV transfer",
                *ev,
                remedy="see the probes' other findings for why nothing was answered",
            )
        blind = [s for s in prefills + decodes if s.served is None]
        return inconclusive(
            GATE,
            ENGAGED,
            node,
            f"cannot tell whether the answers came through a prefill and a decode: {blind[0].label}: {blind[0].how}"
            + (f" (+{len(blind) - 1} more)" if len(blind) > 1 else ""),
            *ev,
            remedy=REMEDY_METRICS,
        )

    def _coverage(self, states: list[Served], sent_extra: int, node: str) -> Finding:
        pd = [s for s in states if s.role in (PREFILL, DECODE)]
        ev = [Evidence(s.label, "pd.served", s.how, "served probes") for s in pd]
        ev.append(Evidence(node, "pd.coverage_probes", sent_extra, f"at most {TOP_UP_MAX}"))
        ev.append(Evidence(node, "pd.ranks", "not observable: SGLang counts requests per worker, not per DP rank"))
        zero = [s for s in pd if s.served is False]
        blind = [s for s in pd if s.served is None]
        if zero:
            return inconclusive(
                GATE,
                COVERAGE,
                node,
                f"{len(zero)} of {len(pd)} listed worker(s) served no probe"
                + (f" (after {sent_extra} extra probes)" if sent_extra else "")
                + ": "
                + ", ".join(s.label for s in zero),
                *ev,
                remedy=REMEDY_ROUTE,
            )
        if blind:
            return inconclusive(
                GATE,
                COVERAGE,
                node,
                f"{len(blind)} of {len(pd)} worker(s) cannot show what they served: "
                + "; ".join(f"{s.label}: {s.how}" for s in blind[:3]),
                *ev,
                remedy=REMEDY_METRICS,
            )
        if not pd:
            return inconclusive(GATE, COVERAGE, node, "no prefill or decode was read", *ev, remedy=REMEDY_PD)
        return passed(
            GATE,
            COVERAGE,
            node,
            f"every listed prefill and decode served probes ({_tally(pd)})",
            *ev,
        )


def _role(r: NodeReading) -> str:
    """The role the worker reports itself (what it did), else the one it was listed or named as."""
    own = r.role
    if own in (PREFILL, DECODE):
        return own
    return own if own != "unknown" else r.spec.role


def _tally(states: Sequence[Served]) -> str:
    return ", ".join(
        f"{s.label}: {s.requests:g}" if s.requests is not None else f"{s.label}: {'yes' if s.served else '?'}"
        for s in states
    )
