"""kernels/memory_stage.py: the gather (store rows -> staging buffer) and the scatter (new rows -> store)
against plain loops, and the Triton kernels against the torch reference (exact: they move bytes), in the
interpreter at small shapes; on CUDA also with the store in pinned host memory (read and written by the
kernels through unified addressing)."""
from __future__ import annotations

import pytest
import torch
from triton_env import DEV, needs_triton

from kernels.memory_stage import (
    gather_rows,
    gather_rows_ref,
    scatter_rows,
    scatter_rows_ref,
)

B, H, S, D, N = 2, 3, 37, 16, 9


def _gather_inputs(seed, with_dst):
    g = torch.Generator().manual_seed(seed)
    sk, sv = torch.randn(B, H, S, D, generator=g), torch.randn(B, H, S, D, generator=g)
    idx = torch.randint(0, S, (B, H, N), generator=g, dtype=torch.int32)
    counts = torch.tensor([[9, 4, 0], [1, 9, 6]], dtype=torch.int32)
    dst = torch.stack([torch.randperm(N + 3, generator=g)[:N] for _ in range(B * H)]).view(B, H, N).int() \
        if with_dst else None
    return sk, sv, idx, counts, dst


@pytest.mark.parametrize("with_dst", [False, True])
def test_gather_reference_equals_plain_loop(with_dst):
    sk, sv, idx, counts, dst = _gather_inputs(0, with_dst)
    ok, ov = torch.full((B, H, N + 3, D), -1.0), torch.full((B, H, N + 3, D), -1.0)
    gather_rows_ref(ok, ov, sk, sv, idx, counts, dst)
    wk, wv = torch.full_like(ok, -1.0), torch.full_like(ov, -1.0)
    for b in range(B):
        for h in range(H):
            for j in range(int(counts[b, h])):
                to = j if dst is None else int(dst[b, h, j])
                wk[b, h, to], wv[b, h, to] = sk[b, h, idx[b, h, j]], sv[b, h, idx[b, h, j]]
    assert torch.equal(ok, wk) and torch.equal(ov, wv)


def test_scatter_reference_equals_plain_loop():
    g = torch.Generator().manual_seed(1)
    k, v = torch.randn(B, H, 4, D, generator=g), torch.randn(B, H, 4, D, generator=g)
    pos = torch.tensor([3, 11, 12, 30])
    for limit in (None, 12):
        dk, dv = torch.zeros(B, H, S, D), torch.zeros(B, H, S, D)
        scatter_rows_ref(dk, dv, pos, k, v, limit)
        wk, wv = torch.zeros_like(dk), torch.zeros_like(dv)
        for t, p in enumerate(pos.tolist()):
            if limit is None or p < limit:
                wk[:, :, p], wv[:, :, p] = k[:, :, t], v[:, :, t]
        assert torch.equal(dk, wk) and torch.equal(dv, wv)


def _host(t: torch.Tensor) -> torch.Tensor:
    """Where the store lives on the device path with offload: pinned host memory on CUDA."""
    return t.pin_memory() if DEV == "cuda" else t.clone()


@needs_triton
@pytest.mark.parametrize("with_dst", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_gather_equals_reference(with_dst, dtype, monkeypatch):
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    sk, sv, idx, counts, dst = _gather_inputs(2, with_dst)
    sk, sv = sk.to(dtype), sv.to(dtype)
    want_k, want_v = torch.full((B, H, N + 3, D), -1.0, dtype=dtype), torch.full((B, H, N + 3, D), -1.0, dtype=dtype)
    gather_rows_ref(want_k, want_v, sk, sv, idx, counts, dst)
    ok, ov = torch.full_like(want_k, -1.0, device=DEV), torch.full_like(want_v, -1.0, device=DEV)
    shared = idx[:, :1].to(DEV).expand(B, H, N)          # one index for every head (stride 0), as U = 1 gives
    gather_rows(ok, ov, _host(sk), _host(sv), idx.to(DEV), counts.to(DEV), None if dst is None else dst.to(DEV))
    if DEV == "cuda":
        torch.cuda.synchronize()
    assert torch.equal(ok.cpu(), want_k) and torch.equal(ov.cpu(), want_v)
    ok2, ov2 = torch.zeros_like(ok), torch.zeros_like(ov)
    gather_rows(ok2, ov2, sk.to(DEV), sv.to(DEV), shared, counts.to(DEV))
    w2k, w2v = torch.zeros_like(want_k), torch.zeros_like(want_v)
    gather_rows_ref(w2k, w2v, sk, sv, idx[:, :1].expand(B, H, N), counts)
    assert torch.equal(ok2.cpu(), w2k) and torch.equal(ov2.cpu(), w2v)


@needs_triton
@pytest.mark.parametrize("limit", [None, 12])
def test_triton_scatter_equals_reference(limit, monkeypatch):
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    g = torch.Generator().manual_seed(3)
    k, v = torch.randn(B, H, 20, D, generator=g).bfloat16(), torch.randn(B, H, 20, D, generator=g).bfloat16()
    pos = torch.randperm(S, generator=g)[:20]
    wk, wv = torch.zeros(B, H, S, D, dtype=torch.bfloat16), torch.zeros(B, H, S, D, dtype=torch.bfloat16)
    scatter_rows_ref(wk, wv, pos, k, v, limit)
    dk, dv = _host(torch.zeros_like(wk)), _host(torch.zeros_like(wv))
    scatter_rows(dk, dv, pos.to(DEV), k.to(DEV), v.to(DEV), limit)
    if DEV == "cuda":
        torch.cuda.synchronize()
    assert torch.equal(dk.cpu(), wk) and torch.equal(dv.cpu(), wv)
