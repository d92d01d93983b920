"""kvgate's pool sizing must equal what each real SGLang release's own sizing code computes.

tests/plan/sglang_sizing_probe.py runs inside the release's CPU environment and executes the release's
argument resolution, ModelConfig, KV-dtype resolution, KVCacheConfigurator/MemoryPoolConfigurator and
TpModelWorker.get_worker_info with the memory figures supplied (there is no GPU). Every number kvgate
reports along the way (cell size per stage, KV budget bytes, pool, max_req_input_len) must be equal,
for every case and every release.

The model configs in model_configs/ are our own, written in the shapes of Llama-3-70B-style GQA,
Qwen3-style GQA (head_dim not hidden/heads), Qwen2.5-style GQA (q/k/v bias, sliding window off),
DeepSeek-V3-style MLA, DeepSeek-V3.2-style DSA and a GLM-5-style DSA with shared-top-k indexer layers
(no weights; nothing is downloaded).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvgate.plan.model import load_shape
from kvgate.plan.planner import PlanInputs, plan_worker
from kvgate.upstream.releases import RELEASES
from tests.assets.real_sglang import cpu_env_or_skip

HERE = Path(__file__).resolve().parent
CONFIGS = HERE / "model_configs"


@dataclass(frozen=True)
class Case:
    """One worker shape, sized by both sides from the same figures."""

    name: str
    config: str
    tp: int
    mem_fraction_static: float
    page_size: int
    kv_cache_dtype: str
    context_length: int
    gpu_memory_gib: float
    weights_gib: float
    dp: int = 1
    pp: int = 1
    max_total_tokens: int | None = None
    gpu_sm: int = 90
    disaggregation_mode: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def inputs(self, model_dir: Path | None = None) -> PlanInputs:
        """`model_dir`: read the config from the folder SGLang reads (with a ModelOpt hf_quant_config.json)."""
        return PlanInputs(
            shape=load_shape(model_dir if model_dir is not None else CONFIGS / f"{self.config}.json"),
            gpu_memory_gib=self.gpu_memory_gib,
            gpus_per_worker=self.tp * self.pp,
            tp=self.tp,
            dp=self.dp,
            attention_dp=self.dp > 1,
            pp=self.pp,
            mem_fraction_static=self.mem_fraction_static,
            context_length=self.context_length,
            kv_cache_dtype=self.kv_cache_dtype,
            page_size=self.page_size,
            weights_gib=self.weights_gib,
            max_total_tokens=self.max_total_tokens,
            gpu_sm=self.gpu_sm,
        )

    def probe_spec(self, model_dir: Path) -> dict[str, Any]:
        return {
            "model_dir": str(model_dir),
            "tp": self.tp,
            "dp": self.dp,
            "pp": self.pp,
            "mem_fraction_static": self.mem_fraction_static,
            "page_size": self.page_size,
            "kv_cache_dtype": self.kv_cache_dtype,
            "context_length": self.context_length,
            "pre_load_gib": self.gpu_memory_gib,
            # The same float operation kvgate performs, so both sides see the same post-load figure.
            "post_load_gib": self.gpu_memory_gib - self.weights_gib,
            "max_total_tokens": self.max_total_tokens,
            "gpu_sm": self.gpu_sm,
            "disaggregation_mode": self.disaggregation_mode,
        }


CASES = (
    Case("gqa-tp8-h200", "llama-gqa", 8, 0.85, 64, "auto", 131072, 139.5, 18.5),
    Case("gqa-dp-attention-fp8", "llama-gqa", 8, 0.8, 1, "fp8_e4m3", 131072, 79.0, 39.0, dp=4),
    Case("gqa-pp3-capped", "llama-gqa", 4, 0.9, 16, "auto", 131072, 79.0, 29.0, pp=3, max_total_tokens=100_000),
    Case("gqa-odd-figures", "llama-gqa", 2, 0.873, 32, "bfloat16", 65536, 79.3217, 61.77731),
    Case("mla-tp8", "deepseek-v3-mla", 8, 0.85, 64, "auto", 163840, 139.5, 79.5),
    Case("mla-fp8-capped", "deepseek-v3-mla", 8, 0.88, 64, "fp8_e4m3", 163840, 139.5, 79.5, max_total_tokens=500_000),
    Case("mla-pp2", "deepseek-v3-mla", 8, 0.9, 64, "auto", 163840, 139.5, 40.25, pp=2),
    Case(
        "dsa-bf16-prefill", "deepseek-v32-dsa", 8, 0.85, 64, "auto", 163840, 139.5, 79.5, disaggregation_mode="prefill"
    ),
    Case(
        "dsa-fp8-hopper-decode",
        "deepseek-v32-dsa",
        8,
        0.85,
        64,
        "fp8_e4m3",
        163840,
        139.5,
        79.5,
        disaggregation_mode="decode",
    ),
    Case(
        "dsa-auto-blackwell",
        "deepseek-v32-dsa",
        8,
        0.85,
        64,
        "auto",
        163840,
        178.0,
        79.5,
        gpu_sm=100,
        disaggregation_mode="prefill",
    ),
    Case("gqa-explicit-head-dim", "qwen3-gqa", 4, 0.88, 16, "auto", 40960, 79.0, 16.2),
    # q/k/v bias (weights only) and a sliding window switched off: the plain pool all the same.
    Case("gqa-qkv-bias-window-off", "qwen2-gqa", 2, 0.85, 32, "bfloat16", 32768, 79.0, 7.6),
    # The checkpoint's KV quantisation under --kv-cache-dtype auto, in every shape the releases parse
    # (each quant method's own from_config runs in the probe), and an explicit dtype over it.
    Case("modelopt-kv-scheme-fp8", "llama-gqa-modelopt-kv-scheme", 8, 0.85, 64, "auto", 131072, 139.5, 9.5),
    Case(
        "modelopt-kv-scheme-explicit-bf16", "llama-gqa-modelopt-kv-scheme", 8, 0.85, 64, "bfloat16", 131072, 139.5, 9.5
    ),
    Case("modelopt-kv-algo-fp8", "llama-gqa-modelopt-kv-algo", 8, 0.85, 64, "auto", 131072, 139.5, 9.5),
    Case("modelopt-int8-scheme-wins", "llama-gqa-modelopt-int8-scheme", 8, 0.85, 64, "auto", 131072, 139.5, 9.5),
    Case("modelopt-nested-hf-quant-config", "llama-gqa-modelopt-nested", 8, 0.85, 64, "auto", 131072, 139.5, 9.5),
    Case("compressed-tensors-kv-fp8", "llama-gqa-compressed-tensors-kv", 4, 0.88, 16, "auto", 131072, 79.0, 18.0),
    Case(
        "compressed-tensors-dynamic-kv",
        "llama-gqa-compressed-tensors-dynamic-kv",
        4,
        0.88,
        16,
        "auto",
        65536,
        79.0,
        18.0,
    ),
    Case("compression-config-kv-fp8", "llama-gqa-compression-config-kv", 4, 0.88, 16, "auto", 131072, 79.0, 18.0),
    Case("fp8-kv-algo", "llama-gqa-fp8-kv", 8, 0.85, 64, "auto", 131072, 139.5, 9.5),
    Case("fp8-block-weights-bf16-kv", "llama-gqa-fp8-block", 8, 0.85, 64, "auto", 131072, 139.5, 9.5),
    Case("fp8-block-explicit-fp8-kv", "llama-gqa-fp8-block", 8, 0.85, 64, "fp8_e4m3", 131072, 139.5, 9.5),
    Case(
        "glm-dsa-shared-topk-prefill",
        "glm-dsa",
        8,
        0.85,
        64,
        "auto",
        202752,
        139.5,
        71.0,
        disaggregation_mode="prefill",
    ),
    Case(
        "glm-dsa-fp8-decode-dp",
        "glm-dsa",
        8,
        0.9,
        64,
        "fp8_e4m3",
        202752,
        139.5,
        71.0,
        dp=8,
        disaggregation_mode="decode",
    ),
)


def _model_dirs(tmp: Path) -> dict[str, Path]:
    """SGLang reads `<model_path>/config.json`: one folder per config."""
    out = {}
    for cfg in sorted(CONFIGS.glob("*.json")):
        d = tmp / cfg.stem
        d.mkdir()
        (d / "config.json").write_text(cfg.read_text())
        sidecar = cfg.with_suffix(".hf_quant_config")  # ModelOpt's nested form, beside config.json
        if sidecar.is_file():
            (d / "hf_quant_config.json").write_text(sidecar.read_text())
        out[cfg.stem] = d
    return out


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _model_dirs(tmp_path_factory.mktemp("model-configs"))


def run_probe(version: str, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Size every spec with sglang `version`'s own code, in one subprocess of its CPU environment."""
    env = cpu_env_or_skip(version)
    proc = subprocess.run(
        [env.python, str(HERE / "sglang_sizing_probe.py")],
        input=json.dumps(specs),
        capture_output=True,
        text=True,
        env=env.env(),
        timeout=900,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("KVGATE-RESULT ")]
    assert proc.returncode == 0 and lines, f"probe failed on {version}:\n{proc.stderr[-3000:]}"
    results: list[dict[str, Any]] = json.loads(lines[-1].split(" ", 1)[1])
    return results


@pytest.mark.parametrize("version", RELEASES)
def test_kvgate_matches_the_release_sizing_code(version: str, model_dirs: dict[str, Path]) -> None:
    results = run_probe(version, [c.probe_spec(model_dirs[c.config]) for c in CASES])
    mismatches = []
    for case, got in zip(CASES, results, strict=True):
        assert "error" not in got, f"{version} {case.name}: sglang raised {got['error']}\n{got.get('trace')}"
        plan = plan_worker(PlanInputs(**{**case.inputs(model_dirs[case.config]).__dict__, "release": version}))
        assert got["page_size"] == case.page_size, f"{case.name}: sglang resolved page_size {got['page_size']}"
        ours = {
            "cell_size": [s.cell.total for s in plan.stages],
            "available_bytes": plan.available_bytes,
            "layers": [s.layers[1] - s.layers[0] for s in plan.stages],
            "max_total_num_tokens": plan.pool,
            "max_req_input_len": plan.max_req_input_len,
            "kv_bytes": plan.kv.bytes,
        }
        theirs = {
            "cell_size": [s["cell_size"] for s in got["stages"]],
            "available_bytes": got["stages"][0]["available_bytes"],
            "layers": [s["layers"] for s in got["stages"]],
            "max_total_num_tokens": got["max_total_num_tokens"],
            "max_req_input_len": got["max_req_input_len"],
            "kv_bytes": 1 if "float8" in got["kv_cache_dtype"] else 2,
        }
        if ours != theirs:
            mismatches.append(f"{case.name}: kvgate {ours} != sglang {version} {theirs}")
        assert all(s["configurator"] == "DefaultPoolConfigurator" for s in got["stages"])
    assert not mismatches, "\n".join(mismatches)


def test_the_cases_cover_every_supported_attention_and_knob() -> None:
    shapes = {load_shape(CONFIGS / f"{c.config}.json").attention.value for c in CASES}
    assert shapes == {"mha", "mla", "dsa"}
    from kvgate.plan.model import MHA_ARCHS, MLA_ARCHS

    planned = {load_shape(CONFIGS / f"{c.config}.json").architecture for c in CASES}
    assert planned == MHA_ARCHS | MLA_ARCHS, "every architecture kvgate plans is run through the releases' code"
    assert any(c.pp > 1 for c in CASES) and any(c.dp > 1 for c in CASES) and any(c.max_total_tokens for c in CASES)
    from kvgate.plan.sizing import KV_DTYPE_CHOICES

    assert {c.kv_cache_dtype for c in CASES} >= set(KV_DTYPE_CHOICES)
    assert {c.disaggregation_mode for c in CASES} >= {"prefill", "decode"}
