"""The CUDA fast path on the embedded SmolLM2 (fused layer, Triton kernels, CUDA-graph decode)
against the reference torch path on the CPU: identical greedy tokens, matching NLL. `-m gpu`."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from methods import ModelInfo, build
from runners.engine import Engine
from tasks import ModelSpec
from tasks.passkey import Passkey

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

METHODS = [{"name": "full", "prefill_chunk": None},
           {"name": "quest", "budget": 256, "page_size": 16, "dense_layers": 2, "min_pages": 3,
            "pool": "query_head", "include_current_page": False, "prefill_chunk": None},
           {"name": "tidal", "budget": 256, "dense_layers": 2, "reselect_layer": 14, "select": "query_head",
            "group_score": "softmax_sum", "include_current": False, "correction_interval": None,
            "prefill_chunk": None}]


def _engine(model, cfg):
    return Engine(model, build(OmegaConf.create(cfg), ModelInfo.from_hf_config(model.config)))


@pytest.fixture(scope="module")
def models():
    from runners import models as loader

    cfg = OmegaConf.load("conf/model/smollm2.yaml")
    cpu, tok = loader.load(cfg, torch.device("cpu"), torch.float32)
    gpu, _ = loader.load(cfg, torch.device("cuda"), torch.float32)
    return cpu, gpu, tok


@pytest.mark.parametrize("cfg", METHODS, ids=lambda c: c["name"])
def test_greedy_tokens_identical_to_reference_path(models, cfg):
    cpu, gpu, tok = models
    task = Passkey(OmegaConf.create({"name": "passkey", "limit": None, "seed": 1, "lengths": [2048],
                                     "depths": [0.3, 0.7], "repeats": 1, "max_new_tokens": 32,
                                     "decode_tail": 16}), tok, ModelSpec("smollm2", 7500))
    for s in task.samples():
        ids = torch.tensor([s.input_ids])
        ref = _engine(cpu, cfg).generate(ids, max_new_tokens=32, decode_tail=s.decode_tail).tokens
        eng = _engine(gpu, cfg)
        got = eng.generate(ids, max_new_tokens=32, decode_tail=s.decode_tail).tokens
        assert eng.graphs is not None and eng.fused is not None
        assert got == ref, (cfg["name"], s.id)


def test_nll_decode_matches_reference_path(models):
    cpu, gpu, tok = models
    ids = torch.tensor([tok("The grass is green. " * 60)["input_ids"][:300]])
    ref = _engine(cpu, METHODS[0]).nll(ids, mode="decode")
    got = _engine(gpu, METHODS[0]).nll(ids, mode="decode").cpu()
    assert (got - ref).abs().max().item() <= 1e-3
