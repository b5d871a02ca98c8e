"""The engine with method=full must reproduce the HF model: logits, greedy tokens, chunked prefill."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from methods import ModelInfo, build
from runners.engine import Engine
from tiny_models import FAMILIES, tiny


def full_engine(model, prefill_chunk=None):
    cfg = OmegaConf.create({"name": "full", "prefill_chunk": prefill_chunk})
    return Engine(model, build(cfg, ModelInfo.from_hf_config(model.config)))


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_hf(family):
    model = tiny(family)
    ids = torch.randint(0, model.config.vocab_size, (2, 50), generator=torch.Generator().manual_seed(1))
    ref = model(ids).logits
    got = full_engine(model).logits(ids)
    assert (ref - got).abs().max().item() <= 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_prefill_equals_one_shot(family):
    model = tiny(family)
    ids = torch.randint(0, model.config.vocab_size, (1, 45), generator=torch.Generator().manual_seed(2))
    one = full_engine(model).logits(ids)
    chunked = full_engine(model, prefill_chunk=8).logits(ids)
    assert (one - chunked).abs().max().item() <= 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_matches_hf_generate(family):
    model = tiny(family)
    ids = torch.randint(0, model.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(3))
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False,
                         min_new_tokens=32, pad_token_id=0)[:, ids.shape[1]:]
    got = full_engine(model).generate(ids, max_new_tokens=32)
    assert got.tokens == ref.tolist()
    assert got.stop_reason == ["length", "length"]


def test_decode_tail_and_stop_ids():
    model = tiny("llama")
    ids = torch.randint(0, 128, (1, 30), generator=torch.Generator().manual_seed(4))
    eng = full_engine(model)
    plain = eng.generate(ids, max_new_tokens=12)
    tail = eng.generate(ids, max_new_tokens=12, decode_tail=10)
    assert plain.tokens == tail.tokens  # the tail goes through decode but the math is the same
    stop = plain.tokens[0][5]
    cut = eng.generate(ids, max_new_tokens=12, stop_ids=[stop])
    first = plain.tokens[0].index(stop)
    assert cut.tokens[0] == plain.tokens[0][:first] and cut.stop_reason == ["stop"]


def test_sampling_is_seeded():
    model = tiny("qwen3")
    ids = torch.randint(0, 128, (1, 10), generator=torch.Generator().manual_seed(5))
    eng = full_engine(model)
    a = eng.generate(ids, max_new_tokens=16, temperature=0.8, top_p=0.9, seed=7).tokens
    b = eng.generate(ids, max_new_tokens=16, temperature=0.8, top_p=0.9, seed=7).tokens
    c = eng.generate(ids, max_new_tokens=16, temperature=0.8, top_p=0.9, seed=8).tokens
    assert a == b and a != c


@pytest.mark.parametrize("mode,stride", [("decode", None), ("stride", 7)])
def test_nll_matches_hf(mode, stride):
    model = tiny("llama3_rope")
    ids = torch.randint(0, 128, (2, 33), generator=torch.Generator().manual_seed(6))
    logits = model(ids).logits
    ref = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
    got = full_engine(model).nll(ids, mode=mode, stride=stride)
    assert got.shape == (2, 32)
    assert (ref - got).abs().max().item() <= 1e-4


def test_dropped_engine_is_freed_without_the_garbage_collector():
    """No reference cycle (engine <-> graph wrapper): the last reference going frees the engine and
    its method's KV storage at once (three 128K engines in one process ran out of memory)."""
    import gc
    import weakref

    model = tiny("llama")
    eng = full_engine(model)
    eng.reset(2, 64)
    method = weakref.ref(eng.method)
    gc.disable()
    try:
        ref = weakref.ref(eng)
        del eng
        assert ref() is None and method() is None
    finally:
        gc.enable()


def test_close_releases_the_method_buffers():
    eng = full_engine(tiny("llama"))
    eng.reset(1, 32)
    assert eng.method.buffers()["k"] is not None
    eng.close()
    assert eng.method.store is None and eng.history is None


def test_long_prefill_runs_the_mlp_in_row_chunks(monkeypatch):
    """Prefill memory is bounded: the MLP of a long prompt runs in chunks of rows, same logits."""
    from runners import layer_ops

    model = tiny("llama")
    ids = torch.randint(0, model.config.vocab_size, (2, 45), generator=torch.Generator().manual_seed(5))
    one = full_engine(model).logits(ids)
    calls = []
    real = layer_ops._chunked

    def spy(fn, x, rows=layer_ops.MLP_ROWS):
        calls.append(x.shape)
        return real(fn, x, rows=16)

    monkeypatch.setattr(layer_ops, "_chunked", spy)
    chunked = full_engine(model).logits(ids)
    assert calls and (one - chunked).abs().max().item() <= 1e-6


def test_nan_logits_raise_instead_of_answering():
    """Greedy argmax of NaN logits would be an answer; the engine raises (the run records a failed row)."""
    from runners.engine import NonFiniteLogits

    model = tiny("llama")
    eng = full_engine(model)
    with torch.no_grad():
        model.lm_head.weight[3, 0] = float("nan")
    ids = torch.randint(0, model.config.vocab_size, (1, 10), generator=torch.Generator().manual_seed(6))
    with pytest.raises(NonFiniteLogits):
        eng.generate(ids, max_new_tokens=4)
