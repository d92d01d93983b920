"""The defenses gate: each check over every node, and the `kvgate check` adapter."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from kvgate.gates.base import CheckOptions, GateContext
from kvgate.gates.defenses.canary import check_canary
from kvgate.gates.defenses.checksum import check_checksum
from kvgate.gates.defenses.code import code_sources, read_code
from kvgate.gates.defenses.common import GATE, DefenseInputs, backend_of
from kvgate.gates.defenses.deferred import check_deferred
from kvgate.gates.defenses.options import DefenseOptions
from kvgate.gates.defenses.release import check_release
from kvgate.results.findings import Finding


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
    findings = _release_findings(nodes, trust_version)
    findings += [check_deferred(n, deferred_release_env) for n in nodes]
    findings.append(check_checksum(nodes, require_checksum))
    findings += [check_canary(n, model_arch, require_canary) for n in nodes]
    return findings


#: the name a node is judged under when its judgement is shared (no worker URL holds a NUL)
_ANON = "\x00node"


def _release_findings(nodes: Sequence[DefenseInputs], trust_version: bool) -> list[Finding]:
    """check_release per node. Nodes judged by their version string alone that differ only in name
    share one judgement, made once and named per node: a fleet of 1,024 on one release costs one
    assessment, not 1,024 (bench/fleet_read.py). A node whose code was read is judged on its own."""
    memo: dict[tuple[object, ...], Finding | None] = {}
    out: list[Finding] = []
    for n in nodes:
        if n.fixes is not None or n.code_error is not None:
            out.append(check_release(n, trust_version))
            continue
        key = (n.version, backend_of(n), n.code_doubt)
        if key not in memo:
            first = check_release(replace(n, node=_ANON), trust_version)
            memo[key] = first if _only_named(first) else None
        shared = memo[key]
        out.append(check_release(n, trust_version) if shared is None else _named(shared, n.node))
    return out


def _only_named(f: Finding) -> bool:
    """The anonymous name appears only where a finding names its node (else it is not shared)."""
    text = [f.summary, f.remedy or "", *(repr((e.field, e.value, e.expected)) for e in f.evidence)]
    return not any(_ANON in t or repr(_ANON)[1:-1] in t for t in text)


def _named(f: Finding, node: str) -> Finding:
    return replace(
        f,
        node=node if f.node == _ANON else f.node,
        evidence=tuple(replace(e, node=node) if e.node == _ANON else e for e in f.evidence),
    )


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
