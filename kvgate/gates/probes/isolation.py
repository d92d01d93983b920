"""Isolation by greedy replay: the same prompt must get the same greedy answer whatever other tenants sent.

Sentinel canaries need a model that repeats its prompt and a tokenizer kvgate can drive; a real model
does neither reliably (a random tiny model never echoes), and a server started with
--skip-tokenizer-init returns ids only. This check needs neither. A decode that attends over pages its
request never wrote (the incident's step 6) computes its answer from whatever other tenants left
there, so the answer to a fixed prompt changes with the traffic that ran before it.

Procedure (every compared request is sent alone, greedy, with a short answer):
1. control: the fixed accepted-length prompt Q twice in a row; the answers must agree, else the
   deployment does not serve a greedy prompt reproducibly and the check is inconclusive (never failed);
2. traffic X (fresh tenants with their own random content), then the over-limit prompt O (first
   rejected length of the pool bound) and Q; then traffic Y (other content), O and Q again;
3. Q after X or Y differing from the control = failed; O served under both and answered differently =
   failed (an over-limit request answered from stale pages, proven without reading its text).

Why it does not false-alarm on a healthy GPU deployment: compared requests run one at a time, so the
batch is always one request (no batch-invariance question); the answer is short (few steps for
round-off to flip an argmax); the control runs the same prompt twice, once cold and once from the
prefix cache, so a deployment whose kernels are not reproducible across those paths shows it in the
control and makes the check inconclusive, with the remedy of SGLang's deterministic inference mode
(`--enable-deterministic-inference`), not a block. The replays ask for the top-2 logprobs and compare
only tokens the control answer was confident of (margin.py: top-1 leads top-2 by
`probes.logprob_margin` nats), so a kernel that is not batch-invariant cannot flip a compared token;
a server that returns no logprobs is compared exactly, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvgate.gates.probes.canary import Sender, Sent
from kvgate.gates.probes.client import ProbeResult
from kvgate.gates.probes.margin import TOP_N, answer_ids, score
from kvgate.gates.probes.plan import ACCEPT, REJECT, LengthProbe, ProbeLimits, max_new_tokens_for
from kvgate.gates.probes.settings import ProbeSettings
from kvgate.output.redact import clip
from kvgate.results.findings import Evidence, Finding, failed, inconclusive, passed

GATE = "probes"
CHECK = "isolation.greedy_replay"


@dataclass(frozen=True)
class _Answer:
    label: str
    answer: tuple[int, ...] | str | None
    served: bool
    observed: bool
    result: ProbeResult

    @classmethod
    def of(cls, rec: Sent) -> _Answer:
        r = rec.result
        return cls(
            rec.label,
            r.answer if r.served else None,
            r.served and r.generated,
            r.status is not None and not r.timed_out,
            r,
        )

    def differs(self, other: _Answer, margin: float, exact: bool) -> bool:
        """`other` changed a token this answer was confident of (margin rule); without logprobs (or ids),
        any difference counts."""
        ref, ids = score(self.result, margin, exact), answer_ids(other.result)
        if ref is None or not ref.scored or ids is None:
            return other.answer != self.answer
        return bool(ref.changed(ids))

    def show(self) -> str:
        a = self.answer
        if isinstance(a, tuple):
            return "ids " + ",".join(map(str, a[:16])) + ("..." if len(a) > 16 else "")
        return repr(clip(a, 48)) if isinstance(a, str) else "no answer"


def run_isolation(
    sender: Sender, limits: ProbeLimits, settings: ProbeSettings, node: str, exact: bool = False
) -> Finding:
    """The greedy-replay isolation check (see the module docstring); `exact`: the workers report
    deterministic inference, so every token is compared."""
    n = settings.isolation_new_tokens
    q_len = min(max(4 * limits.page_size, 64), limits.longest_accepted)
    q = LengthProbe(
        "isolation_replay", q_len, ACCEPT, "none", "fixed prompt replayed", max_new_tokens_for(limits, q_len, n)
    )
    fixed = sender.sentinel("isolation replay prompt (kvgate's own, sent identically each time)")
    over = None
    if limits.reject_band is not None:
        m = limits.max_req_input_len
        over = LengthProbe(
            "isolation_over_limit",
            m,
            REJECT,
            "pool",
            "fixed over-limit prompt replayed",
            max_new_tokens_for(limits, m, n),
        )
    tenant_len = min(max(2 * limits.page_size, 64), limits.longest_accepted)
    tenant = LengthProbe(
        "isolation_tenant",
        tenant_len,
        ACCEPT,
        "none",
        "other tenant's traffic",
        max_new_tokens_for(limits, tenant_len, n),
    )

    with sender.observer.step("isolation: greedy replay of one prompt around other tenants' traffic"):
        control = [_Answer.of(sender.one(q, f"iso-control{i}", sentinel=fixed, top_logprobs=TOP_N)) for i in range(2)]
        after: list[tuple[str, _Answer | None, _Answer]] = []
        for tag in ("X", "Y"):
            sender.many(
                [tenant] * settings.isolation_tenants,
                f"iso-traffic{tag}",
                f"isolation: traffic {tag} ({settings.isolation_tenants} tenants)",
            )
            o = _Answer.of(sender.one(over, f"iso-after{tag}", sentinel=fixed)) if over is not None else None
            replay = sender.one(q, f"iso-after{tag}", sentinel=fixed, top_logprobs=TOP_N)
            after.append((tag, o, _Answer.of(replay)))

    more_time = f"give each probe more time: --probe-deadline {2 * settings.deadline_s:g}"
    ev = [
        Evidence(node, "isolation.control", [a.show() for a in control], "the same answer twice"),
        Evidence(
            node,
            "isolation.after_traffic",
            {tag: {"replay": a.show(), "over_limit": o.show() if o else "not planned"} for tag, o, a in after},
            "the control's answer; over-limit prompts never served",
        ),
    ]
    if not all(a.observed and a.answer is not None for a in control):
        return inconclusive(
            GATE,
            CHECK,
            node,
            "the replay prompt was not answered: " + "; ".join(f"{a.label}: {a.show()}" for a in control),
            *ev,
            remedy=more_time,
        )
    margin = settings.logprob_margin
    if control[0].differs(control[1], margin, exact):
        return inconclusive(
            GATE,
            CHECK,
            node,
            "the same greedy prompt got two different answers in a row "
            f"({control[0].show()} vs {control[1].show()}): this deployment does not serve "
            "reproducibly, so answers cannot show foreign KV",
            *ev,
            remedy="run the gate against workers started with --enable-deterministic-inference",
        )
    changed = [
        f"{a.label}: {a.show()}"
        for _, _, a in after
        if a.observed and (a.answer is None or control[0].differs(a, margin, exact))
    ]
    if changed:
        return failed(
            GATE,
            CHECK,
            node,
            f"the same prompt was answered differently after other tenants' traffic "
            f"({changed[0]}; control {control[0].show()}): answers depend on other requests' KV",
            *ev,
            remedy="upgrade to SGLang 0.5.22+ or backport; raise the KV pool to at least the context",
        )
    overs = [o for _, o, _ in after if o is not None]
    if over is not None and len(overs) == 2 and all(o.served for o in overs) and overs[0].answer != overs[1].answer:
        return failed(
            GATE,
            CHECK,
            node,
            f"over-limit request served from stale KV: the same {over.length:,}-token "
            f"prompt was answered {overs[0].show()} after traffic X and {overs[1].show()} after traffic Y "
            "(its answer is built from other tenants' pages)",
            *ev,
            remedy="upgrade to SGLang 0.5.22+ (#38935) or backport; raise the KV pool to at least the context",
        )
    unobserved = [a.label for _, _, a in after if not a.observed]
    if unobserved:
        return inconclusive(
            GATE, CHECK, node, "replays after traffic got no answer: " + ", ".join(unobserved), *ev, remedy=more_time
        )
    served = [o.label for o in overs if o.served]
    note = (
        (
            f"; the over-limit prompt was served ({', '.join(served)}) but its answer did not change with "
            "the traffic (the contract probes judge that)"
        )
        if served
        else ""
    )
    return passed(
        GATE,
        CHECK,
        node,
        f"the same greedy answer before and after two rounds of "
        f"{settings.isolation_tenants} other tenants' requests{note}",
        *ev,
    )
