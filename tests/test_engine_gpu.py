"""The CUDA fast path (Triton decode kernel, decode step captured in a CUDA graph) against HF.
Runs only where CUDA is available (`pytest -m gpu` on the device machine)."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from methods import ModelInfo, build
from runners.engine import Engine
from tiny_models import tiny

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _engine(model, graphs):
    return Engine(model, build(OmegaConf.create({"name": "full", "prefill_chunk": None}),
                               ModelInfo.from_hf_config(model.config)), use_graphs=graphs)


@pytest.mark.parametrize("family", ["llama", "llama3_rope", "qwen2", "qwen3"])
def test_graph_decode_matches_hf_greedy(family):
    model = tiny(family).cuda()
    ids = torch.randint(0, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0)).cuda()
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False,
                         min_new_tokens=32, pad_token_id=0)[:, ids.shape[1]:].tolist()
    eng = _engine(model, graphs=True)
    assert eng.graphs is not None
    assert eng.generate(ids, max_new_tokens=32).tokens == ref
    assert eng.generate(ids, max_new_tokens=32, decode_tail=7).tokens == ref  # graph reused / recaptured


def test_graph_decode_logits_match_eager_and_hf():
    model = tiny("llama3_rope").cuda()
    ids = torch.randint(0, 128, (1, 64), generator=torch.Generator().manual_seed(1)).cuda()
    with torch.inference_mode():
        ref = model(ids).logits[:, 32:]
    for graphs in (False, True):
        eng = _engine(model, graphs)
        eng.reset(1, 64)
        eng.prefill(ids[:, :32])
        got = torch.stack([eng.decode(ids[:, t]).clone() for t in range(32, 64)], dim=1)
        assert (got - ref).abs().max().item() <= 1e-4, graphs


def test_graph_recaptured_when_method_buffers_change():
    """A captured graph replays raw pointers: new KV buffers at the same capacity must recapture."""
    from methods.parts.stores import FullStore

    model = tiny("llama").cuda()
    ids = torch.randint(0, 128, (1, 30), generator=torch.Generator().manual_seed(2)).cuda()
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False,
                         min_new_tokens=16, pad_token_id=0)[:, 30:].tolist()
    eng = _engine(model, graphs=True)
    assert eng.generate(ids, max_new_tokens=16).tokens == ref
    first = eng.graphs.graph
    keep = eng.method.store  # keep the old buffers alive so a stale graph would read them
    eng.method.store = FullStore()
    assert eng.generate(ids, max_new_tokens=16).tokens == ref
    assert eng.graphs.graph is not first and keep is not eng.method.store
