"""Row moves between InfLLM / Ltri-LLM's positional store in host memory and the device (offload=true
on the device path): every token's un-rotated key and value at its absolute position, in pinned host
memory that kernels read and write through unified virtual addressing (a pinned or cudaHostRegister'ed
CPU tensor is a valid kernel pointer on CUDA: triton PR #1197), so neither move needs a host sync, a CPU
staging copy or a dynamic shape, and both are captured in a CUDA graph.

`gather_rows`   out[b, h, dst[b, h, j]] = src[b, h, index[b, h, j]] for j < counts[b, h], keys and values
                in one launch (dst None: dst[b, h, j] = j): a step's memory rows from the store into a
                device staging buffer; rows at j >= counts are not touched.
`scatter_rows`  dst[b, h, positions[t]] = src[b, h, t] for every t with positions[t] < limit, keys and
                values in one launch: the step's new rows into the store.

Index tensors may be broadcast (stride 0) over heads. Triton on CUDA (or in the interpreter under
HARNESS_KERNELS=triton), the torch reference elsewhere; the two move the same bytes (exact parity).
"""
from __future__ import annotations

import torch

from ._common import HAVE_TRITON, backend_for, kernel_for, next_pow2, tl, triton


def gather_rows_ref(out_k, out_v, src_k, src_v, index, counts, dst=None) -> None:
    B, H, n = index.shape
    j = torch.arange(n, device=index.device)
    for b in range(B):
        for h in range(H):
            m = j < counts[b, h]
            src = index[b, h][m].long().to(src_k.device)
            to = (j[m] if dst is None else dst[b, h][m].long()).to(out_k.device)
            out_k[b, h].index_copy_(0, to, src_k[b, h].index_select(0, src).to(out_k.device))
            out_v[b, h].index_copy_(0, to, src_v[b, h].index_select(0, src).to(out_v.device))


def scatter_rows_ref(dst_k, dst_v, positions, k, v, limit: int | None = None) -> None:
    keep = positions < (dst_k.shape[2] if limit is None else limit)
    pos = positions[keep].to(dst_k.device)
    dst_k.index_copy_(2, pos, k[:, :, keep.to(k.device)].to(dst_k.device))
    dst_v.index_copy_(2, pos, v[:, :, keep.to(v.device)].to(dst_v.device))


if HAVE_TRITON:

    @triton.jit
    def _gather_kernel(OK, OV, SK, SV, Idx, Dst, Cnt, n, H,
                       s_okb, s_okh, s_okn, s_ovb, s_ovh, s_ovn, s_skb, s_skh, s_skn, s_svb, s_svh, s_svn,
                       s_ib, s_ih, s_db, s_dh, s_cb, s_ch, D,
                       BJ: tl.constexpr, BD: tl.constexpr, HAS_DST: tl.constexpr):
        pid = tl.program_id(0)
        b = (pid // H).to(tl.int64)
        h = (pid % H).to(tl.int64)
        jj = tl.program_id(1) * BJ + tl.arange(0, BJ)
        dd = tl.arange(0, BD)
        cnt = tl.load(Cnt + b * s_cb + h * s_ch)
        rows = (jj < n) & (jj < cnt)
        src = tl.load(Idx + b * s_ib + h * s_ih + jj, mask=rows, other=0).to(tl.int64)
        if HAS_DST:
            to = tl.load(Dst + b * s_db + h * s_dh + jj, mask=rows, other=0).to(tl.int64)
        else:
            to = jj.to(tl.int64)
        m = rows[:, None] & (dd[None, :] < D)
        k = tl.load(SK + b * s_skb + h * s_skh + src[:, None] * s_skn + dd[None, :], mask=m)
        v = tl.load(SV + b * s_svb + h * s_svh + src[:, None] * s_svn + dd[None, :], mask=m)
        tl.store(OK + b * s_okb + h * s_okh + to[:, None] * s_okn + dd[None, :], k, mask=m)
        tl.store(OV + b * s_ovb + h * s_ovh + to[:, None] * s_ovn + dd[None, :], v, mask=m)

    @triton.jit
    def _scatter_kernel(DK, DV, SK, SV, Pos, T, H, limit,
                        s_dkb, s_dkh, s_dkn, s_dvb, s_dvh, s_dvn, s_skb, s_skh, s_skn, s_svb, s_svh, s_svn, D,
                        BT: tl.constexpr, BD: tl.constexpr):
        pid = tl.program_id(0)
        b = (pid // H).to(tl.int64)
        h = (pid % H).to(tl.int64)
        tt = tl.program_id(1) * BT + tl.arange(0, BT)
        dd = tl.arange(0, BD)
        pos = tl.load(Pos + tt, mask=tt < T, other=0).to(tl.int64)
        m = ((tt < T) & (pos < limit))[:, None] & (dd[None, :] < D)
        k = tl.load(SK + b * s_skb + h * s_skh + tt[:, None] * s_skn + dd[None, :], mask=m)
        v = tl.load(SV + b * s_svb + h * s_svh + tt[:, None] * s_svn + dd[None, :], mask=m)
        tl.store(DK + b * s_dkb + h * s_dkh + pos[:, None] * s_dkn + dd[None, :], k, mask=m)
        tl.store(DV + b * s_dvb + h * s_dvh + pos[:, None] * s_dvn + dd[None, :], v, mask=m)


def _strides3(t):
    return t.stride(0), t.stride(1), t.stride(2)


def gather_rows(out_k, out_v, src_k, src_v, index, counts, dst=None) -> None:
    """out/src [B, H, rows, D] (last dim contiguous; src may be pinned host memory), index (and dst) int
    [B, H, n] (the last dim contiguous), counts int [B, H]; decided by where `out_k` lives."""
    if backend_for(out_k) == "torch":
        return gather_rows_ref(out_k, out_v, src_k, src_v, index, counts, dst)
    B, H, n = index.shape
    D = out_k.shape[-1]
    if n == 0:
        return None
    assert all(t.stride(-1) == 1 for t in (out_k, out_v, src_k, src_v, index)) and counts.shape == (B, H)
    dd = dst if dst is not None else index
    bj = 32
    kernel_for(_gather_kernel, out_k)[(B * H, triton.cdiv(n, bj))](
        out_k, out_v, src_k, src_v, index, dd, counts, n, H, *_strides3(out_k), *_strides3(out_v),
        *_strides3(src_k), *_strides3(src_v), index.stride(0), index.stride(1), dd.stride(0), dd.stride(1),
        counts.stride(0), counts.stride(1), D, BJ=bj, BD=next_pow2(D), HAS_DST=dst is not None, num_warps=4)
    return None


def scatter_rows(dst_k, dst_v, positions, k, v, limit: int | None = None) -> None:
    """dst [B, H, capacity, D] (may be pinned host memory), positions int [T] (on the device), k/v
    [B, H, T, D]; rows whose position is >= limit (default: capacity) are skipped; decided by where `k`
    lives."""
    if backend_for(k) == "torch":
        return scatter_rows_ref(dst_k, dst_v, positions, k, v, limit)
    B, H, T, D = k.shape
    assert all(t.stride(-1) == 1 for t in (dst_k, dst_v, k, v)) and positions.is_contiguous()
    bt = 16
    kernel_for(_scatter_kernel, k)[(B * H, triton.cdiv(T, bt))](
        dst_k, dst_v, k, v, positions, T, H, dst_k.shape[2] if limit is None else limit,
        *_strides3(dst_k), *_strides3(dst_v), *_strides3(k), *_strides3(v), D, BT=bt, BD=next_pow2(D),
        num_warps=4)
    return None
