"""Every registered method's decisions are stable under rounding noise, on the CPU, driven by the
registry: float32 and float64 runs of the same tiny model give the same logits to float32 accuracy.

Why: a discrete choice (top-k, NMS, a span boundary) taken on scores that tie up to a few ulps goes
one way on the CPU and another on the GPU, and the GPU suite (tests/test_methods_gpu.py) then fails
with a 0.1-sized logit gap that looks like a kernel bug. Changing the precision here perturbs every
score by about what the GPU does, so such a fragile choice shows on the CPU. Ltri-LLM's span scores
and block ranks were found this way (they now round to a grid: methods/parts/selection.tie_round)."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from test_methods_common import one_thread, tiny_model  # noqa: F401
from test_methods_conformance import CASES, cfg_of

from methods import ModelInfo, build
from runners.engine import Engine

pytestmark = pytest.mark.long  # ~2 minutes for every method variant; CI runs it (make test-long)


def _logits(model, cfg, ids, prompt=40):
    eng = Engine(model, build(OmegaConf.create(cfg), ModelInfo.from_hf_config(model.config)), use_graphs=False)
    eng.reset(ids.shape[0], ids.shape[1])
    eng.prefill(ids[:, :prompt])
    return torch.stack([eng.decode(ids[:, t]).double() for t in range(prompt, ids.shape[1])], 1)


@pytest.mark.parametrize("name,variant", CASES)
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_float32_and_float64_choose_alike(name, variant, family):
    model = tiny_model(6, family)
    cfg = cfg_of(name, variant)
    ids = torch.randint(0, 128, (2, 72), generator=torch.Generator().manual_seed(3))  # the GPU suite's inputs
    f32 = _logits(model, cfg, ids)
    f64 = _logits(model.double(), cfg, ids)
    assert (f32 - f64).abs().max().item() <= 2e-5
