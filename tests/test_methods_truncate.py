"""Truncate oracle: on random q, k, v each kept query attends exactly what dense attention over the
cut text would (positions re-assigned from 0), dropped prompt tokens output zero, and block mode reads
each block of `budget` tokens on its own, whatever the prefill chunks."""
from __future__ import annotations

import pytest
import torch
from test_methods_common import Driver, make, masked_attention, one_thread, rope_for  # noqa: F401
from tiny_models import tiny


def _dense(rope, q, k, v, q_pos, k_pos, scale):
    """Causal dense attention of queries at in-cache q_pos over keys at k_pos (both rotated there)."""
    qr, kr = rope.apply(q, q_pos), rope.apply(k, k_pos)
    mask = (k_pos.view(1, -1) <= q_pos.view(-1, 1)).expand(q.shape[0], q.shape[1], -1, -1)
    return masked_attention(qr, kr, v, mask, scale)


@pytest.mark.parametrize("keep,budget", [("last", 9), ("middle", 11), ("last", 40)])
def test_cut_prompt_then_dense_decode(keep, budget):
    model = tiny("llama")
    rope = rope_for(model)
    method, info = make({"name": "truncate", "budget": budget, "keep": keep}, model)
    T0, n_dec = 25, 6
    d = Driver(method, info, rope, max_len=T0 + n_dec)
    qs, outs = d.step(T0, "prefill")
    if T0 <= budget:
        kept = list(range(T0))
    elif keep == "last":
        kept = list(range(T0 - budget, T0))
    else:
        kept = list(range(budget // 2)) + list(range(T0 - budget // 2, T0))
    icp = torch.arange(len(kept))
    for layer in range(info.num_layers):
        ref = _dense(rope, qs[layer][:, :, kept], d.k[layer][:, :, kept], d.v[layer][:, :, kept], icp, icp,
                     info.scaling)
        assert (outs[layer][:, kept] - ref).abs().max().item() <= 1e-5
        dropped = [t for t in range(T0) if t not in kept]
        assert (outs[layer][:, dropped] == 0).all()
    for j in range(n_dec):
        qs, outs = d.step(1, "decode")
        rows = kept + list(range(T0, d.seen))
        for layer in range(info.num_layers):
            ref = _dense(rope, qs[layer], d.k[layer][:, :, rows], d.v[layer][:, :, rows],
                         torch.tensor([len(rows) - 1]), torch.arange(len(rows)), info.scaling)
            assert (outs[layer] - ref).abs().max().item() <= 1e-5, (j, layer)


@pytest.mark.parametrize("chunk", [7, 10, 25])
def test_blocks_are_read_independently(chunk):
    model = tiny("llama")
    rope = rope_for(model)
    N = 10
    method, info = make({"name": "truncate", "budget": N, "keep": "block"}, model)
    T0, n_dec = 25, 12
    d = Driver(method, info, rope, max_len=T0 + n_dec)
    steps = [("prefill", min(chunk, T0 - s)) for s in range(0, T0, chunk)] + [("decode", 1)] * n_dec
    for phase, T in steps:
        qs, outs = d.step(T, phase)
        a0 = d.seen - T
        for layer in range(info.num_layers):
            for t in range(T):
                p = a0 + t
                block = list(range(p // N * N, p + 1))
                ref = _dense(rope, qs[layer][:, :, t:t + 1], d.k[layer][:, :, block], d.v[layer][:, :, block],
                             torch.tensor([p % N]), torch.arange(len(block)), info.scaling)
                assert (outs[layer][:, t:t + 1] - ref).abs().max().item() <= 1e-5, (phase, p, layer)
