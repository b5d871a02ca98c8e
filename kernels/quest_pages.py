"""Quest page metadata and page scores.

Pages hold `page_size` consecutive tokens aligned to position 0 (page p = tokens p*P .. p*P+P-1).
kmin, kmax [B, Hkv, n_pages, D] are the element-wise min/max of each page's keys, kept up to date
incrementally on append (`quest_update_pages`); their dtype is the caller's choice (min/max are
exact in the key dtype, so bf16 metadata loses nothing). The page score of query head h is the
Quest upper bound sum_d max(q_d*kmin_d, q_d*kmax_d), unscaled, fp32.

The kernel computes the bound as q+ . kmax + q- . kmin (q+ = max(q, 0), q- = min(q, 0)), which is
the same sum term by term, as two matrix products over the GQA group.
"""
from __future__ import annotations

import torch

from ._common import HAVE_TRITON, backend_for, kernel_for, next_pow2, tl, triton


def _empty(*shape, device, dtype):
    """Output allocation (tests swap in a NaN-filled version to check every element is written)."""
    return torch.empty(*shape, device=device, dtype=dtype)

if HAVE_TRITON:

    @triton.jit
    def _quest_update_kernel(Kmin, Kmax, Knew, Start, T, NP, HKV,
                             s_mb, s_mh, s_mp, s_nb, s_nh, s_nt,
                             P: tl.constexpr, P_PAD: tl.constexpr, D: tl.constexpr):
        # One program per (batch, KV head, page touched by the append).
        pid = tl.program_id(0)
        j = tl.program_id(1)
        b = (pid // HKV).to(tl.int64)
        h = pid % HKV
        st = tl.load(Start + b)
        page = st // P + j
        lo = tl.maximum(page * P, st)
        hi = tl.minimum(page * P + P, st + T)
        tt = page * P + tl.arange(0, P_PAD)
        dd = tl.arange(0, D)
        m = (tt >= lo) & (tt < hi)
        x = tl.load(Knew + b * s_nb + h * s_nh + (tt - st)[:, None] * s_nt + dd[None, :],
                    mask=m[:, None], other=0.0).to(tl.float32)
        mn = tl.min(tl.where(m[:, None], x, float("inf")), 0)
        mx = tl.max(tl.where(m[:, None], x, float("-inf")), 0)
        ok = (lo < hi) & (page < NP)
        # A page that already holds tokens before `start` merges with its stored bounds; a page
        # that starts inside this append is overwritten (stale contents from a previous sample).
        old = ok & (lo > page * P)
        off = b * s_mb + h * s_mh + page * s_mp + dd
        # (no infinite `other=`: the interpreter cannot build bf16 infinities)
        mn = tl.minimum(mn, tl.where(old, tl.load(Kmin + off, mask=old, other=0.0).to(tl.float32),
                                     float("inf")))
        mx = tl.maximum(mx, tl.where(old, tl.load(Kmax + off, mask=old, other=0.0).to(tl.float32),
                                     float("-inf")))
        tl.store(Kmin + off, mn.to(Kmin.dtype.element_ty), mask=ok & (dd < D))
        tl.store(Kmax + off, mx.to(Kmax.dtype.element_ty), mask=ok & (dd < D))

    @triton.jit
    def _quest_scores_kernel(Q, Kmin, Kmax, Nvalid, Out, NP,
                             s_qb, s_qh, s_mb, s_mh, s_mp, s_ob, s_oh, HKV,
                             G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr,
                             BLOCK_P: tl.constexpr, F32: tl.constexpr, PREC: tl.constexpr,
                             FORCE_LAST: tl.constexpr = False):
        pid = tl.program_id(0)
        b = (pid // HKV).to(tl.int64)
        h = pid % HKV
        rows = tl.arange(0, G_PAD)
        rmask = rows < G
        dd = tl.arange(0, D)
        pp = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)
        pmask = pp < NP
        q = tl.load(Q + b * s_qb + (h * G + rows)[:, None] * s_qh + dd[None, :],
                    mask=rmask[:, None], other=0.0)
        off = b * s_mb + h * s_mh + pp[:, None] * s_mp + dd[None, :]
        kn = tl.load(Kmin + off, mask=pmask[:, None], other=0.0)
        kx = tl.load(Kmax + off, mask=pmask[:, None], other=0.0)
        if F32:
            q = q.to(tl.float32)
            kn = kn.to(tl.float32)
            kx = kx.to(tl.float32)
        zero = tl.zeros_like(q)
        # (max/min promote bf16 to fp32: cast back, exact since the values are q's own)
        s = tl.dot(tl.maximum(q, zero).to(kx.dtype), tl.trans(kx), input_precision=PREC)
        s += tl.dot(tl.minimum(q, zero).to(kn.dtype), tl.trans(kn), input_precision=PREC)
        nv = tl.load(Nvalid + b)
        s = tl.where((pp < nv)[None, :], s, float("-inf"))
        if FORCE_LAST:  # the page being written always taken (Quest's kernel path)
            s = tl.where((pp == nv - 1)[None, :], float("inf"), s)
        tl.store(Out + b * s_ob + (h * G + rows)[:, None] * s_oh + pp[None, :], s,
                 mask=rmask[:, None] & pmask[None, :])


    @triton.jit
    def _page_keep_kernel(Vals, Idx, Rb, OutIdx, Counts, KK, NP, H,
                          HAS_RB: tl.constexpr, BLOCK: tl.constexpr):
        # One program per row of an unsorted top-k: count the kept (finite) entries and find the
        # worst one (first on ties, as torch.argmin), then write the kept page numbers with NP for
        # the others, dropping the worst when the row holds more than its sequence's budget.
        row = tl.program_id(0).to(tl.int64)
        base = row * KK
        n = tl.full([], 0, tl.int32)
        best = tl.full([], float("inf"), tl.float32)
        arg = tl.full([], -1, tl.int32)
        for c in range(0, KK, BLOCK):
            offs = c + tl.arange(0, BLOCK)
            v = tl.load(Vals + base + offs, mask=offs < KK, other=0.0)
            keep = (offs < KK) & (v != float("-inf"))
            n += tl.sum(keep.to(tl.int32), 0)
            vk = tl.where(keep, v, float("inf"))
            cmin = tl.min(vk, 0)
            carg = tl.argmin(vk, 0).to(tl.int32) + c
            upd = cmin < best
            arg = tl.where(upd, carg, arg)
            best = tl.where(upd, cmin, best)
        drop = n < 0
        if HAS_RB:
            drop = n > tl.load(Rb + row // H)
        tl.store(Counts + row, n - drop.to(tl.int32))
        for c in range(0, KK, BLOCK):
            offs = c + tl.arange(0, BLOCK)
            v = tl.load(Vals + base + offs, mask=offs < KK, other=0.0)
            keep = (offs < KK) & (v != float("-inf")) & ~(drop & (offs == arg))
            ix = tl.load(Idx + base + offs, mask=offs < KK, other=0)
            tl.store(OutIdx + base + offs, tl.where(keep, ix, NP).to(tl.int32), mask=offs < KK)


def _as_batch_tensor(x, B, device):
    if isinstance(x, torch.Tensor):
        return x.to(device=device, dtype=torch.int32).reshape(-1).expand(B).contiguous()
    return torch.full((B,), int(x), device=device, dtype=torch.int32)


def quest_update_pages_ref(kmin, kmax, k_new, start, page_size=16):
    B, Hkv, T, D = k_new.shape
    starts = _as_batch_tensor(start, B, kmin.device).tolist()
    for b, s in enumerate(starts):
        p0, p1 = s // page_size, (s + T - 1) // page_size + 1
        pre = s - p0 * page_size
        n = (p1 - p0) * page_size
        x = k_new[b].float()
        lo = torch.full((Hkv, n, D), float("inf"), device=x.device)
        hi = torch.full((Hkv, n, D), float("-inf"), device=x.device)
        lo[:, pre:pre + T] = x
        hi[:, pre:pre + T] = x
        mn = lo.view(Hkv, p1 - p0, page_size, D).amin(2)
        mx = hi.view(Hkv, p1 - p0, page_size, D).amax(2)
        if pre > 0:
            mn[:, 0] = torch.minimum(mn[:, 0], kmin[b, :, p0].float())
            mx[:, 0] = torch.maximum(mx[:, 0], kmax[b, :, p0].float())
        kmin[b, :, p0:p1] = mn.to(kmin.dtype)
        kmax[b, :, p0:p1] = mx.to(kmax.dtype)
    return kmin, kmax


def quest_update_pages(kmin, kmax, k_new, start, page_size=16):
    """Fold the keys k_new [B, Hkv, T, D], written at positions start..start+T-1 (`start`: int or
    int32 [B]), into kmin/kmax in place; returns (kmin, kmax). Pages past n_pages are ignored by the
    kernel (the reference raises), so size the metadata for the cache capacity."""
    if backend_for(k_new) == "torch":
        return quest_update_pages_ref(kmin, kmax, k_new, start, page_size)
    B, Hkv, T, D = k_new.shape
    assert kmin.stride() == kmax.stride() and kmin.stride(-1) == 1 and k_new.stride(-1) == 1
    if T == 0:
        return kmin, kmax
    st = _as_batch_tensor(start, B, k_new.device)
    grid = (B * Hkv, (T - 1) // page_size + 2)  # pages an append of T tokens can touch
    kernel_for(_quest_update_kernel, k_new)[grid](
        kmin, kmax, k_new, st, T, kmin.shape[2], Hkv,
        kmin.stride(0), kmin.stride(1), kmin.stride(2),
        k_new.stride(0), k_new.stride(1), k_new.stride(2),
        P=page_size, P_PAD=next_pow2(page_size), D=D, num_warps=4)
    return kmin, kmax


def quest_page_scores_ref(q, kmin, kmax, n_pages_valid):
    B, Hq, D = q.shape
    Hkv, NP = kmin.shape[1], kmin.shape[2]
    qg = q.float().view(B, Hkv, Hq // Hkv, 1, D)
    out = torch.empty(B, Hkv, Hq // Hkv, NP, device=q.device, dtype=torch.float32)
    for p0 in range(0, NP, 1024):  # bounded temporaries at long contexts
        lo = kmin[:, :, None, p0:p0 + 1024].float()
        hi = kmax[:, :, None, p0:p0 + 1024].float()
        out[..., p0:p0 + 1024] = torch.maximum(qg * lo, qg * hi).sum(-1)
    nv = _as_batch_tensor(n_pages_valid, B, q.device).long().view(B, 1, 1, 1)
    out = out.masked_fill(torch.arange(NP, device=q.device) >= nv, float("-inf"))
    return out.view(B, Hq, NP)


def quest_page_scores(q, kmin, kmax, n_pages_valid, *, force_last: bool = False):
    """Quest bounds q [B, Hq, D] x pages [B, Hkv, n_pages, D] -> [B, Hq, n_pages] fp32, per query
    head (sum over the group yourself for shared pages); pages >= n_pages_valid[b] get -inf; with
    `force_last` the last valid page gets +inf (always selected)."""
    if backend_for(q) == "torch":
        s = quest_page_scores_ref(q, kmin, kmax, n_pages_valid)
        if force_last:
            nv = _as_batch_tensor(n_pages_valid, q.shape[0], q.device).long()
            s = s.masked_fill(torch.arange(s.shape[-1], device=s.device) == (nv - 1).view(-1, 1, 1), float("inf"))
        return s
    B, Hq, D = q.shape
    Hkv, NP = kmin.shape[1], kmin.shape[2]
    G = Hq // Hkv
    assert kmin.stride() == kmax.stride() and kmin.stride(-1) == 1 and q.stride(-1) == 1
    nv = _as_batch_tensor(n_pages_valid, B, q.device)
    out = _empty(B, Hq, NP, device=q.device, dtype=torch.float32)
    # fp32 products when dtypes differ, and on the interpreter (its bf16 tl.dot is wrong).
    f32 = q.dtype == torch.float32 or kmin.dtype != q.dtype or not q.is_cuda
    block_p = 64 if q.is_cuda else 32
    kernel_for(_quest_scores_kernel, q)[(B * Hkv, triton.cdiv(NP, block_p))](
        q, kmin, kmax, nv, out, NP, q.stride(0), q.stride(1),
        kmin.stride(0), kmin.stride(1), kmin.stride(2), out.stride(0), out.stride(1), Hkv,
        G=G, G_PAD=max(16, next_pow2(G)), D=D, BLOCK_P=block_p, F32=f32,
        PREC="ieee" if f32 else "tf32", FORCE_LAST=force_last, num_warps=4)
    return out


def quest_select_pages(q, kmin, kmax, n_pages_valid, page_budget, *, force_last, row_budget=None, chunks="auto",
                       warps=None):
    """Quest's whole selection, per query head: (page index int32 [B, Hq, min(page_budget, NP)] sorted,
    padding 0; counts int32 [B, Hq]) = quest_topk_pages(quest_page_scores(...)) up to ties.

    On the GPU, up to RADIX_MAX_CONTEXT pages (512K tokens at 16 a page), two kernels: the scores
    (masked, the forced page +inf) and the radix top-k with the row budget as a per-sequence k, already
    sorted by page. The torch.topk path was ~8 kernels per layer (mask, top-k, keep, sort, where):
    1.2 ms/token of top-k and sort at 32K on the H100, more than the attention it saves. Exact ties
    in the bound go to the lower page (torch.topk breaks them arbitrarily). chunks / warps: the top-k's
    two-stage split and warps per program (kernels/topk.py::topk_positions; the same pages)."""
    from .topk import RADIX_MAX_CONTEXT, topk_positions

    NP = kmin.shape[2]
    if backend_for(q) == "torch" or NP > RADIX_MAX_CONTEXT:
        scores = quest_page_scores(q, kmin, kmax, n_pages_valid)
        return quest_topk_pages(scores, page_budget, n_pages_valid, force_last=force_last, row_budget=row_budget)
    scores = quest_page_scores(q, kmin, kmax, n_pages_valid, force_last=force_last)
    rk = None if row_budget is None else _as_batch_tensor(row_budget, q.shape[0], q.device)
    return topk_positions(scores, None, page_budget, impl="radix", row_k=rk, chunks=chunks, warps=warps)


def page_keep_ref(vals, idx, n_pages, row_budget=None):
    """Of an unsorted top-k (vals fp32, idx [B, H, k]): (page numbers int32 with `n_pages` in the
    slots not kept, counts int32 [B, H]). Kept: finite scores; with `row_budget` (int [B]) a row
    holding more drops its worst kept entry (the first on ties), so the budget may be at most one
    below the kept count (Quest's clamp of the budget to a short context)."""
    keep = vals != float("-inf")
    if row_budget is not None:
        over = keep.sum(-1, keepdim=True) > row_budget.view(-1, 1, 1).long()
        worst = torch.where(keep, vals, float("inf")).argmin(-1, keepdim=True)
        keep &= ~(over & (torch.arange(vals.shape[-1], device=vals.device) == worst))
    return torch.where(keep, idx, n_pages).to(torch.int32), keep.sum(-1).to(torch.int32)


def page_keep(vals, idx, n_pages, row_budget=None):
    """page_keep_ref in one kernel per row on the GPU (the torch version is ~7 small kernels)."""
    if backend_for(vals) == "torch":
        return page_keep_ref(vals, idx, n_pages, row_budget)
    B, H, K = vals.shape
    vals, idx = vals.contiguous(), idx.contiguous()
    out = _empty(B, H, K, device=vals.device, dtype=torch.int32)
    counts = _empty(B, H, device=vals.device, dtype=torch.int32)
    rb = vals if row_budget is None else _as_batch_tensor(row_budget, B, vals.device)
    kernel_for(_page_keep_kernel, vals)[(B * H,)](
        vals, idx, rb, out, counts, K, n_pages, H, HAS_RB=row_budget is not None,
        BLOCK=min(1024, next_pow2(K)), num_warps=4)
    return out, counts


def quest_topk_pages(scores, page_budget, n_pages_valid, force_last=True, row_budget=None):
    """Page top-k (torch.topk; same code on every backend): scores [B, H, n_pages] -> (page_index
    int32 [B, H, k], page_counts int32 [B, H]) with k = min(page_budget, n_pages). As in Quest's
    kernel path, the last valid page (the one being written) is always taken when `force_last`,
    and the others by score. The valid prefix is sorted by page; padding holds 0.

    `row_budget` (int tensor [B]) lowers the number of pages per sequence without a host sync, for
    the reference's clamp of the budget to the context: it must be >= the valid pages - 1, so it drops
    at most the worst-scored kept page (Quest's clamp: min(length, budget) // page_size >=
    ceil(length / page_size) - 1). The top-k stays unsorted: a sorted top-k of 256 pages cost
    0.58 ms/token at K=4096 on the H100 (Llama-2-7B, 30 sparse layers), the fused keep ~1 kernel."""
    B, H, NP = scores.shape
    kk = min(int(page_budget), NP)
    nv = _as_batch_tensor(n_pages_valid, B, scores.device).long()
    s = scores
    if force_last:
        last = (nv - 1).clamp(min=0).view(B, 1, 1).expand(B, H, 1)
        s = scores.scatter(-1, last, float("inf"))
    s = s.masked_fill(torch.arange(NP, device=s.device) >= nv.view(B, 1, 1), float("-inf"))
    vals, idx = s.topk(kk, dim=-1, sorted=False)
    idx, counts = page_keep(vals, idx, NP, row_budget)
    idx = idx.sort(-1).values
    return torch.where(idx == NP, 0, idx), counts
