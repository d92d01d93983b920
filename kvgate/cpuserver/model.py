"""Tiny models written locally for the real SGLang server on CPU (nothing is fetched from a model hub).

One spec type, two instances of different attention shape: `TINY_LLAMA` (Llama: 4 query heads sharing 2
KV heads of width 16, no bias) and `TINY_QWEN2` (Qwen2: 8 query heads sharing 1 KV head of width 8,
q/k/v bias, another RoPE base), so the real tier's verdicts do not rest on one KV layout. Both: 2 layers,
hidden 64, vocab 1024, random safetensors weights with enough variance that the greedy output depends
on the whole context (cpu-sglang.md: dummy weights are too small to show a stale-page read), and the
same byte-level BPE tokenizer trained with the `tokenizers` library on fixed local text, so the server
also runs with its tokenizer (text prompts, `text` in answers, /v1/tokenize). Written once per spec into
the cache, by the CPU environment's own python (`_write_model.py`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path

from kvgate.backport.cpuenv import CpuEnvError, base_python, root
from kvgate.output.safeio import write_atomic
from kvgate.upstream.releases import locked

_WRITER = Path(__file__).resolve().parent / "_write_model.py"
# Fixed local training text for the tokenizer: standard-library sources, present on every Python.
_CORPUS_MODULES = (
    "textwrap.py",
    "argparse.py",
    "difflib.py",
    "pydoc.py",
    "inspect.py",
    "typing.py",
    "subprocess.py",
    "email/message.py",
    "http/client.py",
    "json/decoder.py",
)


ARCHITECTURES = ("llama", "qwen2")


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of a tiny model. max_positions bounds the --context-length a server accepts; `arch` picks
    the HF architecture (`_write_model.py` knows each one's config keys and weight names)."""

    arch: str = "llama"
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    qkv_bias: bool = False
    rope_theta: float = 10000.0
    vocab: int = 1024
    max_positions: int = 16384
    seed: int = 20260827
    std: float = 0.4

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"tiny model arch {self.arch!r}: one of {', '.join(ARCHITECTURES)}")
        if self.heads % self.kv_heads:
            raise ValueError(f"{self.heads} query heads cannot share {self.kv_heads} KV heads evenly")


TINY_LLAMA = TinyModelSpec()
TINY_QWEN2 = TinyModelSpec(arch="qwen2", heads=8, kv_heads=1, head_dim=8, qkv_bias=True, rope_theta=1000000.0)
TINY_MODELS: dict[str, TinyModelSpec] = {s.arch: s for s in (TINY_LLAMA, TINY_QWEN2)}


def _corpus() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [str(stdlib / m) for m in _CORPUS_MODULES if (stdlib / m).is_file()]
    if len(files) < 3:
        raise CpuEnvError(f"too little local text under {stdlib} to train the tiny model's tokenizer")
    return files


def tiny_model(spec: TinyModelSpec = TINY_LLAMA) -> Path:
    """The model folder for `spec`, written on first use (seconds)."""
    key = hashlib.sha256(json.dumps(asdict(spec), sort_keys=True).encode() + _WRITER.read_bytes()).hexdigest()[:12]
    dest = root() / f"tiny-{spec.arch}-{key}"
    marker = dest / ".kvgate-complete"
    with locked(root() / "tiny-model.lock"):
        if marker.is_file():
            return dest
        if dest.exists():
            shutil.rmtree(dest)
        py = base_python()
        proc = subprocess.run(
            [str(py), str(_WRITER), str(dest), json.dumps(asdict(spec)), *_corpus()], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise CpuEnvError("writing the tiny model failed:\n" + "\n".join(proc.stderr.strip().splitlines()[-8:]))
        write_atomic(marker, key)
    return dest
