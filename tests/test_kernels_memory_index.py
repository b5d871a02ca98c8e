"""kernels/memory_index.py: the decode step's memory positions [sinks | retrieved blocks | remainder] in one
kernel against the torch reference (integers: exact), with the geometry as device tensors (the remainder's
start also as a host int, SlotStage's column), ids shared by the heads or one row per KV head, no block
retrieved yet, and positions clamped into the store; Triton in the interpreter at small shapes."""
from __future__ import annotations

import pytest
import torch
from triton_env import DEV, needs_triton

from kernels.memory_index import memory_positions, memory_positions_ref
from methods.parts.infllm_device import Geometry


@needs_triton
@pytest.mark.parametrize("units,k,const_rem", [(1, 3, False), (2, 3, False), (1, 0, False), (1, 3, True)])
def test_triton_positions_equal_reference(units, k, const_rem, monkeypatch):
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    g = torch.Generator().manual_seed(0)
    n_init, n_local, bs, Hkv, B = 3, 7, 4, 2, 2
    for a in (0, 5, 12, 21, 40, 77):
        geo = Geometry.of(torch.tensor([a], device=DEV), 1, n_init, n_local, bs)
        nb = max(0, a - n_local - n_init) // bs
        ids = torch.randint(0, max(nb, 1), (B, units, k), generator=g).to(torch.int32).to(DEV)
        counts = torch.randint(0, min(nb, k) + 1, (B, units), generator=g).to(torch.int32).to(DEV)
        rem = 30 if const_rem else geo.rem_start
        width, cap = n_init + 3 * bs + bs + 2, 50
        want = memory_positions_ref(ids, counts, geo.init_len, rem, geo.rem_len, n_init, bs, width, Hkv, cap)
        got = memory_positions(ids, counts, geo.init_len, rem, geo.rem_len, n_init, bs, width, Hkv, cap)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), a
        assert got[0].shape == (B, Hkv, width) and got[0].is_contiguous() and int(got[0].max()) < cap
