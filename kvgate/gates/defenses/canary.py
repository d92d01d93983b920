"""`defenses.kv-canary` (per node): the KV canary counts only for the pools it supports.

MHA, MHA-FP4, SWA and DeepSeek-V4 pools; an MLA/DSA model gets "not supported, not a defense". An
opt-in detection aid: off is reported (info) unless the caller requires it.
"""

from __future__ import annotations

from kvgate.gates.defenses.common import GATE, DefenseInputs, not_counted
from kvgate.results.findings import Evidence, Finding, failed, inconclusive, info, passed

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


def check_canary(n: DefenseInputs, model_arch: str | None, required: bool) -> Finding:
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
        return not_counted(
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
