"""The baseline gate: the fleet as read now against a recorded baseline (kvgate/results/baseline.py)."""

from __future__ import annotations

from pathlib import Path

from kvgate.gates.base import GateContext
from kvgate.reading.discovery import normalize_url
from kvgate.results import baseline
from kvgate.results.findings import Finding

GATE = baseline.GATE


class BaselineGate:
    """Loads the baseline at construction (a bad file is a usage error before any request)."""

    name = GATE

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.doc = baseline.load(self.path)

    def run(self, ctx: GateContext) -> list[Finding]:
        current = baseline.record(ctx.readings, ctx.prior, ctx.options.router_url)
        read = {normalize_url(r.spec.url) for r in ctx.readings}
        labels = {normalize_url(s.url): s.label for s in ctx.attempted}
        unread = [u for u in labels if u not in read]
        return baseline.compare(self.doc, current, labels, unread, str(self.path))
