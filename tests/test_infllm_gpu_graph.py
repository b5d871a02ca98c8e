"""InfLLM / Ltri-LLM's device path on the GPU (`pytest -m gpu`), resident (offload=false) and with the
positional store in pinned host memory (offload=true: kernels/memory_stage.py through UVA): the decode step really is
replayed from a CUDA graph (the class is not graph-safe, the instance is), the graph gives the eager CUDA
path's logits and the same greedy tokens, over enough steps that blocks leave the window between
replays (formed by the engine's host hook, correction_span)."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from test_methods_common import tiny_model

from methods import ModelInfo, build
from runners.engine import Engine

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

CFGS = [
    {"name": "infllm", "n_init": 4, "n_local": 16, "block_size": 4, "topk": 3, "repr_topk": 2,
     "exc_block_size": 8, "offload": False},
    {"name": "infllm", "n_init": 2, "n_local": 12, "block_size": 3, "topk": 2, "repr_topk": 1,
     "exc_block_size": 7, "offload": False, "per_head": True},
    {"name": "ltri", "n_init": 4, "n_local": 16, "block_size": 4, "topk": 3, "exc_block_size": 8,
     "offload": False, "spans_per_block": 1, "max_vectors": 3, "last_chunk": 4},
]


def _run(model, cfg, ids, prompt, graphs):
    eng = Engine(model, build(OmegaConf.create(cfg), ModelInfo.from_hf_config(model.config)), use_graphs=graphs)
    eng.reset(ids.shape[0], ids.shape[1])
    eng.prefill(ids[:, :prompt])
    logits = torch.stack([eng.decode(ids[:, t]).float() for t in range(prompt, ids.shape[1])], 1)
    return logits, eng


@pytest.mark.parametrize("offload", [False, True])
@pytest.mark.parametrize("cfg", CFGS)
def test_graph_replay_equals_eager_cuda(cfg, offload):
    cfg = {**cfg, "offload": offload}
    model = tiny_model(4).cuda()
    ids = torch.randint(0, 128, (2, 90), generator=torch.Generator().manual_seed(4)).cuda()
    eager, e1 = _run(model, cfg, ids, 30, graphs=False)
    graphed, e2 = _run(model, cfg, ids, 30, graphs=True)
    assert e1.graphs is None and e2.graphs is not None and e2.graphs.graph is not None
    assert e2.method.formed_blocks == e1.method.formed_blocks >= 10
    assert (graphed - eager).abs().max().item() <= 1e-5
    assert torch.equal(graphed.argmax(-1), eager.argmax(-1))
    if offload:   # the store in page-locked host memory, and rows really staged from it
        assert e2.method.store.k.device.type == "cpu" and e2.method.store.k.is_pinned()
        assert e2.method.stats()["staged_bytes"] > 0 and e2.method.stats()["path"] == "device, offloaded"
    gen = [Engine(model, build(OmegaConf.create(cfg), ModelInfo.from_hf_config(model.config)), use_graphs=g)
           .generate(ids[:, :40], 40).tokens for g in (False, True)]
    assert gen[0] == gen[1]
