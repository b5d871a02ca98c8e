"""The engine on the embedded SmolLM2-135M-Instruct: parity with HF and the passkey check."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from methods import ModelInfo, build
from runners.engine import Engine
from tasks import ModelSpec
from tasks.passkey import Passkey

pytestmark = pytest.mark.slow


def _engine(model):
    return Engine(model, build(OmegaConf.create({"name": "full", "prefill_chunk": None}),
                               ModelInfo.from_hf_config(model.config)))


def test_arch_matches_yaml(smol_model):
    info = ModelInfo.from_hf_config(smol_model[0].config)
    assert (info.num_layers, info.num_heads, info.num_kv_heads, info.head_dim) == (30, 9, 3, 64)
    assert info.max_position == 8192


def test_logits_and_greedy_match_hf(smol_model):
    model, tok = smol_model
    text = "The quick brown fox jumps over the lazy dog. " * 20
    ids = torch.tensor([tok(text)["input_ids"][:200]])
    with torch.inference_mode():
        ref = model(ids).logits
    eng = _engine(model)
    assert (eng.logits(ids) - ref).abs().max().item() <= 1e-4
    ref_gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False,
                             min_new_tokens=32, pad_token_id=tok.eos_token_id)[0, ids.shape[1]:].tolist()
    assert eng.generate(ids, max_new_tokens=32).tokens[0] == ref_gen


def test_chunked_prefill_equals_one_shot(smol_model):
    model, tok = smol_model
    ids = torch.randint(0, 49152, (1, 300), generator=torch.Generator().manual_seed(0))
    one = _engine(model).logits(ids)
    chunked = Engine(model, build(OmegaConf.create({"name": "full", "prefill_chunk": 64}),
                                  ModelInfo.from_hf_config(model.config))).logits(ids)
    assert (one - chunked).abs().max().item() <= 1e-4


@pytest.mark.long   # 4K prompts on the CPU: minutes
def test_passkey_at_2k_and_4k(smol_model):
    """Issue requirement: >= 90% of a small grid at 2K and 4K (HF generate scored 5/5 at both)."""
    model, tok = smol_model
    cfg = OmegaConf.create({"name": "passkey", "limit": None, "seed": 42, "lengths": [2048, 4096],
                            "depths": [0.2, 0.5, 0.8], "repeats": 1, "max_new_tokens": 8, "decode_tail": 8})
    task = Passkey(cfg, tok, ModelSpec(name="smollm2", max_length=8192))
    eng = _engine(model)
    scores = []
    for s in task.samples():
        assert len(s.input_ids) == s.params["length"]
        out = eng.generate(torch.tensor([s.input_ids]), max_new_tokens=s.max_new_tokens,
                           decode_tail=s.decode_tail, stop_ids=[tok.eos_token_id])
        scores.append(task.score(s, tok.decode(out.tokens[0], skip_special_tokens=True))["accuracy"])
    assert len(scores) == 6
    assert sum(scores) / len(scores) >= 0.9, scores
