"""Gate 1: KV pool versus context, on every prefill and decode node and every DP rank.

Why decode too: decode reserves pages for the whole prompt at bootstrap (incident.md section 2,
step 1), so a decode pool below the context is the same hazard on the other side of the handoff.

SGLang's limits (sglang-surface.md section 2; the formulas live in `kvgate.upstream.admission`): the tokenizer
rejects a prompt of N >= context tokens with a plain 400, the scheduler rejects N >= max_req_input_len
= min(context - 1, pool - 1) - 5 through `set_finish_with_abort`, the path that leaked before
#36988/#38935. Every length in between passes the tokenizer and takes the abort path: the reject band.
When the pool is below the context that band is most of the over-pool band (pool, context]: prompts
that fit the context but not the pool, where every prompt the incident leaked was.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvgate.gates.base import GateContext
from kvgate.reading.node import NodeReading
from kvgate.results.findings import Evidence, Finding, Outcome, failed, inconclusive, passed
from kvgate.upstream.admission import AdmissionLimits, max_req_input_len

GATE = "pool-context"
REMEDY_POOL = (
    "raise the KV pool (e.g. --max-total-tokens / --mem-fraction-static, fewer CUDA-graph sizes, more GPUs) "
    "or lower --context-length until pool >= context x headroom; re-run the gate after every capacity change"
)


def _fmt(n: int | None) -> str:
    return "unknown" if n is None else f"{n:,}"


def effective_context(reading: NodeReading, advertised: int | None) -> tuple[int | None, str]:
    """The context the gate must hold the pool to, and where it came from."""
    engine = reading.context_length
    if engine is None and reading.context_length_flag is not None:
        engine = reading.context_length_flag
        src = "server_info context_length (operator flag; /v1/models unavailable)"
    else:
        src = reading.context_source or ""
    if advertised is not None and (engine is None or advertised > engine):
        return advertised, "--context-length / profile context_length"
    return engine, src


def check_node(reading: NodeReading, expected_role: str, advertised: int | None, headroom: float) -> list[Finding]:
    """All gate 1 findings for one node."""
    node = reading.node
    out: list[Finding] = []

    role = reading.role
    if role == "unknown":
        out.append(
            inconclusive(
                GATE,
                "role",
                node,
                "node does not report disaggregation_mode",
                Evidence(node, "disaggregation_mode", None, expected_role),
            )
        )
    elif role != expected_role:
        out.append(
            failed(
                GATE,
                "role",
                node,
                f"node was given as {expected_role} but reports disaggregation_mode={role!r}",
                Evidence(node, "disaggregation_mode", role, expected_role),
                remedy=f"pass this URL as --{role}-url, or relaunch it with --disaggregation-mode {expected_role}",
            )
        )
    else:
        out.append(
            passed(
                GATE,
                "role",
                node,
                f"reports disaggregation_mode={role!r}",
                Evidence(node, "disaggregation_mode", role, expected_role),
            )
        )

    context, ctx_src = effective_context(reading, advertised)
    if advertised is not None and reading.context_length is not None and advertised != reading.context_length:
        out.append(
            failed(
                GATE,
                "context-agreement",
                node,
                f"advertised context {_fmt(advertised)} differs from the engine's effective context "
                f"{_fmt(reading.context_length)}",
                Evidence(node, "/v1/models max_model_len", reading.context_length, f"== {advertised}"),
                remedy="make --context-length of the workers and the advertised context agree",
            )
        )

    for p in reading.problems:
        about_context = p.field.startswith("/v1/models")
        if about_context and context:
            continue  # resolved by a fallback named in the evidence
        # Every field a pool verdict rests on, on every DP rank (a rank without memory_usage included).
        about_pool = p.field in ("max_total_num_tokens", "max_req_input_len") or (
            p.field.startswith("internal_states") and "disaggregation_mode" not in p.field
        )
        if about_context or about_pool:
            out.append(
                failed(
                    GATE,
                    "field",
                    node,
                    f"{p.field}: {p.problem}; the gate fails closed",
                    Evidence(node, p.field, p.problem, "present and well-formed"),
                    remedy=(
                        "run a SGLang release that reports it (0.5.19-0.5.23 do), or check the URL points at a worker"
                    ),
                )
            )

    for p in reading.problems:
        if p.number:
            # A failure, not an error: the worker answered, and what it said proves nothing (exit 4 is
            # for a target kvgate could not read).
            out.append(
                failed(
                    GATE,
                    "number",
                    node,
                    f"{p.field}: {p.problem}: a count, length, rank or size must be a sane JSON integer",
                    Evidence(node, p.field, p.problem, "a JSON integer in range"),
                )
            )

    out.append(_rank_count(reading))

    if context is None:
        out.append(
            failed(
                GATE,
                "headroom",
                node,
                "effective context length unknown (no /v1/models max_model_len, no "
                "context_length flag, no --context-length); cannot prove pool >= context",
                Evidence(node, "context", None, "known"),
                remedy="pass --context-length or expose /v1/models",
            )
        )
        return out

    # (check name, field read, pool): the top-level value, then every DP rank, not rank 0 only.
    pools: list[tuple[str, str, int]] = []
    if reading.max_total_num_tokens is not None:
        pools.append(("headroom", reading.pool_key or "max_total_num_tokens", reading.max_total_num_tokens))
    for rank in reading.ranks:
        if rank.token_capacity is not None:
            pools.append(
                (
                    f"headroom-dp{rank.dp_rank}",
                    f"internal_states[{rank.dp_rank}].memory_usage.token_capacity",
                    rank.token_capacity,
                )
            )
    if not pools:
        return out  # the missing-field failures above already block

    required = math.ceil(context * headroom)
    out += context_sources(reading, [p for _, _, p in pools], headroom)
    for check_name, field_name, pool in pools:
        limits = AdmissionLimits.of(context, pool, reading.max_req_input_len)
        evidence = [
            Evidence(node, field_name, pool, f">= {required:,} (context {context:,} x headroom {headroom:g})"),
            Evidence(node, "context", context, ctx_src),
            Evidence(node, "ratio", round(pool / context, 4), f">= {headroom:g}"),
        ]
        band = limits.over_pool_band
        if band:
            evidence.append(
                Evidence(
                    node,
                    "over_pool_band",
                    f"({pool:,}, {context:,}]",
                    "empty: every prompt that fits the context must fit the pool",
                )
            )
        check = check_name
        if pool >= required:
            out.append(
                passed(
                    GATE, check, node, f"pool {pool:,} >= {required:,} (context {context:,} x {headroom:g})", *evidence
                )
            )
        else:
            what = (
                f"over-pool band ({pool:,}, {context:,}]: prompts that fit the context but not the pool"
                if band
                else f"below the required headroom x{headroom:g}"
            )
            out.append(
                failed(
                    GATE,
                    check,
                    node,
                    f"pool {pool:,} < {required:,} required for context {context:,}; {what}",
                    *evidence,
                    remedy=REMEDY_POOL,
                )
            )

    # server_info reports rank 0's max_req_input_len, so compare it with rank 0's pool.
    pool0 = reading.max_total_num_tokens if reading.max_total_num_tokens is not None else pools[0][2]
    if reading.max_req_input_len is not None:
        limits = AdmissionLimits.of(context, pool0, reading.max_req_input_len)
        expected = max_req_input_len(context, pool0)
        band = limits.reject_band
        ev = [
            Evidence(
                node, "max_req_input_len", reading.max_req_input_len, f"<= {expected:,} = min(context-1, pool-1)-5"
            ),
            Evidence(node, "largest_accepted_prompt", limits.longest_accepted, None),
            Evidence(
                node,
                "reject_band",
                None if band is None else f"[{band[0]:,}, {band[1]:,}]",
                "lengths that pass the tokenizer and take the scheduler's abort path",
            ),
        ]
        if reading.max_req_input_len > expected:
            out.append(
                failed(
                    GATE,
                    "admission-limit",
                    node,
                    f"max_req_input_len {reading.max_req_input_len:,} admits prompts the pool {pool0:,} cannot hold "
                    f"(expected <= {expected:,})",
                    *ev,
                    remedy="the engine's admission bound does not follow its pool; do not ship this build",
                )
            )
        else:
            width = 0 if band is None else band[1] - band[0] + 1
            out.append(
                passed(
                    GATE,
                    "admission-limit",
                    node,
                    f"largest accepted prompt {limits.longest_accepted:,}; {width:,} lengths take the abort path",
                    *ev,
                )
            )
    return out


def context_sources(reading: NodeReading, pools: list[int], headroom: float) -> list[Finding]:
    """The context read twice (or three times) must agree.

    The effective one is /v1/models' `max_model_len` (the engine's `model_config.context_len`, the
    limit the tokenizer rejects at). The `context_length` flag in server_info, when set, is the value
    that one was made from (SGLang takes it as is, or refuses to start), so any difference means the
    documents are not one server's: inconclusive. The scheduler's `max_req_input_len` = min(context
    - 1, pool - 1) - 5 implies the context it was built with wherever the pool does not bind; it may
    legitimately sit lower (a pool it counts smaller than the one reported), so it only counts where
    the headroom verdict under it differs. A verdict that differs between two answers blocks whatever
    the strictness.
    """
    node = reading.node
    context = reading.context_length if reading.context_length is not None else reading.context_length_flag
    if context is None or not pools:
        return []
    source = "/v1/models max_model_len" if reading.context_length is not None else "server_info context_length"

    def verdict(c: int) -> bool:
        return all(p >= math.ceil(c * headroom) for p in pools)

    views: list[tuple[str, int, bool]] = []  # (what, value, any difference counts)
    if reading.context_length is not None and reading.context_length_flag is not None:
        views.append(("server_info context_length (the --context-length flag)", reading.context_length_flag, True))
    mril, pool0 = reading.max_req_input_len, reading.max_total_num_tokens
    if mril is not None and pool0 is not None and mril + 6 < pool0:
        views.append(("max_req_input_len + 6 (the scheduler's context: min(context-1, pool-1)-5)", mril + 6, False))
    ev = [Evidence(node, "effective context", context, source)]
    ev += [Evidence(node, what, value, f"== {context:,}") for what, value, _ in views]
    out: list[Finding] = []
    for what, value, strict in views:
        changes = verdict(value) != verdict(context)
        if value == context or not (strict or changes):
            continue
        f = inconclusive(
            GATE,
            "context-sources",
            node,
            f"two answers for the context: {source} says {context:,}, {what} says {value:,}"
            + ("; the headroom verdict differs between them" if changes else ""),
            *ev,
            remedy="find which answer is the server's (a proxy or a stale document in front of it, or a build "
            "that reports one value and runs another), and re-run once they agree",
        )
        out.append(replace(f, blocking=True) if changes else f)
    if not out and views:
        out.append(passed(GATE, "context-sources", node, f"the context is {context:,} wherever it is read", *ev))
    return out


def _rank_count(reading: NodeReading) -> Finding:
    """Every DP rank must have reported: `internal_states` holds one entry per rank (the tokenizer
    manager's fan-out is `dp_size`, attention-DP groups included), so a rank the server left out
    is a pool nobody checked."""
    node = reading.node
    entries = reading.rank_entries
    ev = [
        Evidence(node, "internal_states entries", entries, f"== dp_size ({reading.dp_size})"),
        Evidence(node, "dp_size", reading.dp_size, "reported"),
        Evidence(node, "tp_size", reading.tp_size, None),
        Evidence(node, "enable_dp_attention", reading.dp_attention, None),
    ]
    if reading.dp_size is None:
        return failed(
            GATE,
            "dp-ranks",
            node,
            f"dp_size not reported: cannot prove all {entries} rank(s) listed are every DP rank; the gate fails closed",
            *ev,
            remedy="check the URL points at an SGLang worker (0.5.19-0.5.23 report dp_size)",
        )
    if entries != reading.dp_size:
        return failed(
            GATE,
            "dp-ranks",
            node,
            f"dp_size {reading.dp_size} but internal_states lists {entries} "
            "rank(s): the pools of the missing ranks were never checked",
            *ev,
            remedy="every DP rank must answer /server_info; check for a rank that is down or restarting",
        )
    if reading.dp_attention and reading.tp_size is not None and reading.tp_size % reading.dp_size:
        return failed(
            GATE,
            "dp-ranks",
            node,
            f"attention DP layout does not add up: tp_size {reading.tp_size} is "
            f"not a multiple of dp_size {reading.dp_size}",
            *ev,
            remedy="the reported parallel layout is inconsistent; do not trust its per-rank capacities",
        )
    return passed(GATE, "dp-ranks", node, f"all {entries} DP rank(s) reported (dp_size {reading.dp_size})", *ev)


def with_plan_knobs(
    findings: list[Finding], reading: NodeReading, model_config: str, headroom: float, deployment: Mapping[str, Any]
) -> list[Finding]:
    """Failed headroom findings of `reading`, explained with `kvgate plan`'s knobs for this model."""
    from kvgate.plan.explain import explain
    from kvgate.plan.model import load_shape
    from kvgate.reading.node import sizing_settings

    shape = load_shape(Path(model_config))
    settings = sizing_settings(reading)
    out = []
    for f in findings:
        if f.outcome is Outcome.FAILED and f.check.startswith("headroom"):
            values = {e.field: e.value for e in f.evidence}
            pool, context = f.evidence[0].value, values.get("context")
            if isinstance(pool, int) and isinstance(context, int):
                ex = explain(reading, settings, shape, context, headroom, pool, deployment)
                notes = tuple(Evidence(reading.node, name, value, how) for name, value, how in ex.notes)
                remedy = f"kvgate plan: {ex.remedy}" if ex.remedy else f.remedy
                f = replace(f, evidence=f.evidence + notes, remedy=remedy)
        out.append(f)
    return out


class PoolContextGate:
    """Gate 1 over every node the operator named."""

    name = GATE

    def run(self, ctx: GateContext) -> list[Finding]:
        out: list[Finding] = []
        opts = ctx.options
        for reading in ctx.readings:
            if reading.spec.role not in ("prefill", "decode"):
                continue
            found = check_node(reading, reading.spec.role, opts.context_len, opts.headroom)
            if opts.model_config:
                found = with_plan_knobs(
                    found, reading, opts.model_config, opts.headroom, opts.deployment.get(reading.spec.role, {})
                )
            out.extend(found)
        return out
