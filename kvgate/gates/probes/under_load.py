"""Isolation under load: distinct prompts answered alone, then all at once, must keep their own tokens.

The other isolation checks send compared requests one at a time. Some cross-request corruption shows
only under concurrency (under-load.md): a decode metadata slot handed to two requests (sglang #17259,
#22716: the first output token of another request, or, with #17430's room check, an abort "Metadata
corruption detected - bootstrap_room mismatch"), or pages reused before the prefill's writer finished
(#24527). Procedure:
1. solo: every distinct prompt (short ones, and a few longer ones that keep the transfers busy) and a
   control prompt, each alone, greedy, a few tokens, with the top-2 logprobs per token;
2. waves: all of them at once, with copies of the control prompt, `load_waves` times; the wave size
   comes from the running-request limit the workers report (never above it), at most `load_concurrency`
   (load_plan.py); while the waves judged fewer than `load_min_positions` confident positions and
   showed nothing else, more waves, up to THIN_WAVES_FACTOR times as many;
   A prompt whose answer alone holds no confident position (margin.py) can show nothing: it is replaced
   by a fresh prompt of the same length, answered alone, up to one more solo pass in all;
3. judge only confident positions (margin.py): a concurrent answer whose changed confident tokens are
   another prompt's solo tokens fails naming donor and victim; a corruption abort fails naming the
   upstream reports; a control copy that differs from its own solo answer (with no donor) makes the
   check inconclusive (the deployment is not batch-invariant at this margin); otherwise a changed
   confident token fails. Other errors under load are a finding of their own (`isolation.load_errors`).
A deployment that stopped answering the prompts sent alone (the sender's stall rule, gate.STALL_AFTER)
gets no waves: both findings are inconclusive; waves none of whose requests was answered compare nothing
and are inconclusive too, and so are waves that compared fewer than `load_min_positions` confident
positions, the extra waves included (too little compared: the remedy says how to get more).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from kvgate.gates.probes.canary import Sender
from kvgate.gates.probes.client import ProbeResult
from kvgate.gates.probes.load_plan import FIRST_CHARS, Plan, Prompt, load_prompt, plan_load
from kvgate.gates.probes.margin import TOP_N, Scored, deterministic, score
from kvgate.gates.probes.plan import ProbeLimits
from kvgate.gates.probes.settings import ProbeSettings
from kvgate.output.redact import clip
from kvgate.reading.node import NodeReading
from kvgate.results.findings import Evidence, Finding, failed, inconclusive, passed

GATE = "probes"
CHECK = "isolation.load"
CHECK_ERRORS = "isolation.load_errors"
#: What SGLang 0.5.19-0.5.23 says when #17430's room check catches a metadata slot collision.
CORRUPTION_MARKERS = (
    "metadata corruption detected",
    "bootstrap_room mismatch",
    "context corruption detected",
    "metadata buffer index collision",
)
UPSTREAM = "sglang #17259/#22716: metadata buffer index collision"
REMEDY_CORRUPTION = (
    "do not promote: requests are mixed or aborted under concurrency (sglang #17259, #22716; #24527 for "
    "early page reuse); run fewer concurrent requests per decode until a fix ships"
)
REMEDY_NOISE = "run the gate against workers started with --enable-deterministic-inference"
#: statuses of a deployment shedding load (not corruption, not a crash)
SHED = (429, 503)
#: Waves the check may send in all when the planned ones judged fewer than `load_min_positions` confident
#: positions and showed nothing else: this many times `load_waves`, never more than MAX_WAVES.
THIN_WAVES_FACTOR = 4
MAX_WAVES = 16


def corruption_message(res: ProbeResult) -> str | None:
    """The corruption message in an answer (its body, or its abort finish_reason), clipped."""
    fr = res.finish_abort
    texts = [res.raw, str(fr.get("message", "")) if fr else ""]
    for t in texts:
        low = t.lower()
        if any(m in low for m in CORRUPTION_MARKERS):
            return clip(t, 160)
    return None


def _failure(res: ProbeResult) -> str:
    return res.unserved(120, "the {:g} s probe deadline", abort=True)


def run_load(
    sender: Sender, limits: ProbeLimits, settings: ProbeSettings, readings: Sequence[NodeReading], node: str
) -> list[Finding]:
    """The isolation-under-load check and its errors finding (see the module docstring)."""
    plan = plan_load(limits, settings, readings)
    exact = deterministic(readings)
    n = settings.load_new_tokens
    distinct = [
        load_prompt(sender, f"short{i:02d}", FIRST_CHARS[i % len(FIRST_CHARS)], plan.short_len, n, limits)
        for i in range(plan.short)
    ] + [
        load_prompt(sender, f"long{i:02d}", FIRST_CHARS[(plan.short + i) % len(FIRST_CHARS)], plan.long_len, n, limits)
        for i in range(plan.long)
    ]
    control = load_prompt(sender, "control", "~", plan.short_len, n, limits)

    def send(p: Prompt, phase: str) -> ProbeResult:
        return sender.send_ids(f"load-{p.label}", p.ids, p.max_new_tokens, phase, top_logprobs=TOP_N)

    t0 = time.monotonic()
    with sender.observer.step(
        f"isolation under load: {len(distinct) + 1} prompts alone, then {plan.waves} wave(s) of {plan.per_wave}"
    ):
        solo = {p.label: send(p, "load-solo") for p in [*distinct, control]}
        if sender.stalled is not None:
            return _not_loaded(plan, sender.stalled, solo, node)
        distinct, control, redrawn = _redraw_unsure(sender, limits, settings, exact, distinct, control, solo, send)
        if sender.stalled is not None:
            return _not_loaded(plan, sender.stalled, solo, node)
        waves: list[list[tuple[Prompt, ProbeResult]]] = []
        cap = min(MAX_WAVES, plan.waves * THIN_WAVES_FACTOR)
        while len(waves) < plan.waves or (
            len(waves) < cap
            and sender.stalled is None
            and any(res.served for _, res in waves[-1])  # a wave none answered: more would wait out deadlines
            and _thin(_tally(exact, settings, solo, waves), settings)
        ):
            w = len(waves)
            batch = [*distinct, *([control] * plan.copies)]
            batch = batch[w % 2 :: 2] + batch[1 - w % 2 :: 2]  # mix short, long and copies differently per wave
            with ThreadPoolExecutor(max_workers=len(batch)) as pool:
                futs = [pool.submit(send, p, f"load-wave{w}") for p in batch]
                waves.append([(p, f.result()) for p, f in zip(batch, futs, strict=True)])
    found = _judge(plan, exact, settings, solo, waves, node)
    extra = (
        Evidence(node, "isolation.load.redrawn", redrawn),
        Evidence(node, "isolation.load.wall_s", round(time.monotonic() - t0, 3)),
    )
    return [replace(f, evidence=(*f.evidence, *extra)) if f.check == CHECK else f for f in found]


def _confident(res: ProbeResult, margin: float, exact: bool) -> int | None:
    """Confident positions of an answer; None when it was not served or carried no ids."""
    sc = score(res, margin, exact) if res.served else None
    return None if sc is None else sc.judged


def _redraw_unsure(
    sender: Sender,
    limits: ProbeLimits,
    settings: ProbeSettings,
    exact: bool,
    distinct: list[Prompt],
    control: Prompt,
    solo: dict[str, ProbeResult],
    send: Callable[[Prompt, str], ProbeResult],
) -> tuple[list[Prompt], Prompt, list[str]]:
    """Replace each prompt whose answer alone held no confident position with a fresh one of the same
    length and label (updating `solo`), at most one more solo pass of requests in all. Without it a small
    model's waves can compare nothing and a slot collision that changes tokens goes unseen (a random
    prompt's four tokens on a tiny model are often all near-ties). Returns the prompts and what was redrawn."""
    budget = len(distinct) + 1
    by_label = {p.label: p for p in [*distinct, control]}
    redrawn: list[str] = []
    draw = 0
    for _ in range(2):
        unsure = [label for label, res in solo.items() if _confident(res, settings.logprob_margin, exact) == 0]
        for label in unsure:
            if budget <= 0 or sender.stalled is not None:
                break
            old = by_label[label]
            first = "~" if label == "control" else FIRST_CHARS[(len(distinct) + draw) % len(FIRST_CHARS)]
            fresh = load_prompt(sender, label, first, len(old.ids), settings.load_new_tokens, limits)
            draw += 1
            budget -= 1
            res = send(fresh, "load-solo")
            if _confident(res, settings.logprob_margin, exact) is None:
                continue  # the fresh one was not answered: keep the old prompt and its answer
            by_label[label] = fresh
            solo[label] = res
            redrawn.append(label)
    return [by_label[p.label] for p in distinct], by_label["control"], redrawn


def _not_loaded(plan: Plan, stalled: str, solo: dict[str, ProbeResult], node: str) -> list[Finding]:
    """Both findings when the deployment stopped answering the prompts sent alone: no wave was sent."""
    ev = (
        Evidence(node, "isolation.load.plan", plan.as_evidence()),
        Evidence(
            node,
            "isolation.load.solo_unanswered",
            [f"{label}: {_failure(res)}" for label, res in solo.items() if not res.served][:10],
            "every prompt answered alone",
        ),
    )
    why = f"the deployment stopped answering the prompts sent alone ({stalled}): no concurrent wave was sent"
    remedy = (
        "find why accepted-length requests go unanswered (the decode's log: a hung request's reservation, a "
        "wedged worker); --keep-going sends every wave anyway"
    )
    return [inconclusive(GATE, check, node, why, *ev, remedy=remedy) for check in (CHECK, CHECK_ERRORS)]


@dataclass
class _Tally:
    """What the waves showed so far, before any verdict."""

    refs: dict[str, Scored] = field(default_factory=dict)
    solo_bad: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    shed: list[str] = field(default_factory=list)
    donors: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    noisy: list[str] = field(default_factory=list)
    judged: int = 0
    sent: int = 0
    together: int = 0


def _tally(
    exact: bool, settings: ProbeSettings, solo: dict[str, ProbeResult], waves: list[list[tuple[Prompt, ProbeResult]]]
) -> _Tally:
    margin = settings.logprob_margin
    t = _Tally()
    refs = t.refs
    for label, res in solo.items():
        sc = score(res, margin, exact) if res.served else None
        if sc is None:
            t.solo_bad.append(f"{label}: {_failure(res) if not res.served else 'no output ids'}")
        else:
            refs[label] = sc
    for w, wave in enumerate(waves):
        for p, res in wave:
            where = f"{p.label} [wave {w + 1}]"
            msg = corruption_message(res)
            if msg is not None:
                t.corrupt.append(f"{where}: HTTP {res.status}: {msg}")
                continue
            if res.not_sent is not None:
                t.shed.append(f"{where}: {_failure(res)}")
                continue
            if not res.served:
                (t.shed if res.status in SHED or res.timed_out or res.transport_error else t.errors).append(
                    f"{where}: {_failure(res)}"
                )
                continue
            ref = refs.get(p.label)
            got = score(res, margin, exact)
            if ref is None or got is None:
                continue
            t.judged += ref.judged
            diff = ref.changed(got.ids)
            if not diff:
                continue
            donor = next(
                (
                    q
                    for q, other in refs.items()
                    if q != p.label
                    and all(j < len(got.ids) and j < len(other.ids) and got.ids[j] == other.ids[j] for j in diff)
                ),
                None,
            )
            shown = f"positions {diff[:6]}: got {list(got.ids[:8])}, alone {list(ref.ids[:8])}"
            if donor is not None:
                what = "first token" if diff == [0] else "tokens"
                t.donors.append(f"{where} (victim) carried the {what} of {donor} (donor): {shown}")
            elif p.label == "control":
                t.noisy.append(f"{where}: {shown}")
            else:
                t.changed.append(f"{where}: {shown}")
    t.sent = sum(len(w) for w in waves)
    t.together = sum(1 for w in waves for _, res in w if res.served)
    return t


def _thin(t: _Tally, settings: ProbeSettings) -> bool:
    """Whether the only thing keeping the check from passing is too few judged positions, so that another
    wave could settle it: nothing failed or disagreed, the references exist and some prompt holds a
    confident position alone, and some request sent together was answered."""
    if t.corrupt or t.donors or t.noisy or t.changed or t.errors:
        return False
    if len(t.refs) < 2 or "control" not in t.refs or not any(r.judged for r in t.refs.values()):
        return False  # no prompt holds a confident position alone: no wave can add one
    return bool(t.together) and t.judged < settings.load_min_positions


def _judge(
    plan: Plan,
    exact: bool,
    settings: ProbeSettings,
    solo: dict[str, ProbeResult],
    waves: list[list[tuple[Prompt, ProbeResult]]],
    node: str,
) -> list[Finding]:
    margin = settings.logprob_margin
    t = _tally(exact, settings, solo, waves)
    refs, solo_bad, corrupt, errors, shed = t.refs, t.solo_bad, t.corrupt, t.errors, t.shed
    donors, changed, noisy, judged, sent, together = t.donors, t.changed, t.noisy, t.judged, t.sent, t.together
    floor = settings.load_min_positions
    ev = [
        Evidence(node, "isolation.load.plan", plan.as_evidence()),
        Evidence(
            node,
            "isolation.load.margin",
            "exact equality (every worker reports enable_deterministic_inference)"
            if exact
            else f"top-1 leads top-2 by >= {margin:g} nats",
        ),
        Evidence(node, "isolation.load.solo", {k: v.show() for k, v in list(refs.items())[:6]}),
        Evidence(node, "isolation.load.answered_together", f"{together} of {sent}", f"{sent} of {sent}"),
        Evidence(node, "isolation.load.waves_sent", len(waves), f"{plan.waves} (more only while evidence is thin)"),
        Evidence(node, "isolation.load.confident_positions_judged", judged, f">= {floor}"),
        Evidence(node, "isolation.load.corruption_aborts", corrupt[:8], "none"),
        Evidence(node, "isolation.load.foreign_tokens", donors[:8], "none"),
        Evidence(node, "isolation.load.changed_confident_tokens", changed[:8], "none"),
        Evidence(node, "isolation.load.control_disagreements", noisy[:8], "none"),
    ]
    err_ev = [
        Evidence(node, "isolation.load.errors", errors[:10], "every request under load answered"),
        Evidence(node, "isolation.load.unanswered", shed[:10], "every request under load answered"),
    ]
    more_time = f"give each probe more time: --probe-deadline {2 * settings.deadline_s:g}"
    out: list[Finding] = []
    if corrupt:
        out.append(
            failed(
                GATE,
                CHECK,
                node,
                f"{len(corrupt)} of {sent} concurrent requests aborted as metadata/context corruption "
                f"({UPSTREAM}): {corrupt[0]}",
                *ev,
                remedy=REMEDY_CORRUPTION,
            )
        )
    elif donors:
        out.append(
            failed(
                GATE,
                CHECK,
                node,
                f"cross-request tokens under load: {len(donors)} answer(s) carried another request's tokens; "
                f"first: {donors[0]}",
                *ev,
                remedy=REMEDY_CORRUPTION,
            )
        )
    elif len(refs) < 2 or "control" not in refs:
        out.append(
            inconclusive(
                GATE,
                CHECK,
                node,
                "the prompts answered alone gave no usable reference: " + "; ".join(solo_bad[:3]),
                *ev,
                remedy=more_time,
            )
        )
    elif not together:
        out.append(
            inconclusive(
                GATE,
                CHECK,
                node,
                f"none of the {sent} requests sent together was answered, so nothing under load was compared",
                *ev,
                remedy=f"{more_time}, or lower probes.load_concurrency",
            )
        )
    elif noisy:
        out.append(
            inconclusive(
                GATE,
                CHECK,
                node,
                f"copies of one prompt sent together differ from its answer alone at positions above the "
                f"margin ({noisy[0]}): this deployment's answers change with the batch, so changed tokens "
                "cannot show corruption",
                *ev,
                remedy=REMEDY_NOISE,
            )
        )
    elif changed:
        out.append(
            failed(
                GATE,
                CHECK,
                node,
                f"{len(changed)} answer(s) under load changed a token the model was confident of alone "
                f"(the control copies agreed): first: {changed[0]}",
                *ev,
                remedy=REMEDY_CORRUPTION,
            )
        )
    elif not any(r.scored for r in refs.values()):
        out.append(
            inconclusive(
                GATE,
                CHECK,
                node,
                "the answers carried no top-2 logprobs (meta_info.output_top_logprobs), so no token could be "
                "judged above the margin",
                *ev,
                remedy="probe through a router that passes return_logprob/top_logprobs_num to SGLang",
            )
        )
    elif judged < floor:
        # A slot collision that changes tokens shows only at a confident position: with few, the check saw
        # mostly that nothing aborted, which is not isolation (stop 53: a bypassed room check passed on 2).
        what = (
            f"no token of these prompts led its runner-up by {margin:g} nats (fresh prompts included), so no "
            "token was compared"
            if not judged
            else f"only {judged} confident token positions were compared, fewer than probes.load_min_positions "
            f"({floor}), after {len(waves)} wave(s)"
        )
        out.append(
            inconclusive(
                GATE,
                CHECK,
                node,
                f"{sent} requests in {len(waves)} concurrent wave(s) of {plan.per_wave}, no corruption abort, but "
                f"{what}: a request given another's tokens could have gone unseen",
                *ev,
                remedy=f"{REMEDY_NOISE} (every token is then judged), or raise probes.load_new_tokens (now "
                f"{settings.load_new_tokens}) or lower probes.logprob_margin (now {margin:g})",
            )
        )
    else:
        out.append(
            passed(
                GATE,
                CHECK,
                node,
                f"{sent} requests in {len(waves)} concurrent wave(s) of {plan.per_wave}: no corruption abort; "
                f"no foreign token; {judged} confident token positions kept",
                *ev,
            )
        )
    if errors:
        out.append(
            failed(
                GATE,
                CHECK_ERRORS,
                node,
                f"{len(errors)} of {sent} concurrent requests failed under load: {errors[0]}",
                *err_ev,
                remedy="read the decode and prefill logs for these request ids; do not promote until load is served",
            )
        )
    elif shed:
        out.append(
            inconclusive(
                GATE,
                CHECK_ERRORS,
                node,
                f"{len(shed)} of {sent} concurrent requests got no answer (shed or late): {shed[0]}",
                *err_ev,
                remedy=f"{more_time}, or lower probes.load_concurrency",
            )
        )
    else:
        out.append(passed(GATE, CHECK_ERRORS, node, f"all {sent} concurrent requests were answered", *err_ev))
    return out
