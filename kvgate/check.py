"""The `kvgate check` pipeline: target -> readings -> gates -> findings -> report."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Sequence

from kvgate.errors import TransportError, UsageError
from kvgate.findings import Evidence, Finding, Outcome, Report, error, passed
from kvgate.gates.base import CheckOptions, Gate, GateContext
from kvgate.gates.pool_context import PoolContextGate
from kvgate.progress import NullObserver, Observer
from kvgate.target import DECODE, PREFILL, NodeReading, NodeSpec, TargetClient, validate_url

GateFactory = Callable[[CheckOptions], Gate]


def node_specs(options: CheckOptions) -> list[NodeSpec]:
    """The workers named on the command line, in order, with per-role indices."""
    specs = [NodeSpec(PREFILL, u.rstrip("/"), i) for i, u in enumerate(options.prefill_urls)]
    specs += [NodeSpec(DECODE, u.rstrip("/"), i) for i, u in enumerate(options.decode_urls)]
    seen: set[str] = set()
    for s in specs:
        if s.url in seen:
            raise UsageError(f"{s.url} is given more than once (a node has one role)")
        seen.add(s.url)
        validate_url(f"--{s.role}-url", s.url)
    if options.router_url:
        validate_url("--router-url", options.router_url)
    return specs


def default_gates(options: CheckOptions) -> list[Gate]:
    """Gate 1 and the defenses gate always; the probe gates when a router is given.

    Construction validates the profile's sections, so a bad profile is a usage error before any
    request is sent.
    """
    from kvgate.gates.defenses import DefensesGate

    gates: list[Gate] = [PoolContextGate(), DefensesGate(options)]
    if options.router_url:
        from kvgate.gates.probes import ProbeGate, ProbeSettings

        where = options.profile_name or "probe settings"
        gates.append(ProbeGate(ProbeSettings.from_mapping(options.probes, where)))
    return gates


def _router_findings(client: TargetClient, url: str) -> list[Finding]:
    node = f"router {url}"
    try:
        body = client.get_json(url, "/readiness", missing_ok=True)
    except TransportError as exc:
        return [error("target", "reachable", node, str(exc), Evidence(node, "GET /readiness", exc.problem, "200"))]
    if body is None:
        return [passed("target", "reachable", node, "router answers (no /readiness endpoint)")]
    return [passed("target", "reachable", node, "router is ready", Evidence(node, "/readiness", body, "200"))]


def _target_summary(options: CheckOptions, readings: Sequence[NodeReading]) -> dict[str, object]:
    return {
        "router": options.router_url,
        "profile": options.profile_name,
        "nodes": [
            {"role": r.spec.role, "url": r.spec.url, "version": r.version, "disaggregation_mode": r.role,
             "context_length": r.context_length, "max_total_num_tokens": r.max_total_num_tokens,
             "max_req_input_len": r.max_req_input_len, "page_size": r.page_size,
             "transfer_backend": r.transfer_backend, "dp_ranks": len(r.ranks)}
            for r in readings
        ],
    }


def run_check(
    options: CheckOptions,
    *,
    token: str | None = None,
    observer: Observer | None = None,
    gates: Sequence[Gate] | None = None,
    self_test: bool = False,
) -> Report:
    """Run every gate against the target and return the report (never raises for target behaviour).

    With `self_test`, the probes first run against a simulated leaky release (the positive control);
    if they cannot see that leak, no probe verdict of this run counts as passed.
    """
    observer = observer or NullObserver()
    specs = node_specs(options)
    if self_test and not specs:
        return _self_test_only(options, observer)
    if not specs:
        raise UsageError("nothing to check: give at least one --prefill-url or --decode-url")
    gates = list(gates) if gates is not None else default_gates(options)
    started = time.time()
    findings: list[Finding] = []
    control: list[Finding] = []
    if self_test:
        control = _run_self_test(options, observer)
        findings.extend(control)
    with TargetClient(timeout=options.timeout, token=token) as client:
        observer.log(f"reading server_info of {len(specs)} node(s)")
        readings: list[NodeReading] = []
        for spec, result in zip(specs, client.read_nodes(specs)):
            if isinstance(result, TransportError):
                findings.append(error("target", "reachable", spec.label, str(result),
                                      Evidence(spec.label, "url", result.url, "reachable SGLang worker")))
            else:
                readings.append(result)
                findings.append(passed("target", "reachable", spec.label,
                                       f"SGLang {result.version or '?'} answered {result.info_path}"))
        if options.router_url:
            findings.extend(_router_findings(client, options.router_url.rstrip("/")))
        ctx = GateContext(options=options, readings=readings, client=client, observer=observer, prior=findings)
        for gate in gates:
            observer.log(f"gate {gate.name}")
            try:
                findings.extend(gate.run(ctx))
            except TransportError as exc:
                findings.append(error(gate.name, "transport", exc.url, str(exc)))
            except Exception as exc:  # noqa: BLE001 - a broken gate must block, never pass
                findings.append(Finding(gate.name, "internal", "kvgate", Outcome.ERROR,
                                        f"gate crashed: {type(exc).__name__}: {exc}"))
    if control and any(f.outcome is not Outcome.PASSED for f in control):
        findings = _distrust_probes(findings, control)
    notes: list[str] = []
    if options.waivers:
        from kvgate.waivers import apply_waivers

        findings, notes = apply_waivers(findings, options.waivers)
    cost = dict(ctx.cost)
    cost.setdefault("wall_s", round(time.time() - started, 3))
    return Report(command="check", findings=tuple(findings), strict=options.strict,
                  strict_source=options.strict_source, target=_target_summary(options, readings), cost=cost,
                  notes=tuple(notes))


def _run_self_test(options: CheckOptions, observer: Observer) -> list[Finding]:
    from kvgate.gates.probes import ProbeSettings
    from kvgate.gates.probes.selftest import run_self_test

    settings = ProbeSettings.from_mapping(options.probes, options.profile_name or "probe settings")
    return run_self_test(settings, observer)


def _self_test_only(options: CheckOptions, observer: Observer) -> Report:
    started = time.time()
    findings = _run_self_test(options, observer)
    return Report(command="check --self-test", findings=tuple(findings), strict=options.strict,
                  strict_source=options.strict_source,
                  cost={"wall_s": round(time.time() - started, 3)})


def _distrust_probes(findings: list[Finding], control: list[Finding]) -> list[Finding]:
    """A probe set that could not see a known leak cannot vouch for 'no leak': passes become inconclusive."""
    out = []
    for f in findings:
        if f.gate == "probes" and f.outcome is Outcome.PASSED and f not in control:
            f = replace(f, outcome=Outcome.INCONCLUSIVE,
                        summary=f"{f.summary} (not trusted: the positive control did not see the known leak)")
        out.append(f)
    return out


__all__ = ["run_check", "node_specs", "default_gates", "CheckOptions"]
