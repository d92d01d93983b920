"""The `kvgate check` pipeline: target -> readings -> gates -> findings -> report."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvgate.errors import TransportError, UsageError
from kvgate.gates.base import CheckOptions, Gate, GateContext
from kvgate.gates.fleet import PD_ROLES, FleetGate
from kvgate.gates.pool_context import PoolContextGate
from kvgate.output.progress import NullObserver, Observer, StepRecorder
from kvgate.pipeline.router import listing_findings, read_listing, router_loads, router_reachable, router_readiness
from kvgate.pipeline.stability import Judged, settle
from kvgate.reading.discovery import RankLoad, RouterListing, normalize_url
from kvgate.reading.node import DECODE, PREFILL, NodeReading, NodeSpec
from kvgate.reading.target import TargetClient, validate_url
from kvgate.results import baseline
from kvgate.results.findings import Evidence, Finding, Outcome, Report, error, inconclusive, info, passed

if TYPE_CHECKING:  # each gate's module loads when the run needs it
    from kvgate.gates.probes import ProbeSettings

#: Role of a worker the router lists without one (`/list_workers`), until its own server_info says.
UNRESOLVED = "worker"

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
    if options.router_health_url:
        validate_url("--router-health-url", options.router_health_url)
    return specs


def default_gates(options: CheckOptions) -> list[Gate]:
    """Gate 1, the defenses and the fleet gates always; the baseline gate with --baseline; the probe
    gates when a router is given (unless --no-probes; `_probe_setup` reports either absence).

    Construction validates the profile's sections and the baseline file, so a bad one is a usage
    error before any request is sent.
    """
    from kvgate.gates.defenses import DefensesGate

    gates: list[Gate] = [PoolContextGate(), DefensesGate(options), FleetGate()]
    if options.baseline:
        from kvgate.gates.baseline import BaselineGate

        gates.append(BaselineGate(options.baseline))
    if options.router_url and options.probes_enabled:
        from kvgate.gates.probes import ProbeGate, ProbeSettings

        where = options.profile_name or "probe settings"
        gates.append(ProbeGate(ProbeSettings.from_mapping(options.probes, where)))
    return gates


def discovered_specs(listing: RouterListing) -> list[NodeSpec]:
    """One spec per worker the router lists (a DP worker once), with the router's role where it gives one."""
    specs: list[NodeSpec] = []
    index: Counter[str] = Counter()
    for url, entries in listing.by_base_url().items():
        roles = {e.role for e in entries if e.role in PD_ROLES}
        role = roles.pop() if len(roles) == 1 else UNRESOLVED
        specs.append(NodeSpec(role, url, index[role]))
        index[role] += 1
    return specs


def _resolve_roles(specs: list[NodeSpec], results: list[NodeReading | TransportError]) -> None:
    """Workers listed without a role take the one they report (in place); the rest stay unresolved."""
    index = Counter(s.role for s in specs)
    for i, (spec, result) in enumerate(zip(specs, results, strict=True)):
        if spec.role == UNRESOLVED and isinstance(result, NodeReading) and result.role in PD_ROLES:
            specs[i] = NodeSpec(result.role, spec.url, index[result.role])
            index[result.role] += 1
            results[i] = replace(result, spec=specs[i])


def _router_names(listing: RouterListing | None) -> dict[str, list[str]]:
    """Each worker's names in the router (its `worker_id`s; one per DP rank under --dp-aware), by URL."""
    if listing is None:
        return {}
    return {url: [e.name for e in entries] for url, entries in listing.by_base_url().items()}


def _target_summary(
    options: CheckOptions, readings: Sequence[NodeReading], listing: RouterListing | None = None
) -> dict[str, object]:
    names = _router_names(listing)
    return {
        "router": options.router_url,
        "router_listing": None if listing is None else {"endpoint": listing.endpoint, "entries": len(listing.workers)},
        "profile": options.profile_name,
        "nodes": [
            {
                "role": r.spec.role,
                "url": r.spec.url,
                "version": r.version,
                "disaggregation_mode": r.role,
                "context_length": r.context_length,
                "max_total_num_tokens": r.max_total_num_tokens,
                "max_req_input_len": r.max_req_input_len,
                "page_size": r.page_size,
                "transfer_backend": r.transfer_backend,
                "dp_ranks": len(r.ranks),
                "router_names": names.get(normalize_url(r.spec.url), []),
            }
            for r in readings
        ],
    }


#: the gate a re-gate does not repeat (it sends traffic through the router): its first-round findings stand
_NOT_REPEATED = frozenset({"probes"})


class _Fleet:
    """One run's means to judge the fleet: the first round, and each round again when the second look
    finds it moved (kvgate/pipeline/stability.py). A round reads what it has no fresh reading of, then judges."""

    def __init__(
        self,
        options: CheckOptions,
        client: TargetClient,
        observer: Observer,
        gates: Sequence[Gate],
        pre: list[Finding],
        cost: dict[str, object],
        router_token: str | None,
        given: Sequence[NodeSpec],
    ) -> None:
        self.options, self.client, self.observer, self.gates = options, client, observer, gates
        self.pre, self.cost, self.router_token, self.given = pre, cost, router_token, list(given)
        self.router = options.router_url.rstrip("/") if options.router_url else ""
        self.discovered = not given  # the workers are the router's listing, not the command line's
        self.unrepeated = _NOT_REPEATED
        self.started = time.time()
        self.timeline: list[dict[str, Any]] = []  # what ran when, how long, what it judged (html report)

    def regate(self, listing: RouterListing | None, fresh: Mapping[str, NodeReading]) -> Judged:
        """The fleet judged again on the listing just read, with the readings just taken."""
        specs = discovered_specs(listing) if self.discovered and listing is not None else self.given
        return self.judge(listing, specs, fresh, first=False)

    def judge(
        self,
        listing: RouterListing | None,
        specs: Sequence[NodeSpec],
        fresh: Mapping[str, NodeReading] | None = None,
        *,
        first: bool = True,
    ) -> Judged:
        prior = list(self.pre)  # what each gate sees before it; the round's own findings are the rest
        ctx = GateContext(
            options=self.options, readings=[], client=self.client, observer=self.observer, prior=prior, cost=self.cost
        )
        specs = list(specs)
        with ThreadPoolExecutor(1, thread_name_prefix="kvgate-router") as pool:
            # The router's readiness and loads are read while the workers are (the workers' answers are
            # most of a round's wait); their findings keep their place before the workers'.
            side = pool.submit(self._router_side, listing) if listing is not None and listing.workers else None
            results = self._read(specs, fresh or {}, first) if specs else []
            if listing is not None:
                prior.extend(listing_findings(listing))
            if side is not None:
                found, loads, loads_problem = side.result()
                prior.extend(found)
                ctx = replace(ctx, listing=listing, router_loads=loads, router_loads_problem=loads_problem)
        if not specs:  # none listed, or every URL refused: what the listing says is the round
            return Judged(listing, (), (), tuple(prior[len(self.pre) :]))
        _resolve_roles(specs, results)
        readings: list[NodeReading] = []
        for spec, result in zip(specs, results, strict=True):
            if isinstance(result, TransportError):
                prior.append(
                    error(
                        "target",
                        "reachable",
                        spec.label,
                        str(result),
                        Evidence(spec.label, "url", result.url, "reachable SGLang worker"),
                    )
                )
            else:
                readings.append(result)
                what = f"SGLang {result.version or '?'} answered {result.info_path}"
                prior.append(passed("target", "reachable", spec.label, what))
        ctx = replace(ctx, readings=readings, attempted=tuple(specs))
        if first:
            prior.extend(_probe_setup(self.options))
        for gate in self.gates:
            if first or gate.name not in self.unrepeated:
                t0 = time.time()
                got = _run_gate(gate, ctx)
                prior.extend(got)
                name = gate.name if first else f"{gate.name} (again)"
                self.timeline.append(_timed(name, t0 - self.started, time.time() - t0, got))
        return Judged(listing, tuple(specs), tuple(results), tuple(prior[len(self.pre) :]))

    def _router_side(self, listing: RouterListing) -> tuple[list[Finding], tuple[RankLoad, ...] | None, str | None]:
        """The router's readiness findings and its per-rank loads (or why not), for one round."""
        found = router_readiness(self.client, self.options.router_health_url or self.router, listing)
        return (found, *router_loads(self.client, self.router, self.router_token))

    def _read(
        self, specs: list[NodeSpec], fresh: Mapping[str, NodeReading], first: bool
    ) -> list[NodeReading | TransportError]:
        todo = [s for s in specs if s.url not in fresh]
        got: list[NodeReading | TransportError] = []
        if todo:
            started = time.monotonic()
            what = "" if first else "new "
            with self.observer.step(
                f"reading metadata of {len(todo)} {what}worker(s), {self.options.concurrency} at a time",
                total=len(todo),
            ) as step:
                got = self.client.read_nodes(todo, read_deadline_s=self.options.read_deadline, on_done=step.advance)
            if first:
                self.cost["metadata_read_s"] = round(time.monotonic() - started, 3)
        new = iter(got)
        return [replace(fresh[s.url], spec=s) if s.url in fresh else next(new) for s in specs]


def _run_gate(gate: Gate, ctx: GateContext) -> list[Finding]:
    ctx.observer.log(f"gate {gate.name}")
    try:
        return gate.run(ctx)
    except TransportError as exc:
        return [error(gate.name, "transport", exc.url, str(exc))]
    except Exception as exc:  # noqa: BLE001 - a broken gate must block, never pass
        return [Finding(gate.name, "internal", "kvgate", Outcome.ERROR, f"gate crashed: {type(exc).__name__}: {exc}")]


def run_check(
    options: CheckOptions,
    *,
    token: str | None = None,
    observer: Observer | None = None,
    gates: Sequence[Gate] | None = None,
    self_test: bool = False,
    router_token: str | None = None,
) -> Report:
    """Run every gate against the target and return the report (never raises for target behaviour).

    With `self_test`, the probes first run against a simulated leaky release (the positive control);
    if they cannot see that leak, no probe verdict of this run counts as passed. `router_token` goes
    only to the router's control-plane routes (/workers, /get_loads); `token` to everything else.
    """
    recorder = StepRecorder(observer or NullObserver())  # each step's start and duration: the html timeline
    observer = recorder
    specs = node_specs(options)
    if self_test and not specs and not options.router_url:
        return _self_test_only(options, observer)
    if not specs and not options.router_url:
        raise UsageError("nothing to check: give --router-url, or at least one --prefill-url or --decode-url")
    gates = list(gates) if gates is not None else default_gates(options)
    started = time.time()
    recorder.t0 = time.monotonic()  # the steps' offsets and the gates' count from the same start
    findings: list[Finding] = []
    control: list[Finding] = []
    left: list[str] = []  # where the self-test's simulator left its logs
    if self_test:
        control = _run_self_test(options, observer, left)
        findings.extend(control)
    readings: list[NodeReading] = []
    listing: RouterListing | None = None
    unread: list[str] = []
    cost: dict[str, object] = {}
    with TargetClient(timeout=options.timeout, token=token, concurrency=options.concurrency) as client:
        fleet = _Fleet(options, client, observer, gates, findings, cost, router_token, specs)
        fleet.started = started  # the timeline's offsets count from the run's start
        if options.router_url:
            router = options.router_url.rstrip("/")
            findings.extend(router_reachable(client, router))
            listing = read_listing(client, router, findings, router_token)
            if listing is not None and not specs:
                specs = discovered_specs(listing)
                observer.log(f"the router lists {len(specs)} worker(s) ({listing.endpoint})")
        if specs:
            judged = fleet.judge(listing, specs)
            # The second look: the verdict is on the fleet as it stands now, or there is none
            # (kvgate/pipeline/stability.py).
            first = judged
            judged, stable = settle(
                client,
                options.router_url.rstrip("/") if options.router_url else None,
                judged,
                fleet.regate,
                discovered=fleet.discovered,
                read_deadline_s=options.read_deadline,
                router_token=router_token,
            )
            if judged is not first:  # judged again without the probes: theirs stand from the first round
                findings.extend(f for f in first.findings if f.gate in fleet.unrepeated)
            findings.extend(judged.findings)
            findings.append(stable)
            listing, readings = judged.listing, judged.readings
            if options.write_baseline:
                unread = [
                    s.url for s, r in zip(judged.specs, judged.results, strict=True) if isinstance(r, TransportError)
                ]
        elif listing is not None:  # nothing to read (none listed, or every URL refused): what the listing says
            findings.extend(fleet.judge(listing, []).findings)
    if control and any(f.outcome is not Outcome.PASSED for f in control):
        findings = _distrust_probes(findings, control)
    notes: list[str] = []
    if options.waivers:
        from kvgate.results.waivers import apply_waivers

        findings, notes = apply_waivers(findings, options.waivers)
    notes += left
    if options.write_baseline:
        # Last, on the verdict as it stands: only a run that passed renews the reference of the next.
        findings.append(
            baseline.write(
                Path(options.write_baseline), readings, findings, options.router_url, unread, strict=options.strict
            )
        )
    cost.setdefault("wall_s", round(time.time() - started, 3))
    if fleet.timeline:
        cost["gates"] = fleet.timeline  # what ran when, how long, what it judged (the html report's timeline)
    if recorder.steps:
        cost["steps"] = recorder.steps  # inside the gates: each probe and read, when and how long
        if recorder.dropped:
            cost["steps_dropped"] = recorder.dropped
    return Report(
        command="check",
        findings=tuple(findings),
        strict=options.strict,
        strict_source=options.strict_source,
        target=_target_summary(options, readings, listing),
        cost=cost,
        notes=tuple(notes),
    )


#: What the probes are, for the findings that say they did not run.
_PROBES_WHAT = "the content probes (exact-length contracts, canaries, isolation, latency, abort) did not run"


def _probe_setup(options: CheckOptions) -> list[Finding]:
    """Probes off by choice is reported (info, and in the verdict line); probes off for want of a
    router is doubt (inconclusive): the content probes are the core of the gate."""
    node = f"router {options.router_url}" if options.router_url else "deployment"
    if not options.probes_enabled:
        return [info("probes", "setup", node, f"opted out with --no-probes: {_PROBES_WHAT}")]
    if not options.router_url:
        return [
            inconclusive(
                "probes",
                "setup",
                node,
                f"no --router-url: {_PROBES_WHAT}",
                remedy="give the router, or opt out with --no-probes",
            )
        ]
    return []


def run_self_test(
    settings: ProbeSettings, observer: Observer | None = None, notes: list[str] | None = None
) -> list[Finding]:
    """The positive control: the probe gate against a simulated leaky 0.5.19 deployment it starts.

    Composed here, by the pipeline that runs the gates; the gate's own module
    (kvgate.gates.probes.selftest) gives the shape and the verdict: PASSED only if the probes saw the leak.
    """
    from kvgate.gates.probes import ProbeGate, selftest
    from kvgate.sim.deploy import SimDeployment

    observer = observer or NullObserver()
    t0 = time.monotonic()
    blind: list[Finding] = []
    for attempt in range(1, selftest.ATTEMPTS + 1):
        try:
            with observer.step(f"self-test: starting the simulated 0.5.19 deployment (attempt {attempt})"):
                dep = SimDeployment(**selftest.SELFTEST_SHAPE).start()
        except Exception as exc:  # noqa: BLE001 - any start failure means nothing was controlled
            return selftest.not_started(exc)
        try:
            options = CheckOptions(
                prefill_urls=tuple(dep.prefill_urls),
                decode_urls=tuple(dep.decode_urls),
                router_url=dep.router_url,
                timeout=30.0,
            )
            report = run_check(options, observer=observer, gates=[ProbeGate(selftest.control_settings(settings))])
        finally:
            dep.stop()
            if notes is not None and dep.log_dir is not None and dep.log_dir.exists():
                from kvgate.paths import left_behind

                notes.append(left_behind("self-test simulator logs", dep.log_dir, f"delete with rm -rf {dep.log_dir}"))
        earlier = blind[0].summary if blind else None
        verdict = selftest.judge(report.findings, round(time.monotonic() - t0, 2), attempt, earlier)
        if verdict[0].outcome != Outcome.FAILED:
            return verdict
        blind = verdict
    return blind


def _run_self_test(options: CheckOptions, observer: Observer, notes: list[str]) -> list[Finding]:
    from kvgate.gates.probes import ProbeSettings

    settings = ProbeSettings.from_mapping(options.probes, options.profile_name or "probe settings")
    return run_self_test(settings, observer, notes)


def _self_test_only(options: CheckOptions, observer: Observer) -> Report:
    started = time.time()
    notes: list[str] = []
    findings = _run_self_test(options, observer, notes)
    return Report(
        command="check --self-test",
        findings=tuple(findings),
        strict=options.strict,
        strict_source=options.strict_source,
        cost={"wall_s": round(time.time() - started, 3)},
        notes=tuple(notes),
    )


def _distrust_probes(findings: list[Finding], control: list[Finding]) -> list[Finding]:
    """A probe set that could not see a known leak cannot vouch for 'no leak': passes become inconclusive."""
    out = []
    for f in findings:
        if f.gate == "probes" and f.outcome is Outcome.PASSED and f not in control:
            f = replace(
                f,
                outcome=Outcome.INCONCLUSIVE,
                summary=f"{f.summary} (not trusted: the positive control did not see the known leak)",
            )
        out.append(f)
    return out


__all__ = ["run_check", "run_self_test", "node_specs", "default_gates", "CheckOptions"]


def _timed(gate: str, start_s: float, seconds: float, judged: Sequence[Finding]) -> dict[str, Any]:
    """One gate's entry in the run's timeline: when it started, how long it ran, what it judged."""
    outcomes: dict[str, int] = {}
    for f in judged:
        outcomes[f.outcome.value] = outcomes.get(f.outcome.value, 0) + 1
    return {
        "gate": gate,
        "start_s": round(start_s, 3),
        "seconds": round(seconds, 3),
        "outcomes": outcomes,
        "checks": sorted({f.test_id for f in judged}),
    }
