"""The defenses gate (gate 4, static part)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvgate.catalogue import assess_installed
from kvgate.catalogue.source import from_site_packages
from kvgate.gates.defenses import DEFERRED_ENV, DefenseInputs, inputs_from_reading, run_defenses_gate
from kvgate.results.findings import Finding, Outcome

P0 = DefenseInputs(
    node="prefill[0]",
    role="prefill",
    version="0.5.22",
    transfer_backend="mooncake",
    kv_checksum=False,
    kv_canary="none",
    tp_size=1,
    env_vars=None,
    architectures=("LlamaForCausalLM",),
    device="cuda",
    page_size=1,
    pp_size=1,
)
D0 = replace(P0, node="decode[0]", role="decode")


def _one(findings: list[Finding], check: str, node: str | None = None) -> Finding:
    hits = [f for f in findings if f.check == check and (node is None or f.node == node)]
    assert len(hits) == 1, [(f.check, f.node) for f in findings]
    assert hits[0].gate == "defenses"
    return hits[0]


# --- release ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "version, outcome",
    [
        ("0.5.19", Outcome.FAILED),
        ("0.5.20", Outcome.FAILED),
        ("0.5.21", Outcome.FAILED),
        ("0.5.22", Outcome.PASSED),
        ("0.5.23", Outcome.PASSED),
    ],
)
def test_release_floor_when_the_version_string_is_trusted(version: str, outcome: Outcome) -> None:
    f = _one(run_defenses_gate([replace(P0, version=version)], trust_version=True), "release")
    assert f.outcome is outcome, f.summary
    assert f.summary.startswith(f"version string {version} only, code not read")


@pytest.mark.parametrize("version", ["0.5.22", "0.5.23"])
def test_version_string_alone_is_not_counted_as_code(version: str) -> None:
    f = _one(run_defenses_gate([replace(P0, version=version)]), "release")
    assert f.outcome is Outcome.INCONCLUSIVE, f.summary
    assert "version string" in f.summary and "code not read" in f.summary and "--trust-version" in f.remedy
    rows = {e.field: e.value for e in f.evidence}
    assert rows["pr-38935"].startswith("present: #38935")
    assert "by version string only, code not read" in rows["pr-38935"]


def test_release_failure_names_fix_and_remedy() -> None:
    f = _one(run_defenses_gate([replace(P0, version="0.5.20")]), "release")
    assert f.outcome is Outcome.FAILED
    assert "#38935" in f.summary and "version string 0.5.20 only, code not read" in f.summary
    assert "upgrade sglang to 0.5.22" in f.remedy and "kvgate backport --release" in f.remedy
    assert "kvgate-admission-door" in f.remedy and "--python COMMAND" in f.remedy


@pytest.mark.parametrize("version", ["0.5.20.post1", "0.5.21.post1", "0.5.21+fork.3"])
def test_post_and_local_builds_are_judged_as_fixes_judges_them(version: str) -> None:
    """PEP 440: a post/local build starts from its base and may carry backports; what came later is unknown."""
    from kvgate.catalogue import assess_version

    f = _one(run_defenses_gate([replace(P0, version=version)], trust_version=True), "release")
    a = assess_version(version)
    assert f.outcome is Outcome.INCONCLUSIVE and a.unproven_correctness() and not a.missing_correctness()
    for s in a.unproven_correctness():
        assert s.fix.label in f.summary


@pytest.mark.parametrize("version", ["0.5.24", "0.6.0", "0.6.0.post1"])
def test_newer_than_the_catalogue_is_weak_evidence(version: str) -> None:
    f = _one(run_defenses_gate([replace(P0, version=version)], trust_version=True), "release")
    assert f.outcome is Outcome.INCONCLUSIVE and "weak evidence" in f.summary
    rows = {e.field: e.value for e in f.evidence}
    assert "assumed by release order" in rows["pr-38935"]


def test_older_than_the_catalogue_fails() -> None:
    f = _one(run_defenses_gate([replace(P0, version="0.5.18")], trust_version=True), "release")
    assert f.outcome is Outcome.FAILED and "#36988" in f.summary


def test_unknown_or_garbage_version_is_inconclusive() -> None:
    for v in (None, "garbage"):
        assert _one(run_defenses_gate([replace(P0, version=v)]), "release").outcome is Outcome.INCONCLUSIVE


def test_dev_build_of_the_minimum_is_inconclusive() -> None:
    f = _one(run_defenses_gate([replace(P0, version="0.5.22.dev3+gabc1234")]), "release")
    assert f.outcome is Outcome.INCONCLUSIVE and "ack-generations" in f.summary


def test_mori_fix_counts_only_on_mori() -> None:
    # A 0.5.21 dev build cannot prove mori support either way; on 0.5.22 mori passes.
    f = _one(run_defenses_gate([replace(P0, transfer_backend="mori")], trust_version=True), "release")
    assert f.outcome is Outcome.PASSED
    f = _one(run_defenses_gate([replace(P0, transfer_backend="mori", version="0.5.21")], trust_version=True), "release")
    assert f.outcome is Outcome.FAILED and "mori-deferred-release" in f.summary


@pytest.mark.wheels
def test_source_assessment_is_trusted_over_version() -> None:
    from tests.catalogue.helpers import wheel

    a = assess_installed(from_site_packages(wheel("0.5.21")))
    f = _one(run_defenses_gate([replace(P0, version="0.5.22", fixes=a)]), "release")
    assert f.outcome is Outcome.FAILED and "ack-generations" in f.summary
    a22 = assess_installed(from_site_packages(wheel("0.5.22")))
    f = _one(run_defenses_gate([replace(P0, version="0.5.20", fixes=a22)]), "release")
    assert f.outcome is Outcome.PASSED


# --- deferred release ------------------------------------------------------------------------


def test_deferred_release_unknown_env_is_inconclusive() -> None:
    f = _one(run_defenses_gate([P0]), "deferred-release")
    assert f.outcome is Outcome.INCONCLUSIVE and "SGLANG_EXPOSE_OWN_ENV_VARS" in f.remedy


@pytest.mark.parametrize(
    "value, outcome",
    [
        ("1", Outcome.PASSED),
        ("true", Outcome.PASSED),
        ("0", Outcome.FAILED),
        ("no", Outcome.FAILED),
        ("maybe", Outcome.INCONCLUSIVE),
    ],
)
def test_deferred_release_from_exposed_env(value: str, outcome: Outcome) -> None:
    f = _one(run_defenses_gate([replace(P0, env_vars={DEFERRED_ENV: value})]), "deferred-release")
    assert f.outcome is outcome


@pytest.mark.parametrize("version, outcome", [("0.5.20", Outcome.FAILED), ("0.5.21", Outcome.PASSED)])
def test_exposed_env_without_the_variable_uses_the_release_default(version: str, outcome: Outcome) -> None:
    f = _one(run_defenses_gate([replace(P0, version=version, env_vars={"OTHER": "1"})]), "deferred-release")
    assert f.outcome is outcome


@pytest.mark.wheels
def test_exposed_env_without_the_variable_uses_the_default_of_the_code_read() -> None:
    """The code a node runs says the default, not its version string (a backported 0.5.20 runs with it on)."""
    from tests.catalogue.helpers import wheel

    node = replace(P0, env_vars={"OTHER": "1"})
    on = replace(node, version="0.5.20", fixes=assess_installed(from_site_packages(wheel("0.5.22"))))
    off = replace(node, version="0.5.22", fixes=assess_installed(from_site_packages(wheel("0.5.20"))))
    f = _one(run_defenses_gate([on]), "deferred-release")
    assert f.outcome is Outcome.PASSED and "default of the code read: #41023 present" in str(f.evidence), f
    f = _one(run_defenses_gate([off]), "deferred-release")
    assert f.outcome is Outcome.FAILED and "default of the code read: #41023 absent" in str(f.evidence), f


def test_operator_input_when_env_not_exposed() -> None:
    f = _one(run_defenses_gate([P0], deferred_release_env=True), "deferred-release")
    assert f.outcome is Outcome.PASSED
    f = _one(run_defenses_gate([P0], deferred_release_env=False), "deferred-release")
    assert f.outcome is Outcome.FAILED and DEFERRED_ENV in f.remedy
    # What the server exposes wins over the operator's claim.
    f = _one(
        run_defenses_gate([replace(P0, env_vars={DEFERRED_ENV: "0"})], deferred_release_env=True), "deferred-release"
    )
    assert f.outcome is Outcome.FAILED


@pytest.mark.parametrize(
    "backend, version, outcome",
    [
        ("mooncake", "0.5.22", Outcome.PASSED),
        ("nixl", "0.5.21", Outcome.PASSED),
        ("ascend", "0.5.21", Outcome.PASSED),
        ("mooncake_tcp", "0.5.22", Outcome.PASSED),
        ("mori", "0.5.22", Outcome.PASSED),
        ("mori", "0.5.21", Outcome.FAILED),
        ("fake", "0.5.23", Outcome.FAILED),
        (None, "0.5.23", Outcome.INCONCLUSIVE),
        ("mori", None, Outcome.INCONCLUSIVE),
    ],
)
def test_deferred_release_backend_support(backend: str | None, version: str | None, outcome: Outcome) -> None:
    n = replace(P0, transfer_backend=backend, version=version)
    f = _one(run_defenses_gate([n], deferred_release_env=True), "deferred-release")
    assert f.outcome is outcome, f.summary


# --- KV checksum -----------------------------------------------------------------------------


def _checksum(*nodes: DefenseInputs, **kw: bool) -> Finding:
    return _one(run_defenses_gate(list(nodes), **kw), "kv-checksum")


def test_checksum_off_is_reported_not_counted() -> None:
    f = _checksum(P0, D0)
    assert f.outcome is Outcome.INFO and "not counted" in f.summary  # off and optional: not a pass
    assert _checksum(P0, D0, require_checksum=True).outcome is Outcome.FAILED


def test_checksum_must_be_on_on_both_sides() -> None:
    f = _checksum(replace(P0, kv_checksum=True), D0)
    assert f.outcome is Outcome.INCONCLUSIVE and "BOTH" in f.summary
    assert _checksum(replace(P0, kv_checksum=True), D0, require_checksum=True).outcome is Outcome.FAILED


def test_checksum_on_both_counts_on_0_5_23() -> None:
    f = _checksum(replace(P0, kv_checksum=True, version="0.5.23"), replace(D0, kv_checksum=True, version="0.5.23"))
    assert f.outcome is Outcome.PASSED and f.node == "deployment"


def test_checksum_is_tp_unsafe_in_0_5_21_and_0_5_22() -> None:
    for v in ("0.5.21", "0.5.22"):
        f = _checksum(
            replace(P0, kv_checksum=True, version=v, tp_size=4), replace(D0, kv_checksum=True, version=v, tp_size=4)
        )
        assert f.outcome is Outcome.INCONCLUSIVE and "TP-unsafe" in f.summary
    f = _checksum(replace(P0, kv_checksum=True, version="0.5.22"), replace(D0, kv_checksum=True, version="0.5.22"))
    assert f.outcome is Outcome.PASSED and "TP-unsafe" in f.summary  # TP=1, still says so


def test_checksum_mismatched_layouts_admitted_unverified_on_0_5_23() -> None:
    f = _checksum(
        replace(P0, kv_checksum=True, version="0.5.23", tp_size=2),
        replace(D0, kv_checksum=True, version="0.5.23", tp_size=8),
    )
    assert f.outcome is Outcome.INCONCLUSIVE and "unverified" in f.summary


def test_checksum_needs_cuda() -> None:
    f = _checksum(replace(P0, kv_checksum=True, device="cpu"), replace(D0, kv_checksum=True))
    assert f.outcome is Outcome.INCONCLUSIVE and "CUDA" in f.summary
    f = _checksum(replace(P0, kv_checksum=True, device=None), replace(D0, kv_checksum=True))
    assert f.outcome is Outcome.INCONCLUSIVE


def test_checksum_flag_absent_before_0_5_21_means_off_and_unknown_after() -> None:
    f = _checksum(replace(P0, kv_checksum=None, version="0.5.20"), replace(D0, kv_checksum=None, version="0.5.20"))
    assert f.outcome is Outcome.INFO and "off" in f.summary
    assert {e.value for e in f.evidence} == {"no such flag in 0.5.20 (from 0.5.21)"}  # not a bare null
    f = _checksum(replace(P0, kv_checksum=None), D0)
    assert f.outcome is Outcome.INCONCLUSIVE


def test_checksum_needs_both_roles() -> None:
    assert _checksum(replace(P0, kv_checksum=True)).outcome is Outcome.INCONCLUSIVE


# --- KV canary -------------------------------------------------------------------------------


def _canary(n: DefenseInputs, **kw: object) -> Finding:
    return _one(run_defenses_gate([n], **kw), "kv-canary")  # type: ignore[arg-type]


@pytest.mark.parametrize("arch", ["DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"])
def test_canary_on_mla_dsa_is_not_a_defense(arch: str) -> None:
    f = _canary(replace(P0, kv_canary="log", architectures=(arch,)))
    assert f.outcome is Outcome.INCONCLUSIVE and "not supported, not a defense" in f.summary
    assert _canary(replace(P0, kv_canary="raise", architectures=(arch,)), require_canary=True).outcome is Outcome.FAILED


def test_canary_model_arch_from_operator() -> None:
    f = _canary(replace(P0, kv_canary="raise", architectures=None), model_arch="GlmMoeDsaForCausalLM")
    assert "not a defense" in f.summary
    assert _canary(replace(P0, kv_canary="raise", architectures=None)).outcome is Outcome.INCONCLUSIVE


def test_canary_on_mha_model_counts() -> None:
    f = _canary(replace(P0, kv_canary="raise"))
    assert f.outcome is Outcome.PASSED
    assert _canary(P0).outcome is Outcome.INFO and "not counted" in _canary(P0).summary
    assert _canary(P0, require_canary=True).outcome is Outcome.FAILED
    assert _canary(replace(P0, kv_canary=None)).outcome is Outcome.INCONCLUSIVE


def test_finding_count_and_gate_name() -> None:
    findings = run_defenses_gate([P0, D0], deferred_release_env=True, trust_version=True)
    assert all(f.gate == "defenses" for f in findings)
    assert [f.check for f in findings].count("release") == 2 and [f.check for f in findings].count("kv-checksum") == 1
    outcomes = {f.check: f.outcome for f in findings}
    want = {
        "release": Outcome.PASSED,
        "deferred-release": Outcome.PASSED,
        "kv-checksum": Outcome.INFO,
        "kv-canary": Outcome.INFO,
    }
    assert outcomes == want, [(f.check, f.summary) for f in findings]


def test_adapter_from_a_node_reading() -> None:
    from kvgate.reading.node import NodeSpec, parse_node
    from tests.assets import sglang_payloads as Pl

    doc = Pl.server_info(pool=2_000_000, context=1_048_576)
    doc.update(
        version="0.5.23",
        disaggregation_mode="decode",
        disaggregation_transfer_backend="nixl",
        disaggregation_enable_kv_checksum=True,
        kv_canary="none",
        tp_size=2,
        device="cuda",
    )
    r = parse_node(NodeSpec("decode", "http://d", 0), "/server_info", doc, Pl.v1_models(1_048_576), None)
    n = inputs_from_reading(r)
    assert (n.node, n.role) == (r.node, r.role)  # the role the node reports (live role wins)
    assert (n.version, n.transfer_backend, n.kv_checksum, n.tp_size, n.device) == ("0.5.23", "nixl", True, 2, "cuda")


def test_profile_section_validation() -> None:
    from kvgate.errors import ProfileError
    from kvgate.gates.defenses import defense_options

    assert defense_options({"model_arch": "GlmMoeDsaForCausalLM", "deferred_release_env": True}) == {
        "model_arch": "GlmMoeDsaForCausalLM",
        "deferred_release_env": True,
    }
    with pytest.raises(ProfileError, match="defenses.require_checksum"):
        defense_options({"require_checksum": "yes"})
    with pytest.raises(ProfileError, match="unknown key"):
        defense_options({"canary": True})


def test_gate_adapter_runs_over_readings() -> None:
    from kvgate.gates.base import CheckOptions, GateContext
    from kvgate.gates.defenses import DefensesGate
    from kvgate.reading.node import NodeSpec, parse_node
    from kvgate.reading.target import TargetClient
    from tests.assets import sglang_payloads as Pl

    doc = Pl.server_info(pool=2_000_000, context=1_048_576)
    doc.update(version="0.5.20", kv_canary="log", device="cuda")
    r = parse_node(NodeSpec("prefill", "http://p", 0), "/server_info", doc, Pl.v1_models(1_048_576), None)
    options = CheckOptions(defenses={"model_arch": "GlmMoeDsaForCausalLM"})
    gate = DefensesGate(options)
    with TargetClient() as client:
        findings = gate.run(GateContext(options=options, readings=[r], client=client))
    assert gate.name == "defenses" and findings
    assert _one(findings, "release").outcome is Outcome.FAILED
    assert r.architectures is None  # no /model_info: the profile's model_arch is used
    assert "not supported, not a defense" in _one(findings, "kv-canary").summary
