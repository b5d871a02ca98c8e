"""Token positions of InfLLM / Ltri-LLM's memory for a decode step: [sinks | retrieved blocks | remainder]
per (sequence, KV head), from the layer's retrieved block ids (methods/parts/infllm_device.py MemoryLayout).

    pos[b, h, j] = j                                       j < init_len                 (sinks)
                 = n_init + blk[b, u, c] * bs + o % bs      o = j - init_len < n * bs,   (blocks, c = o // bs)
                 = rem_start + o - n * bs                   otherwise                    (remainder)
    clamped to [0, capacity); n = counts[b, u] retrieved blocks; u = h when ids has a row per KV head, else 0;
    count[b, h] = init_len + n * bs + rem_len (the valid prefix the decode reads).

In torch that is ~20 small ops per layer of a graph-captured decode step; the kernel is one launch. The
geometry (init_len, rem_start, rem_len) comes as device tensors (a decode step's), so nothing syncs.
Triton on CUDA, the torch reference elsewhere (exact parity: integers).
"""
from __future__ import annotations

import torch

from ._common import HAVE_TRITON, backend_for, kernel_for, next_pow2, tl, triton


def memory_positions_ref(ids, counts, init_len, rem_start, rem_len, n_init: int, bs: int, width: int,
                         kv_heads: int, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids int [B, U, k], counts int [B, U]; init_len, rem_start, rem_len ints or [1] tensors ->
    (pos int32 [B, kv_heads, width], count int32 [B, kv_heads]), both contiguous."""
    B, U, k = ids.shape
    j = torch.arange(width, device=ids.device)
    off = j - init_len
    nsel = counts.long().unsqueeze(-1) * bs                                # [B, U, 1]
    within = n_init + off.remainder(bs)
    if k:
        blk_col = off.div(bs, rounding_mode="floor").clamp(0, k - 1)
        pos_blk = within + ids.long().gather(-1, blk_col.expand(B, U, -1)) * bs
    else:
        pos_blk = within.expand(B, U, -1)
    pos = torch.where(j < init_len, j, torch.where(off < nsel, pos_blk, rem_start + off - nsel))
    pos = pos.clamp(0, capacity - 1).to(torch.int32)
    n = (init_len + rem_len + nsel.squeeze(-1)).to(torch.int32)
    if U != kv_heads:
        pos, n = pos.expand(B, kv_heads, -1), n.expand(B, kv_heads)
    return pos.contiguous(), n.contiguous()


if HAVE_TRITON:

    @triton.jit
    def _index_kernel(Ids, Cnt, Init, RemS, RemL, Pos, N, kmax, W, H, U, n_init, bs, capacity, rem_const, s_ib, s_iu,
                      s_cb, s_cu, BJ: tl.constexpr, REM_PTR: tl.constexpr, HAS_BLK: tl.constexpr):
        pid = tl.program_id(0)
        b = (pid // H).to(tl.int64)
        h = pid % H
        u = (h % U).to(tl.int64)          # U is 1 (shared by the heads) or H
        init_len = tl.load(Init)
        if REM_PTR:
            rem_start = tl.load(RemS)
        else:              # a constant start (SlotStage's remainder column)
            rem_start = tl.zeros((), tl.int64) + rem_const
        cnt = tl.load(Cnt + b * s_cb + u * s_cu).to(tl.int64)
        nsel = cnt * bs
        jj = tl.arange(0, BJ)
        for j0 in range(0, W, BJ):
            j = j0 + jj
            off = j - init_len
            offc = tl.maximum(off, 0)
            if HAS_BLK:
                col = tl.minimum(offc // bs, kmax)
                blk = tl.load(Ids + b * s_ib + u * s_iu + col, mask=j < W, other=0).to(tl.int64)
            else:
                blk = tl.zeros((BJ,), tl.int64)
            pos = tl.where(j < init_len, j, tl.where(off < nsel, n_init + offc % bs + blk * bs, rem_start + off - nsel))
            pos = tl.minimum(tl.maximum(pos, 0), capacity - 1)
            tl.store(Pos + pid.to(tl.int64) * W + j, pos.to(tl.int32), mask=j < W)
        tl.store(N + pid, (init_len + tl.load(RemL) + nsel).to(tl.int32))


def memory_positions(ids, counts, init_len, rem_start, rem_len, n_init: int, bs: int, width: int, kv_heads: int,
                     capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """memory_positions_ref's contract; the kernel when init_len and rem_len are [1] device tensors (rem_start: one
    too, or a host int) on a Triton device."""
    if backend_for(ids) == "torch" or not all(isinstance(t, torch.Tensor) for t in (init_len, rem_len)):
        return memory_positions_ref(ids, counts, init_len, rem_start, rem_len, n_init, bs, width, kv_heads, capacity)
    B, U, k = ids.shape
    has_ptr = isinstance(rem_start, torch.Tensor)    # else a host int, passed by value (rem_const)
    assert U in (1, kv_heads) and ids.stride(-1) == 1 and counts.shape == (B, U)
    pos = torch.empty(B, kv_heads, width, device=ids.device, dtype=torch.int32)
    n = torch.empty(B, kv_heads, device=ids.device, dtype=torch.int32)
    kernel_for(_index_kernel, ids)[(B * kv_heads,)](
        ids, counts, init_len, rem_start if has_ptr else init_len, rem_len, pos, n, max(k - 1, 0), width, kv_heads, U, n_init,
        bs, capacity, 0 if has_ptr else int(rem_start), ids.stride(0), ids.stride(1) if U > 1 else 0,
        counts.stride(0), counts.stride(1) if U > 1 else 0, BJ=min(1024, next_pow2(width)) if ids.is_cuda else 64,
        REM_PTR=has_ptr, HAS_BLK=k > 0, num_warps=4)
    return pos, n
