"""BigBird oracle: on random q, k, v every query (prefill and decode) attends exactly its set (the
`sink` first tokens of its block, a window of the last ones, one token per equal stratum of the span
between, per query head), brute-forced here in plain Python; random picks are checked for structure
(inside their stratum, distinct, reproducible, seed-dependent, shared by a query block's rows with
draw=block), strided picks exactly. The draw=block prefill kernel (Triton's interpreter) equals the
row-by-row path."""
from __future__ import annotations

import pytest
import torch
from test_methods_common import Driver, make, masked_attention, one_thread, rope_for  # noqa: F401
from tiny_models import tiny
from triton_env import needs_triton


def _strata(r, c):
    sink, window, n_random = c.sink, c.window, c.n_random
    a = r if c.draw == "query" else max(r // c.query_block * c.query_block, c.budget - 1)  # the block's anchor
    m = a + 1 - window - sink
    return [(sink + j * m // n_random, sink + (j + 1) * m // n_random) for j in range(n_random)]


@pytest.mark.parametrize("cfg", [{"budget": 12, "sink": 2, "random": 4, "pick": "strided", "query_block": 4},
                                 {"budget": 12, "sink": 2, "random": 4, "query_block": 4},
                                 {"budget": 12, "sink": 2, "random": 4, "draw": "query"},
                                 {"budget": 9, "sink": 0, "random": 3, "block": 16, "prefill_chunk": 8, "query_block": 3},
                                 {"budget": 9, "sink": 0, "random": 3, "block": 16, "prefill_chunk": 8, "draw": "query"},
                                 {"budget": 10, "sink": 3, "seed": 7, "query_block": 5}])
def test_each_query_attends_its_set(cfg):
    model = tiny("llama")
    rope = rope_for(model)
    method, info = make({"name": "bigbird", **cfg}, model)
    c = method.cfg
    Hq = info.num_heads
    block = c.block or 10**9
    T0, n_dec, chunk = 28, 10, cfg.get("prefill_chunk") or 28
    d = Driver(method, info, rope, max_len=T0 + n_dec)
    picks, blocks = [], {}
    for phase, T in [("prefill", min(chunk, T0 - s)) for s in range(0, T0, chunk)] + [("decode", 1)] * n_dec:
        qs, outs = d.step(T, phase)
        a0 = d.seen - T
        pos = torch.arange(a0, d.seen)
        index, counts = method.sets(0, pos, pos % block)
        for layer in range(info.num_layers):
            index, counts = method.sets(layer, pos, pos % block)
            mask = torch.zeros(d.B, Hq, T, d.seen, dtype=torch.bool)
            for t in range(T):
                p = a0 + t
                start, r = p // block * block, p % block
                for h in range(Hq):
                    got = index[t, h, :int(counts[t, h])].tolist()
                    if r + 1 <= c.budget:
                        want = list(range(r + 1))
                        assert got == want
                    else:
                        strata = _strata(r, c)
                        mid = got[c.sink:c.sink + c.n_random]
                        assert got[:c.sink] == list(range(c.sink)) and got[c.sink + c.n_random:] == list(
                            range(r + 1 - c.window, r + 1))
                        assert all(lo <= x < hi for x, (lo, hi) in zip(mid, strata)) and len(set(got)) == len(got)
                        if c.pick == "strided":
                            assert mid == [lo for lo, _ in strata]
                        picks.append((layer, p, h, tuple(mid)))
                        if c.draw == "block":                   # one draw per (query block, layer, head)
                            blocks.setdefault((layer, start, r // c.query_block, h), set()).add(tuple(mid))
                    mask[:, h, t, [start + x for x in got]] = True
            k_rot = torch.empty_like(d.k[layer])
            for s in range(0, d.seen, block):  # keys rotated at their in-block positions
                e = min(d.seen, s + block)
                k_rot[:, :, s:e] = rope.apply(d.k[layer][:, :, s:e], torch.arange(e - s))
            q = rope.apply(qs[layer], pos % block)
            ref = masked_attention(q, k_rot, d.v[layer], mask, info.scaling)
            assert (outs[layer] - ref).abs().max().item() <= 1e-5, (phase, a0, layer)
    if c.pick == "random" and picks:
        # reproducible, and a different seed draws differently
        again, _ = make({"name": "bigbird", **cfg}, model)
        other, _ = make({"name": "bigbird", **cfg, "seed": c.seed + 1}, model)
        for m in (again, other):
            m.setup(info, 1, T0 + n_dec, torch.device("cpu"), torch.float32)
        layer, p, h, mid = picks[-1]
        pos = torch.tensor([p])
        assert tuple(again.sets(layer, pos, pos % block)[0][0, h, c.sink:c.sink + c.n_random].tolist()) == mid
        differ = [tuple(other.sets(ly, torch.tensor([pp]), torch.tensor([pp]) % block)[0][0, hh, c.sink:c.sink
                                                                                            + c.n_random].tolist())
                  != m for ly, pp, hh, m in picks]
        assert any(differ)
        assert len({m for *_, m in picks}) > 1  # heads/positions draw differently
    assert all(len(v) == 1 for v in blocks.values())


@needs_triton
@pytest.mark.parametrize("cfg", [{"budget": 12, "sink": 2, "random": 4, "query_block": 4},
                                 {"budget": 13, "sink": 3, "random": 5, "query_block": 8, "prefill_chunk": 12},
                                 {"budget": 9, "sink": 0, "random": 3, "block": 16, "prefill_chunk": 8, "query_block": 3},
                                 {"budget": 10, "sink": 2, "random": 3, "pick": "strided", "query_block": 16}])
def test_kernel_prefill_equals_row_by_row(cfg, monkeypatch):
    """draw=block: the block-sparse kernel (Triton's interpreter) attends what the row-by-row path does."""
    model = tiny("llama")
    rope = rope_for(model)
    outs = {}
    for backend in ("torch", "triton"):
        monkeypatch.setenv("HARNESS_KERNELS", backend)
        method, info = make({"name": "bigbird", **cfg}, model)
        d = Driver(method, info, rope, max_len=44)
        chunk = cfg.get("prefill_chunk") or 40
        outs[backend] = [d.step(min(chunk, 40 - s), "prefill")[1] for s in range(0, 40, chunk)]
    for a, b in zip(outs["torch"], outs["triton"]):
        for x, y in zip(a, b):
            assert (x - y).abs().max().item() < 1e-4
