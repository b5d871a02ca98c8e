"""kernels/slot_stage.py: InfLLM's slot reuse (assign_slots) and the staging copies (stage_rows) in Triton
against their torch references, bit for bit, over a sequence of retrievals that keep, replace and add blocks
(the tags carried from step to step, the moved counter), fewer retrieved than slots, ids one row per unit or
shared, a remainder that wraps around the ring; the interpreter at small shapes."""
from __future__ import annotations

import pytest
import torch
from triton_env import DEV, needs_triton

from kernels.slot_stage import (
    assign_slots,
    assign_slots_ref,
    stage_rows,
    stage_rows_ref,
)

B, K, N_INIT, BS, D, H, R = 2, 3, 2, 3, 8, 2, 10
RETRIEVALS = ([4, 9], [1, 4, 9], [1, 4, 9], [2, 7, 9], [0, 3, 5], [3, 5], [3, 5, 8], [8])


@needs_triton
@pytest.mark.parametrize("units", [1, 2])
def test_triton_assign_equals_reference(units, monkeypatch):
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    tags = [torch.full((B, units, K), -1, dtype=torch.int32, device=DEV) for _ in range(2)]
    moved = [torch.zeros(1, dtype=torch.long, device=DEV) for _ in range(2)]
    for step, sel in enumerate(RETRIEVALS):
        ids = torch.zeros(B, units, K, dtype=torch.int32)
        counts = torch.zeros(B, units, dtype=torch.int32)
        for b in range(B):
            for u in range(units):
                pick = sel if (b + u + step) % 2 == 0 else sorted(set(sel) ^ {6})[:K]
                ids[b, u, :len(pick)] = torch.tensor(pick, dtype=torch.int32)
                counts[b, u] = len(pick)
        ids, counts = ids.to(DEV), counts.to(DEV)
        want = assign_slots_ref(tags[0], ids, counts, moved[0])
        got = assign_slots(tags[1], ids, counts, moved[1])
        for w, g in zip(want, got):
            assert torch.equal(w.to(torch.int32), g.to(torch.int32)), step
        assert torch.equal(tags[0], tags[1]) and torch.equal(moved[0], moved[1]), step
    assert int(moved[1]) > 0


@needs_triton
@pytest.mark.parametrize("units,rem", [(1, (7, 4)), (2, (3, 0)), (1, (9, 5))])
def test_triton_stage_rows_equal_reference(units, rem, monkeypatch):
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    g = torch.Generator().manual_seed(units)
    store = [torch.randn(B, H, 60, D, generator=g).to(DEV) for _ in range(2)]
    ring = [torch.randn(B, H, R, D, generator=g).to(DEV) for _ in range(2)]
    src = torch.randint(0, 15, (B, units, K), generator=g).to(torch.int32).to(DEV)
    dst = torch.stack([torch.randperm(K, generator=g) for _ in range(B * units)]).view(B, units, K).to(torch.int32)
    n_new = torch.randint(0, K + 1, (B, units), generator=g).to(torch.int32).to(DEV)
    rem_col, cap = N_INIT + K * BS, N_INIT + K * BS + 6
    out = []
    for fn in (stage_rows_ref, stage_rows):
        o = [torch.full((B, H, cap, D), float("nan"), device=DEV) for _ in range(2)]
        fn(*o, *store, *ring, src, dst.to(DEV), n_new, N_INIT, BS, torch.tensor([rem[0]], device=DEV),
           torch.tensor([rem[1]], device=DEV), rem_col)
        out.append(o)
    for w, g_ in zip(*out):
        assert torch.equal(w.nan_to_num(-9), g_.nan_to_num(-9))
