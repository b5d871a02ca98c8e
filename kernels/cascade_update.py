"""Cascading KV cache update: apply a step's plan (methods/parts/stores_cascade.py) to one layer's store.

Inputs (one layer): k, v [B, H, slots, D], score [B, H, slots] fp32, tok [B, H, slots] int64 (the
store, updated in place); the step's new tokens k_new, v_new [B, H, T, D] (un-rotated), score_new
[B, H, T] fp32, tok_new [T] int64 (absolute positions); the plan: fixed items (pool indices: < slots
an old slot, >= slots a new token), merges by stage (winner = x if score(x) >= score(y), else y: the
reference's `score >= old_score`, the incoming token winning ties) and writes (dst slot <- item) by
group, deepest cascade first.

One Triton program per (sequence, KV head) runs the merges stage by stage (vectorised within a
stage) and then the writes group by group, with a barrier between stages and groups: every source a
write reads is an old slot of a shallower cascade (or a new token), which a later group overwrites,
so it is read before it changes. The torch reference gathers every source first and then scatters.
"""
from __future__ import annotations

import torch

from ._common import HAVE_TRITON, backend_for, kernel_for, tl, triton

MERGE_BLOCK = 128
WRITE_BLOCK = 32


def cascade_apply_ref(k, v, score, tok, k_new, v_new, score_new, tok_new, plan) -> None:
    B, H, slots, D = k.shape
    F = plan.n_fixed
    ids = torch.empty(B, H, F + plan.n_merge, dtype=torch.long, device=k.device)
    ids[..., :F] = plan.fixed.long()
    pool_score = torch.cat([score, score_new.float()], -1)
    off = plan.stage_off
    for s in range(len(off) - 1):
        if off[s + 1] == off[s]:
            continue
        x = ids[..., plan.mx[off[s]:off[s + 1]].long()]
        y = ids[..., plan.my[off[s]:off[s + 1]].long()]
        win = pool_score.gather(-1, x) >= pool_score.gather(-1, y)
        ids[..., F + off[s]:F + off[s + 1]] = torch.where(win, x, y)
    if plan.dst.numel() == 0:
        return
    src = ids[..., plan.item.long()]                          # [B, H, n] pool indices
    old = src < slots
    so, sn = src.clamp(max=slots - 1), (src - slots).clamp(min=0)

    def rows(store, new):
        a = store.gather(2, so.unsqueeze(-1).expand(-1, -1, -1, D))
        b = new.gather(2, sn.clamp(max=new.shape[2] - 1).unsqueeze(-1).expand(-1, -1, -1, D))
        return torch.where(old.unsqueeze(-1), a, b)

    kk, vv = rows(k, k_new), rows(v, v_new)
    sc = torch.where(old, score.gather(-1, so), score_new.float().gather(-1, sn.clamp(max=score_new.shape[-1] - 1)))
    tk = torch.where(old, tok.gather(-1, so), tok_new.view(1, 1, -1).expand(B, H, -1).gather(
        -1, sn.clamp(max=tok_new.numel() - 1)))
    dst = plan.dst.long().view(1, 1, -1).expand(B, H, -1)
    k.scatter_(2, dst.unsqueeze(-1).expand(-1, -1, -1, D), kk)
    v.scatter_(2, dst.unsqueeze(-1).expand(-1, -1, -1, D), vv)
    score.scatter_(2, dst, sc)
    tok.scatter_(2, dst, tk)


if HAVE_TRITON:

    @triton.jit
    def _resolve(it, FIXED, IDS, n_fixed, mask):
        is_fixed = it < n_fixed
        a = tl.load(FIXED + it, mask=mask & is_fixed, other=0)
        b = tl.load(IDS + (it - n_fixed), mask=mask & (it >= n_fixed), other=0)
        return tl.where(is_fixed, a, b)

    @triton.jit
    def _pool_score(p, SC, SCN, slots, mask):
        old = p < slots
        a = tl.load(SC + p, mask=mask & old, other=0.0)
        b = tl.load(SCN + (p - slots), mask=mask & (p >= slots), other=0.0)
        return tl.where(old, a, b)

    @triton.jit
    def _apply_kernel(K, V, SC, TOK, KN, VN, SCN, TOKN, FIXED, MX, MY, STAGE, DST, ITEM, GROUP, IDS,
                      n_fixed, n_merge, n_stages, n_groups, slots, H,
                      s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_sb, s_sh, s_tb, s_th,
                      s_knb, s_knh, s_knt, s_vnb, s_vnh, s_vnt, s_snb, s_snh,
                      D: tl.constexpr, BM: tl.constexpr, BW: tl.constexpr):
        pid = tl.program_id(0)
        b = (pid // H).to(tl.int64)
        h = (pid % H).to(tl.int64)
        sc = SC + b * s_sb + h * s_sh
        scn = SCN + b * s_snb + h * s_snh
        ids = IDS + pid.to(tl.int64) * n_merge
        # merges, stage by stage
        for s in range(n_stages):
            lo = tl.load(STAGE + s)
            hi = tl.load(STAGE + s + 1)
            for m0 in range(lo, hi, BM):
                mm = m0 + tl.arange(0, BM)
                mask = mm < hi
                px = _resolve(tl.load(MX + mm, mask=mask, other=0), FIXED, ids, n_fixed, mask)
                py = _resolve(tl.load(MY + mm, mask=mask, other=0), FIXED, ids, n_fixed, mask)
                win = _pool_score(px, sc, scn, slots, mask) >= _pool_score(py, sc, scn, slots, mask)
                tl.store(ids + mm, tl.where(win, px, py), mask=mask)
            tl.debug_barrier()
        # writes, group by group (deepest cascade first)
        dd = tl.arange(0, D)
        kb, vb = K + b * s_kb + h * s_kh, V + b * s_vb + h * s_vh
        knb, vnb = KN + b * s_knb + h * s_knh, VN + b * s_vnb + h * s_vnh
        tb = TOK + b * s_tb + h * s_th
        for g in range(n_groups):
            lo = tl.load(GROUP + g)
            hi = tl.load(GROUP + g + 1)
            for w0 in range(lo, hi, BW):
                ww = w0 + tl.arange(0, BW)
                mask = ww < hi
                dst = tl.load(DST + ww, mask=mask, other=0).to(tl.int64)
                p = _resolve(tl.load(ITEM + ww, mask=mask, other=0), FIXED, ids, n_fixed, mask).to(tl.int64)
                old = (p < slots) & mask
                new = (p >= slots) & mask
                pn = p - slots
                m2o, m2n = old[:, None], new[:, None]
                krow = tl.where(m2o, tl.load(kb + p[:, None] * s_ks + dd[None, :], mask=m2o, other=0.0),
                                tl.load(knb + pn[:, None] * s_knt + dd[None, :], mask=m2n, other=0.0))
                vrow = tl.where(m2o, tl.load(vb + p[:, None] * s_vs + dd[None, :], mask=m2o, other=0.0),
                                tl.load(vnb + pn[:, None] * s_vnt + dd[None, :], mask=m2n, other=0.0))
                srow = _pool_score(p, sc, scn, slots, mask)
                trow = tl.where(old, tl.load(tb + p, mask=old, other=0), tl.load(TOKN + pn, mask=new, other=0))
                # loads of the whole block happen before its stores (one group never reads what it writes)
                tl.store(kb + dst[:, None] * s_ks + dd[None, :], krow, mask=mask[:, None])
                tl.store(vb + dst[:, None] * s_vs + dd[None, :], vrow, mask=mask[:, None])
                tl.store(sc + dst, srow, mask=mask)
                tl.store(tb + dst, trow, mask=mask)
            tl.debug_barrier()


def cascade_apply(k, v, score, tok, k_new, v_new, score_new, tok_new, plan) -> None:
    """Apply `plan` in place to one layer's store (see the module docstring)."""
    if backend_for(k) == "torch":
        return cascade_apply_ref(k, v, score, tok, k_new, v_new, score_new, tok_new, plan)
    B, H, slots, D = k.shape
    assert k.stride(-1) == 1 and v.stride(-1) == 1 and k_new.stride(-1) == 1 and v_new.stride(-1) == 1
    assert score.stride(-1) == 1 and tok.stride(-1) == 1
    dev = k.device
    ids = torch.empty(B * H * max(plan.n_merge, 1), dtype=torch.int32, device=dev)
    stage, group = plan.stage_dev, plan.group_dev
    sn = score_new.float()
    if sn.stride(-1) != 1:
        sn = sn.contiguous()
    tn = tok_new.to(device=dev, dtype=torch.int64).contiguous()
    kernel_for(_apply_kernel, k)[(B * H,)](
        k, v, score, tok, k_new, v_new, sn, tn, plan.fixed, plan.mx, plan.my, stage, plan.dst, plan.item, group, ids,
        plan.n_fixed, max(plan.n_merge, 1), len(plan.stage_off) - 1, len(plan.group_off) - 1, slots, H,
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        score.stride(0), score.stride(1), tok.stride(0), tok.stride(1),
        k_new.stride(0), k_new.stride(1), k_new.stride(2), v_new.stride(0), v_new.stride(1), v_new.stride(2),
        sn.stride(0), sn.stride(1), D=D, BM=MERGE_BLOCK, BW=WRITE_BLOCK, num_warps=4)
