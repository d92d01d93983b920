"""What a gate receives and returns.

A gate is a function of a `GateContext` that returns findings. Readings are taken once, before any
gate runs, so every gate sees the same snapshot of the target.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvgate.defaults import DEFAULT_CONCURRENCY
from kvgate.output.progress import NullObserver, Observer
from kvgate.reading.discovery import RankLoad, RouterListing
from kvgate.reading.node import NodeReading, NodeSpec
from kvgate.reading.target import TargetClient
from kvgate.results.findings import Finding


@dataclass(frozen=True)
class CheckOptions:
    """Everything `kvgate check` was asked to do, after merging the profile and the flags."""

    prefill_urls: tuple[str, ...] = ()
    decode_urls: tuple[str, ...] = ()
    router_url: str | None = None
    # Where the router serves its probes (smg --health-check-port): /readiness is read there.
    router_health_url: str | None = None
    context_len: int | None = None
    headroom: float = 1.25
    timeout: float = 10.0
    # Inconclusive blocks unless the operator opted out (--no-strict, profile `strict: false`).
    strict: bool = True
    strict_source: str = "default"
    profile_name: str | None = None
    # Probe gates (router required): deadline of one probe, number of concurrent tenants, and so on.
    probes: Mapping[str, Any] = field(default_factory=dict)
    # Defenses gate: operator knowledge the server does not expose (e.g. deferred-release env).
    defenses: Mapping[str, Any] = field(default_factory=dict)
    # Accepted findings with a reason and an expiry (kvgate.results.waivers.Waiver); from the profile.
    waivers: tuple[Any, ...] = ()
    # Where each node's code is read (defenses gate): key "*" (flags), "prefill", "decode" or a node URL ->
    # {"site_packages": PATH} or {"python": COMMAND}; validated by kvgate.gates.defenses.code_sources.
    code: Mapping[str, Any] = field(default_factory=dict)
    # Fleet: workers read at once, the whole read's deadline (s), and the probe gates on or off.
    concurrency: int = DEFAULT_CONCURRENCY
    read_deadline: float | None = None
    probes_enabled: bool = True
    # Drift: compare with this baseline file / write a new one after the run.
    baseline: str | None = None
    write_baseline: str | None = None
    # `kvgate plan` inputs that explain a pool/context failure with knobs: the model's config.json and
    # the profile's deployment section (per role).
    model_config: str | None = None
    deployment: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass
class GateContext:
    """The snapshot of the target plus the means to talk to it."""

    options: CheckOptions
    readings: Sequence[NodeReading]
    client: TargetClient
    observer: Observer = field(default_factory=NullObserver)
    prior: list[Finding] = field(default_factory=list)
    cost: dict[str, Any] = field(default_factory=dict)
    # The router's worker list (None without --router-url, or when it could not be read).
    listing: RouterListing | None = None
    # Every worker the run tried to read (read or not), in order.
    attempted: Sequence[NodeSpec] = ()
    # The router's per-DP-rank pools (/get_loads; None: not read), or why they could not be read.
    router_loads: tuple[RankLoad, ...] | None = None
    router_loads_problem: str | None = None

    def nodes(self, role: str) -> list[NodeReading]:
        return [r for r in self.readings if r.spec.role == role]


class Gate(Protocol):
    """A gate: a name and a run function."""

    name: str

    def run(self, ctx: GateContext) -> list[Finding]:
        """Check the target; return findings (never raise for a target's misbehaviour)."""
