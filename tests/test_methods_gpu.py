"""The CUDA decode path of the sparse methods (Triton kernels, CUDA-graph replay) against their
torch path on the CPU: same model, same teacher-forced tokens, per-step logits. `pytest -m gpu`."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from methods import ModelInfo, build
from runners.engine import Engine
from tiny_models import tiny

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

TIDAL = {"name": "tidal", "budget": 12, "dense_layers": 1, "reselect_layer": 2, "select": "query_head",
         "group_score": "softmax_sum", "include_current": False, "correction_interval": None,
         "prefill_chunk": None}
QUEST = {"name": "quest", "budget": 24, "page_size": 8, "dense_layers": 1, "min_pages": 3,
         "pool": "query_head", "include_current_page": False, "prefill_chunk": None}
CONFIGS = [
    TIDAL,
    {**TIDAL, "select": "kv_head"},
    {**TIDAL, "include_current": True, "select": "kv_head", "group_score": "logit_max"},
    {**TIDAL, "correction_interval": 5},
    QUEST,
    {**QUEST, "pool": "kv_head"},
    {**QUEST, "include_current_page": True, "min_pages": 1},
]


def _logits(model, cfg, ids, prompt, graphs):
    eng = Engine(model, build(OmegaConf.create(cfg), ModelInfo.from_hf_config(model.config)), use_graphs=graphs)
    eng.reset(ids.shape[0], ids.shape[1])
    eng.prefill(ids[:, :prompt])
    return torch.stack([eng.decode(ids[:, t]).float().cpu() for t in range(prompt, ids.shape[1])], 1), eng


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(f"{v}" for v in c.values() if v is not None)[:60])
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_kernel_path_matches_torch_path(cfg, family):
    model = tiny(family)
    ids = torch.randint(0, 128, (2, 72), generator=torch.Generator().manual_seed(3))
    ref, _ = _logits(model, cfg, ids, 40, graphs=False)
    gpu = model.cuda()
    got, eng = _logits(gpu, cfg, ids.cuda(), 40, graphs=True)
    assert eng.graphs is not None and eng.graphs.graph is not None  # really replayed from a graph
    assert (got - ref).abs().max().item() <= 2e-4
