"""Every registered method and every variant its config declares, on the GPU (`pytest -m gpu`):
the CUDA path (Triton kernels; decode replayed from a CUDA graph for graph-safe methods) gives the
per-step logits of the CPU path (torch references), same model, same teacher-forced tokens; and for
graph-safe methods the graph replays what eager CUDA computes. Driven by the registry: a new method
is tested here without editing this file."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from test_methods_common import tiny_model
from test_methods_conformance import CASES, cfg_of

from methods import REGISTRY, ModelInfo, build
from runners.engine import Engine

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _logits(model, cfg, ids, prompt, graphs):
    eng = Engine(model, build(OmegaConf.create(cfg), ModelInfo.from_hf_config(model.config)), use_graphs=graphs)
    eng.reset(ids.shape[0], ids.shape[1])
    eng.prefill(ids[:, :prompt])
    return torch.stack([eng.decode(ids[:, t]).float().cpu() for t in range(prompt, ids.shape[1])], 1), eng


@pytest.mark.parametrize("name,variant", CASES)
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_cuda_path_matches_cpu_path(name, variant, family):
    model = tiny_model(6, family)
    cfg = cfg_of(name, variant)
    ids = torch.randint(0, 128, (2, 72), generator=torch.Generator().manual_seed(3))
    ref, _ = _logits(model, cfg, ids, 40, graphs=False)
    got, eng = _logits(model.cuda(), cfg, ids.cuda(), 40, graphs=True)
    if eng.method.graph_safe:
        assert eng.graphs is not None and eng.graphs.graph is not None  # really replayed from a graph
    assert (got - ref).abs().max().item() <= 2e-4


@pytest.mark.parametrize("name,variant", [c for c in CASES if REGISTRY.get(c[0]).graph_safe])
def test_graph_replay_equals_eager_cuda(name, variant):
    model = tiny_model(6).cuda()
    ids = torch.randint(0, 128, (2, 72), generator=torch.Generator().manual_seed(4)).cuda()
    eager, _ = _logits(model, cfg_of(name, variant), ids, 40, graphs=False)
    graphed, _ = _logits(model, cfg_of(name, variant), ids, 40, graphs=True)
    assert (graphed - eager).abs().max().item() <= 1e-5
