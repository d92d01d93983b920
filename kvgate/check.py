"""The `kvgate check` pipeline: target -> readings -> gates -> findings -> report."""

from __future__ import annotations

import time
from typing import Callable, Sequence

from kvgate.errors import TransportError, UsageError
from kvgate.findings import Evidence, Finding, Outcome, Report, error, passed
from kvgate.gates.base import CheckOptions, Gate, GateContext
from kvgate.gates.pool_context import PoolContextGate
from kvgate.progress import NullObserver, Observer
from kvgate.target import DECODE, PREFILL, NodeReading, NodeSpec, TargetClient

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
        if not s.url.startswith(("http://", "https://")):
            raise UsageError(f"--{s.role}-url {s.url}: expected an http:// or https:// URL")
    if options.router_url and not options.router_url.startswith(("http://", "https://")):
        raise UsageError(f"--router-url {options.router_url}: expected an http:// or https:// URL")
    return specs


def default_gates(options: CheckOptions) -> list[Gate]:
    """Gate 1 always; the defenses gate and the probe gates where they apply."""
    gates: list[Gate] = [PoolContextGate()]
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
) -> Report:
    """Run every gate against the target and return the report (never raises for target behaviour)."""
    observer = observer or NullObserver()
    specs = node_specs(options)
    if not specs:
        raise UsageError("nothing to check: give at least one --prefill-url or --decode-url")
    started = time.time()
    findings: list[Finding] = []
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
        for gate in (gates if gates is not None else default_gates(options)):
            observer.log(f"gate {gate.name}")
            try:
                findings.extend(gate.run(ctx))
            except TransportError as exc:
                findings.append(error(gate.name, "transport", exc.url, str(exc)))
            except Exception as exc:  # noqa: BLE001 - a broken gate must block, never pass
                findings.append(Finding(gate.name, "internal", "kvgate", Outcome.ERROR,
                                        f"gate crashed: {type(exc).__name__}: {exc}"))
    cost = dict(ctx.cost)
    cost.setdefault("wall_s", round(time.time() - started, 3))
    return Report(command="check", findings=tuple(findings), strict=options.strict,
                  target=_target_summary(options, readings), cost=cost)


__all__ = ["run_check", "node_specs", "default_gates", "CheckOptions"]
