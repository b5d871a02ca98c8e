"""Tiny random HF models of each supported family, for engine parity tests."""
from __future__ import annotations

import torch

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}

COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=128, max_position_embeddings=512, head_dim=16)


def tiny(family: str):
    from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    torch.manual_seed(0)
    if family == "llama":
        cfg = LlamaConfig(**COMMON)
    elif family == "llama3_rope":
        cfg = LlamaConfig(**COMMON, rope_parameters=LLAMA3_ROPE)
    elif family == "llama_mha_tied":
        cfg = LlamaConfig(**{**COMMON, "num_key_value_heads": 4}, tie_word_embeddings=True)
    elif family == "mistral":
        cfg = MistralConfig(**COMMON, sliding_window=None)
    elif family == "qwen2":
        cfg = Qwen2Config(**COMMON)
    elif family == "qwen3":
        cfg = Qwen3Config(**COMMON)
    else:
        raise ValueError(family)
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    return model


FAMILIES = ["llama", "llama3_rope", "llama_mha_tied", "mistral", "qwen2", "qwen3"]
