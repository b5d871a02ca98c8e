"""InfLLM's buffer-slot reuse for a decode step with offload (methods/parts/infllm_stage.py SlotStage), in
two launches per layer instead of ~60 small torch ops:

`assign_slots`  per (sequence, retrieval unit): which slot each retrieved block takes (a block already in a
                slot stays there; the r-th new block, in block order, takes the r-th slot whose block is no
                longer wanted: InfLLM's greedy _arrange), the slots' new tags, and the new blocks as a list
                (src_blk[r], dst_slot[r] for r < n_new); `moved` += the new blocks.
`stage_rows`    the new blocks' rows from the positional store (pinned host memory, through unified
                addressing) into their slots' columns, and the remainder's rows from the window ring on the
                device into the columns after the slots, in one launch.

The torch references are the operations SlotStage ran before (tests/test_infllm_stage.py checks them
against the host path's _arrange); the kernels are checked against them bit for bit (integers and copies).
"""
from __future__ import annotations

import torch

from ._common import HAVE_TRITON, backend_for, kernel_for, next_pow2, tl, triton
from .memory_stage import gather_rows_ref


def assign_slots_ref(tags, ids, counts, moved):
    """tags int32 [B, U, K] (-1: empty; updated in place), ids int [B, U, k <= K] (the first counts [B, U] valid,
    in block order), moved int64 [1] (+= the new blocks) -> (slot, src_blk, dst_slot int32 [B, U, K], n_new
    [B, U])."""
    held = tags
    K = held.shape[-1]
    B, U = held.shape[:2]
    k = ids.shape[-1]
    ids = torch.nn.functional.pad(ids.to(torch.int32), (0, K - k), value=-1) if k < K else ids.to(torch.int32)
    want = torch.arange(K, device=ids.device) < counts.unsqueeze(-1)
    eq = (ids.unsqueeze(-1) == held.unsqueeze(-2)) & want.unsqueeze(-1) & (held >= 0).unsqueeze(-2)  # [.., i, s]
    new = want & ~eq.any(-1)
    free = ~eq.any(-2)
    match = new.unsqueeze(-1) & free.unsqueeze(-2) & \
        ((new.cumsum(-1) - 1).unsqueeze(-1) == (free.cumsum(-1) - 1).unsqueeze(-2))
    slot = torch.where(new, match.int().argmax(-1), eq.int().argmax(-1)).to(torch.int32)
    placed = match.any(-2)
    tags.copy_(torch.where(placed, (match.int() * ids.unsqueeze(-1)).sum(-2).to(torch.int32), held))
    n_new = new.sum(-1)
    to = torch.where(new, new.cumsum(-1) - 1, K)
    src_blk = torch.zeros(B, U, K + 1, dtype=torch.int32, device=ids.device).scatter_(-1, to, ids)[..., :K]
    dst_slot = torch.zeros(B, U, K + 1, dtype=torch.int32, device=ids.device).scatter_(-1, to, slot)[..., :K]
    moved += n_new.sum()
    return slot, src_blk.contiguous(), dst_slot.contiguous(), n_new.to(torch.int32)


def stage_rows_ref(out_k, out_v, store_k, store_v, ring_k, ring_v, src_blk, dst_slot, n_new, n_init: int, bs: int,
                   rem_start, rem_len, rem_col: int) -> None:
    """out [B, H, cap, D] (the staging buffer), store [B, H, capacity, D], ring [B, H, R, D]; src_blk/dst_slot
    [B, U, K], n_new [B, U] (U = 1 or H); rem_start, rem_len [1]: rows n_init + src_blk[r] * bs + t of the
    store to n_init + dst_slot[r] * bs + t (r < n_new, t < bs); ring rows (rem_start + i) % R to rem_col + i
    (i < rem_len)."""
    B, H = out_k.shape[:2]
    K = src_blk.shape[-1]
    j = torch.arange(K * bs, device=src_blk.device)
    col, within = j // bs, n_init + j % bs
    U = src_blk.shape[1]
    src = (src_blk.gather(-1, col.expand(B, U, -1)) * bs + within).to(torch.int32).expand(B, H, -1)
    dst = (dst_slot.gather(-1, col.expand(B, U, -1)) * bs + within).to(torch.int32).expand(B, H, -1)
    gather_rows_ref(out_k, out_v, store_k, store_v, src, (n_new * bs).to(torch.int32).expand(B, H), dst)
    r = torch.arange(out_k.shape[2] - rem_col, device=src_blk.device)
    rs = ((rem_start + r) % ring_k.shape[2]).to(torch.int32).view(1, 1, -1).expand(B, H, -1)
    rd = (rem_col + r).to(torch.int32).view(1, 1, -1).expand(B, H, -1)
    gather_rows_ref(out_k, out_v, ring_k, ring_v, rs, rem_len.to(torch.int32).view(1, 1).expand(B, H), rd)


if HAVE_TRITON:

    @triton.jit
    def _assign_kernel(Tags, Ids, Cnt, Slot, Src, Dst, NNew, Moved, U, K, k, s_tb, s_tu, s_ib, s_iu, s_cb, s_cu,
                       KP: tl.constexpr):
        pid = tl.program_id(0)
        b = (pid // U).to(tl.int64)
        u = (pid % U).to(tl.int64)
        i = tl.arange(0, KP)
        s = tl.arange(0, KP)
        cnt = tl.load(Cnt + b * s_cb + u * s_cu)
        ids = tl.load(Ids + b * s_ib + u * s_iu + i, mask=i < k, other=-1)
        want = (i < cnt) & (i < K)
        held = tl.load(Tags + b * s_tb + u * s_tu + s, mask=s < K, other=-1)
        eq = (ids[:, None] == held[None, :]) & want[:, None] & (held >= 0)[None, :]
        eqi = eq.to(tl.int32)
        new = want & (tl.max(eqi, 1) == 0)
        free = (tl.max(eqi, 0) == 0) & (s < K)
        rn = tl.cumsum(new.to(tl.int32), 0) - 1
        rf = tl.cumsum(free.to(tl.int32), 0) - 1
        match = (new[:, None] & free[None, :] & (rn[:, None] == rf[None, :])).to(tl.int32)
        slot = tl.where(new, tl.sum(match * s[None, :], 1), tl.sum(eqi * s[None, :], 1))
        placed = tl.max(match, 0) > 0
        tag = tl.where(placed, tl.sum(match * ids[:, None], 0), held)
        tl.store(Tags + b * s_tb + u * s_tu + s, tag, mask=s < K)
        out = pid.to(tl.int64) * K
        tl.store(Slot + out + i, slot, mask=i < K)
        sel = (new[None, :] & (rn[None, :] == i[:, None])).to(tl.int32)       # [r, i]: the r-th new block is i
        tl.store(Src + out + i, tl.sum(sel * ids[None, :], 1), mask=i < K)
        tl.store(Dst + out + i, tl.sum(sel * slot[None, :], 1), mask=i < K)
        n_new = tl.sum(new.to(tl.int32), 0)
        tl.store(NNew + pid, n_new)
        tl.atomic_add(Moved, n_new.to(tl.int64))

    @triton.jit
    def _stage_kernel(OK, OV, SK, SV, RK, RV, Src, Dst, NNew, RemS, RemL, H, U, K, R, n_init, bs, rem_col, rem_max,
                      s_ob, s_oh, s_on, s_sb, s_sh, s_sn, s_rb, s_rh, s_rn, D, BT: tl.constexpr, BD: tl.constexpr):
        # program (b * H + h, r): r < K the r-th new block (if r < n_new), r == K the remainder
        pid = tl.program_id(0)
        r = tl.program_id(1)
        b = (pid // H).to(tl.int64)
        h = (pid % H).to(tl.int64)
        u = h % U
        tt = tl.arange(0, BT)
        dd = tl.arange(0, BD)
        out_k = OK + b * s_ob + h * s_oh
        out_v = OV + b * s_ob + h * s_oh
        if r < K:
            row = (b * U + u) * K + r
            live = r < tl.load(NNew + b * U + u)
            src0 = n_init + tl.load(Src + row).to(tl.int64) * bs
            dst0 = n_init + tl.load(Dst + row).to(tl.int64) * bs
            for t0 in range(0, bs, BT):
                t = t0 + tt
                m = ((t < bs) & live)[:, None] & (dd[None, :] < D)
                src = b * s_sb + h * s_sh + (src0 + t)[:, None] * s_sn + dd[None, :]
                dst = (dst0 + t)[:, None] * s_on + dd[None, :]
                tl.store(out_k + dst, tl.load(SK + src, mask=m), mask=m)
                tl.store(out_v + dst, tl.load(SV + src, mask=m), mask=m)
        else:   # names of their own: a name bound in both branches of a runtime `if` must keep one type
            start = tl.load(RemS).to(tl.int64)
            n = tl.minimum(tl.load(RemL).to(tl.int64), rem_max)     # the buffer's columns after the slots
            for q0 in range(0, n, BT):
                q = q0 + tt
                mq = (q < n)[:, None] & (dd[None, :] < D)
                src_q = b * s_rb + h * s_rh + ((start + q) % R)[:, None] * s_rn + dd[None, :]
                dst_q = (rem_col + q)[:, None] * s_on + dd[None, :]
                tl.store(out_k + dst_q, tl.load(RK + src_q, mask=mq), mask=mq)
                tl.store(out_v + dst_q, tl.load(RV + src_q, mask=mq), mask=mq)


def assign_slots(tags, ids, counts, moved):
    """assign_slots_ref's contract, one program per (sequence, unit) on a Triton device."""
    if backend_for(tags) == "torch":
        return assign_slots_ref(tags, ids, counts, moved)
    B, U, K = tags.shape
    k = ids.shape[-1]
    assert tags.stride(-1) == 1 and ids.stride(-1) == 1 and k <= K and moved.dtype == torch.int64
    slot, src, dst = (torch.empty(B, U, K, device=tags.device, dtype=torch.int32) for _ in range(3))
    n_new = torch.empty(B, U, device=tags.device, dtype=torch.int32)
    kernel_for(_assign_kernel, tags)[(B * U,)](
        tags, ids, counts, slot, src, dst, n_new, moved, U, K, k, tags.stride(0), tags.stride(1), ids.stride(0),
        ids.stride(1), counts.stride(0), counts.stride(1), KP=max(2, next_pow2(K)), num_warps=1)
    return slot, src, dst, n_new


def stage_rows(out_k, out_v, store_k, store_v, ring_k, ring_v, src_blk, dst_slot, n_new, n_init: int, bs: int,
               rem_start, rem_len, rem_col: int) -> None:
    """stage_rows_ref's contract in one launch on a Triton device (decided by where out_k lives)."""
    if backend_for(out_k) == "torch":
        return stage_rows_ref(out_k, out_v, store_k, store_v, ring_k, ring_v, src_blk, dst_slot, n_new, n_init, bs,
                              rem_start, rem_len, rem_col)
    B, H, _, D = out_k.shape
    U, K = src_blk.shape[1:]
    assert out_k.stride() == out_v.stride() and store_k.stride() == store_v.stride() and ring_k.stride() == ring_v.stride()
    assert src_blk.is_contiguous() and dst_slot.is_contiguous() and n_new.is_contiguous()
    kernel_for(_stage_kernel, out_k)[(B * H, K + 1)](
        out_k, out_v, store_k, store_v, ring_k, ring_v, src_blk, dst_slot, n_new, rem_start, rem_len, H, U, K,
        ring_k.shape[2], n_init, bs, rem_col, out_k.shape[2] - rem_col, *out_k.stride()[:3], *store_k.stride()[:3], *ring_k.stride()[:3], D,
        BT=32, BD=next_pow2(D), num_warps=4)
    return None
