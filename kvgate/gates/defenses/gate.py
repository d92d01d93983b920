"""The defenses gate: each check over every node, and the `kvgate check` adapter."""

from __future__ import annotations

from collections.abc import Sequence

from kvgate.findings import Finding
from kvgate.gates.base import CheckOptions, GateContext
from kvgate.gates.defenses.canary import check_canary
from kvgate.gates.defenses.checksum import check_checksum
from kvgate.gates.defenses.code import code_sources, read_code
from kvgate.gates.defenses.common import GATE, DefenseInputs
from kvgate.gates.defenses.deferred import check_deferred
from kvgate.gates.defenses.options import DefenseOptions
from kvgate.gates.defenses.release import check_release


def run_defenses_gate(
    nodes: Sequence[DefenseInputs],
    *,
    deferred_release_env: bool | None = None,
    model_arch: str | None = None,
    require_checksum: bool = False,
    require_canary: bool = False,
    trust_version: bool = False,
) -> list[Finding]:
    """Gate 4 (static part) over the PD workers; the keywords are `DefenseOptions`'."""
    findings = [check_release(n, trust_version) for n in nodes]
    findings += [check_deferred(n, deferred_release_env) for n in nodes]
    findings.append(check_checksum(nodes, require_checksum))
    findings += [check_canary(n, model_arch, require_canary) for n in nodes]
    return findings


class DefensesGate:
    """`kvgate check` adapter: the Gate protocol (kvgate.gates.base) around run_defenses_gate.

    Options come from `CheckOptions.defenses` (the profile's `defenses:` section) and `CheckOptions.code`
    (where each node's code is read), validated at construction so a bad profile is a usage error, not a
    crashed gate.
    """

    name = GATE

    def __init__(self, options: CheckOptions | None = None) -> None:
        options = options or CheckOptions()
        where = options.profile_name or "profile"
        self.options = DefenseOptions.from_section(options.defenses, where)
        self.sources = code_sources(options.code, where)

    def run(self, ctx: GateContext) -> list[Finding]:
        nodes = read_code(ctx.readings, self.sources, ctx.observer)
        if not nodes:
            return []
        o = self.options
        return run_defenses_gate(
            nodes,
            deferred_release_env=o.deferred_release_env,
            model_arch=o.model_arch,
            require_checksum=o.require_checksum,
            require_canary=o.require_canary,
            trust_version=o.trust_version,
        )
