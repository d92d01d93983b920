"""The defenses gate (gate 4, static part): which fixes and defenses are really on, node by node.

One module per check, each a function of `DefenseInputs` (`common`) that returns findings:
- `release` (`defenses.release`, per node): the code must carry every correctness fix of the
  catalogue for its backend, read where the node runs it (`code`: which scan vouches for which node);
- `deferred` (`defenses.deferred-release`, per node): deferred decode KV release on, on a backend
  that supports it;
- `checksum` (`defenses.kv-checksum`, deployment) and `canary` (`defenses.kv-canary`, per node): the
  opt-in detection aids, counted only where they work.
`options` validates the profile's `defenses:` section; `gate` runs every check over a `GateContext`.
"""

from __future__ import annotations

from kvgate.gates.defenses.canary import MLA_DSA_ARCHITECTURES
from kvgate.gates.defenses.code import PLACEHOLDERS, CodeSource, code_sources, source_for, vouch
from kvgate.gates.defenses.common import GATE, DefenseInputs, inputs_from_reading
from kvgate.gates.defenses.gate import DefensesGate, run_defenses_gate
from kvgate.gates.defenses.options import DEFENSE_KEYS, DefenseOptions, defense_options
from kvgate.upstream.releases import DEFERRED_ENV

__all__ = [
    "CodeSource",
    "DEFENSE_KEYS",
    "DEFERRED_ENV",
    "DefenseInputs",
    "DefenseOptions",
    "DefensesGate",
    "GATE",
    "MLA_DSA_ARCHITECTURES",
    "PLACEHOLDERS",
    "code_sources",
    "defense_options",
    "inputs_from_reading",
    "run_defenses_gate",
    "source_for",
    "vouch",
]
