"""Isolation under load after promotion: a golden set recorded when the gate passes, asked again together.

When a full gate passes, the watch records a golden set: `GOLDEN` distinct short prompts of
`probes.isolation.load`'s shape, each answered alone (greedy, top-2 logprobs) right after the pass,
and their confident positions (margin.py, the gate's own rule). Each interval, when the traffic budget
affords the whole burst, all of them are sent at once, so every request shares the decode with at
least `GOLDEN - 1` others (the faults of sglang #17259/#22716/#24527 strike only then). A corruption
abort (the #17430 room check's message) or a changed confident token is a violation; nothing else is
(shed or late answers are not judged, and a token the model was not confident of alone is never
compared, so batch noise cannot flip it).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from kvgate.gates.probes.client import ProbeResult
from kvgate.gates.probes.load_plan import FIRST_CHARS, SHORT_TOKENS, Prompt, load_prompt
from kvgate.gates.probes.margin import TOP_N, Scored, score
from kvgate.gates.probes.under_load import CHECK, GATE, REMEDY_CORRUPTION, UPSTREAM, corruption_message
from kvgate.results.findings import Evidence, Finding, failed
from kvgate.watch.budget import TrafficBudget, every_for_share
from kvgate.watch.route import ProbeRoute

#: prompts of the golden set, all sent at once: each request shares the decode with 5 others (the
#: simulated faults, like the upstream races, need 3 or more in the decode)
GOLDEN = 6
#: the node a watch finding names
NODE = "watch (golden set)"
CORRUPTION_ABORT, CHANGED_TOKEN = "corruption_abort", "changed_token"
VIOLATION_KINDS = (CORRUPTION_ABORT, CHANGED_TOKEN)
#: why a burst was not sent (the watch counts each as `isolation burst: WHY`)
NO_GOLDEN, OVER_BUDGET = "no golden set", "over budget"
BURST_SKIPS = (NO_GOLDEN, OVER_BUDGET)
#: prompts tried beyond GOLDEN, at most, while fewer than GOLDEN answers hold a confident position
EXTRA_CANDIDATES = 12
#: the share of the request budget the bursts may take (the scheduled probes keep the rest)
BURST_SHARE = 0.5


def burst_every(requests_per_min: int, interval_s: float) -> int:
    """Intervals between bursts so that they take at most BURST_SHARE of the request budget (0: never,
    the budget is smaller than one burst)."""
    return every_for_share(requests_per_min, interval_s, BURST_SHARE, GOLDEN)


@dataclass(frozen=True)
class Golden:
    """One prompt of the golden set and its solo answer (confident positions marked)."""

    prompt: Prompt
    ref: Scored


@dataclass(frozen=True)
class BurstResult:
    """One burst: sent or not, what it judged, and any violation (kind, line) seen."""

    sent: bool
    judged: int = 0
    unanswered: int = 0
    violations: tuple[tuple[str, str], ...] = ()
    problem: str | None = None


class IsolationWatch:
    """The golden set of one passed gate and its bursts (one caller: the watch loop)."""

    def __init__(self, route: ProbeRoute, budget: TrafficBudget) -> None:
        self.settings = route.settings
        self.budget = budget
        self.limits = route.limits
        self.sender = route.sender()
        self.length = min(SHORT_TOKENS, route.limits.longest_accepted)
        self.golden: list[Golden] = []

    def _send(self, p: Prompt, phase: str) -> ProbeResult:
        return self.sender.send_ids(f"golden-{p.label}", p.ids, p.max_new_tokens, phase, top_logprobs=TOP_N)

    def record(self) -> str | None:
        """Record the golden set, one prompt at a time; None when recorded, else why not.

        The prompts are random lines, and a small model's short answer may hold no token it is sure of:
        past the first GOLDEN, up to EXTRA_CANDIDATES more prompts are tried (each charged to the budget
        first) while fewer than GOLDEN of them have a confident position, and the GOLDEN with the most
        confident positions are kept. A set with none cannot judge a burst: it is not recorded."""
        if not self.budget.try_spend_all([self.length] * GOLDEN):
            return "the traffic budget cannot afford recording the golden set now"
        n = self.settings.load_new_tokens
        tried: list[Golden] = []
        failures = 0
        for i in range(GOLDEN + EXTRA_CANDIDATES):
            sure = sum(1 for g in tried if g.ref.judged)
            if i >= GOLDEN and (sure >= GOLDEN or failures or not self.budget.try_spend_all([self.length])):
                break
            p = load_prompt(self.sender, f"g{i}", FIRST_CHARS[i % len(FIRST_CHARS)], self.length, n, self.limits)
            res = self._send(p, "watch-golden")
            sc = score(res, self.settings.logprob_margin) if res.served and corruption_message(res) is None else None
            if sc is None:
                failures += 1
            else:
                tried.append(Golden(p, sc))
        if failures:
            return f"{failures} of {len(tried) + failures} golden prompts got no usable answer alone"
        golden = sorted(tried, key=lambda g: -g.ref.judged)[:GOLDEN]
        if not sum(g.ref.judged for g in golden):
            return (
                f"none of {len(tried)} golden prompts' answers alone has a token leading its runner-up by "
                f"{self.settings.logprob_margin:g} nats (answers of {n} tokens): raise probes.load_new_tokens "
                "or lower probes.logprob_margin"
            )
        self.golden = golden
        return None

    @property
    def confident(self) -> int:
        return sum(g.ref.judged for g in self.golden)

    def burst(self) -> BurstResult:
        """Ask the golden set again, all at once, if the budget affords the whole burst."""
        if not self.golden:
            return BurstResult(False, problem=NO_GOLDEN)
        if not self.budget.try_spend_all([len(g.prompt.ids) for g in self.golden]):
            return BurstResult(False, problem=OVER_BUDGET)
        with ThreadPoolExecutor(max_workers=len(self.golden)) as pool:
            futs = [pool.submit(self._send, g.prompt, "watch-burst") for g in self.golden]
            got = [(g, f.result()) for g, f in zip(self.golden, futs, strict=True)]
        return judge(got, self.settings.logprob_margin)


def judge(got: list[tuple[Golden, ProbeResult]], margin: float) -> BurstResult:
    """A corruption abort or a changed confident token is a violation; an unanswered request is not judged."""
    violations: list[tuple[str, str]] = []
    judged = unanswered = 0
    for g, res in got:
        msg = corruption_message(res)
        if msg is not None:
            violations.append((CORRUPTION_ABORT, f"{g.prompt.label}: HTTP {res.status}: {msg}"))
            continue
        now = score(res, margin) if res.served else None
        if now is None:
            unanswered += 1
            continue
        judged += g.ref.judged
        diff = g.ref.changed(now.ids)
        if diff:
            donor = next(
                (
                    o.prompt.label
                    for o, _ in got
                    if o is not g
                    and all(j < len(now.ids) and j < len(o.ref.ids) and now.ids[j] == o.ref.ids[j] for j in diff)
                ),
                None,
            )
            whose = f" (the tokens of {donor} alone: {donor} is the donor)" if donor else ""
            violations.append(
                (
                    CHANGED_TOKEN,
                    f"{g.prompt.label}: confident positions {diff[:6]} changed{whose}: got {list(now.ids[:8])}, "
                    f"alone {list(g.ref.ids[:8])}",
                )
            )
    return BurstResult(True, judged, unanswered, tuple(violations))


def finding(result: BurstResult, sent: int) -> Finding:
    """The failed `probes.isolation.load` finding a violation adds to the watch's report."""
    kinds = {k for k, _ in result.violations}
    what = (
        f"aborted as metadata/context corruption ({UPSTREAM})"
        if CORRUPTION_ABORT in kinds
        else "changed a token the model was confident of alone"
    )
    return failed(
        GATE,
        CHECK,
        NODE,
        f"after promotion, {len(result.violations)} of {sent} golden prompts sent together {what}: "
        f"{result.violations[0][1]}",
        Evidence(NODE, "isolation.load.watch_violations", [line for _, line in result.violations[:8]]),
        remedy=REMEDY_CORRUPTION,
    )
