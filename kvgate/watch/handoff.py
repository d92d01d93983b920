"""The handoff check after promotion: prefill, on its own KV, recomputes decode's tokens, round by round.

`probes.handoff.prefill_oracle` (kvgate/gates/probes/handoff.py) needs no record of a passed gate:
prefill is the oracle in every round. Each round is one prompt of that check's plan, in turn (one
page; several pages with a partial last one; the near-limit prompt where the plan has one and half a
minute's token budget affords its round), fresh for the round (so no cache replaces the transfer),
answered with the top-2 logprobs and replayed at up to WATCH_REPLAYS of decode's confident positions
(the first and the last; the near-limit prompt at the last only, as in the check). The round is
charged to the traffic budget whole before it is sent (the answer and every replay at their longest),
or not sent. Rounds come every `round_every` intervals,
so that they take at most ROUND_SHARE of the request budget; a due round takes the scheduled probes'
slots until the budget has room for it (the loop). A confident disagreement is a failed
`probes.handoff.prefill_oracle` finding; positions where decode's token is below the margin are
never judged.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvgate.gates.probes.handoff import CHECK, GATE, REMEDY_FAIL, HandoffPrompt, Tally, judge_prompt, plan_handoff
from kvgate.results.findings import Evidence, Finding, failed
from kvgate.watch.budget import TrafficBudget, every_for_share
from kvgate.watch.route import ProbeRoute

#: replays per round: decode's first and last confident positions (early and late in the answer)
WATCH_REPLAYS = 2
#: requests of one round: the answer and its replays
ROUND_REQUESTS = 1 + WATCH_REPLAYS
#: the share of the request budget the rounds may take (the isolation bursts take half, the scheduled
#: probes the rest)
ROUND_SHARE = 0.25
#: the node a watch finding names
NODE = "watch (handoff rounds)"
#: why a due round was not sent (the watch counts each as `handoff round: WHY`)
OVER_BUDGET = "over budget"
ROUND_SKIPS = (OVER_BUDGET,)


def round_every(requests_per_min: int, interval_s: float) -> int:
    """Intervals between rounds so that they take at most ROUND_SHARE of the request budget (0: never, the
    budget is smaller than one round)."""
    return every_for_share(requests_per_min, interval_s, ROUND_SHARE, ROUND_REQUESTS)


@dataclass(frozen=True)
class RoundResult:
    """One round: sent or not, the prompt, the positions compared and any confident disagreement."""

    sent: bool
    label: str = ""
    length: int = 0
    compared: int = 0
    disagreements: tuple[str, ...] = ()
    not_compared: tuple[str, ...] = ()
    problem: str | None = None


class HandoffWatch:
    """The rounds of one planned watch (one caller: the watch loop)."""

    def __init__(self, route: ProbeRoute, budget: TrafficBudget, exact: bool = False) -> None:
        self.limits = limits = route.limits
        self.settings = settings = route.settings
        self.budget = budget
        self.exact = exact
        self.sender = route.sender()
        planned, _ = plan_handoff(limits, settings)
        affordable = budget.prefill_tokens_per_min // 2
        rounds = [HandoffPrompt(p.label, p.length, min(p.replays, WATCH_REPLAYS)) for p in planned]
        self.prompts = [p for p in rounds if sum(self.charge(p)) <= affordable]
        self.rounds = 0
        self._turn = 0

    def charge(self, p: HandoffPrompt) -> list[int]:
        """The round's requests at their longest: the answer, then each replay of prompt + answer."""
        return [p.length] + [p.length + self.settings.handoff_new_tokens] * p.replays

    @property
    def why_disabled(self) -> str | None:
        if self.prompts:
            return None
        return (
            f"half of watch.prefill_tokens_per_min ({self.budget.prefill_tokens_per_min:,}) affords no round of "
            "the handoff check's prompts: raise it"
        )

    def round(self) -> RoundResult:
        """The next prompt in turn, answered and replayed, if the budget affords the whole round now."""
        p = self.prompts[self._turn % len(self.prompts)]
        if not self.budget.try_spend_all(self.charge(p)):
            return RoundResult(False, p.label, p.length, problem=OVER_BUDGET)
        self._turn += 1
        self.rounds += 1
        tally = Tally()
        judge_prompt(self.sender, self.limits, self.settings, tally, p, self.exact)
        return RoundResult(
            True,
            p.label,
            p.length,
            len(tally.compared),
            tuple(tally.disagree),
            tuple(tally.unanswered),
        )


def finding(result: RoundResult, rounds: int) -> Finding:
    """The failed `probes.handoff.prefill_oracle` finding a disagreement adds to the watch's report."""
    more = f" (+{len(result.disagreements) - 1} more position(s))" if len(result.disagreements) > 1 else ""
    return failed(
        GATE,
        CHECK,
        NODE,
        f"after promotion (round {rounds}), decode's answer differs from what prefill computes on its own KV: "
        f"{result.disagreements[0]}{more}",
        Evidence(NODE, "handoff.watch_disagreements", list(result.disagreements[:8])),
        remedy=REMEDY_FAIL,
    )
