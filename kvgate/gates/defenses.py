"""The defenses gate (gate 4, static part): which fixes and defenses are really on, node by node.

Checks (gate name "defenses"):
- `release` (per node): the code must carry every correctness fix of the catalogue for its backend
  (kvgate/catalogue/__init__.py says which and why). The code is read where the node runs it (`code:`
  per role or node in the profile, or --site-packages / --python on check; a `--python` command such as
  `kubectl exec -i -n NS POD -- python3` gets kvgate's stdlib-only scan program on stdin) and trusted
  over the version the worker reports: a "0.5.22" running 0.5.20 code fails, "0.5.20 + kvgate
  backports" is judged by the backports' verified code. The assessment and its rendering are
  `kvgate fixes`'s. Without code, the version string decides what it shows missing (failed); what it
  shows present is "version string only, code not read" (inconclusive) unless `trust_version`.
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

Over 500 lines on purpose: the four checks share `DefenseInputs`, the not-counted rule and the
per-node code sources, and each check is one function; split, they would import each other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packaging.version import Version

from kvgate.catalogue import Assessment, Presence, assess_code, assess_version, describe, load_catalogue, parse_release
from kvgate.catalogue.assess import READ_THE_CODE, remedy_for_missing
from kvgate.catalogue.codescan import SCAN_TIMEOUT_S, CodeScan, command_argv, scan_command, scan_site_packages
from kvgate.catalogue.version import ReleaseString
from kvgate.errors import KvgateError, UsageError
from kvgate.findings import Evidence, Finding, error, failed, inconclusive, info, passed
from kvgate.upstream import DEFERRED_ENV, DEFERRED_RELEASE_DEFAULT

GATE = "defenses"
# The first release whose default is on (for remedies).
_DEFERRED_ON_FROM = min((r for r, on in DEFERRED_RELEASE_DEFAULT.items() if on), key=Version)
# Backends whose manager sends ABORT_ACK / declares supports_deferred_decode_kv_release
# (mooncake, nixl; ascend inherits mooncake; mori from 0.5.22).
_DEFERRED_BACKENDS = ("mooncake", "nixl", "ascend")
_MORI_FROM = Version("0.5.22")
_CHECKSUM_FROM = Version("0.5.21")
_CHECKSUM_SAFE_FROM = Version("0.5.23")

# Architectures whose KV pool is MLA (MLATokenToKVPool) or DSA (DSATokenToKVPool): the canary has no
# attacher for them. From sglang 0.5.23 configs/model_config.py (the unconditional MLA list).
MLA_DSA_ARCHITECTURES = frozenset(
    {
        "DeepseekV2ForCausalLM",
        "DeepseekV3ForCausalLM",
        "DeepseekV3ForCausalLMNextN",
        "DeepseekV32ForCausalLM",
        "Glm4MoeLiteForCausalLM",
        "Glm4MoeLiteForCausalLMNextN",
        "GlmMoeDsaForCausalLM",
        "GlmMoeDsaForCausalLMNextN",
        "Glm5NextForConditionalGeneration",
        "Glm5NextForConditionalGenerationNextN",
        "LongcatFlashForCausalLM",
        "LongcatFlashForCausalLMNextN",
        "HYV4ForCausalLM",
        "HYV4ForCausalLMNextN",
        "DotsVLMForCausalLM",
        "Dots3NoteForCausalLM",
        "Dots3NoteForCausalLMNextN",
        "MistralLarge3ForCausalLM",
        "MistralLarge3ForCausalLMEagle",
        "KimiK25ForConditionalGeneration",
        "Eagle3DeepseekV2ForCausalLM",
        "GigaChat35ForCausalLM",
        "GigaChat35ForCausalLMNextN",
    }
)

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
    # Assessment of the code this node runs (trusted over `version`), from kvgate.catalogue.assess_code
    # on a scan of --site-packages / --python; None = only the version string is known.
    fixes: Assessment | None = None
    # Why reading the code failed (the --python command hung, failed or answered garbage): an error.
    code_error: str | None = None


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


def _check_release(n: DefenseInputs, trust_version: bool = False) -> Finding:
    """The correctness fixes this node's code carries: from its code when read, else its version string.

    One assessment (kvgate.catalogue) and one rendering (`describe`) as in `kvgate fixes`. A version
    string alone is "version string only, code not read": inconclusive for the correctness fixes it
    would pass, unless the operator accepts it (`trust_version`); what it shows missing fails.
    """
    cat = load_catalogue()
    backend = _backend(n)
    if n.code_error is not None:
        return error(
            GATE,
            "release",
            n.node,
            f"could not read the code this node runs: {n.code_error}",
            Evidence(n.node, "code", n.code_error, "a kvgate code scan"),
        )
    if n.fixes is not None:
        a, require_code = n.fixes, False
        how = f"code read ({a.notes[0] if a.notes else a.target}; reads as {a.reads_as()})"
        ev = [Evidence(n.node, "code", how), Evidence(n.node, "reported_version", n.version, a.release)]
        if n.version and a.release and n.version != a.release:
            how += f"; the worker reports {n.version}, the code it runs declares {a.release}: the code decides"
    else:
        try:
            a = assess_version(n.version, backend=backend)
        except UsageError:
            return inconclusive(
                GATE,
                "release",
                n.node,
                f"sglang version {n.version!r} is not a PEP 440 version: cannot tell which fixes run",
                Evidence(n.node, "version", n.version, "PEP 440"),
                remedy=READ_THE_CODE,
            )
        require_code = not trust_version
        how = f"version string {n.version} only, code not read" if n.version else "no version reported, code not read"
        ev = [Evidence(n.node, "code", how, "code read by --site-packages PATH or --python COMMAND")]
    missing, tampered = a.missing_correctness(), a.tampered()
    unproven = a.unproven_correctness(require_code)
    ev += [Evidence(n.node, s.fix.id, describe(s), "present") for s in a.correctness() + tampered]
    groups = (
        ("correctness fixes missing", [s.fix.label for s in missing]),
        ("tampered or partial backports (marker without the code)", [s.fix.id for s in tampered]),
        ("unknown", [s.fix.label for s in unproven if s.presence is Presence.UNKNOWN]),
        ("assumed present by release order only (weak evidence)", [s.fix.label for s in unproven if s.weak]),
        (
            "present by the version string only, not counted without the code",
            [s.fix.label for s in unproven if s.presence is Presence.PRESENT and not s.weak],
        ),
    )
    summary = f"{how}: " + "; ".join(f"{what}: {', '.join(labels)}" for what, labels in groups if labels)
    prove = "--site-packages PATH or --python COMMAND"
    if missing or tampered:
        remedy = remedy_for_missing(cat, missing) if missing else "re-apply the backport or remove its marker"
        if a.methods == ("version",):
            remedy += f"; a build that carries kvgate backports: prove it with {prove}"
        return failed(GATE, "release", n.node, summary, *ev, remedy=remedy)
    if unproven:
        return inconclusive(
            GATE,
            "release",
            n.node,
            summary,
            *ev,
            remedy=READ_THE_CODE
            + ("; or accept version strings with --trust-version" if a.methods == ("version",) else ""),
        )
    decided = ", ".join(sorted({s.decided_by or "?" for s in a.correctness()}))
    return passed(
        GATE,
        "release",
        n.node,
        f"{how}: every correctness fix present "
        f"({len(a.correctness())} for backend {backend or 'unknown'}; decided by {decided})",
        *ev,
    )


# --- deferred decode KV release --------------------------------------------------------------


def _check_deferred(n: DefenseInputs, operator_env: bool | None) -> Finding:
    rel = _release(n)
    backend = _backend(n)
    ev = [Evidence(n.node, "transfer_backend", n.transfer_backend, "mooncake|nixl|ascend (mori from 0.5.22)")]
    default = DEFERRED_RELEASE_DEFAULT.get(str(rel.version)) if rel is not None and rel.is_final else None
    on: bool | None
    if n.env_vars is not None and DEFERRED_ENV in n.env_vars:
        on = _env_bool(n.env_vars[DEFERRED_ENV])
        ev.append(Evidence(n.node, f"env {DEFERRED_ENV}", n.env_vars[DEFERRED_ENV], "true|1|yes|y"))
        if on is None:
            return inconclusive(
                GATE,
                "deferred-release",
                n.node,
                f"{DEFERRED_ENV}={n.env_vars[DEFERRED_ENV]!r} is not a boolean sglang reads",
                *ev,
            )
    elif operator_env is not None:
        on = operator_env
        ev.append(Evidence(n.node, f"{DEFERRED_ENV} (operator/profile)", operator_env, "true"))
    elif n.env_vars is not None and default is not None:
        on = default
        ev.append(
            Evidence(n.node, f"{DEFERRED_ENV} (unset; default of {rel.version if rel else '?'})", default, "true")
        )
    else:
        ev.append(
            Evidence(
                n.node,
                f"{DEFERRED_ENV}",
                "not readable",
                f"exposed env (SGLANG_EXPOSE_OWN_ENV_VARS=1) or operator input; release default {default}",
            )
        )
        return inconclusive(
            GATE,
            "deferred-release",
            n.node,
            "deferred decode KV release: the effective env is unknown (no CLI flag, not in server_info)",
            *ev,
            remedy="start workers with SGLANG_EXPOSE_OWN_ENV_VARS=1, or state the value with "
            "--deferred-release-env / --no-deferred-release-env "
            "(profile: defenses.deferred_release_env)",
        )
    if on is False:
        return failed(
            GATE,
            "deferred-release",
            n.node,
            "deferred decode KV release is OFF: pages can be freed while an aborted transfer may still write them",
            *ev,
            remedy=f"set {DEFERRED_ENV}=1 on every prefill and decode worker (default on from {_DEFERRED_ON_FROM})",
        )
    if backend is None:
        return inconclusive(
            GATE,
            "deferred-release",
            n.node,
            "deferred release on, but the transfer backend is unknown: cannot tell whether it supports it",
            *ev,
        )
    supported = backend in _DEFERRED_BACKENDS or (backend == "mori" and rel is not None and rel.base >= _MORI_FROM)
    if backend == "mori" and rel is None:
        return inconclusive(
            GATE,
            "deferred-release",
            n.node,
            "deferred release on with mori, which supports it only from 0.5.22; version unknown",
            *ev,
        )
    if not supported:
        return failed(
            GATE,
            "deferred-release",
            n.node,
            f"deferred release is on but backend {backend} "
            f"{'in ' + n.version if n.version else ''} does not support it: no drain ACK protects the pages",
            *ev,
            remedy="use mooncake, nixl or ascend (mori from sglang 0.5.22)",
        )
    return passed(
        GATE, "deferred-release", n.node, f"deferred decode KV release on, backend {backend} supports it", *ev
    )


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
        unknown = [n.node for n, f in zip(pd, flags, strict=True) if f is None]
        return inconclusive(GATE, "kv-checksum", node, f"KV checksum flag not reported by {', '.join(unknown)}", *ev)
    if not any(flags):
        if required:
            return failed(GATE, "kv-checksum", node, "KV checksum is off (required by the profile)", *ev, remedy=remedy)
        return info(GATE, "kv-checksum", node, "KV checksum off: optional detection, not counted as a defense", *ev)
    if not all(flags):
        off = [n.node for n, f in zip(pd, flags, strict=True) if not f]
        return _not_counted(
            "kv-checksum",
            node,
            f"KV checksum on for some nodes only (off: {', '.join(off)}): it "
            "counts only when on for BOTH prefill and decode, so it is no defense",
            required,
            *ev,
            remedy=remedy,
        )
    devices = {n.node: n.device for n in pd}
    ev += [Evidence(k, "device", v, "cuda") for k, v in devices.items()]
    non_cuda = [k for k, v in devices.items() if v is not None and not v.lower().startswith("cuda")]
    if non_cuda:
        return _not_counted(
            "kv-checksum",
            node,
            f"KV checksum needs CUDA (CUDA JIT kernel); not CUDA: {', '.join(non_cuda)}",
            required,
            *ev,
            remedy=remedy,
        )
    if any(v is None for v in devices.values()):
        return inconclusive(
            GATE, "kv-checksum", node, "KV checksum on, but the device is not reported: it needs CUDA", *ev
        )
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
            return inconclusive(
                GATE,
                "kv-checksum",
                node,
                f"KV checksum on in {low}: TP-unsafe in 0.5.21/0.5.22 and tp_size is not reported",
                *ev,
            )
        if any(t and t > 1 for t in tps):
            return _not_counted(
                "kv-checksum",
                node,
                f"KV checksum on, but TP-unsafe in {low} (0.5.21/0.5.22): a "
                "mismatch is dropped rank-locally without all-reduce, which hangs TP",
                required,
                *ev,
                remedy="upgrade to 0.5.23 (all-reduced mismatch, layout signature) or run TP=1",
            )
        if not layout_known or len(layouts) > 1:
            return _not_counted(
                "kv-checksum",
                node,
                f"KV checksum on in {low}: no layout check before 0.5.23, and "
                "prefill/decode layouts differ or are unknown (page size / PP): digests mismatch",
                required,
                *ev,
                remedy="match page size and PP, or upgrade to 0.5.23",
            )
        return passed(
            GATE,
            "kv-checksum",
            node,
            f"KV checksum on for prefill and decode (TP=1, equal layouts) in {low}"
            "; checks the transfer only, not every decode read; TP-unsafe in 0.5.21/0.5.22 if TP>1",
            *ev,
        )
    if not layout_known:
        return inconclusive(
            GATE,
            "kv-checksum",
            node,
            "KV checksum on, but layouts are not reported: 0.5.23 admits a "
            "mismatched layout unverified (one-time warning)",
            *ev,
        )
    if len(layouts) > 1:
        return _not_counted(
            "kv-checksum",
            node,
            "KV checksum on, but prefill/decode layouts differ: 0.5.23 admits "
            "these transfers unverified (one-time warning)",
            required,
            *ev,
            remedy="use equal TP, PP and page size on prefill and decode",
        )
    return passed(
        GATE,
        "kv-checksum",
        node,
        f"KV checksum on for prefill and decode, equal layouts, {low}: counts "
        "(checks the transfer only, not every decode read)",
        *ev,
    )


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
        return inconclusive(
            GATE,
            "kv-canary",
            n.node,
            f"KV canary {mode}, but the model architecture is unknown: the "
            "canary supports MHA, MHA-FP4, SWA and DeepSeek-V4 pools only",
            *ev,
        )
    mla = sorted(set(archs) & MLA_DSA_ARCHITECTURES)
    if mla:
        return _not_counted(
            "kv-canary",
            n.node,
            f"KV canary {mode} on {', '.join(mla)} (MLA/DSA pool): not supported, not a defense",
            required,
            *ev,
            remedy="no canary exists for MLA/DSA pools; rely on the fixes, deferred release and the checksum",
        )
    return passed(
        GATE,
        "kv-canary",
        n.node,
        f"KV canary {mode} on a non-MLA/DSA model: counts (install_canary refuses "
        "unsupported pools at start-up)" + ("; 'log' only logs" if mode == "log" else ""),
        *ev,
    )


def run_defenses_gate(
    nodes: Sequence[DefenseInputs],
    *,
    deferred_release_env: bool | None = None,
    model_arch: str | None = None,
    require_checksum: bool = False,
    require_canary: bool = False,
    trust_version: bool = False,
) -> list[Finding]:
    """Gate 4 (static part) over the PD workers.

    `deferred_release_env`: the operator's / profile's value of SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE
    for nodes that do not expose their env. `model_arch`: the architecture when nodes do not report it.
    `require_checksum` / `require_canary`: fail instead of reporting when that detection aid does not count.
    `trust_version`: let a version string alone decide the correctness fixes (reported as such).
    """
    findings: list[Finding] = []
    for n in nodes:
        findings.append(_check_release(n, trust_version))
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
    "trust_version": bool,
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


@dataclass(frozen=True)
class CodeSource:
    """Where the code of a node is read: a site-packages folder here, or a command running its Python."""

    site_packages: str | None = None
    python: str | None = None
    timeout: float = SCAN_TIMEOUT_S  # seconds the --python command may take

    def describe(self) -> str:
        return f"--site-packages {self.site_packages}" if self.site_packages else f"--python {self.python!r}"

    def scan(self) -> CodeScan:
        cat = load_catalogue()
        if self.site_packages:
            return scan_site_packages(Path(self.site_packages), cat)
        return scan_command(str(self.python), cat, timeout=self.timeout)


def code_sources(section: Mapping[str, Any], where: str = "profile") -> dict[str, CodeSource]:
    """Validate a `code:` mapping: keys `*` (every node), `prefill`, `decode` or a node URL; each value
    has exactly one of `site_packages` / `python`, and optionally `timeout` (ProfileError if bad)."""
    from kvgate.errors import ProfileError

    out: dict[str, CodeSource] = {}
    for key, value in section.items():
        k = str(key).rstrip("/")
        if not (k in ("*", "prefill", "decode") or k.startswith(("http://", "https://"))):
            raise ProfileError(where, f"code.{key}", "expected prefill, decode or a node URL")
        if (
            not isinstance(value, Mapping)
            or set(value) - {"site_packages", "python", "timeout"}
            or len(set(value) & {"site_packages", "python"}) != 1
        ):
            raise ProfileError(
                where,
                f"code.{key}",
                "expected a mapping with exactly one of site_packages, python (and optionally timeout)",
            )
        timeout = value.get("timeout", SCAN_TIMEOUT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ProfileError(where, f"code.{key}.timeout", f"expected a number of seconds > 0, got {timeout!r}")
        kind = "site_packages" if "site_packages" in value else "python"
        text = value[kind]
        if not isinstance(text, str) or not text.strip():
            raise ProfileError(where, f"code.{key}.{kind}", f"expected a non-empty string, got {text!r}")
        if kind == "site_packages" and not Path(text).expanduser().is_dir():
            raise ProfileError(where, f"code.{key}.site_packages", f"{text}: no such directory")
        if kind == "python":
            command_argv(text)  # unbalanced quotes are a usage error now, not a failed scan later
        out[k] = CodeSource(**{kind: text}, timeout=float(timeout))
    return out


def source_for(sources: Mapping[str, CodeSource], url: str, role: str) -> CodeSource | None:
    """The code source of one node: the flags' (`*`) win, then its URL, then its role."""
    return sources.get("*") or sources.get(url.rstrip("/")) or sources.get(role)


class DefensesGate:
    """`kvgate check` adapter: the Gate protocol (kvgate.gates.base) around run_defenses_gate.

    Options come from `CheckOptions.defenses` (the profile's `defenses:` section) and `CheckOptions.code`
    (where each node's code is read), validated at construction so a bad profile is a usage error, not a
    crashed gate. Each distinct code source is scanned once.
    """

    name = GATE

    def __init__(self, options: Any = None) -> None:
        where = getattr(options, "profile_name", None) or "profile"
        section = getattr(options, "defenses", None) or {}
        self.kwargs = defense_options(section, where)
        self.sources = code_sources(getattr(options, "code", None) or {}, where)

    def run(self, ctx: Any) -> list[Finding]:
        nodes = []
        scans: dict[CodeSource, CodeScan | str] = {}
        for r in ctx.readings:
            n = inputs_from_reading(r)
            src = source_for(self.sources, r.spec.url, r.spec.role)
            if src is not None:
                if src not in scans:
                    ctx.observer.log(f"reading the code of {n.node} through {src.describe()}")
                    try:
                        scans[src] = src.scan()
                    except KvgateError as exc:
                        scans[src] = str(exc)
                got = scans[src]
                n = (
                    replace(n, code_error=got)
                    if isinstance(got, str)
                    else replace(n, fixes=assess_code(got, backend=_backend(n)))
                )
            nodes.append(n)
        if not nodes:
            return []
        return run_defenses_gate(nodes, **self.kwargs)


__all__ = [
    "CodeSource",
    "DEFENSE_KEYS",
    "DefenseInputs",
    "DefensesGate",
    "code_sources",
    "source_for",
    "GATE",
    "MLA_DSA_ARCHITECTURES",
    "defense_options",
    "inputs_from_reading",
    "run_defenses_gate",
]
