"""MInference + Cascade oracle (methods/minference_cascade.py), on random q, k, v per layer (two sequences,
prefill chunks then decode steps):

  * with a pattern covering every pair of a chunk it IS Cascade: outputs, slots, keys and EMA scores
    equal `method=cascade`'s bit for bit (torch path);
  * with sparse patterns the outputs, the token every slot holds and the EMA scores equal the plain-Python
    Cascading simulation of tests/test_methods_cascade.py whose probabilities come from a float64 masked
    softmax: every cached key visible, the chunk's own keys under MInference's mask
    (minference_patterns.rows_mask over chunk-local rows, from the index the method estimated: the mask
    definition, not the block/column lists or the kernel).
"""
from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf
from test_methods_cascade import Sim, oracle_layer, reduce
from test_methods_common import Driver, make, one_thread, rope_for  # noqa: F401
from tiny_models import tiny

from common.errors import ConfigError
from methods import ModelInfo, build
from methods.minference_cascade import DENSE_PATH, SPARSE_PATH, MInferenceCascade
from methods.parts import minference_patterns as P

SMALL = {"last_q": 4, "block_size": 4, "init_columns": 1, "local_slashes": 2, "min_vertical": 1, "min_slash": 2}


class Recording(MInferenceCascade):
    """The method, keeping the estimated index of each (step, layer) for the oracle."""

    def _adjust_index(self, heads, index, T):
        self.seen_index.append(index)
        return index


def drive(method, info, rope, prompt, n_dec, stride):
    d = Driver(method, info, rope, max_len=prompt + n_dec)
    steps = [(min(stride, prompt - s), "prefill") for s in range(0, prompt, stride)] + [(1, "decode")] * n_dec
    return d, steps


def test_covering_pattern_is_cascade_bit_for_bit():
    model = tiny("llama")
    rope = rope_for(model)
    base = {"sink": 2, "cascades": 2, "cache_size": 6, "stride": 9, "beta": 0.9}
    a, info = make({"name": "cascade", **base}, model)
    b, _ = make({"name": "minference_cascade", **base, "patterns": "all:vertical_slash:9:9", **SMALL}, model)
    runs = []
    for m in (a, b):
        d, steps = drive(m, info, rope, 31, 9, 9)
        runs.append([d.step(T, phase)[1] for T, phase in steps])
    for x, y in zip(*runs):
        assert all(torch.equal(o1, o2) for o1, o2 in zip(x, y))
    for key in ("k", "v", "score", "tok"):
        assert torch.equal(getattr(a.store, key), getattr(b.store, key)), key
    assert b.stats()["prefill_path"] == {SPARSE_PATH: info.num_layers}
    assert b.stats()["chunk_density_mean"] == 1.0


CASES = [  # sink, cascades, window, stride, beta, patterns, dense_layers
    (2, 3, 2, 9, 0.9, "mix:vertical_slash:2:3,a_shape:2:3,block_sparse:1,vertical_slash:1:2", 0),
    (0, 2, 3, 12, 0.9, "all:vertical_slash:2:2", 1),             # no sinks; layer 0 dense
    (3, 1, 4, 7, 0.95, "all:a_shape:1:3", 0),                     # one cascade (StreamingLLM with strides)
    (1, 2, 2, None, 0.9, "all:block_sparse:1", 0),                # the whole prompt one sparse chunk
]


@pytest.mark.parametrize("S,N,W,stride,beta,patterns,dense", CASES)
def test_sparse_chunks_match_simulation(S, N, W, stride, beta, patterns, dense):
    model = tiny("llama")
    rope = rope_for(model)
    cfg = {"sink": S, "cascades": N, "cache_size": N * W, "stride": stride, "beta": beta, "patterns": patterns,
           "dense_layers": dense, **SMALL}
    info = ModelInfo.from_hf_config(model.config)
    method = Recording(build(OmegaConf.create({"name": "minference_cascade", **cfg}), info).cfg)
    method.seen_index = []
    Hq, Hkv = info.num_heads, info.num_kv_heads
    prompt, n_dec = 26, 12
    d, steps = drive(method, info, rope, prompt, n_dec, stride or prompt)
    heads = method.cfg.pattern_set(info).heads
    consts = method.cfg.consts()
    sims = {(l, b, h): Sim(S, N, W, True) for l in range(info.num_layers) for b in range(d.B) for h in range(Hkv)}
    for T, phase in steps:
        a = d.seen
        method.seen_index = []
        qs, outs = d.step(T, phase)
        sparse = iter(method.seen_index)
        w = torch.tensor([(1 - beta) * beta ** (T - 1 - m) for m in range(T)], dtype=torch.float64)
        for layer in range(info.num_layers):
            order = {(b, h): sims[layer, b, h].order() for b in range(d.B) for h in range(Hkv)}
            n = len(order[0, 0])
            own = torch.ones(d.B, Hq, T, T, dtype=torch.bool).tril()
            if phase == "prefill" and layer >= dense:        # the chunk's mask, from the index the method estimated
                index = next(sparse)
                own = torch.stack([P.rows_mask(p, index[h], torch.arange(T), T, d.B, consts)
                                   for h, p in enumerate(heads[layer])], 1)
            ref_out, probs = oracle_layer(d, layer, qs[layer], order, a, own, rope, info)
            assert (outs[layer].double() - ref_out).abs().max().item() <= 1e-5, (phase, a, layer)
            mass = reduce((probs * w.view(1, 1, -1, 1)).sum(2), method.cfg.head_reduction, Hkv, False)
            for b in range(d.B):
                for h in range(Hkv):
                    sim = sims[layer, b, h]
                    for i, tok in enumerate(order[b, h]):
                        if i >= len(sim.sinks):
                            sim.score[tok] = beta ** T * sim.score[tok] + mass[b, h, i].item()
                    for t in range(T):
                        sim.score[a + t] = mass[b, h, n + t].item()
                        sim.push(a + t)
        assert next(sparse, None) is None
        for (layer, b, h), sim in sims.items():
            slots = sim.slots()
            assert method.store.tok[layer, b, h, :len(slots)].tolist() == slots, (phase, a, layer, b, h)
            for s_, tok in enumerate(slots):
                if tok >= 0 and s_ >= S:
                    assert math.isclose(method.store.score[layer, b, h, s_].item(), sim.score[tok], rel_tol=1e-4,
                                        abs_tol=1e-9), (phase, a, layer, b, h, s_)
    st = method.stats()
    assert st["prefill_path"] == ({SPARSE_PATH: info.num_layers} if not dense else
                                  {DENSE_PATH: dense, SPARSE_PATH: info.num_layers - dense})
    assert all(0 < x <= 1 for x in st["chunk_density"].values()) and st["chunk_density_mean"] < 1


@pytest.mark.parametrize("cfg,needle", [
    ({"slash_cover": "token"}, "slash_cover=token"),
    ({"cache_size": 64, "sink": 4}, "positions"),                 # the paper's 100K stride on a 512-position model
    ({"stride": 64, "cache_size": 64, "patterns": "all:vertical_slash:0:1"}, "positive integer"),
    ({"stride": 64, "cache_size": 64, "patterns": "auto", "pattern_model": "no_such_model"}, "no_such_model"),
])
def test_refusals_one_line(cfg, needle):
    info = ModelInfo(arch="llama", num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, hidden_size=64,
                     max_position=512)
    with pytest.raises(ConfigError) as e:
        build(OmegaConf.create({"name": "minference_cascade", **cfg}), info)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_head_dim_refused():
    info = ModelInfo(arch="llama", num_layers=2, num_heads=4, num_kv_heads=2, head_dim=24, hidden_size=96,
                     max_position=1 << 20)
    with pytest.raises(ConfigError, match="head_dim"):
        build(OmegaConf.create({"name": "minference_cascade", "patterns": "all:dense"}), info)


def test_defaults_and_semantics():
    from methods.minference_cascade import MInferenceCascadeConfig

    c = MInferenceCascadeConfig()
    assert (c.stride, c.sink, c.cascades, c.patterns) == (100000, 64, 4, "auto")
    sem = MInferenceCascadeConfig.parse({"patterns": "all:vertical_slash:1000:6096", "cache_size": 16384}).semantics()
    assert "sparse" in sem["prefill"] and sem["decode"].startswith("dense") and sem["budget_total"] == 16448


def test_kernel_path_equals_torch_path(monkeypatch):
    """The whole method on the Triton kernels (the interpreter on the CPU) against its torch path: outputs,
    slots and EMA scores of prefill chunks and decode steps, the chunk density the kernel counted."""
    import kernels
    from kernels import _common

    if not (kernels.HAVE_TRITON and _common.interpreter_active()):     # the Driver's tensors live on the CPU
        pytest.skip("needs Triton's interpreter (TRITON_INTERPRET=1 before triton's import; not on CUDA machines)")
    model = tiny("llama")
    rope = rope_for(model)
    cfg = {"name": "minference_cascade", "sink": 2, "cascades": 2, "cache_size": 8, "stride": 13, **SMALL,
           "patterns": "mix:vertical_slash:2:3,a_shape:2:5,block_sparse:1,dense"}
    got = []
    for backend in ("torch", "triton"):
        monkeypatch.setenv("HARNESS_KERNELS", backend)
        method, info = make(cfg, model)
        d, steps = drive(method, info, rope, 33, 6, 13)
        outs = [d.step(T, phase)[1] for T, phase in steps]
        got.append((outs, method.store, method.stats()))
    (a, sa, ta), (b, sb, tb) = got
    for x, y in zip(a, b):
        assert max((o1 - o2).abs().max().item() for o1, o2 in zip(x, y)) < 2e-5
    assert torch.equal(sa.tok, sb.tok)
    assert torch.allclose(sa.score, sb.score, rtol=1e-4, atol=1e-13) and sa.score.abs().max() > 0
    assert ta["chunk_density"] == tb["chunk_density"]
