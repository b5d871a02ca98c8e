"""A new eviction rule is its score: a toy Scissorhands-like press (a token's score counts the steps in
which it drew more than the average attention of its KV group; the recent window is protected), defined
here in a few lines over methods/parts/eviction.py, goes through the shared conformance checks (budget
covering the context = full attention, reuse with poisoned buffers, only declared state, batch = one at
a time, fewer tokens attended than seen). Not registered: the registry and conf/method/ stay as they are."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from omegaconf import OmegaConf
from test_methods_common import one_thread, tiny_model  # noqa: F401
from test_methods_conformance import TOTAL, _poisoned_rerun, _violations, ids_for, run

from methods import ModelInfo, build
from methods.config import ChunkedPrefill, option
from methods.parts.eviction import EvictionMethod


@dataclass(frozen=True)
class ToyConfig(ChunkedPrefill):
    """Toy Scissorhands-like eviction: counts of above-average attention, recent window protected."""

    budget: int = option(12, "tokens kept per KV head", min=2)
    recent: int = option(4, "recent tokens never evicted", min=1)


class Toy(EvictionMethod):
    name = "toy_scissorhands"
    Config = ToyConfig
    accumulate = True

    def score(self, probs):
        heavy = (probs * (probs > 0).sum(-1, keepdim=True) > probs.sum(-1, keepdim=True)).float()
        return heavy.view(probs.shape[0], self.info.num_kv_heads, -1, probs.shape[-1]).sum(2)

    def protected(self, pos, last):
        return pos > last - self.cfg.recent


@pytest.fixture
def model():
    return tiny_model(6)


def test_toy_rule_is_sparse_and_equals_full_when_the_budget_covers(model):
    info = ModelInfo.from_hf_config(model.config)
    ids = ids_for(1)
    ref = run(model, build(OmegaConf.create({"name": "full"}), info), ids)
    assert (run(model, Toy({"budget": TOTAL, "recent": 4}), ids) - ref).abs().max().item() <= 1e-5
    sparse = Toy({"budget": 12, "recent": 4, "prefill_chunk": 16})
    got = run(model, sparse, ids)
    assert sparse.stats()["attended_mean"] == 13 < TOTAL            # budget + the incoming token
    assert (got - ref).abs().max().item() > 1e-4


def test_toy_rule_passes_the_state_checks(model):
    info = ModelInfo.from_hf_config(model.config)
    got, ref = _poisoned_rerun(Toy({"budget": 10}), lambda: Toy({"budget": 10}), info, model)
    assert torch.isfinite(got).all() and (got - ref).abs().max().item() <= 1e-6
    assert _violations(Toy({"budget": 10, "recent": 3}), model) == []
    ids = torch.randint(0, 128, (3, TOTAL), generator=torch.Generator().manual_seed(7))
    batched = run(model, Toy({"budget": 10}), ids)
    for b in range(3):
        assert (batched[b:b + 1] - run(model, Toy({"budget": 10}), ids[b:b + 1])).abs().max().item() <= 1e-5
