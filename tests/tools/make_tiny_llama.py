#!/usr/bin/env python3
"""Writes a tiny random Llama (LlamaForCausalLM) that vLLM can load from a
local folder: config.json + model.safetensors, nothing from a model hub.

2 layers, hidden 256, 4 attention heads / 2 KV heads, head_dim 64, vocab
4096, float32 weights from a fixed seed (the same bytes on every run). There
is no tokenizer: engines load it with ``skip_tokenizer_init=True`` and take
token-id prompts. Used by tests/integration/test_engine_vllm_cpu.py.

The weights are scaled so that (a) attention matters: the tokens generated
for two prompts that differ only in their first 8 of 600 tokens differ (a
wrong or stale KV retrieved from a cache changes the output), and (b) the
greedy choice has a clear margin (>= 1.4 logits over the first 8 steps of
the test prompts, checked with transformers' reference Llama): random weights
at the usual 0.02 give near-flat logits, where the rounding differences
between a prefill computed whole and one resumed from cached KV could flip
an argmax.

``--hybrid`` writes a hybrid-KV variant (a Gemma-style model): 4 layers,
alternately full attention and 128-token sliding-window attention
(``layer_types``), which vLLM keeps in two KV cache groups and LMCache
0.5.7's connector registers as two groups (``group_layouts``).

Needs numpy and safetensors (both in the engine venv).

    python tests/tools/make_tiny_llama.py OUT_DIR [--seed 1234] [--hybrid]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

LAYERS = 2
HIDDEN = 256
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 64
VOCAB = 4096
INTERMEDIATE = 512
MAX_POS = 4096


SLIDING_WINDOW = 128


def config(layers: int = LAYERS, hybrid: bool = False) -> dict:
    c = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "vocab_size": VOCAB,
        "max_position_embeddings": MAX_POS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }
    if hybrid:
        c["layer_types"] = ["full_attention" if i % 2 == 0 else "sliding_attention"
                            for i in range(layers)]
        c["sliding_window"] = SLIDING_WINDOW
    return c


def weights(seed: int, layers: int = LAYERS) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def w(*shape, std=0.02):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    t: dict[str, np.ndarray] = {"model.embed_tokens.weight": w(VOCAB, HIDDEN, std=1.0)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = w(HEADS * HEAD_DIM, HIDDEN, std=0.3)
        t[p + "self_attn.k_proj.weight"] = w(KV_HEADS * HEAD_DIM, HIDDEN, std=0.3)
        t[p + "self_attn.v_proj.weight"] = w(KV_HEADS * HEAD_DIM, HIDDEN, std=0.2)
        t[p + "self_attn.o_proj.weight"] = w(HIDDEN, HEADS * HEAD_DIM, std=0.2)
        t[p + "mlp.gate_proj.weight"] = w(INTERMEDIATE, HIDDEN, std=0.05)
        t[p + "mlp.up_proj.weight"] = w(INTERMEDIATE, HIDDEN, std=0.05)
        t[p + "mlp.down_proj.weight"] = w(HIDDEN, INTERMEDIATE, std=0.05)
        t[p + "input_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        t[p + "post_attention_layernorm.weight"] = np.ones(HIDDEN, np.float32)
    t["model.norm.weight"] = np.ones(HIDDEN, np.float32)
    t["lm_head.weight"] = w(VOCAB, HIDDEN, std=2.0)
    return t


def write(out: Path, seed: int = 1234, hybrid: bool = False) -> Path:
    layers = 2 * LAYERS if hybrid else LAYERS
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config(layers, hybrid), indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}) + "\n")
    save_file(weights(seed, layers), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--hybrid", action="store_true",
                    help="4 layers, alternately full and sliding-window attention")
    a = ap.parse_args()
    print(write(a.out, a.seed, a.hybrid))


if __name__ == "__main__":
    main()
