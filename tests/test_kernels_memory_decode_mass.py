"""kernels/memory_decode.py's fused epilogue (two_part_decode_mass): the combine, its lse, the local window's
mass under it and the hold, in one launch, against the reference (two_part_decode_lse_ref and the mass in
torch); Triton in the interpreter at small shapes, including a window reaching before position 0 (invalid
distances), a stale non-finite logit and an empty memory part."""
from __future__ import annotations

import pytest
import torch
from test_kernels_memory_decode import HKV, HQ, B, _inputs
from triton_env import DEV, needs_triton

from kernels.memory_decode import (
    local_mass_ref,
    two_part_decode_lse_ref,
    two_part_decode_mass,
)

R, NL = 40, 11


def _case(seed, counts2, a):
    q1, p1, q2, p2 = _inputs(seed, counts2)
    k1, v1, _, _ = p1
    lpos = a - torch.arange(NL)
    idx = lpos.remainder(R).to(torch.int32).view(1, 1, NL).expand(B, HKV, NL).contiguous()
    cnt = torch.full((B, HKV), min(a + 1, NL), dtype=torch.int32)
    return [t.to(DEV) for t in (q1, k1, v1, idx, cnt, q2, *p2)]


def test_reference_mass_is_the_torch_formula():
    sc = torch.randn(B, HQ, R)
    sc[0, 1, 7] = float("inf")
    lse = torch.randn(B, HQ)
    first = torch.tensor([5])
    m = local_mass_ref(sc, lse, first, R, NL, 0.3)
    for j in range(NL):
        for b in range(B):
            for h in range(HQ):
                raw = sc[b, h, (5 - j) % R]
                want = 0.0 if j > 5 or not torch.isfinite(raw) else torch.exp(raw * 0.3 - lse[b, h]).item()
                assert abs(m[b, h, j].item() - want) <= 1e-6


@needs_triton
@pytest.mark.parametrize("a,counts2", [(30, [13, 5, 0, 8]), (6, [0, 0, 0, 0]), (47, [3, 13, 1, 0])])
def test_triton_epilogue_equals_reference(a, counts2, monkeypatch):
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    args = _case(3, counts2, a)
    first = torch.tensor([a], device=DEV)
    sc_ref = torch.full((B, HQ, R), float("nan"), device=DEV)
    sc_got = sc_ref.clone()
    want, want_lse = two_part_decode_lse_ref(*args, 0.3, scores=sc_ref)
    want_mass = local_mass_ref(sc_ref, want_lse, first, R, NL, 0.3)
    mass = torch.full((3, B, HQ, NL), -5.0, device=DEV)
    pos = torch.full((3, 1), -1, dtype=torch.long, device=DEV)
    got, got_lse = two_part_decode_mass(*args, 0.3, scores=sc_got, first=first, ring_size=R, mass_out=mass[1],
                                        pos_out=pos[1])
    assert (got.float() - want.float()).abs().max().item() <= 1e-4
    assert (got_lse - want_lse).abs().max().item() <= 1e-4
    assert (mass[1] - want_mass).abs().max().item() <= 1e-5
    assert (mass[0] == -5).all() and (mass[2] == -5).all()
    assert pos[:, 0].tolist() == [-1, a, -1]
