"""Which of SGLang's model modules a CPU server's scheduler may skip (SGLANG_DISABLED_MODEL_ARCHS).

Against every real wheel 0.5.19-0.5.23 and kvgate's two tiny models' configs: exactly the one module
that defines the model's architecture is kept, the registry's others are named; the real-server tier
(tests/real) starts every release's pairs with that list in the workers' environment.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate.cpuserver.env import DISABLED_ARCHS_ENV, unused_model_modules
from kvgate.deploy.launch import PDLaunchPlan
from kvgate.upstream.releases import RELEASES
from tests.assets.real_sglang import wheel_or_skip


def _config(folder: Path, archs: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"architectures": archs}))
    return folder


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize(("arch", "module"), [("LlamaForCausalLM", "llama"), ("Qwen2ForCausalLM", "qwen2")])
def test_only_the_module_defining_the_architecture_is_kept(
    release: str, arch: str, module: str, tmp_path: Path
) -> None:
    sglang = wheel_or_skip(release) / "sglang"
    every = {p.stem for p in (sglang / "srt" / "models").glob("*.py")} - {"__init__"}
    skipped = unused_model_modules(sglang, _config(tmp_path, [arch]))
    assert module in every and set(skipped) == every - {module}


@pytest.mark.parametrize("archs", [None, [], "LlamaForCausalLM", ["NoSuchForCausalLM"], ["x(y"], [3]])
def test_a_config_naming_nothing_sglang_defines_skips_nothing(archs: object, tmp_path: Path) -> None:
    sglang = tmp_path / "sglang"
    (sglang / "srt" / "models").mkdir(parents=True)
    (sglang / "srt" / "models" / "llama.py").write_text("class LlamaForCausalLM(object):\n    pass\n")
    (sglang / "srt" / "models" / "other.py").write_text("x = 1\n")
    assert unused_model_modules(sglang, _config(tmp_path / "m", archs)) == ()
    assert unused_model_modules(sglang, tmp_path / "no-model") == ()
    assert unused_model_modules(sglang, _config(tmp_path / "ok", ["LlamaForCausalLM"])) == ("other",)


def test_an_operators_own_list_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    """`kvgate up --device cpu` sets the list only where the operator's environment has none."""
    import kvgate.cpuserver.env as cpu

    site = "/nonexistent/site-packages"
    fake = cpu.ServerEnv(version="0.5.22", python="/bin/python3", pythonpath=(str(cpu.STUB_DIR), site))
    monkeypatch.setattr(cpu, "server_env", lambda version: fake)
    monkeypatch.setattr(cpu, "unused_model_modules", lambda sglang, model: ("a", "b"))
    plan = PDLaunchPlan(model_path="/m", engine="sglang", device="cpu", release="0.5.22")
    monkeypatch.delenv(DISABLED_ARCHS_ENV, raising=False)
    assert plan.resolved().env[DISABLED_ARCHS_ENV] == "a,b"
    monkeypatch.setenv(DISABLED_ARCHS_ENV, "mine")
    assert plan.resolved().env[DISABLED_ARCHS_ENV] == "mine"
