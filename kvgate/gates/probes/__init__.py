"""Probing gates (issue 4): exact-length contracts, canaries, latency and abort mid-transfer.

Public API: `ProbeGate(settings)` (a gate named "probes"), `ProbeSettings.from_mapping(mapping, source)`,
`Verdict` (the contract's named failure classes) and `run_self_test` in `kvgate.gates.probes.selftest`.
"""

from __future__ import annotations

from kvgate.gates.probes.contract import Verdict
from kvgate.gates.probes.gate import ProbeGate
from kvgate.gates.probes.settings import ProbeSettings

__all__ = ["ProbeGate", "ProbeSettings", "Verdict"]
