"""The defenses gate (gate 4, static part): which fixes and defenses are really on, node by node.

Checks (gate name "defenses"):
- `release` (per node): the code must carry every correctness fix of the catalogue for its backend
  (kvgate/catalogue/__init__.py says which and why). With only a version string, a release below the
  recommended minimum (0.5.22) fails whatever its suffix; a source assessment (`DefenseInputs.fixes`,
  e.g. from `kvgate fixes --site-packages`) is trusted over the version, so "0.5.20 + kvgate backports"
  is judged by what the code carries.
- `deferred-release` (per node): SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE must be on and the
  transfer backend must support it (mooncake, nixl, ascend; mori from 0.5.22). The variable has no CLI
  flag and is not in server_info: it is read from the exposed env vars (SGLANG_EXPOSE_OWN_ENV_VARS=1),
  else from the operator / profile; when neither says, it is unknown -> inconclusive.
- `kv-checksum` (deployment): counts only when on for every prefill AND decode node, on CUDA, with
  matching layouts; TP-unsafe in 0.5.21/0.5.22; 0.5.23 admits mismatched layouts unverified.
- `kv-canary` (per node): counts only for the pools it supports (MHA, MHA-FP4, SWA, DeepSeek-V4); an
  MLA/DSA model gets "not supported, not a defense".
The checksum and canary are opt-in detection aids: off is reported (passed, "not counted") unless the
caller requires them; on but ineffective is inconclusive (failed when required); unknown is inconclusive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from packaging.version import Version

from kvgate.catalogue import Assessment, assess_version, load_catalogue, parse_release
from kvgate.catalogue.assess import remedy_for_missing
from kvgate.catalogue.version import ReleaseString
from kvgate.errors import UsageError
from kvgate.findings import Evidence, Finding, failed, inconclusive, info, passed

GATE = "defenses"
DEFERRED_ENV = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"

# Deferred-release default per release (srt/environ.py, upstream-fixes.md section 4).
_DEFERRED_DEFAULT = {"0.5.19": False, "0.5.20": False, "0.5.21": True, "0.5.22": True, "0.5.23": True}
# Backends whose manager sends ABORT_ACK / declares supports_deferred_decode_kv_release
# (mooncake, nixl; ascend inherits mooncake; mori from 0.5.22).
_DEFERRED_BACKENDS = ("mooncake", "nixl", "ascend")
_MORI_FROM = Version("0.5.22")
_CHECKSUM_FROM = Version("0.5.21")
_CHECKSUM_SAFE_FROM = Version("0.5.23")

# Architectures whose KV pool is MLA (MLATokenToKVPool) or DSA (DSATokenToKVPool): the canary has no
# attacher for them. From sglang 0.5.23 configs/model_config.py (the unconditional MLA list).
MLA_DSA_ARCHITECTURES = frozenset({
    "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV3ForCausalLMNextN", "DeepseekV32ForCausalLM",
    "Glm4MoeLiteForCausalLM", "Glm4MoeLiteForCausalLMNextN", "GlmMoeDsaForCausalLM", "GlmMoeDsaForCausalLMNextN",
    "Glm5NextForConditionalGeneration", "Glm5NextForConditionalGenerationNextN", "LongcatFlashForCausalLM",
    "LongcatFlashForCausalLMNextN", "HYV4ForCausalLM", "HYV4ForCausalLMNextN", "DotsVLMForCausalLM",
    "Dots3NoteForCausalLM", "Dots3NoteForCausalLMNextN", "MistralLarge3ForCausalLM", "MistralLarge3ForCausalLMEagle",
    "KimiK25ForConditionalGeneration", "Eagle3DeepseekV2ForCausalLM", "GigaChat35ForCausalLM",
    "GigaChat35ForCausalLMNextN",
})

_TRUE = {"true", "1", "yes", "y"}
_FALSE = {"false", "0", "no", "n"}


@dataclass(frozen=True)
class DefenseInputs:
    """What the defenses gate needs from one worker. None always means "not known"."""

    node: str
    role: str
    version: str | None
    transfer_backend: str | None
    kv_checksum: bool | None
    kv_canary: str | None
    tp_size: int | None
    env_vars: Mapping[str, str] | None
    architectures: tuple[str, ...] | None
    device: str | None = None
    page_size: int | None = None
    pp_size: int | None = None
    # Source/git assessment of the code this node runs (trusted over `version`), e.g. from
    # kvgate.catalogue.assess_installed; None = judge by version.
    fixes: Assessment | None = None


def inputs_from_reading(reading: Any) -> DefenseInputs:
    """Adapter for kvgate.target.NodeReading (duck-typed; nothing beyond its public fields is used)."""
    info = getattr(reading, "server_info", None) or {}
    arch = getattr(reading, "architectures", None)
    return DefenseInputs(
        node=reading.node,
        role=reading.role,
        version=reading.version,
        transfer_backend=reading.transfer_backend,
        kv_checksum=reading.kv_checksum,
        kv_canary=reading.kv_canary,
        tp_size=reading.tp_size,
        env_vars=dict(reading.env_vars) if reading.env_vars is not None else None,
        architectures=tuple(arch) if arch is not None else None,
        device=info.get("device") if isinstance(info.get("device"), str) else None,
        page_size=reading.page_size,
        pp_size=info.get("pp_size") if isinstance(info.get("pp_size"), int) else None,
    )


def _release(n: DefenseInputs) -> ReleaseString | None:
    if not n.version:
        return None
    try:
        return parse_release(n.version)
    except UsageError:
        return None


def _backend(n: DefenseInputs) -> str | None:
    if not n.transfer_backend:
        return None
    b = n.transfer_backend.strip().lower()
    return "mooncake" if b == "mooncake_tcp" else b


def _env_bool(value: str) -> bool | None:
    v = value.strip().lower()
    return True if v in _TRUE else False if v in _FALSE else None


# --- release / correctness fixes --------------------------------------------------------------

def _check_release(n: DefenseInputs) -> Finding:
    cat = load_catalogue()
    backend = _backend(n)
    if n.fixes is not None:
        a, how = n.fixes, f"source of {n.fixes.target} (reads as {n.fixes.reads_as()})"
    else:
        rel = _release(n)
        if rel is None:
            why = "not reported" if not n.version else f"{n.version!r} is not a PEP 440 version"
            return inconclusive(GATE, "release", n.node, f"sglang version {why}: cannot tell which fixes run",
                                Evidence(n.node, "version", n.version, f">= {cat.recommended_minimum}"),
                                remedy="give the source: kvgate fixes --site-packages PATH / --python INTERPRETER")
        a, how = assess_version(n.version, backend=backend), f"version {n.version}"
        if rel.base < cat.recommended_minimum:
            missing = a.missing_correctness() + a.unknown_correctness()
            labels = ", ".join(s.fix.label for s in missing) or "none by version"
            return failed(
                GATE, "release", n.node,
                f"sglang {n.version} is below the recommended minimum {cat.recommended_minimum}; "
                f"correctness fixes missing or unproven: {labels}",
                Evidence(n.node, "version", n.version, f">= {cat.recommended_minimum}"),
                *(Evidence(n.node, s.fix.id, s.presence.value, "present") for s in missing),
                remedy=remedy_for_missing(cat, missing) + "; a build that carries backports: prove it with "
                "kvgate fixes --site-packages PATH",
            )
    missing, unknown = a.missing_correctness(), a.unknown_correctness()
    ev = [Evidence(n.node, "code", how)]
    ev += [Evidence(n.node, s.fix.id, s.presence.value, "present") for s in missing + unknown]
    if missing:
        return failed(GATE, "release", n.node,
                      f"{how}: correctness fixes missing: {', '.join(s.fix.label for s in missing)}",
                      *ev, remedy=remedy_for_missing(cat, missing))
    if unknown:
        return inconclusive(GATE, "release", n.node,
                            f"{how}: cannot tell whether {', '.join(s.fix.label for s in unknown)} are present",
                            *ev, remedy="give the source: kvgate fixes --site-packages PATH / --python INTERPRETER")
    return passed(GATE, "release", n.node, f"{how}: every correctness fix present "
                  f"({len(a.correctness())} for backend {backend or 'unknown'})", *ev)


# --- deferred decode KV release --------------------------------------------------------------

def _check_deferred(n: DefenseInputs, operator_env: bool | None) -> Finding:
    rel = _release(n)
    backend = _backend(n)
    ev = [Evidence(n.node, "transfer_backend", n.transfer_backend, "mooncake|nixl|ascend (mori from 0.5.22)")]
    default = _DEFERRED_DEFAULT.get(str(rel.version)) if rel is not None and rel.is_final else None
    on: bool | None
    if n.env_vars is not None and DEFERRED_ENV in n.env_vars:
        on = _env_bool(n.env_vars[DEFERRED_ENV])
        ev.append(Evidence(n.node, f"env {DEFERRED_ENV}", n.env_vars[DEFERRED_ENV], "true|1|yes|y"))
        if on is None:
            return inconclusive(GATE, "deferred-release", n.node,
                                f"{DEFERRED_ENV}={n.env_vars[DEFERRED_ENV]!r} is not a boolean sglang reads", *ev)
    elif operator_env is not None:
        on = operator_env
        ev.append(Evidence(n.node, f"{DEFERRED_ENV} (operator/profile)", operator_env, "true"))
    elif n.env_vars is not None and default is not None:
        on = default
        ev.append(Evidence(n.node, f"{DEFERRED_ENV} (unset; default of {rel.version if rel else '?'})", default, "true"))
    else:
        ev.append(Evidence(n.node, f"{DEFERRED_ENV}", "not readable",
                           f"exposed env (SGLANG_EXPOSE_OWN_ENV_VARS=1) or operator input; release default {default}"))
        return inconclusive(GATE, "deferred-release", n.node,
                            "deferred decode KV release: the effective env is unknown (no CLI flag, not in server_info)",
                            *ev, remedy="start workers with SGLANG_EXPOSE_OWN_ENV_VARS=1, or state the value with "
                            "--deferred-release-env / --no-deferred-release-env (profile: defenses.deferred_release_env)")
    if on is False:
        return failed(GATE, "deferred-release", n.node, "deferred decode KV release is OFF: pages can be freed "
                      "while an aborted transfer may still write them", *ev,
                      remedy=f"set {DEFERRED_ENV}=1 on every prefill and decode worker (default on from 0.5.21)")
    if backend is None:
        return inconclusive(GATE, "deferred-release", n.node, "deferred release on, but the transfer backend is "
                            "unknown: cannot tell whether it supports it", *ev)
    supported = backend in _DEFERRED_BACKENDS or (backend == "mori" and rel is not None and rel.base >= _MORI_FROM)
    if backend == "mori" and rel is None:
        return inconclusive(GATE, "deferred-release", n.node,
                            "deferred release on with mori, which supports it only from 0.5.22; version unknown", *ev)
    if not supported:
        return failed(GATE, "deferred-release", n.node, f"deferred release is on but backend {backend} "
                      f"{'in ' + n.version if n.version else ''} does not support it: no drain ACK protects the pages",
                      *ev, remedy="use mooncake, nixl or ascend (mori from sglang 0.5.22)")
    return passed(GATE, "deferred-release", n.node, f"deferred decode KV release on, backend {backend} supports it", *ev)


# --- KV checksum ----------------------------------------------------------------------------

def _not_counted(check: str, node: str, summary: str, required: bool, *ev: Evidence, remedy: str) -> Finding:
    if required:
        return failed(GATE, check, node, summary, *ev, remedy=remedy)
    return inconclusive(GATE, check, node, summary, *ev, remedy=remedy)


def _checksum_value(n: DefenseInputs) -> object:
    """The flag as read; a release before the flag existed says so instead of a bare null."""
    rel = _release(n)
    if n.kv_checksum is None and rel is not None and rel.base < _CHECKSUM_FROM:
        return f"no such flag in {n.version} (from 0.5.21)"
    return n.kv_checksum


def _check_checksum(nodes: Sequence[DefenseInputs], required: bool) -> Finding:
    node = "deployment"
    pd = [n for n in nodes if n.role in ("prefill", "decode")]
    want = "true" if required else "true to count as a defense"
    ev = [Evidence(n.node, "disaggregation_enable_kv_checksum", _checksum_value(n), want) for n in pd]
    remedy = "--disaggregation-enable-kv-checksum on every prefill AND decode worker (sglang >= 0.5.21, CUDA)"
    if not any(n.role == "prefill" for n in pd) or not any(n.role == "decode" for n in pd):
        return inconclusive(GATE, "kv-checksum", node, "KV checksum needs prefill and decode nodes to judge", *ev)
    flags: list[bool | None] = []
    for n in pd:
        rel = _release(n)
        if n.kv_checksum is None and rel is not None and rel.base < _CHECKSUM_FROM:
            flags.append(False)  # the flag does not exist before 0.5.21
        else:
            flags.append(n.kv_checksum)
    if None in flags:
        unknown = [n.node for n, f in zip(pd, flags) if f is None]
        return inconclusive(GATE, "kv-checksum", node, f"KV checksum flag not reported by {', '.join(unknown)}", *ev)
    if not any(flags):
        if required:
            return failed(GATE, "kv-checksum", node, "KV checksum is off (required by the profile)", *ev, remedy=remedy)
        return info(GATE, "kv-checksum", node, "KV checksum off: optional detection, not counted as a defense", *ev)
    if not all(flags):
        off = [n.node for n, f in zip(pd, flags) if not f]
        return _not_counted("kv-checksum", node, f"KV checksum on for some nodes only (off: {', '.join(off)}): it "
                            "counts only when on for BOTH prefill and decode, so it is no defense", required, *ev,
                            remedy=remedy)
    devices = {n.node: n.device for n in pd}
    ev += [Evidence(k, "device", v, "cuda") for k, v in devices.items()]
    non_cuda = [k for k, v in devices.items() if v is not None and not v.lower().startswith("cuda")]
    if non_cuda:
        return _not_counted("kv-checksum", node, f"KV checksum needs CUDA (CUDA JIT kernel); not CUDA: "
                            f"{', '.join(non_cuda)}", required, *ev, remedy=remedy)
    if any(v is None for v in devices.values()):
        return inconclusive(GATE, "kv-checksum", node, "KV checksum on, but the device is not reported: it needs CUDA",
                            *ev)
    rels = [_release(n) for n in pd]
    if any(r is None for r in rels):
        return inconclusive(GATE, "kv-checksum", node, "KV checksum on, but a node's version is unknown", *ev)
    low = min(r.base for r in rels if r is not None)
    ev += [Evidence(n.node, "tp_size", n.tp_size) for n in pd]
    layouts = {(n.tp_size, n.page_size, n.pp_size or 1) for n in pd}
    layout_known = all(n.tp_size is not None and n.page_size is not None for n in pd)
    if low < _CHECKSUM_SAFE_FROM:
        tps = [n.tp_size for n in pd]
        if any(t is None for t in tps):
            return inconclusive(GATE, "kv-checksum", node, f"KV checksum on in {low}: TP-unsafe in 0.5.21/0.5.22 "
                                "and tp_size is not reported", *ev)
        if any(t and t > 1 for t in tps):
            return _not_counted("kv-checksum", node, f"KV checksum on, but TP-unsafe in {low} (0.5.21/0.5.22): a "
                                "mismatch is dropped rank-locally without all-reduce, which hangs TP", required, *ev,
                                remedy="upgrade to 0.5.23 (all-reduced mismatch, layout signature) or run TP=1")
        if not layout_known or len(layouts) > 1:
            return _not_counted("kv-checksum", node, f"KV checksum on in {low}: no layout check before 0.5.23, and "
                                "prefill/decode layouts differ or are unknown (page size / PP): digests mismatch",
                                required, *ev, remedy="match page size and PP, or upgrade to 0.5.23")
        return passed(GATE, "kv-checksum", node, f"KV checksum on for prefill and decode (TP=1, equal layouts) in {low}"
                      "; checks the transfer only, not every decode read; TP-unsafe in 0.5.21/0.5.22 if TP>1", *ev)
    if not layout_known:
        return inconclusive(GATE, "kv-checksum", node, "KV checksum on, but layouts are not reported: 0.5.23 admits a "
                            "mismatched layout unverified (one-time warning)", *ev)
    if len(layouts) > 1:
        return _not_counted("kv-checksum", node, "KV checksum on, but prefill/decode layouts differ: 0.5.23 admits "
                            "these transfers unverified (one-time warning)", required, *ev,
                            remedy="use equal TP, PP and page size on prefill and decode")
    return passed(GATE, "kv-checksum", node, f"KV checksum on for prefill and decode, equal layouts, {low}: counts "
                  "(checks the transfer only, not every decode read)", *ev)


# --- KV canary ------------------------------------------------------------------------------

def _check_canary(n: DefenseInputs, model_arch: str | None, required: bool) -> Finding:
    ev = [Evidence(n.node, "kv_canary", n.kv_canary, "log|raise" if required else "log|raise to count as a defense")]
    remedy = "--kv-canary log|raise on a model whose KV pool is MHA, MHA-FP4, SWA or DeepSeek-V4"
    if n.kv_canary is None:
        return inconclusive(GATE, "kv-canary", n.node, "kv_canary not reported", *ev)
    mode = n.kv_canary.strip().lower()
    if mode == "none":
        if required:
            return failed(GATE, "kv-canary", n.node, "KV canary is off (required by the profile)", *ev, remedy=remedy)
        return info(GATE, "kv-canary", n.node, "KV canary off: optional detection, not counted as a defense", *ev)
    archs = n.architectures if n.architectures is not None else ((model_arch,) if model_arch else None)
    ev.append(Evidence(n.node, "architectures", list(archs) if archs is not None else None))
    if not archs:
        return inconclusive(GATE, "kv-canary", n.node, f"KV canary {mode}, but the model architecture is unknown: the "
                            "canary supports MHA, MHA-FP4, SWA and DeepSeek-V4 pools only", *ev)
    mla = sorted(set(archs) & MLA_DSA_ARCHITECTURES)
    if mla:
        return _not_counted("kv-canary", n.node, f"KV canary {mode} on {', '.join(mla)} (MLA/DSA pool): not supported, "
                            "not a defense", required, *ev, remedy="no canary exists for MLA/DSA pools; rely on the "
                            "fixes, deferred release and the checksum")
    return passed(GATE, "kv-canary", n.node, f"KV canary {mode} on a non-MLA/DSA model: counts (install_canary refuses "
                  "unsupported pools at start-up)" + ("; 'log' only logs" if mode == "log" else ""), *ev)


def run_defenses_gate(
    nodes: Sequence[DefenseInputs],
    *,
    deferred_release_env: bool | None = None,
    model_arch: str | None = None,
    require_checksum: bool = False,
    require_canary: bool = False,
) -> list[Finding]:
    """Gate 4 (static part) over the PD workers.

    `deferred_release_env`: the operator's / profile's value of SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE
    for nodes that do not expose their env. `model_arch`: the architecture when nodes do not report it.
    `require_checksum` / `require_canary`: fail instead of reporting when that detection aid does not count.
    """
    findings: list[Finding] = []
    for n in nodes:
        findings.append(_check_release(n))
    for n in nodes:
        findings.append(_check_deferred(n, deferred_release_env))
    findings.append(_check_checksum(nodes, require_checksum))
    for n in nodes:
        findings.append(_check_canary(n, model_arch, require_canary))
    return findings


#: Keys of a gate profile's `defenses:` section, with the type each must have.
DEFENSE_KEYS: dict[str, type] = {
    "deferred_release_env": bool,
    "model_arch": str,
    "require_checksum": bool,
    "require_canary": bool,
}


def defense_options(section: Mapping[str, Any], where: str = "profile") -> dict[str, Any]:
    """Validate a profile's `defenses:` mapping into run_defenses_gate keyword arguments (ProfileError if bad)."""
    from kvgate.errors import ProfileError

    out: dict[str, Any] = {}
    for key, value in section.items():
        if key not in DEFENSE_KEYS:
            raise ProfileError(where, f"defenses.{key}", f"unknown key; expected one of {sorted(DEFENSE_KEYS)}")
        if value is not None and not isinstance(value, DEFENSE_KEYS[key]):
            raise ProfileError(where, f"defenses.{key}", f"expected {DEFENSE_KEYS[key].__name__}, got {value!r}")
        out[key] = value
    return out


class DefensesGate:
    """`kvgate check` adapter: the Gate protocol (kvgate.gates.base) around run_defenses_gate.

    Options come from `CheckOptions.defenses` (the profile's `defenses:` section), validated at
    construction so a bad profile is a usage error, not a crashed gate.
    """

    name = GATE

    def __init__(self, options: Any = None) -> None:
        section = getattr(options, "defenses", None) or {}
        self.kwargs = defense_options(section, getattr(options, "profile_name", None) or "profile")

    def run(self, ctx: Any) -> list[Finding]:
        nodes = [inputs_from_reading(r) for r in ctx.readings]
        if not nodes:
            return []
        return run_defenses_gate(nodes, **self.kwargs)


__all__ = ["DEFENSE_KEYS", "DefenseInputs", "DefensesGate", "GATE", "MLA_DSA_ARCHITECTURES", "defense_options",
           "inputs_from_reading", "run_defenses_gate"]
