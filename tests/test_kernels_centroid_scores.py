"""The cluster-score kernel (kernels/centroid_scores.py) against the scores `selection_attention` writes
(what Tactic read before) and against its torch reference: the same q.c per query head and centroid,
GQA groups, n below the centroid capacity, strided centroid slices. Interpreter on the CPU."""
from __future__ import annotations

import pytest
import torch
from triton_env import DEV, needs_triton

import kernels
from kernels import centroid_scores as C

pytestmark = needs_triton


@pytest.mark.parametrize("B,Hq,Hkv,n,cap,dtype", [(1, 8, 2, 37, 40, torch.float32), (2, 4, 4, 70, 96, torch.float32),
                                                  (1, 8, 2, 5, 64, torch.bfloat16)])
def test_scores_match_selection_attention(monkeypatch, B, Hq, Hkv, n, cap, dtype):
    g = torch.Generator().manual_seed(n)
    q = torch.randn(B, Hq, 32, generator=g).to(dtype).to(DEV)
    cent = torch.randn(2, B, Hkv, cap, 32, generator=g).to(dtype).to(DEV)[1]     # a layer slice, as Tactic's
    ref = C.cluster_scores_ref(q.cpu(), cent.cpu(), n, 0.2)
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    got = kernels.cluster_scores(q, cent, n, 0.2)
    lengths = torch.full((B,), n, dtype=torch.int32, device=DEV)
    _, want = kernels.selection_attention(q, cent, cent, lengths, 0.2, max_length=n)
    assert got.shape == (B, Hq, n) and got.dtype == torch.float32
    assert torch.equal(got, want)                     # the attention kernel's own scores, bit for bit
    torch.testing.assert_close(got.cpu(), ref, rtol=1e-4, atol=1e-4)
