"""Writes one of kvgate's tiny models (Llama or Qwen2) and its tokenizer into argv[1].

Run by the CPU sglang environment's python.

Self-contained (torch, safetensors, tokenizers, all in that environment); `model.py` decides when to run it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]


def config(spec: dict) -> dict:
    common = {
        "hidden_size": spec["hidden"],
        "intermediate_size": spec["hidden"] * 2,
        "num_hidden_layers": spec["layers"],
        "num_attention_heads": spec["heads"],
        "num_key_value_heads": spec["kv_heads"],
        "head_dim": spec["head_dim"],
        "vocab_size": spec["vocab"],
        "max_position_embeddings": spec["max_positions"],
        "rms_norm_eps": 1e-5,
        "rope_theta": spec["rope_theta"],
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 3,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    if spec["arch"] == "llama":
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **common}
    if spec["arch"] == "qwen2":
        # Qwen2's q/k/v projections always carry a bias (its modelling code has no switch for it).
        if not spec["qkv_bias"]:
            raise SystemExit("qwen2 has q/k/v bias by construction")
        return {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "use_sliding_window": False,
            "max_window_layers": spec["layers"],
            **common,
        }
    raise SystemExit(f"unknown tiny model arch {spec['arch']!r}")


def weights(cfg: dict, seed: int, std: float, qkv_bias: bool) -> dict[str, torch.Tensor]:
    # Large random weights (std ~0.4): greedy output then depends on every cached token, so a stale or
    # missing KV page changes the answer. SGLang's `--load-format dummy` weights are too small for that.
    gen = torch.Generator().manual_seed(seed)
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd

    def rnd(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * std).contiguous()

    out = {"model.embed_tokens.weight": rnd(v, h), "model.norm.weight": torch.ones(h), "lm_head.weight": rnd(v, h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update(
            {
                p + "self_attn.q_proj.weight": rnd(q, h),
                p + "self_attn.k_proj.weight": rnd(kv, h),
                p + "self_attn.v_proj.weight": rnd(kv, h),
                p + "self_attn.o_proj.weight": rnd(h, q),
                p + "mlp.gate_proj.weight": rnd(inter, h),
                p + "mlp.up_proj.weight": rnd(inter, h),
                p + "mlp.down_proj.weight": rnd(h, inter),
                p + "input_layernorm.weight": torch.ones(h),
                p + "post_attention_layernorm.weight": torch.ones(h),
            }
        )
        if qkv_bias:
            out.update({p + "self_attn.q_proj.bias": rnd(q), p + "self_attn.k_proj.bias": rnd(kv)})
            out[p + "self_attn.v_proj.bias"] = rnd(kv)
    return out


def tokenizer(corpus: list[str], vocab: int) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIALS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    if tok.get_vocab_size() != vocab:
        raise SystemExit(f"tokenizer trained to {tok.get_vocab_size()} ids, the model has {vocab}: corpus too small")
    return tok


def main() -> None:
    out = Path(sys.argv[1])
    spec = json.loads(sys.argv[2])
    corpus_files = sys.argv[3:]
    out.mkdir(parents=True, exist_ok=True)
    cfg = config(spec)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}))
    save_file(
        weights(cfg, spec["seed"], spec["std"], spec["qkv_bias"]),
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    corpus = [Path(f).read_text(errors="replace") for f in corpus_files]
    tokenizer(corpus, cfg["vocab_size"]).save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "<pad>",
                "model_max_length": spec["max_positions"],
                "add_bos_token": False,
                "add_eos_token": False,
                "chat_template": "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}assistant: {% endif %}",
            },
            indent=2,
        )
    )
    (out / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"})
    )


if __name__ == "__main__":
    main()
