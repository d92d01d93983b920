"""A plan as findings: pool >= context x headroom per role, every step as evidence, the knobs as the remedy."""

from __future__ import annotations

from typing import Any

from kvgate.plan.knobs import Knob, knobs
from kvgate.plan.planner import WorkerPlan
from kvgate.results.findings import Evidence, Finding, Report, failed, passed

GATE = "plan"


def knob_text(k: Knob) -> str:
    """One knob as a line a human acts on."""
    if k.possible:
        return f"{k.name} {k.current} -> {k.needed} (pool {k.pool_at_needed:,}; {k.note})"
    return f"{k.name} {k.current}: {k.note}"


def knob_remedy(ks: list[Knob]) -> str:
    """The possible single-knob fixes, then the impossible ones."""
    can = [knob_text(k) for k in ks if k.possible]
    cannot = [f"{k.name} ({k.note.removeprefix('impossible: ')})" for k in ks if not k.possible]
    text = "any one of: " + "; ".join(can) if can else "no single knob closes the gap"
    if cannot:
        text += ". Not by: " + "; ".join(cannot)
    return text


def role_findings(role: str, plan: WorkerPlan) -> list[Finding]:
    """The findings of one worker role (prefill or decode)."""
    inp = plan.inputs
    node = f"{role} (planned)"
    # Each step is a fact with its derivation in the field's name, not a requirement: only the pool has a "want".
    evidence = [
        Evidence(
            node,
            f"{s.name} ({s.formula})",
            s.value,
            f">= {inp.required:,}" if s.name == "max_total_num_tokens" else None,
        )
        for s in plan.steps
    ]
    band = f"({plan.pool:,}, {inp.context_length:,}]" if plan.pool < inp.context_length else "empty"
    evidence.append(Evidence(node, "over_pool_band (prompts that fit the context but not the pool)", band))
    ratio = round(plan.pool / inp.context_length, 4)
    if plan.fits:
        return [
            passed(
                GATE,
                "pool",
                node,
                f"SGLang {inp.release} sizes {plan.pool:,} tokens >= {inp.required:,} "
                f"(context {inp.context_length:,} x {inp.headroom:g}; ratio {ratio})",
                *evidence,
            )
        ]
    ks = knobs(plan)
    # The knobs' notes are in the remedy; here each knob's value only (what it would take, or impossible).
    evidence += [Evidence(node, f"knob {k.name}", k.needed if k.possible else "impossible") for k in ks]
    what = f"over-pool band {band}" if plan.pool < inp.context_length else f"below the headroom x{inp.headroom:g}"
    summary = (
        f"SGLang {inp.release} sizes {plan.pool:,} tokens < {inp.required:,} required for context "
        f"{inp.context_length:,}; {what}"
    )
    if plan.startup_error:
        summary = f"the worker would not start: {plan.startup_error}"
    return [failed(GATE, "pool", node, summary, *evidence, remedy=knob_remedy(ks))]


def plan_report(plans: dict[str, WorkerPlan], notes: tuple[str, ...] = ()) -> Report:
    """The report of `kvgate plan`: one finding per role; the numbers again, machine-readable, in target."""
    findings: list[Finding] = []
    target: dict[str, Any] = {}
    for role, plan in plans.items():
        findings.extend(role_findings(role, plan))
        target[role] = {
            "model": plan.inputs.shape.architecture,
            "release": plan.inputs.release,
            "max_total_num_tokens": plan.pool,
            "max_req_input_len": plan.max_req_input_len,
            "required": plan.inputs.required,
            "fits": plan.fits,
            "steps": [{"name": s.name, "value": s.value, "formula": s.formula} for s in plan.steps],
        }
    return Report(command="plan", findings=tuple(findings), target=target, notes=notes)
