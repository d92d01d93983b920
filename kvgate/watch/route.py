"""What a planned watch's probes go out with: the bounded client, the router, the planned lengths, the
sentinel codec and the probe settings; one `sender()` builds the gate's Sender over them for every
traffic kind (the scheduled probes, the golden-set bursts, the handoff rounds, a soak's content checks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from kvgate.gates.probes.canary import Sender
from kvgate.gates.probes.client import GenerateClient
from kvgate.gates.probes.cost import CostMeter
from kvgate.gates.probes.plan import ProbeLimits
from kvgate.gates.probes.sentinels import Sentinel, TokenCodec
from kvgate.gates.probes.settings import ProbeSettings
from kvgate.output.progress import NullObserver


@dataclass(frozen=True)
class ProbeRoute:
    """The client, the router (kept without a trailing slash), the lengths, the codec and the settings."""

    http: httpx.Client
    router: str
    limits: ProbeLimits
    codec: TokenCodec
    settings: ProbeSettings

    def __post_init__(self) -> None:
        object.__setattr__(self, "router", self.router.rstrip("/"))

    def sender(self, book: Sequence[Sentinel] = ()) -> Sender:
        """A Sender through the router within the settings' deadline, costs charged against the planned
        context, observed by no one; `book` holds sentinels sent earlier (their owners are known)."""
        return Sender(
            GenerateClient(self.http, self.router, self.settings.deadline_s),
            self.codec,
            CostMeter(context=self.limits.context),
            NullObserver(),
            book=list(book),
        )


__all__ = ["ProbeRoute"]
