"""Prefill is the oracle: every token decode makes, checked against what prefill computes on its own KV.

In PD serving the first output token is computed on prefill, from KV it wrote itself; every later
token on decode, from KV it received (handoff.md). So for a greedy answer `y` to a prompt `X`, the
request `X + y[:k]` makes prefill compute, on its own KV, the token decode produced at answer position
k. A decode that misreads what it received (a layout, dtype or page-table mismatch, a dropped layer, a
wrong head slice) answers wrong the same way every time, with nothing foreign in it: replay agrees with
itself, no sentinel moves, every contract holds. This check compares the two.

Procedure (every request alone, greedy): for each prompt (one page; several pages with a partial last
page; and, where it is affordable, one near the longest accepted length, where page-table and chunking
mistakes live), a fresh prompt of distinct lines gets a short answer with the top-2 logprobs; then, at
positions k chosen early and late among those where decode's token is confident, `X + y[:k]` is sent
for one token. Judged under the margin rule of the isolation checks (margin.py), with decode's answer
as the reference: a position counts where decode's token leads its runner-up by `probes.logprob_margin`
nats, and prefill's top-1 there must be that token (every position, exactly, where every worker reports
deterministic inference). For prefill to rank another token first, the two computations' logits must
differ by half the margin or more, far beyond round-off; prefill's own lead is not required, since a
decode that misreads its KV makes answers prefill is seldom sure of (a real decode with a dropped layer:
prefill below the margin at 15 of 16 replays). A position whose decode token is below the margin is
never replayed (it could not be judged): the check costs only what it can use. Where the planned
prompts leave fewer than `probes.handoff_min_positions` compared positions (a model that is seldom
confident), up to EXTRA_PROMPTS more one-page prompts are sent until enough are; a confident
disagreement fails; still too few is inconclusive.

Every request is recorded (`Sample`: prompt, position, rid, status, what the answer says about the
workers that served it) for the PD-coverage check to read.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from kvgate.gates.probes.canary import Sender
from kvgate.gates.probes.client import ProbeResult
from kvgate.gates.probes.margin import TOP_N, score, tops_at
from kvgate.gates.probes.plan import ProbeLimits, max_new_tokens_for
from kvgate.gates.probes.settings import ProbeSettings
from kvgate.output.redact import clip
from kvgate.results.findings import Evidence, Finding, failed, inconclusive, passed

GATE = "probes"
CHECK = "handoff.prefill_oracle"
PHASE = "handoff"
#: the longest accepted prompt up to which the near-limit prompt is sent by default: it and its replay
#: cost two prefills of that length (no prefix cache assumed), which at a 1M context would double the
#: probes' cost; `probes.handoff_long_tokens` sends one of any length
NEAR_LIMIT_AUTO_MAX = 65_536
#: one-page prompts sent beyond the plan, at most, while too few positions were compared
EXTRA_PROMPTS = 4
#: meta_info keys an answer may carry about the workers that served it (none of SGLang 0.5.19-0.5.23's
#: /generate answers through smg 1.13.0 names them; kept when a router or gateway adds them)
SERVED_BY_KEYS = ("prefill_url", "decode_url", "prefill_worker", "decode_worker", "bootstrap_host", "dp_rank")
REMEDY_FAIL = (
    "do not promote: decode computes from KV other than what prefill wrote. Check that prefill and decode "
    "agree on page size, KV dtype (and FP8 scales), model and TP head slicing, that the transfer backend "
    "moves every layer's (and every indexer's) buffer, and that decode's prefix cache (HiCache) is off or "
    "sound; then rerun"
)


@dataclass(frozen=True)
class HandoffPrompt:
    """One prompt of the check: its length and how many confident answer positions are replayed."""

    label: str
    length: int
    replays: int


@dataclass(frozen=True)
class Sample:
    """One request of the check, for whoever reads which workers the probes reached."""

    prompt: str
    prompt_tokens: int
    position: int | None  # None: the answer request; k: the replay X + y[:k]
    rid: str
    status: int | None
    served_by: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "prompt_tokens": self.prompt_tokens,
            "position": self.position,
            "rid": self.rid,
            "status": self.status,
            "served_by": self.served_by or "not reported by the answer",
        }


@dataclass
class Tally:
    """What the check's requests found, prompt by prompt (the watch's rounds keep one per round)."""

    compared: list[str] = field(default_factory=list)
    disagree: list[str] = field(default_factory=list)
    unanswered: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    prefill_tokens: int = 0
    candidates: int = 0  # answer positions after the first (decode's own tokens)
    decode_sure: int = 0  # of those, where decode's token leads its runner-up by the margin


def plan_handoff(limits: ProbeLimits, settings: ProbeSettings) -> tuple[list[HandoffPrompt], str]:
    """The check's prompts (each leaves room for its replays within the longest accepted prompt) and a
    note on the near-limit prompt (sent, or why not)."""
    n = settings.handoff_new_tokens
    room = limits.longest_accepted - n
    p = limits.page_size
    out: list[HandoffPrompt] = []

    def add(label: str, length: int, replays: int) -> None:
        length = min(length, room)
        if length >= 1 and all(length != o.length for o in out):
            out.append(HandoffPrompt(label, length, replays))

    add("one_page", limits.one_page, 3)
    # several pages and a partial last one (a page size of 1 has no partial page: 51 pages then)
    add("pages_partial", 3 * p + max(1, p // 2) if p > 1 else 51, 2)
    wanted = settings.handoff_long_tokens
    if wanted is None and limits.longest_accepted > NEAR_LIMIT_AUTO_MAX:
        note = (
            f"near-limit prompt not sent: at the longest accepted length ({limits.longest_accepted:,} tokens) "
            "it and its replay would cost two such prefills without a prefix cache; set "
            "probes.handoff_long_tokens to send one"
        )
        return out, note
    length = room if wanted is None else min(wanted, room)
    before = len(out)
    add("near_limit", length, 1)
    note = (
        f"near-limit prompt {length:,} tokens (the longest accepted is {limits.longest_accepted:,})"
        if len(out) > before
        else "near-limit prompt not sent: no length beyond the shorter prompts is accepted"
    )
    return out, note


def pick(sure: list[int], n: int) -> list[int]:
    """Up to `n` of the confident positions, early and late: the first, the last, then the middle."""
    if not sure or n < 1:
        return []
    chosen = [sure[-1]] if n == 1 else [sure[0], sure[-1]] + ([sure[len(sure) // 2]] if n > 2 else [])
    return sorted(set(chosen))


def prompt_ids(sender: Sender, label: str, length: int) -> list[int]:
    """Exactly `length` ids of distinct numbered lines, fresh for this run (no cache can hold them)."""
    run = secrets.token_hex(4)
    lines = max(8, length // 8)
    ids: list[int] = []
    for _ in range(4):
        text = "".join(f"{label[:2]}{run}:{i:06d} handoff\n" for i in range(lines))
        ids = sender.codec.encode(text)
        if len(ids) >= length:
            break
        lines *= 2
    while len(ids) < length:  # a tokenizer that packs many characters per id: repeat the block
        ids = ids + ids
    return ids[:length]


def _served_by(res: ProbeResult) -> dict[str, Any]:
    # real 0.5.22 answers carry `dp_rank: null` through smg: a null names nothing
    return {k: clip(str(res.meta[k]), 80) for k in SERVED_BY_KEYS if res.meta.get(k) is not None}


def _who(s: Sample) -> str:
    named = ", ".join(f"{k} {v}" for k, v in s.served_by.items())
    return f"{named} (rid {s.rid})" if named else f"rid {s.rid} (the answer names no worker)"


def _tok(res: ProbeResult, j: int) -> str:
    tops = tops_at(res, j)
    if not tops:
        return "no logprobs"
    head = f"id {tops[0][1]} (logprob {tops[0][0]:.2f}"
    return head + (f", runner-up id {tops[1][1]} {tops[1][0]:.2f})" if len(tops) > 1 else ")")


def judge_prompt(
    sender: Sender,
    limits: ProbeLimits,
    settings: ProbeSettings,
    tally: Tally,
    p: HandoffPrompt,
    exact: bool = False,
) -> None:
    """One prompt of the check: a fresh prompt of `p.length` tokens answered, then replayed on prefill at
    up to `p.replays` of decode's confident positions (early and late); the findings go to `tally`."""
    margin = settings.logprob_margin

    def send(ids: list[int], new: int, position: int | None) -> ProbeResult:
        rid = f"kvgate-{sender.run_id}-{PHASE}-{p.label}-{'a' if position is None else position}-{secrets.token_hex(3)}"
        res = sender.send_ids(f"handoff-{p.label}", ids, new, PHASE, top_logprobs=TOP_N, rid=rid)
        tally.samples.append(Sample(p.label, len(ids), position, rid, res.status, _served_by(res)))
        if res.served:
            tally.prefill_tokens += len(ids)
        return res

    ids = prompt_ids(sender, p.label, p.length)
    answer_at = len(tally.samples)
    ans = send(ids, max_new_tokens_for(limits, p.length, settings.handoff_new_tokens), None)
    ref = score(ans, margin, exact) if ans.served else None
    if ref is None or not ref.ids:
        tally.unanswered.append(f"{p.label} ({p.length:,} tokens): {ans.unserved(100)}")
        return
    y = ref.ids
    sure = [k for k in range(1, len(y)) if ref.confident[k]]
    tally.candidates += len(y) - 1
    tally.decode_sure += len(sure)
    for k in pick(sure, p.replays):
        where = f"{p.label} ({p.length:,} tokens) position {k}"
        rep = send(ids + list(y[:k]), 1, k)
        got = score(rep, margin, exact) if rep.served else None
        if got is None or not got.ids:
            tally.unanswered.append(f"{where}: {rep.unserved(100)}")
            continue
        tally.compared.append(where)
        if got.ids[0] != y[k]:
            a, r = tally.samples[answer_at], tally.samples[-1]
            tally.disagree.append(
                f"{where}: decode produced {_tok(ans, k)}, prefill computes {_tok(rep, 0)} on its own "
                f"KV for the same {len(ids) + k:,}-token context; served by {_who(a)} (answer), "
                f"{_who(r)} (replay)"
            )


def run_handoff(
    sender: Sender, limits: ProbeLimits, settings: ProbeSettings, node: str, exact: bool = False
) -> tuple[Finding, list[Sample]]:
    """The handoff check (see the module docstring) and every request it sent; `exact`: every worker
    reports deterministic inference, so every position is compared."""
    prompts, note = plan_handoff(limits, settings)
    tally = Tally()
    with sender.observer.step(f"handoff: {len(prompts)} prompts answered, then replayed on prefill"):
        for p in prompts:
            judge_prompt(sender, limits, settings, tally, p, exact)
        extra = 0
        # more prompts help a model that is seldom confident, not a deployment that stopped answering
        while (
            len(tally.compared) < settings.handoff_min_positions
            and extra < EXTRA_PROMPTS
            and prompts
            and not tally.unanswered
        ):
            extra += 1
            p = HandoffPrompt(f"one_page_{extra + 1}", prompts[0].length, 3)
            prompts.append(p)
            judge_prompt(sender, limits, settings, tally, p, exact)
    return _finding(tally, prompts, note, settings, node, exact), tally.samples


def _finding(
    tally: Tally, prompts: list[HandoffPrompt], note: str, settings: ProbeSettings, node: str, exact: bool
) -> Finding:
    m = settings.logprob_margin
    rule = (
        "exact (deterministic inference)"
        if exact
        else f"decode's token leads its runner-up by {m:g} nats and is prefill's top-1"
    )
    plan = {p.label: {"tokens": p.length, "replays": p.replays} for p in prompts}
    ev = [
        Evidence(node, "handoff.plan", plan),
        Evidence(node, "handoff.note", note),
        Evidence(node, "handoff.rule", rule),
        Evidence(node, "handoff.compared", tally.compared, "prefill's token equals decode's at every position"),
        Evidence(node, "handoff.not_compared", tally.unanswered),
        Evidence(
            node,
            "handoff.decode_confident",
            f"{tally.decode_sure} of {tally.candidates} decode-computed answer positions above the margin",
        ),
        Evidence(node, "handoff.prefill_tokens", tally.prefill_tokens),
        Evidence(node, "handoff.requests", [s.as_dict() for s in tally.samples]),
    ]
    if tally.disagree:
        return failed(
            GATE,
            CHECK,
            node,
            f"decode's answer differs from what prefill computes on its own KV: {tally.disagree[0]}"
            + (f" (+{len(tally.disagree) - 1} more position(s))" if len(tally.disagree) > 1 else ""),
            *ev,
            Evidence(node, "handoff.disagreements", tally.disagree),
            remedy=REMEDY_FAIL,
        )
    need = settings.handoff_min_positions
    if len(tally.compared) < need:
        why = (
            f"only {len(tally.compared)} confident position(s) compared (at least {need} needed) over "
            f"{len(prompts)} prompts: decode was confident at {tally.decode_sure} of its {tally.candidates} "
            f"answer positions, {len(tally.unanswered)} request(s) unanswered"
        )
        if tally.unanswered and len(tally.unanswered) >= tally.candidates - tally.decode_sure:
            remedy = f"give each probe more time: --probe-deadline {2 * settings.deadline_s:g}"
        else:
            remedy = (
                "start the workers with --enable-deterministic-inference (every position is then compared), or "
                "lower probes.logprob_margin / probes.handoff_min_positions in a profile"
            )
        first = tally.unanswered[:1]
        return inconclusive(GATE, CHECK, node, why + (f"; first: {first[0]}" if first else ""), *ev, remedy=remedy)
    return passed(
        GATE,
        CHECK,
        node,
        f"prefill, on its own KV, computes decode's token at all {len(tally.compared)} compared positions "
        f"({', '.join(p.label for p in prompts)}; {rule}); {note}"
        + (f"; {len(tally.unanswered)} position(s) not compared (handoff.not_compared)" if tally.unanswered else ""),
        *ev,
    )
