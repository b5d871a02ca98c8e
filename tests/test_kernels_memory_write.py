"""kernels/memory_write.py: the decode step's start in one launch (the pending mass folded into the ring's
scores, the token into the ring, the positional store and the sink columns) against the torch reference,
bit for bit: a due and a not-due fold, a fold reaching the token's own slot, a sink and a non-sink position,
with and without the staging buffer; Triton in the interpreter at small shapes."""
from __future__ import annotations

import pytest
import torch
from triton_env import DEV, needs_triton

from kernels.memory_write import decode_write, decode_write_ref

B, HQ, HKV, D, R, NL, CAP, N_INIT = 2, 4, 2, 16, 12, 7, 40, 3


def _state(g):
    ring = [torch.randn(B, HKV, R, D, generator=g) for _ in range(3)]
    store = [torch.randn(B, HKV, CAP, D, generator=g) for _ in range(2)]
    sink = [torch.randn(B, HKV, CAP // 2, D, generator=g) for _ in range(2)]
    return ring, torch.randn(B, HQ, R, generator=g), store, sink


@needs_triton
@pytest.mark.parametrize("a,due,with_sink", [(20, 19, True), (20, -1, True), (1, 0, True), (26, 18, False),
                                              (5, 4, False)])
def test_triton_write_equals_reference(a, due, with_sink, monkeypatch):
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    g = torch.Generator().manual_seed(a)
    k, kr, v = (torch.randn(B, HKV, 1, D, generator=g).to(DEV) for _ in range(3))
    mass = torch.rand(B, HQ, NL, generator=g).to(DEV)
    first, due_pos = torch.tensor([a], device=DEV), torch.tensor([due], device=DEV)
    out = []
    for fn in (decode_write_ref, decode_write):
        ring, score, store, sink = _state(torch.Generator().manual_seed(9))
        ring, store, sink = [[t.to(DEV) for t in x] for x in (ring, store, sink)]
        score = score.to(DEV)
        fn(ring, score, first, k, kr, v, store, sink if with_sink else None, N_INIT, mass, due_pos)
        out.append([*ring, score, *store, *sink])
    for want, got in zip(*out):
        assert torch.equal(want, got)
    score = out[1][3]
    assert (score[:, :, a % R] == 0).all()
    assert torch.equal(out[1][4][:, :, a], k[:, :, 0])
